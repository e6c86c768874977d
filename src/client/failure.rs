//! Failures as the one line a command prints before exiting non-zero: the gRPC code as the spec names it,
//! the gate's own message, and what the operator can change. The gate's messages already name the limit or
//! the namespace; what they cannot know is which flag of this command to change.

use std::error::Error;

use tonic::{Code, Status};

use crate::proto::code_name;

/// `error` and every error beneath it, joined with ": ", repeated texts once: tonic's transport errors say
/// "transport error" on top and the useful part ("Connection refused") several sources down.
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(error) = next {
        let text = error.to_string();
        if !text.is_empty() && !parts.iter().any(|seen| seen.contains(&text)) {
            parts.push(text);
        }
        next = error.source();
    }
    parts.join(": ")
}

/// The gate at `uri` could not be reached.
pub fn unreachable(uri: &str, error: &(dyn Error + 'static)) -> String {
    format!(
        "cannot connect to {uri}: {}; is the gate running, and is --addr right?",
        chain(error)
    )
}

/// The gate refused (or never answered) `call` with `status`.
pub fn refused(call: &str, status: &Status) -> String {
    let mut message = status.message().to_string();
    if let Some(source) = status.source() {
        let below = chain(source);
        if !message.contains(&below) {
            message = format!("{message}: {below}");
        }
    }
    let hint = match status.code() {
        Code::Unauthenticated => {
            "pass a token the gate knows with --token or EXISTENCE_GATE_TOKEN (its sha256 must be in the \
             gate's [[tokens]])"
        }
        Code::PermissionDenied => {
            "use a token whose [[tokens]] entry grants the role on that namespace (check and watch need read; \
             add, absent and load need write; stats, rebuild and snapshot need admin)"
        }
        Code::NotFound => {
            "check --namespace: names are case-sensitive, and `existence-gate stats` lists the gate's namespaces"
        }
        Code::InvalidArgument if message.contains("max_batch_keys") => {
            "lower --batch to the gate's max_batch_keys"
        }
        Code::ResourceExhausted if message.contains("message length too large") => {
            "lower --batch: the batch is larger than the gate's --max-message-bytes"
        }
        Code::ResourceExhausted => "the gate is at its limit: retry later, or with fewer --in-flight",
        Code::Unavailable => {
            "the gate is loading, shutting down or refusing writes (its /readyz says why), or the \
             connection broke: retry, or use another replica"
        }
        Code::DeadlineExceeded => "the gate did not answer in time: retry",
        _ => "",
    };
    let mut line = format!("{call} failed: {}: {message}", code_name(status.code()));
    if !hint.is_empty() {
        line.push_str("; ");
        line.push_str(hint);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_code_the_message_and_the_fix() {
        let line = refused("Add", &Status::unauthenticated("unknown token"));
        assert!(
            line.starts_with("Add failed: UNAUTHENTICATED: unknown token; pass a token"),
            "{line}"
        );
        let line = refused(
            "Add",
            &Status::invalid_argument(
                "the request has 20000 keys; the limit is max_batch_keys = 10000",
            ),
        );
        assert!(
            line.ends_with("lower --batch to the gate's max_batch_keys"),
            "{line}"
        );
        assert_eq!(
            refused("Stats", &Status::internal("boom")),
            "Stats failed: INTERNAL: boom"
        );
    }

    #[test]
    fn a_chain_keeps_each_text_once() {
        let inner = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let outer = std::io::Error::other(inner);
        assert_eq!(chain(&outer), "refused");
    }
}
