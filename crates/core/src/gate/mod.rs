//! The gate: every namespace, the request limits, the log and the clock — the core's whole public surface.
//!
//! It validates requests (precise messages naming the limit and, for repeated keys, the index), resolves
//! namespaces, answers while warming, and takes writes in one of two ways, chosen once when loading is
//! done ([`WriteMode`]): [`logged`] — appended to a [`Log`] the gate owns, then applied (a single server) —
//! or [`published`] — prepared here, ordered by a log that assigns seqs itself, applied as it hands them
//! back (a replica). Both validate a request the same way, in this file. It knows nothing of gRPC; the
//! gRPC layer maps [`GateError`] to status codes.

mod logged;
pub use logged::Logged;
mod published;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use metrics::Counter;

use crate::answer::{Answer, Lookup, NamespaceStats, Scan};
use crate::clock::{Clock, ReadTime, StreamTime, WallCheck};
use crate::config::{GateConfig, Limits};
use crate::hashing::{FilterHasher, KeyHasher};
use crate::invalidations::Subscription;
use crate::keys::PackedKeys;
use crate::lease::ReadLease;
use crate::log::{Log, LogError, Mutation};
use crate::namespace::{
    AbsenceReport, Applied, MirrorImage, Namespace, NamespaceImage, NewKeys, WriteError,
    WritesStopped,
};

/// How a log numbers one namespace's mutations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seqs {
    /// One after another (the write-ahead log): a gap means mutations were lost.
    Contiguous,
    /// Rising with gaps (a stream shared by namespaces).
    Gapped,
}

/// Why a request was refused. Nothing was changed and no seq was used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateError {
    /// The namespace is not configured.
    UnknownNamespace(String),
    /// The request breaks a rule; the message says which and what the limit is.
    InvalidArgument(String),
    /// The mutation could not be logged, or the gate is shutting down.
    Unavailable(String),
    /// The request conflicts with the gate's state (e.g. a rebuild already runs).
    Conflict(String),
    /// A bounded resource is full (e.g. subscribers of a namespace).
    Exhausted(String),
}

impl std::fmt::Display for GateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownNamespace(name) => write!(f, "namespace {name:?} does not exist"),
            Self::InvalidArgument(message)
            | Self::Unavailable(message)
            | Self::Conflict(message)
            | Self::Exhausted(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for GateError {}

impl From<LogError> for GateError {
    fn from(error: LogError) -> Self {
        Self::Unavailable(error.to_string())
    }
}

impl From<WriteError> for GateError {
    fn from(error: WriteError) -> Self {
        Self::Unavailable(error.to_string())
    }
}

fn still_loading() -> GateError {
    GateError::Unavailable("the gate is still loading its state; retry shortly".to_string())
}

/// A namespace and the counters of its fail-open answers.
struct Entry {
    namespace: Arc<Namespace>,
    warming_answers: Counter,
    lease_fail_opens: Counter,
}

/// Where writes go once loading is done.
enum WriteMode {
    /// Through a [`Log`] the gate appends to and applies after (the write-ahead log, or memory).
    Logged(Arc<dyn Log>),
    /// Through a log that assigns seqs itself (a replicated stream): the wiring publishes
    /// [prepared](Gate::prepare_add) mutations and hands them back to [`Gate::apply_streamed`].
    Published,
}

/// All namespaces and the machinery around them.
pub struct Gate {
    namespaces: HashMap<String, Entry>,
    limits: Limits,
    hasher: Arc<KeyHasher>,
    clock: Arc<dyn Clock>,
    /// Where writes go; set once loading is done. Until then lookups fail open (`MAY_EXIST` + `WARMING`)
    /// and writes are refused.
    writes: OnceLock<WriteMode>,
    /// For a replica of a shared log: `ABSENT` only while this holds (see [`ReadLease`]).
    lease: Option<Arc<ReadLease>>,
    /// For a replica of a shared log: what is live is decided by its clock and this ([`ReadTime::agreed`]).
    stream_time: Option<StreamTime>,
    /// A maintenance tick kept the windows for want of the read lease: they are freed once it holds
    /// ([`lease_granted`](Self::lease_granted)).
    windows_waiting: AtomicBool,
    /// Set once writes are open: what a write that arrives while loading waits for
    /// ([`until_ready`](Self::until_ready)).
    ready: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("namespaces", &self.namespaces.keys().collect::<Vec<_>>())
            .field("limits", &self.limits)
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

impl Gate {
    /// A gate with the namespaces of `config`, still warming: call [`open`](Self::open) once its state is
    /// loaded.
    pub fn new(config: &GateConfig, hasher: KeyHasher, clock: Arc<dyn Clock>) -> Self {
        let hasher = Arc::new(hasher);
        let namespaces = config
            .namespaces
            .iter()
            .map(|(name, settings)| {
                let namespace = Namespace::new(
                    name,
                    settings.clone(),
                    Arc::clone(&hasher),
                    config
                        .limits
                        .replay_buffer_bytes_for(settings.filter_spec().initial_bytes()),
                );
                let entry = Entry {
                    namespace: Arc::new(namespace),
                    warming_answers: crate::metrics::warming_answers(name),
                    lease_fail_opens: crate::metrics::lease_fail_opens(name),
                };
                (name.clone(), entry)
            })
            .collect();
        Self {
            namespaces,
            limits: config.limits.clone(),
            hasher,
            clock,
            writes: OnceLock::new(),
            lease: None,
            stream_time: None,
            windows_waiting: AtomicBool::new(false),
            ready: tokio::sync::watch::Sender::new(false),
        }
    }

    /// The same gate answering `ABSENT` only while `lease` holds: a replica of a shared log.
    pub fn with_read_lease(mut self, lease: Arc<ReadLease>) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The same gate deciding what has expired by the time its stream has reached, too: a replica of a shared
    /// log. Its lookups, expiry, stats and snapshots go by its own clock and the time the stream's leader
    /// stored the latest applied message at ([`StreamTime`]): windows by the earlier, tombstones by the later
    /// ([`ReadTime::agreed`]); and each streamed mutation's times are [agreed](Mutation::agreed) with its
    /// stored time before it is applied. So no one host's clock decides: a replica whose clock is ahead
    /// expires no window early (the stream's time bounds it), nor does a leader's clock ahead (the replica's
    /// bounds it), nor a writer's (its `Add` lands in a later window and drops none). Writes are still stamped
    /// on the local clock: the applier agrees them.
    pub fn with_stream_time(mut self) -> Self {
        self.stream_time = Some(StreamTime::default());
        self
    }

    /// Ends warming: lookups answer from state, writes go to `log`. Only the first call counts.
    pub fn open(&self, log: Arc<dyn Log>) {
        let _ = self.writes.set(WriteMode::Logged(log));
        self.ready.send_replace(true);
    }

    /// Ends warming for a replica of a shared log: lookups answer from state, writes are
    /// [prepared](Self::prepare_add) here and published by the wiring. Only the first call counts.
    pub fn open_published(&self) {
        let _ = self.writes.set(WriteMode::Published);
        self.ready.send_replace(true);
    }

    /// Returns once writes are open. A write that reaches a server still loading — a restarted replica a
    /// balancer already sends calls to — waits for its state (bounded by its caller) rather than fail "still
    /// loading"; lookups meanwhile fail open (`WARMING`).
    pub async fn until_ready(&self) {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|ready| *ready).await;
    }

    /// Whether a write may wait inside the log (see [`Log::commit_may_wait`]); also while loading, when the
    /// log is not yet known.
    pub fn writes_may_wait(&self) -> bool {
        match self.writes.get() {
            Some(WriteMode::Logged(log)) => log.commit_may_wait(),
            _ => true,
        }
    }

    /// Whether writes may wait for the log without a thread of their own ([`Log::commits_without_thread`]):
    /// then [`add_logged`](Self::add_logged) and [`committed`](Self::committed) run on the caller's task.
    pub fn commits_without_thread(&self) -> bool {
        match self.writes.get() {
            Some(WriteMode::Logged(log)) => log.commits_without_thread(),
            _ => false,
        }
    }

    /// Why writes are refused now, if they are, while reads are still answered: the log cannot write,
    /// or a namespace stopped taking writes after a panic. `None` while loading (that is not a failure).
    pub fn write_failure(&self) -> Option<String> {
        let log_failure = match self.writes.get()? {
            WriteMode::Logged(log) => log.write_failure(),
            WriteMode::Published => None,
        };
        log_failure.or_else(|| {
            self.namespaces
                .values()
                .find(|e| e.namespace.writes_stopped())
                .map(|e| WritesStopped(Arc::clone(e.namespace.name())).to_string())
        })
    }

    /// Whether loading is done.
    pub fn is_ready(&self) -> bool {
        self.writes.get().is_some()
    }

    /// Whether `ABSENT` may be answered now: always, unless the gate serves under a lease that does not hold.
    fn absent_allowed(&self) -> bool {
        self.lease.as_ref().is_none_or(|lease| lease.holds())
    }

    /// The request limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The namespaces, sorted by name.
    pub fn namespaces(&self) -> Vec<Arc<Namespace>> {
        let mut all: Vec<_> = self
            .namespaces
            .values()
            .map(|e| Arc::clone(&e.namespace))
            .collect();
        all.sort_by(|a, b| a.name().cmp(b.name()));
        all
    }

    fn entry(&self, name: &str) -> Result<&Entry, GateError> {
        self.namespaces
            .get(name)
            .ok_or_else(|| GateError::UnknownNamespace(name.to_string()))
    }

    /// The namespace called `name` (the gRPC layer resolves a request's "" to `default` before asking).
    pub fn namespace(&self, name: &str) -> Result<&Arc<Namespace>, GateError> {
        self.entry(name).map(|e| &e.namespace)
    }

    fn check_key(&self, key: &[u8], index: Option<usize>) -> Result<(), GateError> {
        // The name is formatted only for a bad key: this runs for every key of every batch.
        let name = || index.map_or_else(|| "key".to_string(), |i| format!("keys[{i}]"));
        if key.is_empty() {
            return Err(GateError::InvalidArgument(format!(
                "{} is empty; keys must be 1 to {} bytes",
                name(),
                self.limits.max_key_bytes
            )));
        }
        if key.len() > self.limits.max_key_bytes {
            return Err(GateError::InvalidArgument(format!(
                "{} is {} bytes; the limit is max_key_bytes = {}",
                name(),
                key.len(),
                self.limits.max_key_bytes
            )));
        }
        Ok(())
    }

    fn check_keys<'k>(
        &self,
        keys: impl ExactSizeIterator<Item = &'k [u8]>,
    ) -> Result<(), GateError> {
        if keys.len() > self.limits.max_batch_keys {
            return Err(GateError::InvalidArgument(format!(
                "the request has {} keys; the limit is max_batch_keys = {}",
                keys.len(),
                self.limits.max_batch_keys
            )));
        }
        keys.enumerate()
            .try_for_each(|(i, key)| self.check_key(key, Some(i)))
    }

    /// An `Add`'s namespace and keys, validated alike for either write path: a configured namespace, at
    /// least one key, each within the limits.
    fn add_request(
        &self,
        namespace: &str,
        keys: impl Into<PackedKeys>,
    ) -> Result<(&Arc<Namespace>, PackedKeys), GateError> {
        let namespace = self.namespace(namespace)?;
        let keys = keys.into();
        if keys.is_empty() {
            return Err(GateError::InvalidArgument(
                "Add needs at least one key".to_string(),
            ));
        }
        self.check_keys(keys.slices())?;
        Ok((namespace, keys))
    }

    /// A reported absence's namespace, its key validated alike for either write path.
    fn absence_request(
        &self,
        namespace: &str,
        report: &AbsenceReport,
    ) -> Result<&Arc<Namespace>, GateError> {
        let namespace = self.namespace(namespace)?;
        self.check_key(&report.key, None)?;
        Ok(namespace)
    }

    /// Can `key` exist in `namespace`? Returns the answer and the seq it reflects.
    pub fn may_exist(&self, namespace: &str, key: &[u8]) -> Result<(Lookup, u64), GateError> {
        let entry = self.entry(namespace)?;
        self.check_key(key, None)?;
        let observed_seq = self.observed_seq(&entry.namespace);
        if !self.is_ready() {
            entry.warming_answers.increment(1);
            return Ok((Lookup::WARMING, observed_seq));
        }
        // The lease is read before the lookup: a renewal between the two cannot turn a lookup made before
        // it into an ABSENT under the new lease (the state read after the check holds all the lease needs).
        let leased = self.absent_allowed();
        let lookup = entry.namespace.lookup(key, self.read_time());
        if lookup.answer == Answer::Absent && !leased {
            entry.lease_fail_opens.increment(1);
            return Ok((Lookup::WARMING, observed_seq));
        }
        Ok((lookup, observed_seq))
    }

    /// What a lookup now would report as its `observed_seq`: `namespace`'s latest applied seq, for a
    /// replica no later than the seq its copy of the log is vouched for through
    /// ([`ReadLease::observed_seq`]).
    pub fn current_seq(&self, namespace: &str) -> Result<u64, GateError> {
        Ok(self.observed_seq(&self.entry(namespace)?.namespace))
    }

    fn observed_seq(&self, namespace: &Namespace) -> u64 {
        let latest = namespace.latest_seq();
        self.lease
            .as_ref()
            .map_or(latest, |lease| lease.observed_seq(latest))
    }

    /// Answers for `keys` in order into `answers`; returns the seq they reflect.
    pub fn batch_may_exist<K: AsRef<[u8]>>(
        &self,
        namespace: &str,
        keys: &[K],
        answers: &mut Vec<Lookup>,
    ) -> Result<u64, GateError> {
        let entry = self.entry(namespace)?;
        self.check_keys(keys.iter().map(AsRef::as_ref))?;
        let observed_seq = self.observed_seq(&entry.namespace);
        if !self.is_ready() {
            entry.warming_answers.increment(keys.len() as u64);
            answers.clear();
            answers.resize(keys.len(), Lookup::WARMING);
            return Ok(observed_seq);
        }
        let leased = self.absent_allowed();
        entry.namespace.lookup_many(keys, self.read_time(), answers);
        if !leased {
            let absent = answers.iter_mut().filter(|l| l.answer == Answer::Absent);
            let failed_open = absent.map(|l| *l = Lookup::WARMING).count();
            entry.lease_fail_opens.increment(failed_open as u64);
        }
        Ok(observed_seq)
    }

    /// What a mirror of `namespace` starts from: its canonical name, the filter's hash and the filter as of a
    /// seq with every later `Add` ([`MirrorImage`]). Refused while the state loads: a filter still being
    /// replayed is not one to copy.
    pub fn mirror_image(
        &self,
        namespace: &str,
    ) -> Result<(Arc<str>, FilterHasher, MirrorImage), GateError> {
        let namespace = self.namespace(namespace)?;
        if !self.is_ready() {
            return Err(GateError::Unavailable(
                "the gate is still loading its state; attach the mirror once it serves".to_string(),
            ));
        }
        let image = namespace
            .mirror_image()
            .map_err(|stopped| GateError::Unavailable(stopped.to_string()))?;
        Ok((
            Arc::clone(namespace.name()),
            self.hasher.filter_hasher().clone(),
            image,
        ))
    }

    /// Subscribes to `namespace`'s invalidations after `after_seq`; returns the canonical name with it.
    pub fn subscribe(
        &self,
        namespace: &str,
        after_seq: u64,
    ) -> Result<(Arc<str>, Subscription), GateError> {
        let namespace = self.namespace(namespace)?;
        let max = self.limits.max_subscribers_per_namespace;
        let subscription = namespace.subscribe(after_seq, max).ok_or_else(|| {
            GateError::Exhausted(format!(
                "namespace {:?} has {max} subscribers, the limit (max_subscribers_per_namespace)",
                namespace.name()
            ))
        })?;
        Ok((Arc::clone(namespace.name()), subscription))
    }

    fn apply_logged(
        &self,
        mutation: Mutation,
        seqs: Seqs,
        new_keys: NewKeys,
    ) -> Result<Option<Applied>, String> {
        let namespace = self.namespace(mutation.namespace()).map_err(|_| {
            format!(
                "the log has mutations of namespace {:?}, which is not configured; add it back to the \
                 configuration (or move the data directory aside to start without it)",
                mutation.namespace()
            )
        })?;
        let (seq, latest) = (mutation.seq(), namespace.latest_seq());
        if seq <= latest {
            return Ok(None);
        }
        if seqs == Seqs::Contiguous && seq != latest + 1 {
            return Err(format!(
                "namespace {:?} jumps from seq {latest} to {seq}: mutations are missing from the log",
                mutation.namespace()
            ));
        }
        namespace
            .apply_with(mutation, new_keys)
            .map(Some)
            .map_err(|stopped| stopped.to_string())
    }

    /// Every namespace's state, copied (see [`NamespaceImage::detached`]), sorted by name. Consistent as of
    /// each namespace's seq only if nothing is applied meanwhile: the caller holds the log still.
    pub fn export_detached(&self) -> Result<Vec<NamespaceImage>, String> {
        let now = self.read_time();
        self.namespaces()
            .iter()
            .map(|n| n.export(now).map(NamespaceImage::detached))
            .collect::<Result<_, _>>()
            .map_err(|stopped| stopped.to_string())
    }

    /// The hasher's [`check_value`](KeyHasher::check_value), recorded in snapshots.
    pub fn hash_check(&self) -> u64 {
        self.hasher.check_value()
    }

    /// The times what is live is decided at: the gate's clock, or for a replica that and the time its stream
    /// has reached, each structure by the one that errs toward `MAY_EXIST` ([`ReadTime::agreed`]; see
    /// [`with_stream_time`](Self::with_stream_time)).
    pub fn read_time(&self) -> ReadTime {
        let local = self.clock.now_ms();
        self.stream_time
            .as_ref()
            .map_or(ReadTime::from(local), |stream| {
                ReadTime::agreed(local, stream.reached_ms())
            })
    }

    /// How the wall clock stands against the gate's clock, if that clock keeps its own time
    /// ([`Clock::check_wall`]).
    pub fn check_wall_clock(&self) -> Option<WallCheck> {
        self.clock.check_wall()
    }

    /// Frees dead windows and expired tombstones in every namespace.
    ///
    /// A replica frees windows only while it holds its lease. Until then the stream time it has applied
    /// may be any old message's — one a leader stamped two hours ahead before its clock was set right, read
    /// again by a replica that restarted on a clock of its own two hours ahead — and those two together
    /// would drop windows a current stamp keeps. Under a lease the latest message applied is at most a
    /// lease old, stamped by the stream's current leader, and [`ReadTime::agreed`] bounds each clock by the
    /// other. (Its lookups need no such rule: without a lease they answer no `ABSENT`.) A replica renews its
    /// lease only while it is used, so a tick without it asks for it, as a lookup would, and the windows are
    /// freed when it is granted ([`lease_granted`](Self::lease_granted)): a replica that takes no lookups
    /// would otherwise keep a window more every span, for ever.
    pub fn maintain(&self) {
        let now = self.read_time();
        let now = match &self.lease {
            Some(lease) if !lease.holds_at(lease.now()) => {
                self.windows_waiting.store(true, Ordering::Release);
                lease.holds();
                now.keeping_windows()
            }
            _ => now,
        };
        self.namespaces
            .values()
            .for_each(|e| e.namespace.maintain(now));
    }

    /// The replica's read lease was just granted: frees the windows a maintenance tick kept for want of it.
    pub fn lease_granted(&self) {
        if self.windows_waiting.swap(false, Ordering::AcqRel) {
            let now = self.read_time();
            self.namespaces
                .values()
                .for_each(|e| e.namespace.expire_windows(now));
        }
    }

    /// Figures of every namespace, sorted by name.
    pub fn stats(&self) -> Vec<NamespaceStats> {
        let now = self.read_time();
        self.namespaces().iter().map(|n| n.stats(now)).collect()
    }

    /// What a read of each namespace's whole state tells, by name: fill ratio and state digest, for `Stats`.
    pub fn scan(&self) -> HashMap<Arc<str>, Scan> {
        let now = self.read_time();
        self.namespaces()
            .iter()
            .map(|n| {
                let scan = Scan {
                    fill_ratio: n.fill_ratio(now),
                    digest: n.state_digest(now).ok(),
                };
                (Arc::clone(n.name()), scan)
            })
            .collect()
    }

    /// Publishes every namespace's gauges; returns the figures published (what [`stats`](Self::stats) says).
    pub fn export_gauges(&self) -> Vec<NamespaceStats> {
        let now = self.read_time();
        self.namespaces
            .values()
            .map(|e| e.namespace.export_gauges(now))
            .collect()
    }
}
