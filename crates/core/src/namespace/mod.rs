//! One namespace: its filter, tombstones, seq and invalidations — the deterministic state machine the log
//! feeds, and the decisions (`REDUNDANT`, `SUPERSEDED`, `THROTTLED`, TTL and jitter) that turn a request into a
//! mutation.
//!
//! Reads never take the writer lock: the filter is lock-free, tombstones take a shard read lock. Writes
//! (`Add`, stored tombstones) are serialised by the writer lock, which makes seq order, log order and apply
//! order the same.
//!
//! ```text
//!  mod.rs      the namespace's state and its reads (lookups, stats, subscriptions)
//!  decide.rs   what a request comes to before it is logged: an Add's record, an absence's outcome and TTL
//!  apply.rs    the state machine the log feeds, in seq order under the writer lock
//!  rebuild.rs  a fresh filter filled beside the live one and swapped in
//!  image.rs    the whole state as a snapshot holds it: export, restore, digest
//!  outcome.rs  the answers to writes and why a write is refused
//! ```

mod apply;
mod decide;
mod image;
mod outcome;
mod rebuild;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;

use crate::answer::{Lookup, NamespaceStats};
use crate::clock::ReadTime;
use crate::config::NamespaceSettings;
use crate::filter::WindowedFilter;
use crate::hashing::{KeyHash, KeyHasher};
use crate::invalidations::{Hub, Subscription};
use crate::log::GENESIS_SEQ;
use crate::metrics::NamespaceMetrics;
use crate::rate_limit::TokenBucket;
use crate::recent_adds::RecentAdds;
use crate::tombstones::TombstoneStore;

pub use decide::Absence;
pub use image::*;
pub use outcome::*;
pub use rebuild::{Rebuild, Rebuilt};

/// State only writers touch.
struct Writer {
    /// Bounds on each key's newest `Add` seq, for `SUPERSEDED`.
    recent_adds: RecentAdds,
    /// Tombstone admission rate.
    admission: TokenBucket,
    /// The filter being rebuilt beside the live one, if a rebuild runs: Adds go to both.
    shadow: Option<Shadow>,
}

/// A filter being rebuilt beside the live one.
struct Shadow {
    filter: Arc<WindowedFilter>,
    /// The seq of its logged `Begin`; `None` for a rebuild a [`Rebuild`] drives in this process.
    began: Option<u64>,
    /// Keys its logged steps fed it.
    keys: u64,
    /// Unix ms of its latest logged step.
    last_step_ms: u64,
}

impl Writer {
    /// The open logged rebuild that began at `began`.
    fn logged_rebuild(&mut self, began: u64) -> Option<&mut Shadow> {
        self.shadow.as_mut().filter(|s| s.began == Some(began))
    }
}

/// One key space.
pub struct Namespace {
    name: Arc<str>,
    settings: NamespaceSettings,
    hasher: Arc<KeyHasher>,
    /// Swapped whole when a snapshot is restored or a rebuild completes.
    filter: ArcSwap<WindowedFilter>,
    tombstones: TombstoneStore,
    /// Latest applied seq; shared with subscriptions for `RESYNC`.
    latest_seq: Arc<AtomicU64>,
    keys_added: AtomicU64,
    hub: Arc<Hub>,
    writer: Mutex<Writer>,
    /// Whether the stop of writes (a poisoned writer lock) was logged already.
    stop_logged: AtomicBool,
    metrics: NamespaceMetrics,
}

impl std::fmt::Debug for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespace")
            .field("name", &self.name)
            .field("seq", &self.latest_seq())
            .finish_non_exhaustive()
    }
}

impl Namespace {
    /// An empty namespace.
    pub fn new(
        name: &str,
        settings: NamespaceSettings,
        hasher: Arc<KeyHasher>,
        replay_buffer_bytes: usize,
    ) -> Self {
        let writer = Writer {
            recent_adds: RecentAdds::default(),
            admission: TokenBucket::new(settings.max_tombstone_rate),
            shadow: None,
        };
        Self {
            name: Arc::from(name),
            filter: ArcSwap::from_pointee(WindowedFilter::new(settings.filter_spec())),
            tombstones: TombstoneStore::new(settings.max_tombstones),
            settings,
            hasher,
            latest_seq: Arc::new(AtomicU64::new(GENESIS_SEQ)),
            keys_added: AtomicU64::new(0),
            hub: Arc::new(Hub::new(replay_buffer_bytes)),
            writer: Mutex::new(writer),
            stop_logged: AtomicBool::new(false),
            metrics: NamespaceMetrics::new(name),
        }
    }

    /// Canonical name.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Its settings.
    pub fn settings(&self) -> &NamespaceSettings {
        &self.settings
    }

    /// Latest applied seq.
    pub fn latest_seq(&self) -> u64 {
        self.latest_seq.load(Ordering::Acquire)
    }

    /// The seq of the latest `Add` applied (0: none since start or restore): the last seq that changed the
    /// filter, and so what a mirror, which is sent `Add`s only, must have applied before a grant holds
    /// (a tombstone's seq after it would never reach the mirror).
    pub fn latest_add_seq(&self) -> u64 {
        self.hub.newest_seq()
    }

    /// The writer lock, unless a writer panicked while holding it (see [`WritesStopped`]).
    fn writer(&self) -> Result<MutexGuard<'_, Writer>, WritesStopped> {
        self.writer.lock().map_err(|_| {
            if !self.stop_logged.swap(true, Ordering::Relaxed) {
                tracing::error!(
                    namespace = %self.name,
                    "a mutation panicked while being applied: this namespace takes no more writes until \
                     a restart rebuilds its state from the log"
                );
            }
            WritesStopped(Arc::clone(&self.name))
        })
    }

    /// Whether writes were stopped by a panic while applying a mutation.
    pub fn writes_stopped(&self) -> bool {
        self.writer.is_poisoned()
    }

    /// The answer for one key at `time`.
    #[inline]
    pub fn lookup(&self, key: &[u8], time: impl Into<ReadTime>) -> Lookup {
        let time = time.into();
        let hash = self.hasher.hash(key);
        let tombstoned =
            self.tombstones
                .lookup(hash, || self.hasher.strong(key), time.tombstones_ms);
        let lookup = Lookup::of(tombstoned, || {
            self.filter.load().contains(hash, time.windows_ms)
        });
        self.metrics.count_answers(std::slice::from_ref(&lookup));
        lookup
    }

    /// Answers for many keys at once, in order, into `answers`: the filter probes them as a batch so that
    /// their cache misses overlap.
    pub fn lookup_many<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        time: impl Into<ReadTime>,
        answers: &mut Vec<Lookup>,
    ) {
        let time = time.into();
        let hashes: Vec<KeyHash> = keys.iter().map(|k| self.hasher.hash(k.as_ref())).collect();
        let mut tombstoned = Vec::with_capacity(hashes.len());
        self.tombstones.lookup_many(
            &hashes,
            |i| self.hasher.strong(keys[i].as_ref()),
            time.tombstones_ms,
            &mut tombstoned,
        );
        let mut in_filter = Vec::with_capacity(hashes.len());
        self.filter
            .load()
            .contains_many(&hashes, time.windows_ms, &mut in_filter);
        answers.clear();
        answers.extend(
            tombstoned
                .into_iter()
                .zip(in_filter)
                .map(|(tombstoned, in_filter)| Lookup::of(tombstoned, || in_filter)),
        );
        self.metrics.count_answers(answers);
    }

    /// A subscription to this namespace's invalidations after `after_seq` (0 = from now on), or `None` if
    /// `max` are already open.
    pub fn subscribe(&self, after_seq: u64, max: usize) -> Option<Subscription> {
        self.hub.subscribe(after_seq, &self.latest_seq, max)
    }

    /// Frees dead windows and expired tombstones; the server calls it periodically.
    pub fn maintain(&self, time: impl Into<ReadTime>) {
        let time = time.into();
        self.filter.load().expire(time.windows_ms);
        self.tombstones.purge_expired(time.tombstones_ms);
    }

    /// Frees dead windows only (a replica's once its lease holds: see [`Gate::maintain`](crate::gate::Gate)).
    pub fn expire_windows(&self, time: impl Into<ReadTime>) {
        self.filter.load().expire(time.into().windows_ms);
    }

    /// Current figures.
    pub fn stats(&self, time: impl Into<ReadTime>) -> NamespaceStats {
        let now_ms = time.into().windows_ms;
        NamespaceStats {
            name: Arc::clone(&self.name),
            seq: self.latest_seq(),
            keys_added: self.keys_added.load(Ordering::Relaxed),
            filter: self.filter.load().stats(now_ms),
            tombstones: self.tombstones.len(),
            tombstone_bytes: self.tombstones.bytes(),
            replay_buffer_bytes: self.hub.bytes(),
            recent_adds_bytes: crate::recent_adds::BYTES,
            subscribers: self.hub.subscribers(),
        }
    }

    /// Fraction of the live filter's bits that are set (a scan of every filter word: see
    /// [`crate::filter::WindowedFilter::fill_ratio`]).
    pub fn fill_ratio(&self, time: impl Into<ReadTime>) -> f64 {
        self.filter.load().fill_ratio(time.into().windows_ms)
    }

    /// Publishes the gauges of this namespace; returns the figures it published.
    pub fn export_gauges(&self, time: impl Into<ReadTime>) -> NamespaceStats {
        let stats = self.stats(time);
        self.metrics.export(&stats);
        stats
    }
}
