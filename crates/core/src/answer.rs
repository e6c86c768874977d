//! What a look-up answers and what a namespace reports: the values the core hands out and metrics counts.
//! A leaf, so that metrics and the namespace both depend on it rather than on each other.

use std::sync::Arc;

use crate::filter::FilterStats;

/// The answer to "can this key exist?".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// Definitely absent: skip the source.
    Absent,
    /// May exist: ask the source.
    MayExist,
}

/// What an answer rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Basis {
    /// The Bloom filter of added keys.
    Filter,
    /// A live tombstone.
    Tombstone,
    /// The gate is still loading and fails open.
    Warming,
}

/// An answer with its basis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lookup {
    /// The answer.
    pub answer: Answer,
    /// Its basis.
    pub basis: Basis,
}

impl Lookup {
    /// The fail-open answer given while warming.
    pub const WARMING: Lookup = Lookup {
        answer: Answer::MayExist,
        basis: Basis::Warming,
    };

    /// The answer for a key: a live tombstone (`tombstoned`) answers first; otherwise the filter
    /// (`in_filter`, asked only if needed) decides.
    #[inline]
    pub(crate) fn of(tombstoned: bool, in_filter: impl FnOnce() -> bool) -> Lookup {
        if tombstoned {
            Lookup {
                answer: Answer::Absent,
                basis: Basis::Tombstone,
            }
        } else {
            Lookup {
                answer: if in_filter() {
                    Answer::MayExist
                } else {
                    Answer::Absent
                },
                basis: Basis::Filter,
            }
        }
    }
}

/// Figures for stats and metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct NamespaceStats {
    /// Canonical name.
    pub name: Arc<str>,
    /// Latest applied seq.
    pub seq: u64,
    /// Keys passed to `Add` since start.
    pub keys_added: u64,
    /// The filter's figures.
    pub filter: FilterStats,
    /// Stored tombstones.
    pub tombstones: u64,
    /// Bytes of the tombstone tables.
    pub tombstone_bytes: u64,
    /// Bytes of recent invalidations kept for resuming subscribers.
    pub replay_buffer_bytes: usize,
    /// Bytes of the memory of recent adds (fixed per namespace; see [`crate::recent_adds`]).
    pub recent_adds_bytes: usize,
    /// Open subscriptions.
    pub subscribers: usize,
}

/// A namespace's [`state_digest`](crate::namespace::Namespace::state_digest) and the seq it was taken at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateDigest {
    /// The latest applied seq when it was taken.
    pub seq: u64,
    /// The hash of the state.
    pub digest: u64,
}

/// What `Stats` learns by reading a namespace's whole state (milliseconds per 16 MB of filter, so never on a
/// request thread).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scan {
    /// Fraction of live filter bits set.
    pub fill_ratio: f64,
    /// The state digest, unless the namespace's writes were stopped (its state may then be half-applied).
    pub digest: Option<StateDigest>,
}
