//! The feed's loop: replication events in, gate calls out, and the slot's position confirmed to PostgreSQL
//! only once the gate has acknowledged every change up to it.
//!
//! ```text
//!  Begin ─ XLogData (pgoutput) … ─ Commit(end LSN, time)      KeepAlive(wal end)
//!            │ tables.changes                │                   │ nothing in flight:
//!            ▼                               ▼                   ▼ confirm wal end
//!          batch (commit order) ── flush when ≥ --batch keys, or --linger after a commit
//!            │ Add / RecordAbsent(DELETED), in order, retried while the gate is unavailable
//!            ▼
//!          acknowledged (durable on the gate) ─▶ confirm the last commit's end LSN to the slot
//! ```
//!
//! **Nothing is lost.** PostgreSQL keeps every change after the slot's confirmed position, and the feed
//! confirms a commit's end only after the gate acknowledged (made durable) all its changes, so whatever
//! stops — the feed, the gate, the database — the next session starts from the slot and sends again what
//! was not confirmed. **Repeats are harmless**: they are the same changes in the same order, and `Add` of
//! a key twice leaves what adding it once left; a repeated delete and re-insert ends with the key present.
//!
//! A keepalive's WAL end is confirmed when no transaction is open and nothing waits for the gate, as
//! PostgreSQL's own subscriber does: PostgreSQL 15 skips transactions that touch no published table and
//! sends a keepalive instead, so a feed whose tables are quiet still lets the slot release WAL.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pgwire_replication::{Lsn, ReplicationClient, ReplicationEvent};
use tokio::sync::Notify;
use tonic::Code;

use super::batch::{Batch, Call};
use super::changes::{KeyChange, Tables};
use super::fence::Fences;
use super::metrics::FeedMetrics;
use super::pgoutput;
use crate::client::connection::GateClient;
use crate::client::failure;
use crate::proto::{AbsenceKind, AddRequest, RecordAbsentRequest};

/// Unix seconds of PostgreSQL's epoch (2000-01-01), which commit times count from.
const PG_EPOCH_UNIX_SECS: u64 = 946_684_800;
/// The first pause before calling an unavailable gate again; doubled up to `MAX_RETRY_PAUSE`.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(50);
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(2);

/// Why following stopped.
#[derive(Debug)]
pub enum Stop {
    /// The replication session failed or ended: connect again (nothing unconfirmed was lost).
    Session(String),
    /// The slot is gone (dropped or invalidated): what it held is lost, and only `--recreate-slot` or the
    /// operator can make the gate complete again.
    SlotLost(String),
    /// The slot was consumed by another client (its confirmed position moved without this feed): the
    /// changes it skipped are lost for the feed, as with a lost slot.
    SlotConsumed(String),
    /// Something only the operator can fix (a table without its column, a token the gate refuses).
    Fatal(String),
}

/// One replication session's follower.
pub struct Follower<'a> {
    /// Where the changes go.
    pub writer: &'a GateWriter,
    /// The followed tables.
    pub tables: &'a mut Tables,
    /// Keys per flush (and per `Add`).
    pub batch_keys: usize,
    /// How long committed changes may wait for more before they are sent.
    pub linger: Duration,
    /// The slot, whose fences this feed's deletes carry.
    pub slot: &'a str,
    /// Asks the fencer for a fence now.
    pub fence_wanted: &'a Notify,
    /// Where this feed left the slot: where it started following, then what it confirmed (0: not known).
    pub confirmed: &'a AtomicU64,
}

/// Sends calls to the gate, retrying while it is unavailable (cheap to clone: one connection shared).
#[derive(Clone)]
pub struct GateWriter {
    /// The gate.
    pub gate: GateClient,
    /// The feed's metrics.
    pub metrics: FeedMetrics,
}

/// What the batch waiting to be sent covers.
#[derive(Default)]
struct Covered {
    /// The end LSN of the last commit whose changes are all in the batch (or already sent).
    commit_end: Option<Lsn>,
    /// The commit times of the transactions in it (µs since PostgreSQL's epoch), for the lag.
    commit_times: Vec<i64>,
}

impl Follower<'_> {
    /// Follows `session` until it fails or ends.
    pub async fn follow(&mut self, session: &mut ReplicationClient) -> Stop {
        let mut batch = Batch::new(self.batch_keys);
        // Only this session's fences: one seen before a reconnect may lie after changes it replays.
        let mut fences = Fences::new(self.slot);
        self.fence_wanted.notify_one();
        let mut covered = Covered::default();
        let mut in_transaction = false;
        let mut flush_at: Option<tokio::time::Instant> = None;
        loop {
            let event = match flush_at {
                Some(deadline) => match tokio::time::timeout_at(deadline, session.recv()).await {
                    Ok(event) => event,
                    Err(_) => {
                        flush_at = None;
                        if let Err(stop) = self.flush(&mut batch, &mut covered, session).await {
                            return stop;
                        }
                        continue;
                    }
                },
                None => session.recv().await,
            };
            let event = match event {
                Ok(Some(event)) => event,
                Ok(None) => return Stop::Session("the replication stream ended".to_string()),
                Err(error) => return Stop::Session(error.to_string()),
            };
            match event {
                ReplicationEvent::Begin { .. } => in_transaction = true,
                ReplicationEvent::XLogData { data, .. } => {
                    let message = match pgoutput::decode(&data) {
                        Ok(message) => message,
                        Err(malformed) => return Stop::Session(malformed.to_string()),
                    };
                    let changes = match self.tables.changes(message) {
                        Ok(changes) => changes,
                        Err(reason) => return Stop::Fatal(reason),
                    };
                    for change in changes {
                        self.writer.metrics.note(&change);
                        self.take(change, &mut batch, &fences);
                    }
                    if batch.keys() >= self.batch_keys {
                        if let Err(stop) = self.flush(&mut batch, &mut covered, session).await {
                            return stop;
                        }
                    }
                }
                ReplicationEvent::Commit {
                    end_lsn,
                    commit_time_micros,
                    ..
                } => {
                    in_transaction = false;
                    covered.commit_end = Some(end_lsn);
                    covered.commit_times.push(commit_time_micros);
                    flush_at.get_or_insert_with(|| tokio::time::Instant::now() + self.linger);
                }
                ReplicationEvent::KeepAlive { wal_end, .. } => {
                    if !in_transaction && flush_at.is_none() && batch.keys() == 0 {
                        self.confirm(session, wal_end);
                    }
                }
                ReplicationEvent::Message {
                    prefix, content, ..
                } => {
                    if let Err(reason) = fences.observe(&prefix, &content) {
                        return Stop::Fatal(reason);
                    }
                }
                ReplicationEvent::StoppedAt { .. } => {}
            }
        }
    }

    /// Puts one change into the batch: a delete with the seq of the newest fence before it, or, with none
    /// yet in this session, not at all (counted; a fence is asked for) — a tombstone that cannot be fenced
    /// could hide a key added again after the delete.
    fn take(&self, change: KeyChange, batch: &mut Batch, fences: &Fences) {
        match change {
            KeyChange::Exists { namespace, key } => batch.exists(namespace, key),
            KeyChange::Deleted { namespace, key } => match fences.seq(&namespace) {
                Some(observed_seq) => batch.deleted(namespace, key, observed_seq),
                None => {
                    self.writer.metrics.unfenced_delete();
                    self.fence_wanted.notify_one();
                }
            },
            KeyChange::Truncated { .. } | KeyChange::NoKey { .. } => {}
        }
    }

    /// Sends the batch, then confirms the last commit it covers.
    async fn flush(
        &self,
        batch: &mut Batch,
        covered: &mut Covered,
        session: &ReplicationClient,
    ) -> Result<(), Stop> {
        let mut added = false;
        for call in batch.take() {
            added |= matches!(call, Call::Add { .. });
            self.writer.send(call).await?;
        }
        if added {
            // A fresh fence soon, so a key deleted right after this insert keeps its tombstone.
            self.fence_wanted.notify_one();
        }
        let acknowledged = SystemTime::now();
        for micros in covered.commit_times.drain(..) {
            self.writer.metrics.lag(lag(micros, acknowledged));
        }
        if let Some(lsn) = covered.commit_end.take() {
            self.confirm(session, lsn);
        }
        Ok(())
    }

    fn confirm(&self, session: &ReplicationClient, lsn: Lsn) {
        session.update_applied_lsn(lsn);
        self.confirmed.store(lsn.as_u64(), Ordering::Relaxed);
        self.writer.metrics.confirmed(lsn.as_u64());
    }
}

impl GateWriter {
    /// One call, retried for as long as the gate is unavailable (restarting, or a replica without NATS):
    /// nothing after it is confirmed meanwhile, so waiting loses nothing.
    pub async fn send(&self, call: Call) -> Result<(), Stop> {
        let mut pause = FIRST_RETRY_PAUSE;
        loop {
            let status = match self.call(&call).await {
                Ok(()) => return Ok(()),
                Err(status) => status,
            };
            match status.code() {
                Code::Unavailable
                | Code::DeadlineExceeded
                | Code::ResourceExhausted
                | Code::Aborted
                | Code::Unknown
                | Code::Internal
                | Code::Cancelled => {
                    self.metrics.gate_retry();
                    tracing::warn!(code = ?status.code(), message = status.message(), ?pause, "the gate refused a call; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_RETRY_PAUSE);
                }
                Code::InvalidArgument => return self.one_by_one(call).await,
                _ => return Err(Stop::Fatal(failure::refused("a feed call", &status))),
            }
        }
    }

    /// A call the gate refused as invalid, key by key: the keys it refuses (longer than its limit, say) can
    /// never be looked up either, so skipping them answers no lookup wrongly.
    async fn one_by_one(&self, call: Call) -> Result<(), Stop> {
        let singles: Vec<Call> = match call {
            Call::Add { namespace, keys } => keys
                .into_iter()
                .map(|key| Call::Add {
                    namespace: namespace.clone(),
                    keys: vec![key],
                })
                .collect(),
            deleted @ Call::Deleted { .. } => vec![deleted],
        };
        for single in singles {
            match self.call(&single).await {
                Err(status) if status.code() == Code::InvalidArgument => {
                    self.metrics.refused_key();
                    tracing::error!(
                        message = status.message(),
                        "the gate refused a key; skipped"
                    );
                }
                Err(_) => Box::pin(self.send(single)).await?,
                Ok(()) => {}
            }
        }
        Ok(())
    }

    /// Checks that the gate takes writes to `namespace` with this token, before anything is followed: an
    /// `Add` of no keys is refused for the token or the namespace first (`UNAUTHENTICATED`,
    /// `PERMISSION_DENIED`, `NOT_FOUND`) and otherwise as empty (`INVALID_ARGUMENT`), changing nothing.
    pub async fn check_writable(&self, namespace: &str) -> Result<(), String> {
        let probe = AddRequest {
            namespace: namespace.to_string(),
            keys: Vec::new(),
            ..Default::default()
        };
        match self.gate.clone().add(probe).await {
            Err(status) if status.code() == Code::InvalidArgument => Ok(()),
            Err(status) => Err(failure::refused("Add", &status)),
            Ok(_) => Ok(()),
        }
    }

    /// One attempt at `call`.
    async fn call(&self, call: &Call) -> Result<(), tonic::Status> {
        let mut gate = self.gate.clone();
        match call {
            Call::Add { namespace, keys } => {
                let request = AddRequest {
                    namespace: namespace.clone(),
                    keys: keys.clone(),
                    ..Default::default()
                };
                gate.add(request).await?;
            }
            Call::Deleted {
                namespace,
                key,
                observed_seq,
            } => {
                let request = RecordAbsentRequest {
                    namespace: namespace.clone(),
                    key: key.clone(),
                    kind: AbsenceKind::Deleted as i32,
                    observed_seq: *observed_seq,
                    ttl_seconds: 0,
                };
                gate.record_absent(request).await?;
            }
        }
        self.metrics.sent(call);
        Ok(())
    }
}

/// How long ago a commit at `micros` (since PostgreSQL's epoch) was, at `now`.
fn lag(micros: i64, now: SystemTime) -> Duration {
    let committed = UNIX_EPOCH
        + Duration::from_secs(PG_EPOCH_UNIX_SECS)
        + Duration::from_micros(micros.max(0) as u64);
    now.duration_since(committed).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_times_count_from_2000() {
        let now = UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECS + 10);
        assert_eq!(lag(7_500_000, now), Duration::from_millis(2_500));
        assert_eq!(
            lag(20_000_000, now),
            Duration::ZERO,
            "a commit from the future"
        );
    }
}
