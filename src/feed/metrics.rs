//! The feed's metrics, on its own `/metrics`.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

use super::batch::Call;
use super::changes::KeyChange;

/// Seconds from a commit to the gate's acknowledgement of its changes (its buckets, milliseconds to
/// minutes, are set where the recorder is installed: every `*lag_seconds` histogram).
const LAG: &str = "existence_feed_lag_seconds";

/// Where the feed records what it did.
#[derive(Debug, Default, Clone, Copy)]
pub struct FeedMetrics;

impl FeedMetrics {
    /// A change that is not a call: a truncate (the operator must rebuild) or a row without its key.
    pub fn note(&self, change: &KeyChange) {
        match change {
            KeyChange::Truncated { table } => {
                tracing::warn!(
                    %table,
                    "table truncated: its keys are still in the gate; rebuild the namespace from the \
                     table (`existence-gate rebuild --postgres ...`)"
                );
                counter!("existence_feed_truncates_total", "table" => table.clone()).increment(1);
            }
            KeyChange::NoKey { table, operation } => {
                tracing::warn!(
                    %table,
                    operation,
                    "a change without its key column (NULL, or outside the replica identity): skipped"
                );
                counter!("existence_feed_keyless_rows_total", "table" => table.clone(), "operation" => *operation)
                    .increment(1);
            }
            KeyChange::Exists { .. } | KeyChange::Deleted { .. } => {}
        }
    }

    /// A call the gate acknowledged.
    pub fn sent(&self, call: &Call) {
        let (kind, keys) = match call {
            Call::Add { keys, .. } => ("add", keys.len()),
            Call::Deleted { .. } => ("deleted", 1),
        };
        counter!("existence_feed_calls_total", "call" => kind).increment(1);
        counter!("existence_feed_keys_total", "call" => kind).increment(keys as u64);
    }

    /// A commit's changes acknowledged by the gate this long after the commit.
    pub fn lag(&self, lag: Duration) {
        histogram!(LAG).record(lag.as_secs_f64());
    }

    /// The position confirmed to the slot.
    pub fn confirmed(&self, lsn: u64) {
        gauge!("existence_feed_confirmed_lsn").set(lsn as f64);
    }

    /// A call retried because the gate was unavailable.
    pub fn gate_retry(&self) {
        counter!("existence_feed_gate_retries_total").increment(1);
    }

    /// Whether the replication slot is gone (1 until a session follows it again).
    pub fn slot_lost(&self, lost: bool) {
        gauge!("existence_feed_slot_lost").set(if lost { 1.0 } else { 0.0 });
    }

    /// A delete not sent: no fence came before it in its session (see `fence`).
    pub fn unfenced_delete(&self) {
        counter!("existence_feed_unfenced_deletes_total").increment(1);
    }

    /// A key the gate refused as invalid (skipped).
    pub fn refused_key(&self) {
        counter!("existence_feed_refused_keys_total").increment(1);
    }

    /// Whether a replication session is running.
    pub fn connected(&self, connected: bool) {
        gauge!("existence_feed_connected").set(if connected { 1.0 } else { 0.0 });
    }

    /// WAL the slot holds back, in bytes.
    pub fn retained(&self, bytes: u64) {
        gauge!("existence_feed_slot_retained_wal_bytes").set(bytes as f64);
    }
}
