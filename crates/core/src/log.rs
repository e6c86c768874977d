//! The ordered log of mutations that feeds the core.
//!
//! Every change to what `MayExist` can answer is a [`Mutation`] with its namespace's next seq and absolute
//! times (when it was added; when a tombstone expires), decided before it is logged — TTL jitter included —
//! so that applying the same mutations in the same order always yields the same answers. The gate appends a
//! mutation to its [`Log`] and only then applies it; a log that persists (a write-ahead file) or distributes
//! (a replicated stream) plugs in here without the core changing.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::keys::PackedKeys;
use crate::tombstones::AbsenceKind;

/// The seq of every namespace before its first mutation. Seqs count from 1, not 0, so that every
/// `observed_seq` an answer carries differs from 0, which in a request means "not observed": a client that
/// looked a key up in a namespace no one had written yet still gets `SUPERSEDED` if the key is added before
/// its `RecordAbsent`.
pub const GENESIS_SEQ: u64 = 1;

/// One state change of one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    /// Keys that exist.
    Add {
        /// Canonical namespace name.
        namespace: Arc<str>,
        /// The seq all these keys share.
        seq: u64,
        /// Unix ms when the keys were added: picks their window.
        at_ms: u64,
        /// The keys, packed: the invalidation subscribers receive is these same bytes, and a replica
        /// decoding 1,000 keys makes two allocations instead of a `Bytes` (and its reference count) per key.
        keys: PackedKeys,
    },
    /// A tombstone for a key the source says does not exist.
    RecordAbsent {
        /// Canonical namespace name.
        namespace: Arc<str>,
        /// The tombstone's seq.
        seq: u64,
        /// Unix ms when it was recorded.
        at_ms: u64,
        /// The key.
        key: Bytes,
        /// Why it is absent.
        kind: AbsenceKind,
        /// Unix ms at which it stops answering (TTL and jitter already applied).
        expires_at_ms: u64,
        /// The seq of the answer that sent the reporter to the source; 0 = not observed. Applying the
        /// mutation stores nothing if the key may have been added after it (`SUPERSEDED`): decided when
        /// applied, in log order, so every replica of one stream decides alike.
        observed_seq: u64,
    },
    /// A step of a filter rebuild carried by a log that several replicas apply, so that each builds the same
    /// filter beside its live one and swaps it in at the same point of the log. (A single node's rebuild
    /// is not logged: it fills its filter in memory and takes a snapshot when it swaps.)
    Rebuild {
        /// Canonical namespace name.
        namespace: Arc<str>,
        /// The step's seq.
        seq: u64,
        /// Unix ms when the step was taken: picks the window of the keys it carries.
        at_ms: u64,
        /// What it does.
        step: RebuildStep,
    },
}

/// A step of a logged rebuild. A rebuild is named by the seq of its `Begin`; a later `Begin` of the same
/// namespace replaces an open one, whose remaining steps then change nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebuildStep {
    /// Start an empty filter beside the live one; `Add`s applied from here on go to both.
    Begin,
    /// Keys that exist, for the rebuild that began at `began`.
    Keys {
        /// The seq of the rebuild's `Begin`.
        began: u64,
        /// The keys.
        keys: Vec<Bytes>,
    },
    /// Swap the rebuilt filter in.
    Commit {
        /// The seq of the rebuild's `Begin`.
        began: u64,
    },
    /// Drop the rebuilt filter: the live one stays.
    Abort {
        /// The seq of the rebuild's `Begin`.
        began: u64,
    },
}

impl Mutation {
    /// The namespace it changes.
    pub fn namespace(&self) -> &str {
        match self {
            Self::Add { namespace, .. }
            | Self::RecordAbsent { namespace, .. }
            | Self::Rebuild { namespace, .. } => namespace,
        }
    }

    /// Its seq.
    pub fn seq(&self) -> u64 {
        match self {
            Self::Add { seq, .. } | Self::RecordAbsent { seq, .. } | Self::Rebuild { seq, .. } => {
                *seq
            }
        }
    }

    /// The same mutation with times no single clock decides, for a log whose leader stamped it
    /// `stored_at_ms` when it stored it (a replicated stream: every replica reads the same stamp, so every
    /// replica applies the same times).
    ///
    /// Its writer stamped it on its own clock; either clock may have been stepped, and nothing tells which.
    /// So each time is taken from the clock that errs the safe way:
    /// - an `Add`'s (and a rebuild step's) keys go to the window of the **later** of the two: a key then
    ///   lives longer, never shorter. (An insert never expires a window, however far ahead its time:
    ///   [`WindowedFilter`](crate::filter::windowed::WindowedFilter) leaves that to the reader's time.)
    /// - a tombstone counts its TTL from the **earlier** of the two: it then stops answering `ABSENT` sooner,
    ///   never later.
    ///
    /// One host's clock stepped by hours therefore changes neither when a key expires nor how long a
    /// tombstone answers; both clocks wrong the same way is outside the fault model (a minority of hosts).
    pub fn agreed(mut self, stored_at_ms: u64) -> Self {
        match &mut self {
            Self::Add { at_ms, .. } | Self::Rebuild { at_ms, .. } => {
                *at_ms = (*at_ms).max(stored_at_ms)
            }
            Self::RecordAbsent {
                at_ms,
                expires_at_ms,
                ..
            } => {
                let earlier = (*at_ms).min(stored_at_ms);
                *expires_at_ms = earlier.saturating_add(expires_at_ms.saturating_sub(*at_ms));
                *at_ms = earlier;
            }
        }
        self
    }

    /// The same mutation with its seq `by` higher: for logs written when seqs counted from another origin.
    pub fn shift_seq(self, by: u64) -> Self {
        let seq = self.seq() + by;
        self.with_seq(seq)
    }

    /// The same mutation at `seq`: for a log that assigns seqs itself (a stream's sequence numbers).
    pub fn with_seq(mut self, new: u64) -> Self {
        match &mut self {
            Self::Add { seq, .. } | Self::RecordAbsent { seq, .. } | Self::Rebuild { seq, .. } => {
                *seq = new
            }
        }
        self
    }
}

/// A log write that failed: the mutation was not applied and the caller must be told.
#[derive(Debug)]
pub struct LogError(pub std::io::Error);

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "log write failed: {}", self.0)
    }
}

impl std::error::Error for LogError {}

/// A position in the log, returned by [`Log::append`] and waited on by [`Log::commit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Ticket(pub u64);

/// Where mutations are recorded.
///
/// Writing is split in two so that concurrent writers can share one fsync (group commit): `append` orders
/// the mutation (the gate calls it under the namespace's writer lock, so appends of one namespace arrive in
/// seq order, and applies the mutation only if it succeeds); `commit` waits, without any lock held, until
/// the mutation is as durable as the log promises — the caller is answered only after that.
pub trait Log: Send + Sync + 'static {
    /// Orders `mutation` after every earlier append.
    fn append(&self, mutation: &Mutation) -> Result<Ticket, LogError>;
    /// Waits until the mutation behind `ticket` is durable.
    fn commit(&self, ticket: Ticket) -> Result<(), LogError>;
    /// Why appends are refused now, if they are (a failed disk, a full one): readiness reports it.
    fn write_failure(&self) -> Option<String> {
        None
    }
    /// Whether `commit` can wait (for a disk, another writer's fsync, a network): callers must then not run
    /// it on a thread that serves other requests. Only a log that never waits says no.
    fn commit_may_wait(&self) -> bool {
        true
    }
    /// Whether [`committed`](Self::committed) waits without a thread. A log that can wake its waiters
    /// itself spares every write a hand-off to a thread that may block (and the wake-ups of all of them
    /// when one group write lands); callers check this before they append.
    fn commits_without_thread(&self) -> bool {
        false
    }
    /// [`commit`](Self::commit) as a future, for a log that
    /// [`commits_without_thread`](Self::commits_without_thread); any other log waits in `commit` on the
    /// thread that polls it.
    fn committed(&self, ticket: Ticket) -> Committed {
        let committed = self.commit(ticket);
        Box::pin(std::future::ready(committed))
    }
}

/// A wait until a ticket is durable ([`Log::committed`]).
pub type Committed =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), LogError>> + Send>>;

/// The log of a gate that keeps its state in memory only: nothing survives a restart, so it records nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct VolatileLog;

impl Log for VolatileLog {
    fn append(&self, _mutation: &Mutation) -> Result<Ticket, LogError> {
        Ok(Ticket::default())
    }

    fn commit(&self, _ticket: Ticket) -> Result<(), LogError> {
        Ok(())
    }

    fn commit_may_wait(&self) -> bool {
        false
    }
}

/// A log held in memory in full: for replaying a gate's history into another (tests of determinism).
#[derive(Debug, Default)]
pub struct MemoryLog {
    mutations: Mutex<Vec<Mutation>>,
}

impl MemoryLog {
    /// Every mutation appended so far, in order.
    pub fn mutations(&self) -> Vec<Mutation> {
        self.mutations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Log for MemoryLog {
    fn append(&self, mutation: &Mutation) -> Result<Ticket, LogError> {
        let mut mutations = self.mutations.lock().unwrap_or_else(|e| e.into_inner());
        mutations.push(mutation.clone());
        Ok(Ticket(mutations.len() as u64))
    }

    fn commit(&self, _ticket: Ticket) -> Result<(), LogError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    fn add(at_ms: u64) -> Mutation {
        Mutation::Add {
            namespace: "n".into(),
            seq: 7,
            at_ms,
            keys: PackedKeys::from(vec![Bytes::from_static(b"k")]),
        }
    }

    fn absence(at_ms: u64, ttl_ms: u64) -> Mutation {
        Mutation::RecordAbsent {
            namespace: "n".into(),
            seq: 7,
            at_ms,
            key: Bytes::from_static(b"k"),
            kind: AbsenceKind::Missing,
            expires_at_ms: at_ms + ttl_ms,
            observed_seq: 0,
        }
    }

    #[test]
    fn an_add_takes_the_later_clock_and_a_tombstone_the_earlier() {
        let now = 1_000 * HOUR;
        // Writer two hours ahead, or the leader two hours ahead: the key's window is the later one.
        assert_eq!(add(now + 2 * HOUR).agreed(now), add(now + 2 * HOUR));
        assert_eq!(add(now).agreed(now + 2 * HOUR), add(now + 2 * HOUR));
        // Writer two hours behind: the leader's time.
        assert_eq!(add(now - 2 * HOUR).agreed(now), add(now));
        // A tombstone of 60 s from a writer two hours ahead lives 60 s from the leader's time.
        assert_eq!(
            absence(now + 2 * HOUR, 60_000).agreed(now),
            absence(now, 60_000)
        );
        // From a writer two hours behind: 60 s from its own time, so it has expired already.
        assert_eq!(
            absence(now - 2 * HOUR, 60_000).agreed(now),
            absence(now - 2 * HOUR, 60_000)
        );
    }
}
