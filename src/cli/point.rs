//! `check`, `add` and `absent`: the read path's calls, a few keys at a time, for trying the gate out and for
//! scripts.

use std::ffi::OsString;
use std::io::Write;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use crate::cli::output::{self, insert_key, key_text, short_name};
use crate::cli::reader::Format;
use crate::cli::source;
use crate::client::connection::{ConnectArgs, Gate, GateClient};
use crate::client::failure;
use crate::core::config::parse_duration;
use crate::proto::{
    AbsenceKind, AddRequest, Answer, Basis, BatchMayExistRequest, BatchMayExistResponse,
    RecordAbsentRequest, RecordOutcome,
};

/// `BatchMayExist` calls in flight at once while checking many keys: enough to hide the round trips.
const CHECK_IN_FLIGHT: usize = 4;

/// `check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// The namespace to ask.
    #[arg(long, short, default_value = "default")]
    pub namespace: String,
    /// The keys; without any, keys are read from standard input.
    pub keys: Vec<OsString>,
    /// How keys on standard input are written (lines, raw or hex; see `load --help`).
    #[arg(long, value_enum, default_value_t = Format::Lines)]
    pub format: Format,
    /// One JSON object per key (key, answer, basis, observed_seq) instead of `KEY ANSWER BASIS`.
    #[arg(long)]
    pub json: bool,
    /// Keys per BatchMayExist (at most the gate's max_batch_keys).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,
}

/// `add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// The namespace to add to.
    #[arg(long, short, default_value = "default")]
    pub namespace: String,
    /// The keys (all in one Add, so at most the gate's max_batch_keys).
    #[arg(required = true)]
    pub keys: Vec<OsString>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `absent`.
#[derive(Debug, Args)]
pub struct AbsentArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// The namespace.
    #[arg(long, short, default_value = "default")]
    pub namespace: String,
    /// The key the source did not find.
    pub key: OsString,
    /// The entity was deleted (the namespace's deleted_ttl applies), rather than never found (missing_ttl).
    #[arg(long)]
    pub deleted: bool,
    /// How long the tombstone should live (e.g. 60s, 10m); default: the namespace's TTL for the kind.
    /// Clamped to the namespace's max_ttl and jittered by the gate.
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    /// The observed_seq of the answer that sent you to the source (`check --json` prints it): the gate
    /// refuses the absence (SUPERSEDED) if the key was added since. 0 skips that check.
    #[arg(long, default_value_t = 0)]
    pub observed_seq: u64,
    /// Print the outcome as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Looks the keys up in batches (`BatchMayExist` with their bases, `CHECK_IN_FLIGHT` at a time, answers
/// kept in order) and prints one line per key.
pub async fn check(args: CheckArgs) -> Result<(), String> {
    let gate = Gate::connect(&args.connect).await?;
    let client = gate.gate();
    let batches: BoxStream<'static, Result<Vec<Bytes>, String>> = if args.keys.is_empty() {
        let mut input = source::stdin(args.format)?;
        let size = args.batch as usize;
        Box::pin(async_stream::stream! {
            loop {
                match input.next_batch(size).await {
                    Ok(Some(batch)) => yield Ok(batch.keys),
                    Ok(None) => break,
                    Err(error) => {
                        yield Err(error);
                        break;
                    }
                }
            }
        })
    } else {
        let keys = argument_keys(&args.keys);
        let batches: Vec<_> = keys
            .chunks(args.batch as usize)
            .map(|c| Ok(c.to_vec()))
            .collect();
        Box::pin(futures_util::stream::iter(batches))
    };
    let mut answered = batches
        .map(|keys| lookup(client.clone(), args.namespace.clone(), keys))
        .buffered(CHECK_IN_FLIGHT);
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    while let Some(answered) = answered.next().await {
        let (keys, reply) = answered?;
        print_answers(&mut stdout, &args, &keys, &reply)?;
    }
    stdout.flush().map_err(output::stdout_failed)
}

/// One `BatchMayExist` of `keys` (an error from the input passes through).
async fn lookup(
    mut client: GateClient,
    namespace: String,
    keys: Result<Vec<Bytes>, String>,
) -> Result<(Vec<Bytes>, BatchMayExistResponse), String> {
    let keys = keys?;
    let request = BatchMayExistRequest {
        namespace,
        keys: keys.clone(),
        with_bases: true,
        ..Default::default()
    };
    let reply = client
        .batch_may_exist(request)
        .await
        .map_err(|status| failure::refused("BatchMayExist", &status))?
        .into_inner();
    Ok((keys, reply))
}

/// A line per key of `reply`: `KEY ANSWER BASIS`, or a JSON object.
fn print_answers(
    out: &mut impl Write,
    args: &CheckArgs,
    keys: &[Bytes],
    reply: &BatchMayExistResponse,
) -> Result<(), String> {
    for (i, key) in keys.iter().enumerate() {
        let answer =
            Answer::try_from(reply.answers.get(i).copied().unwrap_or_default()).unwrap_or_default();
        let basis =
            Basis::try_from(reply.bases.get(i).copied().unwrap_or_default()).unwrap_or_default();
        let answer = short_name(answer.as_str_name(), "ANSWER_");
        let basis = short_name(basis.as_str_name(), "BASIS_");
        if args.json {
            let mut object = Map::new();
            insert_key(&mut object, key);
            object.insert("answer".into(), answer.into());
            object.insert("basis".into(), basis.into());
            object.insert("observed_seq".into(), reply.observed_seq.into());
            writeln!(out, "{}", Value::Object(object))
        } else {
            writeln!(out, "{} {answer} {basis}", key_text(key))
        }
        .map_err(output::stdout_failed)?;
    }
    Ok(())
}

/// Adds the keys in one call and prints its seq.
pub async fn add(args: AddArgs) -> Result<(), String> {
    let gate = Gate::connect(&args.connect).await?;
    let keys = argument_keys(&args.keys);
    let count = keys.len();
    let reply = gate
        .gate()
        .add(AddRequest {
            namespace: args.namespace.clone(),
            keys,
            ..Default::default()
        })
        .await
        .map_err(|status| failure::refused("Add", &status))?
        .into_inner();
    if args.json {
        return output::line(
            &json!({
                "namespace": args.namespace,
                "keys": count,
                "seq": reply.seq,
                "tombstones_cleared": reply.tombstones_cleared,
            })
            .to_string(),
        );
    }
    output::line(&format!(
        "added {} to namespace {:?} at seq {} ({} cleared)",
        output::count(count as u64, "key"),
        args.namespace,
        reply.seq,
        output::count(reply.tombstones_cleared.into(), "tombstone")
    ))
}

/// Records the absence and prints the outcome (every outcome is an answer, not a failure: exit 0).
pub async fn absent(args: AbsentArgs) -> Result<(), String> {
    let ttl_seconds = match args.ttl {
        None => 0,
        Some(ttl) => whole_seconds(ttl)?,
    };
    let gate = Gate::connect(&args.connect).await?;
    let key = argument_keys(std::slice::from_ref(&args.key)).remove(0);
    let reply = gate
        .gate()
        .record_absent(RecordAbsentRequest {
            namespace: args.namespace.clone(),
            key: key.clone(),
            kind: if args.deleted {
                AbsenceKind::Deleted
            } else {
                AbsenceKind::Missing
            } as i32,
            observed_seq: args.observed_seq,
            ttl_seconds,
        })
        .await
        .map_err(|status| failure::refused("RecordAbsent", &status))?
        .into_inner();
    let outcome = reply.outcome();
    let name = short_name(outcome.as_str_name(), "RECORD_OUTCOME_");
    if args.json {
        let mut object = Map::new();
        insert_key(&mut object, &key);
        object.insert("outcome".into(), name.into());
        object.insert("seq".into(), reply.seq.into());
        object.insert("expires_in_ms".into(), reply.expires_in_ms.into());
        return output::line(&Value::Object(object).to_string());
    }
    let meaning = match outcome {
        RecordOutcome::Recorded => format!(
            "tombstone stored at seq {}, expires in {:.1} s",
            reply.seq,
            reply.expires_in_ms as f64 / 1000.0
        ),
        RecordOutcome::Redundant => {
            "the filter alone already answers ABSENT for this key; nothing stored".to_string()
        }
        RecordOutcome::Superseded => format!(
            "an Add of this key may have been applied after observed seq {}: the absence may be stale; nothing \
             stored",
            args.observed_seq
        ),
        RecordOutcome::Throttled => {
            "over the namespace's max_tombstone_rate; nothing stored".to_string()
        }
        RecordOutcome::Unspecified => "the gate gave no outcome".to_string(),
    };
    output::line(&format!("{} {name}: {meaning}", key_text(&key)))
}

/// `ttl` in whole seconds, as `ttl_seconds` carries it.
fn whole_seconds(ttl: Duration) -> Result<u32, String> {
    if ttl.subsec_nanos() != 0 || ttl.is_zero() {
        return Err(format!(
            "--ttl {ttl:?}: the gate takes TTLs in whole seconds; write at least 1s, e.g. 60s or 10m"
        ));
    }
    u32::try_from(ttl.as_secs()).map_err(|_| format!("--ttl {ttl:?} is longer than any max_ttl"))
}

/// Keys given on the command line, as bytes (any bytes a Unix argument can hold).
fn argument_keys(keys: &[OsString]) -> Vec<Bytes> {
    use std::os::unix::ffi::OsStrExt;
    keys.iter()
        .map(|key| Bytes::copy_from_slice(key.as_bytes()))
        .collect()
}
