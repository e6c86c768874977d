//! One namespace: its filter, tombstones, seq and invalidations — the deterministic state machine the log
//! feeds, and the decisions (`REDUNDANT`, `SUPERSEDED`, `THROTTLED`, TTL and jitter) that turn a request into a
//! mutation.
//!
//! Reads never take the writer lock: the filter is lock-free, tombstones take a shard read lock. Writes
//! (`Add`, stored tombstones) are serialised by the writer lock, which makes seq order, log order and apply
//! order the same.

use std::hash::Hasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;

use crate::core::answer::{Lookup, NamespaceStats, StateDigest};
use crate::core::config::NamespaceSettings;
use crate::core::filter::{BloomLayer, WindowedFilter};
use crate::core::hashing::{KeyHash, KeyHasher};
use crate::core::invalidations::{Hub, Invalidation, Subscription};
use crate::core::log::{Log, LogError, Mutation, RebuildStep, GENESIS_SEQ};
use crate::core::metrics::NamespaceMetrics;
use crate::core::rate_limit::TokenBucket;
use crate::core::recent_adds::{RecentAdds, RecentAddsImage};
use crate::core::tombstones::{self, AbsenceKind, Tombstone, TombstoneKey, TombstoneStore};

/// The result of an `Add`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Added {
    /// The seq shared by the call's keys.
    pub seq: u64,
    /// Live tombstones of these keys that were removed.
    pub tombstones_cleared: u32,
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

/// A filter window as a snapshot holds it: its id and its layers, oldest first.
pub type WindowImage = (u64, Vec<Arc<BloomLayer>>);

/// One namespace's whole state, as [`Namespace::export`] gives it and [`Namespace::restore`] takes it back.
/// Storage encodes it; the core never sees a file. Whether an image fits this namespace (its sizing
/// fingerprint, the hash seed) is for whoever read it to check before restoring.
pub struct NamespaceImage {
    /// The namespace's name.
    pub name: String,
    /// The [fingerprint](crate::core::filter::FilterSpec::fingerprint) of the sizing its filter was built with.
    pub fingerprint: u64,
    /// The seq it is consistent from.
    pub seq: u64,
    /// Keys added, for stats.
    pub keys_added: u64,
    /// Filter windows, oldest first.
    pub windows: Vec<WindowImage>,
    /// Live tombstones as of when it was taken.
    pub tombstones: Vec<Tombstone>,
    /// The memory of recent adds behind `SUPERSEDED`, as of `seq`.
    pub recent_adds: RecentAddsImage,
    /// The logged rebuild in progress, if one is.
    pub rebuild: Option<RebuildImage>,
}

/// A logged rebuild in progress, as a snapshot holds it: a replica restored from the snapshot goes on with
/// it when the rest of its steps arrive, exactly as the replicas that applied its first steps do. (A
/// rebuild driven in this process is not in images: it ends with its caller.)
pub struct RebuildImage {
    /// The seq of its `Begin`.
    pub began: u64,
    /// Keys its steps fed it.
    pub keys: u64,
    /// Unix ms of its latest step.
    pub last_step_ms: u64,
    /// Its filter's windows, oldest first.
    pub windows: Vec<WindowImage>,
}

/// What a reported absence comes to before it is logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Absence {
    /// Nothing to store: the answer as it stands.
    Answered(Recorded),
    /// A tombstone to log, and the answer if applying it records it.
    Store {
        /// The mutation to log.
        mutation: Mutation,
        /// The answer once it is recorded (its seq is the mutation's).
        recorded: Recorded,
    },
}

impl NamespaceImage {
    /// The image with its filter layers copied: it no longer shares them with the live filter, so later
    /// writes do not change it. For a snapshot that must be exactly the state as of `seq` (a replica's, whose
    /// digest must equal the others'), taken while nothing is applied; the cost is a copy of the filter.
    pub fn detached(mut self) -> Self {
        let rebuilt = self.rebuild.iter_mut().flat_map(|r| &mut r.windows);
        for (_, layers) in self.windows.iter_mut().chain(rebuilt) {
            for layer in layers.iter_mut() {
                *layer = Arc::new(layer.copy());
            }
        }
        self
    }
}

/// What applying one mutation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// An `Add`'s keys are in the filter; it removed this many live tombstones of them.
    Added {
        /// Live tombstones of the added keys that were removed.
        tombstones_cleared: u32,
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

/// 64 well-mixed bits from a key's hash and a time: splitmix64's finalizer over their combination (every input
/// bit flips about half the output bits), so that keys with close hashes, or one key at close times, draw
/// unrelated jitters.
fn jitter_bits(hash: KeyHash, at_ms: u64) -> u64 {
    let mut z = hash.0 ^ at_ms.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
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

/// A rebuild in progress: keys streamed from the source of truth fill a fresh filter, which replaces the
/// live one on [`finish`](Self::finish). Dropped unfinished, it is abandoned and the live filter stays.
pub struct Rebuild {
    namespace: Arc<Namespace>,
    shadow: Arc<WindowedFilter>,
    keys: u64,
    finished: bool,
}

/// What a finished rebuild produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rebuilt {
    /// Keys streamed.
    pub keys: u64,
    /// Bytes of the new filter.
    pub filter_bytes: u64,
    /// The namespace's seq when it was swapped in.
    pub seq: u64,
}

impl Rebuild {
    /// Adds keys that exist (validated by the caller) as of `now_ms`.
    pub fn insert(&mut self, keys: &[Bytes], now_ms: u64) {
        let hashes: Vec<KeyHash> = keys
            .iter()
            .map(|key| self.namespace.hasher.hash(key))
            .collect();
        self.shadow.insert_many(&hashes, now_ms);
        self.keys += keys.len() as u64;
    }

    /// Swaps the rebuilt filter in. Adds applied since the rebuild began are in it too.
    pub fn finish(mut self) -> Result<Rebuilt, WritesStopped> {
        let mut writer = self.namespace.writer()?;
        writer.shadow = None;
        self.namespace.filter.store(Arc::clone(&self.shadow));
        self.finished = true;
        Ok(Rebuilt {
            keys: self.keys,
            filter_bytes: self.shadow.bytes(),
            seq: self.namespace.latest_seq(),
        })
    }
}

impl Drop for Rebuild {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let Ok(mut writer) = self.namespace.writer() {
            if writer
                .shadow
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(&s.filter, &self.shadow))
            {
                writer.shadow = None;
            }
        }
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

    /// The answer for one key at `now_ms`.
    #[inline]
    pub fn lookup(&self, key: &[u8], now_ms: u64) -> Lookup {
        let hash = self.hasher.hash(key);
        let tombstoned = self
            .tombstones
            .lookup(hash, || self.hasher.strong(key), now_ms);
        let lookup = Lookup::of(tombstoned, || self.filter.load().contains(hash, now_ms));
        self.metrics.count_answers(std::slice::from_ref(&lookup));
        lookup
    }

    /// Answers for many keys at once, in order, into `answers`: the filter probes them as a batch so that
    /// their cache misses overlap.
    pub fn lookup_many<K: AsRef<[u8]>>(&self, keys: &[K], now_ms: u64, answers: &mut Vec<Lookup>) {
        let hashes: Vec<KeyHash> = keys.iter().map(|k| self.hasher.hash(k.as_ref())).collect();
        let mut tombstoned = Vec::with_capacity(hashes.len());
        self.tombstones.lookup_many(
            &hashes,
            |i| self.hasher.strong(keys[i].as_ref()),
            now_ms,
            &mut tombstoned,
        );
        let mut in_filter = Vec::with_capacity(hashes.len());
        self.filter
            .load()
            .contains_many(&hashes, now_ms, &mut in_filter);
        answers.clear();
        answers.extend(
            tombstoned
                .into_iter()
                .zip(in_filter)
                .map(|(tombstoned, in_filter)| Lookup::of(tombstoned, || in_filter)),
        );
        self.metrics.count_answers(answers);
    }

    /// Adds `keys` (non-empty, validated) at `now_ms`.
    pub fn add(&self, keys: Vec<Bytes>, now_ms: u64, log: &dyn Log) -> Result<Added, WriteError> {
        let mut writer = self.writer()?;
        let mutation = self.addition(keys, now_ms, self.latest_seq() + 1);
        let seq = mutation.seq();
        let ticket = log.append(&mutation)?;
        let Applied::Added { tombstones_cleared } = self.apply_locked(&mut writer, mutation) else {
            unreachable!("an Add applies as added")
        };
        drop(writer);
        log.commit(ticket)?;
        Ok(Added {
            seq,
            tombstones_cleared,
        })
    }

    /// The `Add` of `keys` at `now_ms`, for a log that assigns seqs itself (seq 0 until it does). Nothing
    /// changes until the log hands it back to [`apply`](Self::apply).
    pub fn prepare_add(&self, keys: Vec<Bytes>, now_ms: u64) -> Result<Mutation, WritesStopped> {
        drop(self.writer()?);
        Ok(self.addition(keys, now_ms, 0))
    }

    fn addition(&self, keys: Vec<Bytes>, at_ms: u64, seq: u64) -> Mutation {
        Mutation::Add {
            namespace: Arc::clone(&self.name),
            seq,
            at_ms,
            keys,
        }
    }

    /// Decides what to do with a reported absence and, if it is to be stored, logs and applies it.
    pub fn record_absent(
        &self,
        report: AbsenceReport,
        now_ms: u64,
        log: &dyn Log,
    ) -> Result<Recorded, WriteError> {
        let mut writer = self.writer()?;
        let seq = self.latest_seq() + 1;
        let (mutation, recorded) = match self.decide_absence(&mut writer, report, now_ms, seq) {
            Absence::Answered(recorded) => return Ok(recorded),
            Absence::Store { mutation, recorded } => (mutation, recorded),
        };
        let ticket = log.append(&mutation)?;
        let applied = self.apply_locked(&mut writer, mutation);
        // Checked by the decision under the same lock, against the same memory of adds.
        debug_assert_eq!(applied, Applied::Recorded);
        drop(writer);
        log.commit(ticket)?;
        Ok(recorded)
    }

    /// Decides a reported absence against this replica's state, for a log that assigns seqs itself: either
    /// the answer (`REDUNDANT`, `SUPERSEDED`, `THROTTLED` — nothing to log), or the mutation to publish (seq
    /// 0 until the log assigns it), whose outcome is decided again when it is applied, in log order.
    pub fn prepare_absence(
        &self,
        report: AbsenceReport,
        now_ms: u64,
    ) -> Result<Absence, WritesStopped> {
        let mut writer = self.writer()?;
        Ok(self.decide_absence(&mut writer, report, now_ms, 0))
    }

    /// The decisions of `RecordAbsent` before anything is logged: the filter already answers absent, the
    /// key may have been added after the caller's observation, or the namespace is over its tombstone rate —
    /// else a tombstone at `seq` with its jittered TTL.
    fn decide_absence(
        &self,
        writer: &mut Writer,
        report: AbsenceReport,
        now_ms: u64,
        seq: u64,
    ) -> Absence {
        let hash = self.hasher.hash(&report.key);
        let not_stored = |outcome| {
            Absence::Answered(Recorded {
                outcome,
                seq: self.latest_seq(),
                expires_in_ms: 0,
            })
        };
        if !self.filter.load().contains(hash, now_ms) {
            return not_stored(RecordOutcome::Redundant);
        }
        if report.observed_seq != 0
            && writer
                .recent_adds
                .may_have_been_added_after(hash, report.observed_seq)
        {
            return not_stored(RecordOutcome::Superseded);
        }
        if report.kind == AbsenceKind::Missing {
            // The filter passed a key the source does not have: a false positive as clients see it.
            self.metrics.false_positives.increment(1);
        }
        if !writer.admission.try_take(now_ms) {
            self.metrics.throttled.increment(1);
            return not_stored(RecordOutcome::Throttled);
        }
        let ttl_ms = self.ttl_ms(report.kind, report.ttl_seconds, hash, now_ms);
        Absence::Store {
            mutation: Mutation::RecordAbsent {
                namespace: Arc::clone(&self.name),
                seq,
                at_ms: now_ms,
                key: report.key,
                kind: report.kind,
                expires_at_ms: now_ms.saturating_add(ttl_ms),
                observed_seq: report.observed_seq,
            },
            recorded: Recorded {
                outcome: RecordOutcome::Recorded,
                seq,
                expires_in_ms: ttl_ms,
            },
        }
    }

    /// The TTL for a tombstone: requested or default, clamped to the maximum, jittered (never above it).
    ///
    /// The jitter spreads the expiries of keys recorded together (a burst of misses would otherwise all
    /// expire, and all reach the source, in the same millisecond). It is drawn from the key's keyed hash and
    /// the time of the report rather than from a random generator, so the core stays a pure function of its
    /// inputs: whoever computes a mutation — this process, or any replica from the same message — gets the
    /// same expiry, and property tests reproduce. Keys differ in hash, so a burst still spreads; one key
    /// recorded again later gets another draw. The draw is uniform in `[-jitter, +jitter]` to 2^-53.
    fn ttl_ms(&self, kind: AbsenceKind, requested_seconds: u32, hash: KeyHash, at_ms: u64) -> u64 {
        let base = match (requested_seconds, kind) {
            (0, AbsenceKind::Missing) => self.settings.missing_ttl,
            (0, AbsenceKind::Deleted) => self.settings.deleted_ttl,
            (seconds, _) => Duration::from_secs(u64::from(seconds)),
        };
        let max_ms = self.settings.max_ttl.as_millis() as f64;
        let base_ms = (base.as_millis() as f64).min(max_ms);
        let unit = (jitter_bits(hash, at_ms) >> 11) as f64 / (1u64 << 53) as f64;
        let factor = 1.0 + self.settings.ttl_jitter * (2.0 * unit - 1.0);
        (base_ms * factor).round().clamp(1.0, max_ms) as u64
    }

    /// Applies a mutation from the log (replay, or a replica's feed). Mutations must arrive in seq order.
    pub fn apply(&self, mutation: Mutation) -> Result<Applied, WritesStopped> {
        let mut writer = self.writer()?;
        Ok(self.apply_locked(&mut writer, mutation))
    }

    /// The state machine's step.
    fn apply_locked(&self, writer: &mut Writer, mutation: Mutation) -> Applied {
        match mutation {
            Mutation::Add {
                seq, at_ms, keys, ..
            } => {
                let hashes: Vec<KeyHash> = keys.iter().map(|key| self.hasher.hash(key)).collect();
                self.filter.load().insert_many(&hashes, at_ms);
                if let Some(shadow) = &writer.shadow {
                    shadow.filter.insert_many(&hashes, at_ms);
                }
                let mut cleared = 0;
                for (key, &hash) in keys.iter().zip(&hashes) {
                    writer.recent_adds.record(hash, seq);
                    cleared += u32::from(self.tombstones.remove(
                        hash,
                        || self.hasher.strong(key),
                        at_ms,
                    ));
                }
                self.keys_added
                    .fetch_add(keys.len() as u64, Ordering::Relaxed);
                self.metrics.keys_added.increment(keys.len() as u64);
                self.hub
                    .publish(Invalidation { seq, keys }, &self.latest_seq);
                Applied::Added {
                    tombstones_cleared: cleared,
                }
            }
            Mutation::RecordAbsent {
                seq,
                at_ms,
                key,
                kind,
                expires_at_ms,
                observed_seq,
                ..
            } => {
                let hash = self.hasher.hash(&key);
                if observed_seq != 0
                    && writer
                        .recent_adds
                        .may_have_been_added_after(hash, observed_seq)
                {
                    self.latest_seq.store(seq, Ordering::Release);
                    return Applied::Superseded;
                }
                let tombstone = TombstoneKey {
                    tag: tombstones::tag(hash),
                    strong: self.hasher.strong(&key),
                };
                let evicted = self
                    .tombstones
                    .insert(tombstone, kind, expires_at_ms, at_ms)
                    .evicted;
                if evicted > 0 {
                    self.metrics
                        .tombstones_evicted
                        .increment(u64::from(evicted));
                }
                self.latest_seq.store(seq, Ordering::Release);
                Applied::Recorded
            }
            Mutation::Rebuild {
                seq, at_ms, step, ..
            } => {
                let applied = self.apply_rebuild_step(writer, seq, at_ms, step);
                self.latest_seq.store(seq, Ordering::Release);
                applied
            }
        }
    }

    /// A logged rebuild's step; steps of a rebuild that is not open change nothing.
    fn apply_rebuild_step(
        &self,
        writer: &mut Writer,
        seq: u64,
        at_ms: u64,
        step: RebuildStep,
    ) -> Applied {
        match step {
            RebuildStep::Begin => {
                let fresh = Shadow {
                    filter: Arc::new(WindowedFilter::new(self.settings.filter_spec())),
                    began: Some(seq),
                    keys: 0,
                    last_step_ms: at_ms,
                };
                let replaced = writer.shadow.replace(fresh).and_then(|old| old.began);
                if let Some(replaced) = replaced {
                    tracing::warn!(namespace = %self.name, replaced, began = seq, "a rebuild replaced the open one");
                }
                Applied::RebuildBegun { replaced }
            }
            RebuildStep::Keys { began, keys } => {
                let Some(shadow) = writer.logged_rebuild(began) else {
                    return Applied::RebuildGone;
                };
                for key in &keys {
                    shadow.filter.insert(self.hasher.hash(key), at_ms);
                }
                shadow.keys += keys.len() as u64;
                shadow.last_step_ms = at_ms;
                Applied::RebuildFed
            }
            RebuildStep::Commit { began } => {
                if writer.logged_rebuild(began).is_none() {
                    return Applied::RebuildGone;
                }
                let shadow = writer.shadow.take().expect("checked open");
                self.filter.store(Arc::clone(&shadow.filter));
                Applied::Rebuilt(Rebuilt {
                    keys: shadow.keys,
                    filter_bytes: shadow.filter.bytes(),
                    seq,
                })
            }
            RebuildStep::Abort { began } => {
                if writer.logged_rebuild(began).is_none() {
                    return Applied::RebuildGone;
                }
                writer.shadow = None;
                Applied::RebuildAborted
            }
        }
    }

    /// A subscription to this namespace's invalidations after `after_seq` (0 = from now on), or `None` if
    /// `max` are already open.
    pub fn subscribe(&self, after_seq: u64, max: usize) -> Option<Subscription> {
        self.hub.subscribe(after_seq, &self.latest_seq, max)
    }

    /// Starts rebuilding the filter beside the live one; `None` if a rebuild already runs.
    pub fn begin_rebuild(self: &Arc<Self>) -> Result<Option<Rebuild>, WritesStopped> {
        let mut writer = self.writer()?;
        if writer.shadow.is_some() {
            return Ok(None);
        }
        let shadow = Arc::new(WindowedFilter::new(self.settings.filter_spec()));
        writer.shadow = Some(Shadow {
            filter: Arc::clone(&shadow),
            began: None,
            keys: 0,
            last_step_ms: 0,
        });
        Ok(Some(Rebuild {
            namespace: Arc::clone(self),
            shadow,
            keys: 0,
            finished: false,
        }))
    }

    /// The `Begin` of a logged rebuild at `now_ms` (seq 0 until the log assigns it), or `None` while another
    /// logged rebuild of this namespace took a step within `idle`: its driver is presumably alive, and one
    /// rebuild runs at a time. One idle for longer is presumed abandoned (the replica driving it stopped);
    /// the new `Begin` replaces it wherever it is applied.
    pub fn prepare_rebuild(
        &self,
        now_ms: u64,
        idle: Duration,
    ) -> Result<Option<Mutation>, WritesStopped> {
        let writer = self.writer()?;
        let busy = writer.shadow.as_ref().is_some_and(|s| {
            s.began.is_none() || now_ms.saturating_sub(s.last_step_ms) < idle.as_millis() as u64
        });
        Ok((!busy).then(|| self.rebuild_step(RebuildStep::Begin, now_ms)))
    }

    /// A step of a logged rebuild at `now_ms` (seq 0 until the log assigns it).
    pub fn rebuild_step(&self, step: RebuildStep, now_ms: u64) -> Mutation {
        Mutation::Rebuild {
            namespace: Arc::clone(&self.name),
            seq: 0,
            at_ms: now_ms,
            step,
        }
    }

    /// Replaces the whole state with a snapshot's: filter windows, live tombstones, the memory of recent adds
    /// and seq. Invalidations before `seq` become unservable. (An image without that memory — snapshot
    /// format 2 — brings a floor instead: any absence observed before `seq` is then `SUPERSEDED`.)
    pub fn restore(&self, image: NamespaceImage, now_ms: u64) -> Result<(), WritesStopped> {
        let NamespaceImage {
            seq,
            keys_added,
            windows,
            tombstones,
            recent_adds,
            rebuild,
            ..
        } = image;
        let mut writer = self.writer()?;
        let filter = WindowedFilter::from_windows(self.settings.filter_spec(), windows);
        self.filter.store(Arc::new(filter));
        writer.shadow = rebuild.map(|r| Shadow {
            filter: Arc::new(WindowedFilter::from_windows(
                self.settings.filter_spec(),
                r.windows,
            )),
            began: Some(r.began),
            keys: r.keys,
            last_step_ms: r.last_step_ms,
        });
        for tombstone in &tombstones {
            self.tombstones.insert(
                tombstone.key,
                tombstone.kind,
                tombstone.expires_at_ms,
                now_ms,
            );
        }
        // An image's cells were checked when it was read; out of range here, fall back to the floor (every
        // absence observed before `seq` is then SUPERSEDED: a lost tombstone, never a wrong one).
        writer.recent_adds =
            RecentAdds::restore(&recent_adds).unwrap_or_else(|| RecentAdds::with_floor(seq));
        self.keys_added.store(keys_added, Ordering::Relaxed);
        self.hub.reset(seq);
        self.latest_seq.store(seq, Ordering::Release);
        Ok(())
    }

    /// The state a snapshot needs. Its seq is read under the writer lock, so every mutation logged before
    /// this call is included; later mutations may be partly included and are replayed from the log.
    pub fn export(&self, now_ms: u64) -> Result<NamespaceImage, WritesStopped> {
        let (seq, recent_adds, rebuild) = {
            let writer = self.writer()?;
            let rebuild = writer.shadow.as_ref().and_then(|s| {
                let began = s.began?;
                Some((began, s.keys, s.last_step_ms, Arc::clone(&s.filter)))
            });
            (self.latest_seq(), writer.recent_adds.export(), rebuild)
        };
        Ok(NamespaceImage {
            name: self.name.to_string(),
            fingerprint: self.settings.filter_spec().fingerprint(),
            seq,
            keys_added: self.keys_added.load(Ordering::Relaxed),
            windows: self.filter.load().export(),
            tombstones: self.tombstones.live(now_ms),
            recent_adds,
            rebuild: rebuild.map(|(began, keys, last_step_ms, filter)| RebuildImage {
                began,
                keys,
                last_step_ms,
                windows: filter.export(),
            }),
        })
    }

    /// A hash of everything this namespace answers from, as of its seq and `now_ms`: the live filter windows'
    /// bits and the live tombstones (sorted, so the store's slot layout does not count). Replicas, or a live
    /// gate and its replayed log, that applied the same mutations have equal digests; so the operator (and
    /// the tests) can see that they agree. Taken under the writer lock, so no mutation lands half-way
    /// through; reads go on. Compare digests taken at about the same time: a tombstone or window expiring
    /// between two calls changes it.
    pub fn state_digest(&self, now_ms: u64) -> Result<StateDigest, WritesStopped> {
        let _writer = self.writer()?;
        let seq = self.latest_seq();
        let mut digest = siphasher::sip::SipHasher13::new();
        digest.write_u64(seq);
        self.filter.load().digest(now_ms, &mut digest);
        let mut tombstones = self.tombstones.live(now_ms);
        tombstones.sort_unstable_by_key(|t| (t.key.tag, t.key.strong.0));
        for tombstone in &tombstones {
            digest.write_u32(tombstone.key.tag);
            digest.write_u64(tombstone.key.strong.0[0]);
            digest.write_u64(tombstone.key.strong.0[1]);
            digest.write_u64(tombstone.expires_at_ms);
            digest.write_u8(tombstone.kind as u8);
        }
        Ok(StateDigest {
            seq,
            digest: digest.finish(),
        })
    }

    /// Frees dead windows and expired tombstones; the server calls it periodically.
    pub fn maintain(&self, now_ms: u64) {
        self.filter.load().expire(now_ms);
        self.tombstones.purge_expired(now_ms);
    }

    /// Current figures.
    pub fn stats(&self, now_ms: u64) -> NamespaceStats {
        NamespaceStats {
            name: Arc::clone(&self.name),
            seq: self.latest_seq(),
            keys_added: self.keys_added.load(Ordering::Relaxed),
            filter: self.filter.load().stats(now_ms),
            tombstones: self.tombstones.len(),
            tombstone_bytes: self.tombstones.bytes(),
            replay_buffer_bytes: self.hub.bytes(),
            subscribers: self.hub.subscribers(),
        }
    }

    /// Fraction of the live filter's bits that are set (a scan of every filter word: see
    /// [`crate::core::filter::WindowedFilter::fill_ratio`]).
    pub fn fill_ratio(&self, now_ms: u64) -> f64 {
        self.filter.load().fill_ratio(now_ms)
    }

    /// Publishes the gauges of this namespace.
    pub fn export_gauges(&self, now_ms: u64) {
        self.metrics.export(&self.stats(now_ms));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::answer::Answer;
    use crate::core::log::MemoryLog;

    fn namespace() -> Arc<Namespace> {
        let hasher = Arc::new(KeyHasher::from_seed([9; 32]));
        Arc::new(Namespace::new(
            "default",
            NamespaceSettings::default(),
            hasher,
            1 << 16,
        ))
    }

    fn key(k: &str) -> Bytes {
        Bytes::copy_from_slice(k.as_bytes())
    }

    /// A panic while the writer lock is held (as inside `apply_locked`) stops writes, logged or replayed, and
    /// snapshots of the possibly half-applied state; lookups go on.
    #[test]
    fn a_panic_while_applying_stops_writes_but_not_reads() {
        let namespace = namespace();
        let log = MemoryLog::default();
        namespace.add(vec![key("before")], 1_000, &log).unwrap();
        let panicking = Arc::clone(&namespace);
        let result = std::thread::spawn(move || {
            let _writer = panicking.writer();
            panic!("a bug inside the state machine");
        })
        .join();
        assert!(result.is_err());
        assert!(namespace.writes_stopped());

        let refused = namespace.add(vec![key("after")], 2_000, &log).unwrap_err();
        assert!(
            matches!(&refused, WriteError::Stopped(WritesStopped(name)) if &**name == "default"),
            "{refused}"
        );
        assert!(refused.to_string().contains("Restart the server"));
        let report = AbsenceReport {
            key: key("before"),
            kind: AbsenceKind::Missing,
            observed_seq: namespace.latest_seq(),
            ttl_seconds: 60,
        };
        assert!(namespace.record_absent(report, 2_000, &log).is_err());
        assert!(namespace.export(2_000).is_err());
        assert!(namespace.begin_rebuild().is_err());
        let replayed = Mutation::Add {
            namespace: Arc::from("default"),
            seq: namespace.latest_seq() + 1,
            at_ms: 2_000,
            keys: vec![key("replayed")],
        };
        assert!(namespace.apply(replayed).is_err());
        assert_eq!(log.mutations().len(), 1, "nothing more was logged");

        assert_eq!(namespace.lookup(b"before", 3_000).answer, Answer::MayExist);
    }

    /// Records an absence of each of `keys` (added first) at `at_ms`; returns each one's TTL.
    fn tombstone_ttls(namespace: &Namespace, keys: &[Bytes], at_ms: u64) -> Vec<u64> {
        let log = MemoryLog::default();
        namespace.add(keys.to_vec(), at_ms, &log).unwrap();
        keys.iter()
            .map(|key| {
                let report = AbsenceReport {
                    key: key.clone(),
                    kind: AbsenceKind::Missing,
                    observed_seq: 0,
                    ttl_seconds: 0,
                };
                let recorded = namespace.record_absent(report, at_ms, &log).unwrap();
                assert_eq!(recorded.outcome, RecordOutcome::Recorded);
                recorded.expires_in_ms
            })
            .collect()
    }

    /// Jitter is a function of key and time, so two gates given the same reports store the same expiries
    /// (and replicas applying one message agree); across keys it still spreads over the whole ±10% range.
    #[test]
    fn tombstone_jitter_is_a_function_of_key_and_time_and_spans_its_range() {
        let keys: Vec<Bytes> = (0..2_000).map(|i| key(&format!("k{i}"))).collect();
        let first = tombstone_ttls(&namespace(), &keys, 5_000);
        assert_eq!(first, tombstone_ttls(&namespace(), &keys, 5_000));
        assert_ne!(first, tombstone_ttls(&namespace(), &keys, 5_001));
        let (base, jitter) = (60_000.0, 0.1);
        let (low, high) = (*first.iter().min().unwrap(), *first.iter().max().unwrap());
        assert!(low as f64 >= base * (1.0 - jitter) && (low as f64) < base * (1.0 - 0.99 * jitter));
        assert!(
            high as f64 <= base * (1.0 + jitter) && (high as f64) > base * (1.0 + 0.99 * jitter)
        );
        let mean = first.iter().sum::<u64>() as f64 / first.len() as f64;
        assert!((mean / base - 1.0).abs() < 0.005, "mean TTL {mean} ms");
    }

    /// The digest follows the state: equal for equal mutations, different as soon as one bit or tombstone
    /// differs, and unavailable once writes stopped.
    #[test]
    fn the_state_digest_tells_equal_states_from_different_ones() {
        let (left, right) = (namespace(), namespace());
        let log = MemoryLog::default();
        for namespace in [&left, &right] {
            namespace
                .add(vec![key("a"), key("b")], 1_000, &log)
                .unwrap();
        }
        let digest = |namespace: &Namespace| namespace.state_digest(2_000).unwrap();
        assert_eq!(digest(&left), digest(&right));

        let before = digest(&left);
        let report = AbsenceReport {
            key: key("a"),
            kind: AbsenceKind::Deleted,
            observed_seq: 0,
            ttl_seconds: 30,
        };
        left.record_absent(report, 1_500, &log).unwrap();
        assert_ne!(digest(&left).digest, before.digest, "a tombstone counts");
        right.add(vec![key("c")], 1_500, &log).unwrap();
        assert_eq!(digest(&left).seq, digest(&right).seq);
        assert_ne!(digest(&left).digest, digest(&right).digest);
        let expired_later = left.state_digest(1_500 + 40_000).unwrap();
        assert_ne!(
            expired_later.digest,
            digest(&left).digest,
            "an expired tombstone no longer counts"
        );

        let stopping = Arc::clone(&right);
        let _ = std::thread::spawn(move || {
            let _writer = stopping.writer();
            panic!("a bug inside the state machine");
        })
        .join();
        assert!(right.state_digest(2_000).is_err());
    }

    fn step(seq: u64, step: RebuildStep) -> Mutation {
        Mutation::Rebuild {
            namespace: Arc::from("default"),
            seq,
            at_ms: 1_000,
            step,
        }
    }

    fn addition(seq: u64, keys: &[&str]) -> Mutation {
        Mutation::Add {
            namespace: Arc::from("default"),
            seq,
            at_ms: 1_000,
            keys: keys.iter().map(|k| key(k)).collect(),
        }
    }

    /// A logged rebuild ends with exactly the keys it was fed plus those added after its `Begin`, swapped
    /// in at its `Commit`; a namespace restored from an image taken half-way carries on with it and ends
    /// in the same state.
    #[test]
    fn a_logged_rebuild_swaps_at_its_commit_and_carries_on_after_a_restore() {
        let live = namespace();
        let applied = |namespace: &Namespace, mutation| namespace.apply(mutation).unwrap();
        applied(&live, addition(2, &["gone", "kept"]));
        assert_eq!(
            applied(&live, step(3, RebuildStep::Begin)),
            Applied::RebuildBegun { replaced: None }
        );
        applied(&live, addition(4, &["added-meanwhile"]));
        let kept = RebuildStep::Keys {
            began: 3,
            keys: vec![key("kept")],
        };
        assert_eq!(applied(&live, step(5, kept)), Applied::RebuildFed);
        assert_eq!(live.lookup(b"gone", 2_000).answer, Answer::MayExist);

        let restored = namespace();
        let image = live.export(2_000).unwrap().detached();
        assert_eq!(
            image.rebuild.as_ref().map(|r| (r.began, r.keys)),
            Some((3, 1))
        );
        restored.restore(image, 2_000).unwrap();
        let rest = [
            step(
                6,
                RebuildStep::Keys {
                    began: 3,
                    keys: vec![key("fed-last")],
                },
            ),
            step(7, RebuildStep::Commit { began: 3 }),
        ];
        for namespace in [&live, &restored] {
            let outcomes: Vec<Applied> =
                rest.iter().map(|m| applied(namespace, m.clone())).collect();
            assert_eq!(
                outcomes,
                [
                    Applied::RebuildFed,
                    Applied::Rebuilt(Rebuilt {
                        keys: 2,
                        filter_bytes: live.filter.load().bytes(),
                        seq: 7
                    })
                ]
            );
        }

        // Built from scratch with exactly those keys, at the same seq: the same bits.
        let expected = namespace();
        applied(
            &expected,
            addition(2, &["kept", "added-meanwhile", "fed-last"]),
        );
        let late = RebuildStep::Abort { began: 3 };
        assert_eq!(applied(&expected, step(7, late)), Applied::RebuildGone);
        let digest = |namespace: &Namespace| namespace.state_digest(2_000).unwrap();
        assert_eq!(digest(&live), digest(&expected));
        assert_eq!(digest(&restored), digest(&expected));
        assert!(live.export(2_000).unwrap().rebuild.is_none());
        let stale = RebuildStep::Keys {
            began: 3,
            keys: vec![key("late")],
        };
        for namespace in [&live, &expected] {
            assert_eq!(
                applied(namespace, step(8, stale.clone())),
                Applied::RebuildGone
            );
        }
        assert_eq!(digest(&live), digest(&expected));
    }

    /// A later `Begin` replaces an open rebuild, whose steps then change nothing; a new `Begin` is prepared
    /// only once the open one has been idle for the given time, and an abort leaves the live filter as it was.
    #[test]
    fn one_logged_rebuild_at_a_time_and_an_abort_keeps_the_live_filter() {
        let live = namespace();
        let applied = |mutation| live.apply(mutation).unwrap();
        applied(addition(2, &["a", "b"]));
        let before = live.state_digest(2_000).unwrap().digest;
        let idle = Duration::from_secs(120);
        assert!(live.prepare_rebuild(1_000, idle).unwrap().is_some());
        applied(step(3, RebuildStep::Begin));
        assert!(live
            .prepare_rebuild(1_000 + 119_999, idle)
            .unwrap()
            .is_none());
        assert!(live
            .prepare_rebuild(1_000 + 120_000, idle)
            .unwrap()
            .is_some());
        assert_eq!(
            applied(step(4, RebuildStep::Begin)),
            Applied::RebuildBegun { replaced: Some(3) }
        );
        let replaced = RebuildStep::Keys {
            began: 3,
            keys: vec![key("a")],
        };
        assert_eq!(applied(step(5, replaced)), Applied::RebuildGone);
        assert_eq!(
            applied(step(6, RebuildStep::Commit { began: 3 })),
            Applied::RebuildGone
        );
        assert_eq!(
            applied(step(7, RebuildStep::Abort { began: 4 })),
            Applied::RebuildAborted
        );
        assert_eq!(live.latest_seq(), 7);
        assert_eq!(live.lookup(b"a", 2_000).answer, Answer::MayExist);
        let after = live.state_digest(2_000).unwrap();
        assert_ne!(after.digest, before, "the digest covers the seq");
        let expected = namespace();
        expected.apply(addition(2, &["a", "b"])).unwrap();
        expected
            .apply(step(7, RebuildStep::Abort { began: 4 }))
            .unwrap();
        assert_eq!(after, expected.state_digest(2_000).unwrap());
    }

    fn absence(seq: u64, k: &str, observed_seq: u64) -> Mutation {
        Mutation::RecordAbsent {
            namespace: Arc::from("default"),
            seq,
            at_ms: 1_000,
            key: key(k),
            kind: AbsenceKind::Missing,
            expires_at_ms: 61_000,
            observed_seq,
        }
    }

    /// Two replicas publish at once: an absence observed at seq 5 and an `Add` of the same key, which the
    /// stream orders first (seq 7). Applying the absence at seq 8 stores nothing, on every replica; an
    /// absence observed after the `Add` is stored.
    #[test]
    fn an_absence_applied_after_a_later_add_of_its_key_is_superseded() {
        let namespace = namespace();
        namespace.apply(addition(7, &["raced"])).unwrap();
        assert_eq!(
            namespace.apply(absence(8, "raced", 5)).unwrap(),
            Applied::Superseded
        );
        assert_eq!(namespace.latest_seq(), 8, "the seq is used all the same");
        assert_eq!(namespace.lookup(b"raced", 2_000).answer, Answer::MayExist);
        assert_eq!(
            namespace.apply(absence(9, "raced", 7)).unwrap(),
            Applied::Recorded
        );
        assert_eq!(namespace.lookup(b"raced", 2_000).answer, Answer::Absent);
    }

    /// A namespace restored from an export decides `SUPERSEDED` exactly as the exporter does — including
    /// for absences observed before the export, which a floor at the export's seq would all refuse.
    #[test]
    fn a_restored_namespace_decides_superseded_as_its_exporter() {
        let exporter = namespace();
        for (seq, k) in (2..40).zip((0..).map(|i| format!("k{i}"))) {
            exporter.apply(addition(seq, &[&k])).unwrap();
        }
        let image = exporter.export(1_000).unwrap();
        assert_eq!(image.seq, 39);
        let restored = namespace();
        restored.restore(image, 1_000).unwrap();
        for (i, observed_seq) in [(3, 4), (3, 6), (30, 10), (30, 33), (37, 38)] {
            let (k, next) = (format!("k{i}"), exporter.latest_seq() + 1);
            let decided = exporter.apply(absence(next, &k, observed_seq)).unwrap();
            assert_eq!(
                restored.apply(absence(next, &k, observed_seq)).unwrap(),
                decided
            );
        }
        // k3 was added at seq 5: observed at 4 it is superseded, at a later seq recorded.
        assert_eq!(restored.lookup(b"k3", 2_000).answer, Answer::Absent);
        assert_eq!(
            restored.state_digest(2_000).unwrap(),
            exporter.state_digest(2_000).unwrap()
        );
    }

    /// In a namespace no one has written, an answer's seq is still not 0, so an `Add` that races a
    /// `RecordAbsent` of the recommended read path makes it `SUPERSEDED`.
    #[test]
    fn an_observation_of_a_fresh_namespace_still_detects_a_later_add() {
        let namespace = namespace();
        let log = MemoryLog::default();
        let observed_seq = namespace.latest_seq();
        assert_eq!(observed_seq, GENESIS_SEQ);
        assert_ne!(observed_seq, 0, "0 in a request means \"not observed\"");
        namespace.add(vec![key("raced")], 1_000, &log).unwrap();
        let report = AbsenceReport {
            key: key("raced"),
            kind: AbsenceKind::Missing,
            observed_seq,
            ttl_seconds: 60,
        };
        let recorded = namespace.record_absent(report, 1_001, &log).unwrap();
        assert_eq!(recorded.outcome, RecordOutcome::Superseded);
        assert_eq!(namespace.lookup(b"raced", 1_002).answer, Answer::MayExist);
    }
}
