//! A replica: the gate fed by the shared [`MutationStream`], its writes published to it, and the read
//! lease and acknowledgement rule of the [`protocol`](super::protocol) that keep every replica from
//! answering a false `ABSENT`.
//!
//! ```text
//!  write RPC ─▶ prepare (validate, REDUNDANT/THROTTLED here) ─▶ publish(Nats-Msg-Id) ─▶ stream seq N
//!                                                                                       │
//!  applier: follow the stream ─▶ gate.apply_streamed + protocol.apply (in order) ◀──────┘
//!           └─▶ after each batch holding another process's write: report "incarnation I applied through
//!               N" on a core subject, to that writer alone (several writers: to all; see Protocol::recipients)
//!  write RPC answered when: applied here, and every member as of N reported N (or departed over a fallback
//!                           ago) — or lease × (1 + ρ) + margin after the publish ack (Protocol::ack)
//!  mirrors (with [mirrors] on): an Add counts as applied here — for this replica's acknowledgement and its
//!           reports — only once the mirrors holding sub-leases from it applied it (core::sublease, rule 3)
//!  lease keeper: every lease/4 — report to all; every quarter lease while lookups asked for the lease in the last
//!                30 s (or to catch up and join, or once a second as a probe) publish a barrier at t, stored
//!                at B; once applied through B as a member, ABSENT may be answered until t + lease. Joins
//!                once caught up; leaves at shutdown.
//! ```
//!
//! The argument is in [`protocol`](super::protocol); this module feeds it real events and real time (the
//! read lease's monotonic clock) and acts on its answers. Its parts, each a task or a path of the diagram:
//!
//! - this file: the replica's state, its options and what the server reads of it (members, applied seq,
//!   who shares snapshots, a still cut of the state for a snapshot).
//! - [`applier`]: following the stream and applying it in order; gaps explained.
//! - [`lease_keeper`]: reports, barriers, join and leave.
//! - [`peers`]: the other replicas' reports.
//! - [`history`]: history digests told and compared; a replica every other one differs from stops.
//! - [`writes`]: `Add` and `RecordAbsent` published, applied and acknowledged under the safety rule.
//! - [`add_queue`]: concurrent small `Add`s of one namespace merged into one message.
//! - [`health`]: whether the replica should take traffic ([`Lagging`]).

mod add_queue;
mod applier;
mod health;
mod history;
mod lease_keeper;
mod peers;
mod writes;

pub use health::Lagging;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
use tokio::sync::{oneshot, watch, Notify};

use self::peers::Peers;
use super::protocol::copy::MessageDigest;
use super::protocol::history::{History, HistoryDigest};
use super::protocol::{Incarnation, MemberRecord, Protocol, Timing, WriteId};
use super::stream::{MutationStream, StreamError};
use crate::core::gate::{Gate, GateError};
use crate::core::lease::ReadLease;
use crate::core::namespace::{Applied, NewKeys};
use crate::core::replicas::{LoggedRebuild, Replicas};
use crate::core::sublease::MirrorWait;
use crate::core::writes::Pending;
use crate::replicated_rebuild::ReplicatedRebuild;

/// How long a replica waits for its own applier to reach a write it published before answering
/// `UNAVAILABLE` (the write is stored and will apply; the replica is far behind or cut off).
const APPLY_WAIT: Duration = Duration::from_secs(10);
/// The pause before the first retry of a publish; doubled up to `MAX_RETRY_PAUSE`.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(50);
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(800);
/// A replica whose report arrived within this many lease lengths shares snapshots and holds back purges.
const RECENT_LEASES: u32 = 2;
/// How often an idle replica (no lookup asked for the lease) still publishes a barrier: what keeps its
/// health true while nobody asks it anything.
const PROBE: Duration = Duration::from_secs(1);
/// Reads of the membership at start before the replica gives up starting.
const MEMBERSHIP_READS: u32 = 3;
/// Added to the protocol's waits for clock granularity.
const MARGIN: Duration = Duration::from_millis(1);

/// How a replica takes part.
#[derive(Debug, Clone)]
pub struct ReplicaOptions {
    /// How it names itself in reports, metrics and logs.
    pub id: String,
    /// How long a sample of the stream's end lets it answer `ABSENT` (see the module docs).
    pub read_lease: Duration,
    /// Seqs behind the stream past which it reports itself lagging (not serving).
    pub max_lag: u64,
    /// ρ in parts per million: how much faster one replica's monotonic clock may run than another's.
    pub max_clock_drift_ppm: u64,
    /// Where this process runs (host and process id; the server adds its gRPC address): what a twin with
    /// the same id is told.
    pub origin: String,
}

pub use crate::core::replicas::MemberView;

/// The replica's series.
struct ReplicaMetrics {
    applied_seq: Gauge,
    lag_seqs: Gauge,
    lag_seconds: Gauge,
    lease_held: Gauge,
    peers: Gauge,
    applied: Counter,
    publish_ack: Histogram,
    apply_wait: Histogram,
    members_wait: Histogram,
    adds_per_message: Histogram,
    acked_by_lease: Counter,
    reports_to_writer: Counter,
    reports_to_all: Counter,
    publish_retries: Counter,
    skipped: Counter,
    read_failures: Counter,
    grace_waits: Counter,
    histories_same: Gauge,
    histories_differing: Gauge,
}

impl ReplicaMetrics {
    fn new() -> Self {
        Self {
            applied_seq: gauge!("existence_replica_applied_seq"),
            lag_seqs: gauge!("existence_replica_lag_seqs"),
            lag_seconds: gauge!("existence_replica_lag_seconds"),
            lease_held: gauge!("existence_replica_lease_held"),
            peers: gauge!("existence_replica_peers"),
            applied: counter!("existence_replica_applied_total"),
            publish_ack: histogram!("existence_replica_publish_ack_duration_seconds"),
            apply_wait: histogram!("existence_replica_apply_wait_duration_seconds"),
            members_wait: histogram!("existence_replica_members_wait_duration_seconds"),
            adds_per_message: histogram!("existence_replica_adds_per_message"),
            acked_by_lease: counter!("existence_replica_acked_by_lease_total"),
            reports_to_writer: counter!("existence_replica_reports_total", "to" => "writer"),
            reports_to_all: counter!("existence_replica_reports_total", "to" => "all"),
            publish_retries: counter!("existence_replica_publish_retries_total"),
            skipped: counter!("existence_replica_skipped_messages_total"),
            read_failures: counter!("existence_replica_stream_read_failures_total"),
            grace_waits: counter!("existence_replica_grace_waits_total"),
            histories_same: gauge!("existence_replica_histories_same"),
            histories_differing: gauge!("existence_replica_histories_differing"),
        }
    }
}

/// One replica of the deployment.
///
/// Lock order: `applying` (async, held across a batch's apply and by a snapshot's still cut) comes first;
/// every `std` mutex below — `protocol`, `history`, `waiting`, `stopped`, `last_read`, `last_barrier`,
/// `fresh_at`, `last_asked`, `caught_up_at`, `lease_lost_at` and those inside `peers` — is held briefly,
/// never across an await, and never while another of them is held: each is taken, read or written, and
/// let go before the next (a value needed from one is copied out first, as `heard_history` does with the
/// nonce). So no two of them can wait on each other, whatever order the tasks take them in. The read lease
/// (`lease`, atomics in the core) is set while `protocol` is held, and takes nothing of the replica's.
pub struct Replica {
    stream: MutationStream,
    gate: Arc<Gate>,
    lease: Arc<ReadLease>,
    options: ReplicaOptions,
    /// The stream seq applied through (stream records included).
    applied: watch::Sender<u64>,
    /// Whether a graceful stop is over: the leave published and applied here (or given up).
    left: watch::Sender<bool>,
    /// The newest stream last seq fetched.
    stream_seq: AtomicU64,
    /// When the applier last had everything fetched applied: what lag in time is measured from.
    caught_up_at: Mutex<Instant>,
    /// The protocol's state: membership, reports, barriers, the lease it grants. Locked briefly, never
    /// across an await; the lease it grants is copied into `lease` under the lock.
    protocol: Mutex<Protocol>,
    /// Woken when a report arrives or a batch is applied: writers waiting to acknowledge look again.
    progress: Notify,
    /// Woken by a lookup that found no lease: the keeper renews at once.
    wanted: Arc<Notify>,
    /// When the last barrier was acknowledged, and its seq: health's proof of freshness while no lookup
    /// asks for the lease.
    last_barrier: Mutex<Option<(Instant, u64)>>,
    /// When the newest barrier this replica has applied through was acknowledged: health's proof that it
    /// is caught up while no lookup keeps the lease renewed (a barrier acknowledged but not yet applied
    /// does not take that proof away).
    fresh_at: Mutex<Option<Instant>>,
    /// When a lookup last asked for the lease (as the lease keeper saw it).
    last_asked: Mutex<Option<Instant>>,
    /// Writes published by this replica and not yet applied here, by message id.
    waiting: Mutex<HashMap<String, Waiter>>,
    /// `Add`s waiting to be published together.
    adds: add_queue::AddQueue,
    /// This replica, for the tasks that publish its `Add`s.
    this: Weak<Replica>,
    /// The runtime it was made on (the process's main one), where those tasks run: a write can arrive on a
    /// RESP worker's own runtime, which ends with that worker's last connection at a drain, and would take
    /// with it the publish of other callers' `Add`s it had started (they were answered "the replica stopped
    /// before the write was acknowledged" in a rolling restart).
    runtime: Option<tokio::runtime::Handle>,
    peers: Peers,
    /// Message ids: this process's prefix (its id and nonce, see [`message_id_prefix`]), then a counter.
    id_prefix: String,
    next_id: AtomicU64,
    stopped: Mutex<Option<String>>,
    /// The message this process read last, by seq and digest: a new consumer must find it first.
    last_read: Mutex<Option<(u64, MessageDigest)>>,
    /// The digest of what it applied, and the others' (see [`history`]). Locked briefly, never with
    /// `protocol`.
    history: Mutex<History>,
    /// When (the lease's clock) it last told the others its history digest; 0: never.
    history_reported_at: AtomicU64,
    /// Since when the lease has not held (`None` while it holds).
    lease_lost_at: Mutex<Option<Instant>>,
    /// Held while a batch is applied: a snapshot holding it sees the state as of exactly the applied seq.
    applying: Arc<tokio::sync::Mutex<()>>,
    /// The mirrors attached to this replica, whose sub-leases hold back its `Add`s' acknowledgements and its
    /// reports of others' (rule 3 of [`crate::core::sublease`]); unset while mirrors are off. Its lock (the
    /// service's registry) is taken with none of the replica's held.
    mirrors: OnceLock<Arc<dyn MirrorWait>>,
    metrics: ReplicaMetrics,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.options.id)
            .field("applied", &self.applied_seq())
            .finish_non_exhaustive()
    }
}

/// A write published by this process and waiting to be applied here: told what applying it did, which
/// reports an `Add`'s new keys if it asks.
type Waiter = (oneshot::Sender<Option<Applied>>, NewKeys);

/// The start of every message id this process publishes under: `<replica id>:<nonce, 16 hex digits>:`.
/// The nonce makes it unique to the process (a restarted replica must not reuse the ids of its previous run
/// within the stream's duplicate window, or its new writes would be dropped), and tells every replica that
/// applies the message which process waits for its report, and which of its writes it is ([`write_id`]).
fn message_id_prefix(id: &str, nonce: u64) -> String {
    format!("{id}:{nonce:016x}")
}

/// The write published under id `message_id`: its writer's nonce and counter (`None` for an id of another
/// shape: an older build's, whose middle part is not its nonce, names no member, gets a report to all, and
/// counts for no acknowledgement). Read from the right, since a replica id may itself hold colons
/// (`host:port` by default).
pub(super) fn write_id(message_id: &str) -> Option<WriteId> {
    let mut parts = message_id.rsplitn(3, ':');
    let (counter, nonce, _id) = (parts.next()?, parts.next()?, parts.next()?);
    if nonce.len() != 16 {
        return None;
    }
    Some(WriteId {
        writer: u64::from_str_radix(nonce, 16).ok()?,
        counter: counter.parse().ok()?,
    })
}

impl Replica {
    /// A replica of `stream` applying into `gate` (built with `lease`), having applied nothing yet (see
    /// [`start_after`](Self::start_after)).
    pub fn new(
        stream: MutationStream,
        gate: Arc<Gate>,
        lease: Arc<ReadLease>,
        options: ReplicaOptions,
    ) -> Arc<Self> {
        let applied_seq = 0;
        let me = Incarnation {
            id: options.id.clone(),
            nonce: rand::random::<u64>(),
        };
        let id_prefix = message_id_prefix(&options.id, me.nonce);
        let timing = Timing {
            lease: options.read_lease.as_nanos() as u64,
            drift_ppm: options.max_clock_drift_ppm,
            margin: MARGIN.as_nanos() as u64,
        };
        let wanted = Arc::new(Notify::new());
        let wake = Arc::clone(&wanted);
        lease.on_wanted(move || wake.notify_one());
        Arc::new_cyclic(|this| Self {
            protocol: Mutex::new(Protocol::new(me, timing)),
            progress: Notify::new(),
            wanted,
            last_barrier: Mutex::new(None),
            last_asked: Mutex::new(None),
            fresh_at: Mutex::new(None),
            stream,
            gate,
            lease,
            id_prefix,
            options,
            applied: watch::Sender::new(applied_seq),
            left: watch::Sender::new(false),
            stream_seq: AtomicU64::new(applied_seq),
            caught_up_at: Mutex::new(Instant::now()),
            waiting: Mutex::new(HashMap::new()),
            adds: add_queue::AddQueue::new(gauge!("existence_replica_adds_waiting")),
            this: Weak::clone(this),
            runtime: tokio::runtime::Handle::try_current().ok(),
            peers: Peers::default(),
            next_id: AtomicU64::new(0),
            stopped: Mutex::new(None),
            last_read: Mutex::new(None),
            history: Mutex::new(History::start(0, None, 0)),
            history_reported_at: AtomicU64::new(0),
            lease_lost_at: Mutex::new(None),
            applying: Arc::default(),
            mirrors: OnceLock::new(),
            metrics: ReplicaMetrics::new(),
        })
    }

    /// Mirrors attach to this replica, kept by `mirrors`: from now on an `Add` counts as applied here (for
    /// this replica's acknowledgements and its reports to other writers) only once `mirrors` count it. Set
    /// once, at start, before the replica takes writes; a second call changes nothing.
    pub fn wait_for_mirrors(&self, mirrors: Arc<dyn MirrorWait>) {
        let _ = self.mirrors.set(mirrors);
    }

    /// Starts from a restored snapshot covering stream seq `seq` (before [`apply`](Self::apply) runs),
    /// reading the membership as of `seq` from the stream (see `MutationStream::membership_through`); the
    /// first consumer must deliver `last_read`, the message read last when the snapshot was taken, if known,
    /// and the history goes on from `history`, its digest at `seq`, if known.
    pub async fn start_after(
        &self,
        seq: u64,
        last_read: Option<(u64, MessageDigest)>,
        history: Option<HistoryDigest>,
    ) -> Result<(), StreamError> {
        let members = if seq == 0 {
            Default::default()
        } else {
            self.membership_through(seq).await?
        };
        self.protocol().start_after(seq, members, self.lease.now());
        *self.last_read.lock().unwrap_or_else(|e| e.into_inner()) = last_read;
        *self.history() = History::start(seq, history, self.lease.now());
        self.applied.send_replace(seq);
        self.stream_seq.fetch_max(seq, Ordering::AcqRel);
        Ok(())
    }

    /// The membership as of `seq`, read again (a few times) after a read that could not complete: a
    /// server's copy that lags or differs from the quorum's is passed over by the next read.
    async fn membership_through(
        &self,
        seq: u64,
    ) -> Result<super::protocol::Membership, StreamError> {
        let mut pause = FIRST_RETRY_PAUSE;
        let mut attempts = 1;
        loop {
            let read = self
                .stream
                .membership_through(seq, &self.options.id, self.nonce())
                .await;
            match read {
                Err(StreamError::Read(reason)) if attempts < MEMBERSHIP_READS => {
                    tracing::warn!(%reason, "reading the membership again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_RETRY_PAUSE);
                    attempts += 1;
                }
                read => return read,
            }
        }
    }

    fn protocol(&self) -> std::sync::MutexGuard<'_, Protocol> {
        self.protocol.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This process's nonce: what tells it apart from any other process using its replica id.
    pub fn nonce(&self) -> u64 {
        self.protocol().me().nonce
    }

    /// The members as of the applied seq, by id.
    pub fn members(&self) -> Vec<MemberView> {
        let protocol = self.protocol();
        protocol
            .members()
            .iter()
            .map(|(id, m)| MemberView {
                id: id.clone(),
                nonce: m.nonce,
                joined: m.joined,
                origin: m.origin.clone(),
                reported: protocol.reported(m.nonce),
                this_replica: m.nonce == protocol.me().nonce,
            })
            .collect()
    }

    /// Publishes an operator's removal of replica `id`; the seq it was stored at.
    pub async fn remove_member(&self, id: &str) -> Result<u64, GateError> {
        let record = MemberRecord::Remove { id: id.to_string() };
        let seq = self
            .stream
            .publish_member(&record)
            .await
            .map_err(unavailable)?;
        tracing::warn!(seq, replica = %id, "replica removed from the membership by an operator");
        Ok(seq)
    }

    /// The least seq applied by every replica heard from within `within` (this one included); 0 until this
    /// replica has listened to the others for that long (before, it may not have heard them all).
    pub fn applied_everywhere(&self, within: Duration) -> u64 {
        let listening = *self
            .peers
            .listening_since
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if listening.is_none_or(|since| since.elapsed() < within) {
            return 0;
        }
        self.peers
            .slowest(within)
            .unwrap_or(0)
            .min(self.applied_seq())
    }

    /// Whether this replica shares snapshots now: its id sorts first among the replicas heard from recently
    /// (see `replica_snapshots`).
    pub fn shares_snapshots(&self) -> bool {
        let recent = self.options.read_lease * RECENT_LEASES;
        self.peers
            .first_recent(recent)
            .is_none_or(|first| first >= self.options.id)
    }

    /// Runs `read` on the blocking pool while no mutation is applied, with the seq applied through: what it
    /// reads of the gate is the state as of exactly that seq, in every namespace (writes wait meanwhile).
    pub async fn while_still<T: Send + 'static>(
        &self,
        read: impl FnOnce(u64) -> T + Send + 'static,
    ) -> Result<T, String> {
        let still = Arc::clone(&self.applying).lock_owned().await;
        let applied = self.applied_seq();
        let read = tokio::task::spawn_blocking(move || {
            let _still = still;
            read(applied)
        });
        read.await
            .map_err(|panic| format!("reading the state failed: {panic}"))
    }

    /// The message this process read last: its seq and digest.
    pub fn last_read(&self) -> Option<(u64, MessageDigest)> {
        *self.last_read.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The digest of the history applied through the applied seq, if known ([`history`]).
    pub fn history_digest(&self) -> Option<HistoryDigest> {
        self.history().digest()
    }

    /// Whether, within `within`, what this process applied through `seq` comes to be vouched for by one of
    /// its barriers read as sent ([`Protocol::checked_through`]); `false` on a divergence or the time out.
    /// A barrier comes every quarter lease while lookups want the lease, else every [`PROBE`].
    pub async fn vouched_through(&self, seq: u64, within: Duration) -> bool {
        let vouched = self.protocol_says(|protocol| match protocol.checked_through() {
            Some(checked) if checked >= seq => Some(true),
            None => Some(false),
            Some(_) => None,
        });
        tokio::time::timeout(within, vouched).await.unwrap_or(false)
    }

    /// Returns once this process has found that what it read is not the quorum's history (see
    /// [`Protocol::diverged`]): its snapshots may hold that history, and must not be loaded again.
    pub async fn diverged(&self) {
        self.protocol_says(|protocol| protocol.diverged().map(|_| ()))
            .await
    }

    /// What `answer` first says of the protocol, asked again after each batch applied (see `settle`).
    async fn protocol_says<T>(&self, mut answer: impl FnMut(&Protocol) -> Option<T>) -> T {
        loop {
            let changed = self.progress.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if let Some(said) = answer(&self.protocol()) {
                return said;
            }
            changed.await;
        }
    }

    /// The stream seq applied through.
    pub fn applied_seq(&self) -> u64 {
        *self.applied.borrow()
    }

    /// The stream.
    pub fn stream(&self) -> &MutationStream {
        &self.stream
    }

    /// Waits until the replica has applied through `seq`, at most `bound`; whether it has.
    pub async fn wait_applied(&self, seq: u64, bound: Duration) -> bool {
        let mut applied = self.applied.subscribe();
        tokio::time::timeout(bound, applied.wait_for(|applied| *applied >= seq))
            .await
            .is_ok_and(|reached| reached.is_ok())
    }

    /// The gate it applies into.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }
}

/// What the Admin service asks of a replica: its members, an operator's removal, a rebuild through the
/// stream.
impl Replicas for Replica {
    fn applied_seq(&self) -> u64 {
        Replica::applied_seq(self)
    }

    fn members(&self) -> Vec<MemberView> {
        Replica::members(self)
    }

    fn remove_member<'a>(&'a self, id: &'a str) -> Pending<'a, Result<u64, GateError>> {
        Box::pin(Replica::remove_member(self, id))
    }

    fn begin_rebuild(
        self: Arc<Self>,
        namespace: String,
    ) -> Pending<'static, Result<Box<dyn LoggedRebuild>, GateError>> {
        Box::pin(async move {
            let rebuild = ReplicatedRebuild::begin(self, &namespace).await?;
            Ok(Box::new(rebuild) as Box<dyn LoggedRebuild>)
        })
    }
}

impl Replica {
    /// Hands lookups what `protocol` grants now: the lease's end, and the seq through which its copy of the
    /// stream is vouched for ([`Protocol::checked_through`]), which bounds the `observed_seq` answers claim
    /// ([`ReadLease::observed_seq`]).
    fn hand_lease(&self, protocol: &Protocol) {
        self.lease
            .set_vouched_seq(protocol.checked_through().unwrap_or(0));
        self.lease.set_until(protocol.lease_until());
    }
}

fn unavailable(error: StreamError) -> GateError {
    GateError::Unavailable(format!("NATS: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_id_names_its_writers_nonce_and_counter_whatever_the_replica_id_holds() {
        for id in ["r0", "gate-7:50051", "a:b:c", ""] {
            let message_id = format!("{}:{}", message_id_prefix(id, 0xfeed_0000_0000_0001), 42);
            assert_eq!(
                write_id(&message_id),
                Some(WriteId {
                    writer: 0xfeed_0000_0000_0001,
                    counter: 42
                }),
                "{id:?}"
            );
        }
        assert_eq!(write_id("r0:42"), None);
        assert_eq!(write_id("r0:xyz:42"), None);
        assert_eq!(write_id("r0:0000000000000zz1:42"), None);
        assert_eq!(write_id("r0:0000000000000001:x"), None);
    }
}
