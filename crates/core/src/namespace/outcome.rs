//! What a namespace answers for a write: the outcome types of `Add` and `RecordAbsent`, what applying a
//! mutation did, and why a write is refused.

use std::sync::Arc;

use bytes::Bytes;

use super::*;
use crate::log::LogError;
use crate::tombstones::AbsenceKind;

/// The result of an `Add`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Added {
    /// The seq shared by the call's keys.
    pub seq: u64,
    /// Live tombstones of these keys that were removed.
    pub tombstones_cleared: u32,
    /// When asked for ([`NewKeys::Report`]): the positions, in the call's key order, of the keys that were
    /// new — answered `ABSENT` (by the filter, or a live tombstone) just before this `Add` applied, and not
    /// earlier in it.
    /// Decided where `Add`s are ordered (under the namespace's writer lock, in log order), so of concurrent
    /// `Add`s of one key exactly one finds it new: `BF.ADD`'s 1.
    pub new: Option<Vec<u32>>,
}

/// Whether an `Add` reports which of its keys were new (a filter lookup per key, under the writer lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewKeys {
    /// No: the seq and the tombstones cleared are enough (`Add` over gRPC).
    Skip,
    /// Yes (`BF.ADD`, `BF.MADD`, `BF.INSERT`).
    Report,
}

/// What `RecordAbsent` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordOutcome {
    /// A tombstone was stored or replaced.
    Recorded,
    /// The filter already answers absent: nothing stored.
    Redundant,
    /// The key may have been added after the caller's observation: nothing stored.
    Superseded,
    /// Over the namespace's tombstone rate: nothing stored.
    Throttled,
}

/// The result of a `RecordAbsent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// What was done.
    pub outcome: RecordOutcome,
    /// The tombstone's seq if recorded, else the namespace's latest seq.
    pub seq: u64,
    /// The TTL applied in ms; 0 unless recorded.
    pub expires_in_ms: u64,
}

/// A `RecordAbsent` request, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbsenceReport {
    /// The key.
    pub key: Bytes,
    /// Why it is absent.
    pub kind: AbsenceKind,
    /// The seq of the lookup that sent the caller to the source; 0 = unknown.
    pub observed_seq: u64,
    /// Requested TTL in seconds; 0 = the namespace default for the kind.
    pub ttl_seconds: u32,
}

/// What applying one mutation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// An `Add`'s keys are in the filter; it removed the live tombstones of the keys at `cleared`.
    Added {
        /// The positions, in the `Add`'s key order, of the keys whose live tombstone it removed (empty, and
        /// no allocation, in the common case): positions rather than a count because concurrent `Add`s
        /// can share one message, and each caller is told how many of its own keys it cleared.
        cleared: Vec<u32>,
        /// The positions of the keys that were new, if asked ([`Added::new`]).
        new: Option<Vec<u32>>,
    },
    /// A tombstone is stored.
    Recorded,
    /// A `RecordAbsent` stored nothing: its key may have been added after the answer it observed.
    Superseded,
    /// A logged rebuild began, replacing the open one that began at seq `replaced`, if any.
    RebuildBegun {
        /// The `Begin` seq of the rebuild it replaced.
        replaced: Option<u64>,
    },
    /// A logged rebuild's keys are in its filter.
    RebuildFed,
    /// A logged rebuild's filter is live.
    Rebuilt(Rebuilt),
    /// A logged rebuild was dropped; the live filter stays.
    RebuildAborted,
    /// The step's rebuild is not open (a later `Begin` replaced it, or it ended): it changed nothing.
    RebuildGone,
}

/// Why a namespace refuses a write.
#[derive(Debug)]
pub enum WriteError {
    /// The log could not record it.
    Log(LogError),
    /// A mutation panicked while being applied: see [`WritesStopped`].
    Stopped(WritesStopped),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Log(error) => error.fmt(f),
            Self::Stopped(stopped) => stopped.fmt(f),
        }
    }
}

impl std::error::Error for WriteError {}

impl From<LogError> for WriteError {
    fn from(error: LogError) -> Self {
        Self::Log(error)
    }
}

impl From<WritesStopped> for WriteError {
    fn from(stopped: WritesStopped) -> Self {
        Self::Stopped(stopped)
    }
}

/// A namespace whose writer panicked mid-mutation. Its state may then differ from what replaying the log
/// yields (the mutation was logged, but only part of it applied), and answers built on such a state could be
/// a false "absent" that no restart would reproduce. So it takes no more writes; reads are still answered
/// from what was applied, and a restart rebuilds the state from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WritesStopped(pub Arc<str>);

impl std::fmt::Display for WritesStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "namespace {:?} takes no more writes: applying a mutation failed part-way (a panic), so its \
             state may differ from its log; reads are still answered. Restart the server to rebuild the \
             state from the log",
            self.0
        )
    }
}

impl std::error::Error for WritesStopped {}
