//! Counters every language's client keeps (`clients/README.md`): plain atomics, read as a [`Stats`]
//! snapshot, so any metrics system can export them without the client depending on one.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of the counters; each only ever grows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Single-key lookups asked of the client.
    pub lookups: u64,
    /// Lookup RPCs sent (`MayExist` or `BatchMayExist`).
    pub gate_calls: u64,
    /// Keys sent in coalesced batches (`batched_keys / gate_calls` is the mean batch size).
    pub batched_keys: u64,
    /// Calls retried on another address.
    pub retries: u64,
    /// `get`s answered by the local absence cache.
    pub cache_hits: u64,
    /// `get`s that read the source because the gate failed.
    pub fail_opens: u64,
    /// Source reads (after single flight).
    pub source_reads: u64,
    /// `RecordAbsent` calls answered `RECORDED`.
    pub absences_recorded: u64,
    /// `ADDED` keys applied to the local cache, plus one per `RESYNC`.
    pub invalidations: u64,
    /// Subscriptions reopened.
    pub resubscribes: u64,
    /// Lookups a mirror answered `ABSENT` with no call (also counted in `lookups`).
    pub mirror_answers: u64,
    /// Mirror streams that ended (each then attaches again).
    pub mirror_attaches: u64,
}

/// The live counters behind [`Stats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub lookups: AtomicU64,
    pub gate_calls: AtomicU64,
    pub batched_keys: AtomicU64,
    pub retries: AtomicU64,
    pub cache_hits: AtomicU64,
    pub fail_opens: AtomicU64,
    pub source_reads: AtomicU64,
    pub absences_recorded: AtomicU64,
    pub invalidations: AtomicU64,
    pub resubscribes: AtomicU64,
    pub mirror_answers: AtomicU64,
    pub mirror_attaches: AtomicU64,
}

/// Adds `n` to `counter`.
pub(crate) fn count(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}

impl Counters {
    pub fn snapshot(&self) -> Stats {
        Stats {
            lookups: self.lookups.load(Relaxed),
            gate_calls: self.gate_calls.load(Relaxed),
            batched_keys: self.batched_keys.load(Relaxed),
            retries: self.retries.load(Relaxed),
            cache_hits: self.cache_hits.load(Relaxed),
            fail_opens: self.fail_opens.load(Relaxed),
            source_reads: self.source_reads.load(Relaxed),
            absences_recorded: self.absences_recorded.load(Relaxed),
            invalidations: self.invalidations.load(Relaxed),
            resubscribes: self.resubscribes.load(Relaxed),
            mirror_answers: self.mirror_answers.load(Relaxed),
            mirror_attaches: self.mirror_attaches.load(Relaxed),
        }
    }
}
