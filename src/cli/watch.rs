//! `watch`: a namespace's invalidations as JSON lines, for looking at what subscribers get and for piping into
//! other tools. It runs until interrupted; Ctrl-C is how it is meant to end, so it exits 0.

use clap::Args;
use serde_json::{json, Value};

use crate::cli::output::{self, short_name};
use crate::client::connection::{ConnectArgs, Gate};
use crate::client::failure;
use crate::proto::{Invalidation, SubscribeInvalidationsRequest};

/// `watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// The namespace to watch.
    #[arg(long, short, default_value = "default")]
    pub namespace: String,
    /// Resume after this seq (the last one seen); 0 starts from now on.
    #[arg(long, default_value_t = 0)]
    pub after_seq: u64,
}

/// Prints each invalidation as a JSON line until Ctrl-C, or until the gate ends the stream (an error).
pub async fn watch(args: WatchArgs) -> Result<(), String> {
    let gate = Gate::connect(&args.connect).await?;
    // Installed now, before anything is printed: from the first line on, Ctrl-C ends the watch cleanly.
    let mut interrupted = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| format!("cannot listen for Ctrl-C: {e}"))?;
    let mut stream = gate
        .gate()
        .subscribe_invalidations(SubscribeInvalidationsRequest {
            namespace: args.namespace.clone(),
            after_seq: args.after_seq,
        })
        .await
        .map_err(|status| failure::refused("SubscribeInvalidations", &status))?
        .into_inner();
    // The gate registers a subscription before it answers with headers, so from here on nothing is missed:
    // say so, for whoever waits to make changes until the watch is in place.
    eprintln!(
        "watching namespace {:?} after seq {}; Ctrl-C to stop",
        args.namespace, args.after_seq
    );
    loop {
        tokio::select! {
            _ = interrupted.recv() => return Ok(()),
            message = stream.message() => match message {
                Ok(Some(invalidation)) => output::line(&as_json(&invalidation).to_string())?,
                Ok(None) => return Err("the gate ended the subscription".to_string()),
                Err(status) => {
                    return Err(format!(
                        "{}; resume with --after-seq set to the last seq printed",
                        failure::refused("SubscribeInvalidations", &status)
                    ))
                }
            },
        }
    }
}

/// `{"namespace":…,"seq":…,"cause":"ADDED","keys":[…]}`; keys that are not all UTF-8 come as `keys_hex`.
fn as_json(invalidation: &Invalidation) -> Value {
    let mut object = json!({
        "namespace": invalidation.namespace,
        "seq": invalidation.seq,
        "cause": short_name(invalidation.cause().as_str_name(), "INVALIDATION_CAUSE_"),
    });
    let text: Option<Vec<&str>> = invalidation
        .keys
        .iter()
        .map(|key| std::str::from_utf8(key).ok())
        .collect();
    match text {
        Some(text) => object["keys"] = json!(text),
        None => {
            let hexed: Vec<String> = invalidation.keys.iter().map(hex::encode).collect();
            object["keys_hex"] = json!(hexed);
        }
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::InvalidationCause;
    use bytes::Bytes;

    #[test]
    fn invalidations_print_as_one_json_object() {
        let mut invalidation = Invalidation {
            namespace: "users".into(),
            keys: vec![Bytes::from_static(b"u1")],
            seq: 7,
            cause: InvalidationCause::Added as i32,
        };
        assert_eq!(
            as_json(&invalidation).to_string(),
            r#"{"cause":"ADDED","keys":["u1"],"namespace":"users","seq":7}"#
        );
        invalidation.keys.push(Bytes::from_static(&[0xff]));
        assert_eq!(as_json(&invalidation)["keys_hex"], json!(["7531", "ff"]));
    }
}
