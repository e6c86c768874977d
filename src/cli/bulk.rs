//! `load` and `rebuild`: every key of a source into one namespace. `load` sends batches of `Add`, several in
//! flight so that reading, the network and the gate's log all stay busy; `rebuild` streams the same batches
//! through one `Admin.Rebuild` call, whose end swaps the new filter in.

use clap::Args;
use indicatif::{HumanBytes, HumanCount};
use serde_json::json;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::{Code, Status};

use crate::cli::output;
use crate::cli::progress::{Finished, Progress};
use crate::cli::source::{Source, SourceArgs};
use crate::client::connection::{ConnectArgs, Gate};
use crate::client::failure;
use crate::proto::{AddRequest, RebuildRequest};

/// The flags `load` and `rebuild` share.
#[derive(Debug, Args)]
pub struct BulkArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// The namespace to fill.
    #[arg(long, short, default_value = "default")]
    pub namespace: String,
    #[command(flatten)]
    pub source: SourceArgs,
    /// Keys per message: at most the gate's max_batch_keys (10,000 unless configured otherwise).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub batch: u32,
    /// Print the summary as a JSON object on stdout instead of a line on stderr.
    #[arg(long)]
    pub json: bool,
}

/// `load`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    #[command(flatten)]
    pub bulk: BulkArgs,
    /// Add calls in flight at once: while the gate logs one batch, the next ones are on their way.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub in_flight: u32,
}

/// `rebuild`.
#[derive(Debug, Args)]
pub struct RebuildArgs {
    #[command(flatten)]
    pub bulk: BulkArgs,
    /// Rebuild even from an input with no keys, emptying the namespace's filter (every key then answers
    /// ABSENT until added again). Without it, an empty input is refused here and by the gate.
    #[arg(long)]
    pub allow_empty: bool,
}

/// What an `Add` task hands back: the keys and input bytes it covered, or the input's number of its first
/// key and the refusal.
type AddOutcome = Result<(u64, u64), (u64, Status)>;

/// Sends every key of the source as `Add` batches, `--in-flight` at a time; the first refusal stops it.
pub async fn load(args: LoadArgs) -> Result<(), String> {
    let bulk = &args.bulk;
    let gate = Gate::connect(&bulk.connect).await?;
    let (mut source, total) = Source::open(&bulk.source).await?;
    let mut progress = Progress::start(total);
    let mut calls: JoinSet<AddOutcome> = JoinSet::new();
    let mut sent = 0u64;
    while let Some(batch) = source.next_batch(bulk.batch as usize).await? {
        while calls.len() >= args.in_flight as usize {
            settle(calls.join_next().await, &mut progress)?;
        }
        let first = sent;
        let covered = (batch.keys.len() as u64, batch.input_bytes);
        sent += covered.0;
        let request = AddRequest {
            namespace: bulk.namespace.clone(),
            keys: batch.keys,
            ..Default::default()
        };
        let mut client = gate.gate();
        calls.spawn(async move {
            client
                .add(request)
                .await
                .map(|_| covered)
                .map_err(|status| (first, status))
        });
    }
    while let Some(done) = calls.join_next().await {
        settle(Some(done), &mut progress)?;
    }
    let finished = progress.finish();
    summarise(
        bulk,
        &finished,
        source.skipped(),
        json!({}),
        format!(
            "loaded {} into namespace {:?}",
            finished.figures(),
            bulk.namespace
        ),
    )
}

/// Accounts for one finished `Add`, or turns its refusal into the command's error.
fn settle(
    done: Option<Result<AddOutcome, tokio::task::JoinError>>,
    progress: &mut Progress,
) -> Result<(), String> {
    match done {
        None => Ok(()),
        Some(Ok(Ok((keys, input_bytes)))) => {
            progress.advance(keys, input_bytes);
            Ok(())
        }
        Some(Ok(Err((first, status)))) => {
            // The gate names a bad key by its index in the batch (`keys[12] is empty`); say which key of the
            // input that is, so it can be found and fixed.
            let call = match refused_index(status.message()) {
                Some(index) => format!(
                    "Add (keys[{index}] is key #{} of the input)",
                    HumanCount(first + index + 1)
                ),
                None => "Add".to_string(),
            };
            Err(failure::refused(&call, &status))
        }
        Some(Err(error)) => Err(format!("an Add call panicked or was cancelled: {error}")),
    }
}

/// The `i` of a `keys[i]` the gate's message names.
fn refused_index(message: &str) -> Option<u64> {
    let (_, after) = message.split_once("keys[")?;
    after.split_once(']')?.0.parse().ok()
}

/// What the request stream of a rebuild is told: keys to send, or the last message (the source is
/// exhausted).
enum Feed {
    Keys(RebuildRequest),
    End(RebuildRequest),
}

/// Streams every key of the source through one `Admin.Rebuild`, then commits it. When the source fails or
/// Ctrl-C interrupts, the stream ends without the commit, which the gate refuses (`INVALID_ARGUMENT`) by
/// abandoning the rebuild; the command waits for that refusal, so the live filter is known to be as it
/// was. (Cancelling the call would not do: HTTP/2 servers may read a stream reset as the body's clean end,
/// which is why the gate wants an explicit commit.)
pub async fn rebuild(args: RebuildArgs) -> Result<(), String> {
    let bulk = &args.bulk;
    let gate = Gate::connect(&bulk.connect).await?;
    let (mut source, total) = Source::open(&bulk.source).await?;
    let mut progress = Progress::start(total);
    let first = source.next_batch(bulk.batch as usize).await?;
    if first.is_none() && !args.allow_empty {
        return Err(format!(
            "the input holds no keys: rebuilding namespace {:?} from it would empty its filter (every key \
             would answer ABSENT); nothing was sent (--allow-empty if the namespace really holds no keys)",
            bulk.namespace
        ));
    }
    let mut interrupted =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot listen for Ctrl-C: {e}"))?;
    let (feed, mut requests) = mpsc::channel::<Feed>(2);
    let requests = async_stream::stream! {
        loop {
            match requests.recv().await {
                Some(Feed::Keys(request)) => yield request,
                Some(Feed::End(last)) => {
                    yield last;
                    break;
                }
                // The sender is gone without saying End: the source failed or the command was interrupted,
                // and the stream ends uncommitted.
                None => break,
            }
        }
    };
    let mut admin = gate.admin();
    let call = admin.rebuild(requests);
    tokio::pin!(call);
    let send = async {
        let feed = feed;
        let mut namespace = bulk.namespace.clone();
        let mut next = first;
        while let Some(batch) = next {
            let covered = (batch.keys.len() as u64, batch.input_bytes);
            let request = RebuildRequest {
                // The first message names the namespace; later ones may leave it empty.
                namespace: std::mem::take(&mut namespace),
                keys: batch.keys,
                ..Default::default()
            };
            if feed.send(Feed::Keys(request)).await.is_err() {
                // The call ended early; its status says why.
                return Ok(());
            }
            progress.advance(covered.0, covered.1);
            next = source.next_batch(bulk.batch as usize).await?;
        }
        // The gate swaps the new filter in only on a message with `commit` set; it names the namespace
        // if no keys went before. A closed channel here, too, means the call ended, and its status says why.
        let last = RebuildRequest {
            namespace,
            commit: true,
            allow_empty: args.allow_empty,
            ..Default::default()
        };
        let _ = feed.send(Feed::End(last)).await;
        Ok::<(), String>(())
    };
    let sent = tokio::select! {
        reply = &mut call => {
            // The gate only answers before the stream ends when it refuses the rebuild.
            return Err(match reply {
                Err(status) => failure::refused("Rebuild", &status),
                Ok(_) => "the gate ended the rebuild before every key was sent".to_string(),
            });
        }
        sent = send => sent,
        _ = interrupted.recv() => Err("interrupted".to_string()),
    };
    if let Err(why) = sent {
        // The feed is gone, so the stream ends uncommitted: wait for the gate to refuse it.
        return Err(match call.await {
            Err(status) if status.code() == Code::InvalidArgument => format!(
                "{why}; the rebuild was abandoned and the live filter of namespace {:?} is unchanged",
                bulk.namespace
            ),
            Err(status) => format!("{why}; then {}", failure::refused("Rebuild", &status)),
            Ok(_) => format!("{why}; yet the gate finished the rebuild"),
        });
    }
    let reply = call
        .await
        .map_err(|status| failure::refused("Rebuild", &status))?
        .into_inner();
    let finished = progress.finish();
    summarise(
        bulk,
        &finished,
        source.skipped(),
        json!({"filter_bytes": reply.filter_bytes, "seq": reply.seq, "keys_rebuilt": reply.keys}),
        format!(
            "rebuilt namespace {:?} from {}: filter {}, swapped in at seq {}",
            bulk.namespace,
            finished.figures(),
            HumanBytes(reply.filter_bytes),
            reply.seq
        ),
    )
}

/// Prints how the command went: `line` on stderr, or with --json an object on stdout with the figures and
/// `extra`.
fn summarise(
    bulk: &BulkArgs,
    finished: &Finished,
    skipped: u64,
    extra: serde_json::Value,
    line: String,
) -> Result<(), String> {
    if bulk.json {
        let mut object = json!({
            "namespace": bulk.namespace,
            "keys": finished.keys,
            "seconds": finished.elapsed.as_secs_f64(),
            "keys_per_second": finished.keys_per_second(),
            "skipped": skipped,
        });
        if let (Some(object), serde_json::Value::Object(extra)) = (object.as_object_mut(), extra) {
            object.extend(extra);
        }
        return output::line(&object.to_string());
    }
    let skipped = match skipped {
        0 => String::new(),
        n => format!("; skipped {}", output::count(n, "empty or NULL key")),
    };
    eprintln!("{line}{skipped}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_key_is_found_by_its_index() {
        assert_eq!(refused_index("keys[12] is empty"), Some(12));
        assert_eq!(refused_index("namespace \"x\" does not exist"), None);
    }
}
