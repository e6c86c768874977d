//! A replica: the gate fed by the shared [`MutationStream`], its writes published to it, and the read
//! lease and acknowledgement rule of the [`protocol`](super::protocol) that keep every replica from
//! answering a false `ABSENT`.
//!
//! ```text
//!  write RPC ─▶ prepare (validate, REDUNDANT/THROTTLED here) ─▶ publish(Nats-Msg-Id) ─▶ stream seq N
//!                                                                                       │
//!  applier: follow the stream ─▶ gate.apply_streamed + protocol.apply (in order) ◀──────┘
//!           └─▶ after each batch: report "incarnation I applied through N" on a core subject
//!  write RPC answered when: applied here, and every member as of N reported N (or departed over a fallback
//!                           ago) — or lease × (1 + ρ) + margin after the publish ack (Protocol::ack)
//!  lease keeper: every lease/4 — report; every quarter lease while lookups asked for the lease in the last
//!                30 s (or to catch up and join, or once a second as a probe) publish a barrier at t, stored
//!                at B; once applied through B as a member, ABSENT may be answered until t + lease. Joins
//!                once caught up; leaves at shutdown.
//! ```
//!
//! The argument is in [`protocol`](super::protocol); this module feeds it real events and real time (the
//! read lease's monotonic clock) and acts on its answers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
use tokio::sync::{oneshot, watch, Notify};

use super::protocol::{Ack, Cause, Incarnation, MemberRecord, Protocol, Standing, Timing};
use super::snapshot_store::oldest_retained;
use super::stream::{AppliedReport, MutationStream, StreamError, Streamed};
use crate::core::gate::{Gate, GateError};
use crate::core::lease::ReadLease;
use crate::core::log::Mutation;
use crate::core::namespace::{Absence, AbsenceReport, Added, Applied, RecordOutcome, Recorded};
use crate::core::writes::{Pending, Writes};

/// How long a replica waits for its own applier to reach a write it published before answering
/// `UNAVAILABLE` (the write is stored and will apply; the replica is far behind or cut off).
const APPLY_WAIT: Duration = Duration::from_secs(10);
/// How long a publish is retried (with the same message id, so it is stored once) before the write is
/// refused: covers a stream leader election (a few seconds on a LAN).
const PUBLISH_RETRY_FOR: Duration = Duration::from_secs(8);
/// The pause before the first retry of a publish; doubled up to `MAX_RETRY_PAUSE`.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(50);
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(800);
/// How long the applier waits for a message, while the stream is known to hold more, before it follows
/// the stream again with a new consumer. A replica paused longer than the server keeps an idle ordered
/// consumer finds it gone, and this is how long it then fails open before it catches up: with 2 s, a
/// replica stopped for 70 s took 2.1 s to catch up on 4,000 Adds (`cargo bench --bench replicated`); a
/// needless re-follow costs one consumer creation.
const STALL: Duration = Duration::from_millis(500);
/// Messages the applier takes from the stream at once when they are waiting (one report per batch).
const APPLY_BATCH: usize = 256;
/// A replica whose report arrived within this many lease lengths shares snapshots and holds back purges.
const RECENT_LEASES: u32 = 2;
/// A replica not heard from for this long is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(3600);
/// How often an idle replica (no lookup asked for the lease) still publishes a barrier: what keeps its
/// health true while nobody asks it anything.
const PROBE: Duration = Duration::from_secs(1);
/// How long after the last lookup that asked for the lease it is still renewed every quarter lease: a caller
/// with a lookup every few seconds finds it held, and an idle replica publishes only the probe.
const IN_USE: Duration = Duration::from_secs(30);
/// Added to the protocol's waits for clock granularity.
const MARGIN: Duration = Duration::from_millis(1);
/// How long a graceful stop waits for its leave to be stored.
const LEAVE_WAIT: Duration = Duration::from_secs(2);

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

/// A member as a replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    /// Its `--replica-id`.
    pub id: String,
    /// Its process's nonce.
    pub nonce: u64,
    /// The seq of its join.
    pub joined: u64,
    /// Where it runs.
    pub origin: String,
    /// The applied seq it last reported here.
    pub reported: u64,
    /// Whether it is this replica.
    pub this_replica: bool,
}

/// Why a replica should not be sent traffic now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lagging {
    /// Behind the stream by more than `--max-lag`.
    Behind { applied: u64, stream: u64, max: u64 },
    /// No read lease: it cannot confirm it has the stream's end (NATS unreachable, or still catching up).
    NoLease { applied: u64, stream: u64 },
    /// The applier stopped on an error it cannot get past.
    Stopped(String),
    /// Not a member: another process joined with this replica's id.
    Displaced { id: String, seq: u64, by: String },
    /// Not a member: an operator removed it.
    Removed { id: String, seq: u64 },
}

impl std::fmt::Display for Lagging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Behind { applied, stream, max } => write!(
                f,
                "applied through seq {applied}, the stream is at {stream}: {} behind (--max-lag {max})",
                stream - applied
            ),
            Self::NoLease { applied, stream } => write!(
                f,
                "no read lease (applied through seq {applied}, stream last seen at {stream}): lookups fail \
                 open until the replica confirms it has applied the stream's end (still catching up, NATS \
                 unreachable, or too busy to renew the lease)"
            ),
            Self::Stopped(reason) => write!(f, "stopped applying the stream: {reason}"),
            Self::Displaced { id, seq, by } => write!(
                f,
                "another process joined as replica {id:?} at seq {seq} ({by}): two processes use one \
                 --replica-id, so this one answers no ABSENT; give each replica its own id and restart it"
            ),
            Self::Removed { id, seq } => write!(
                f,
                "replica {id:?} was removed from the membership at seq {seq} (existence-gate replicas \
                 remove): it answers no ABSENT; restart it to join again"
            ),
        }
    }
}

/// What the other replicas last said, by replica id: applied seq and when it was heard.
#[derive(Debug, Default)]
struct Peers {
    heard: Mutex<HashMap<String, (u64, Instant)>>,
    changed: Notify,
    /// Since when the reports have been heard without a break.
    listening_since: Mutex<Option<Instant>>,
}

impl Peers {
    fn heard(&self, report: AppliedReport) {
        let now = Instant::now();
        let mut heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        // Overwritten, not raised: one replica's reports arrive in order, and a restarted replica reports
        // from where it starts again (0 while it loads, which must hold back purges).
        heard.insert(report.replica, (report.seq, now));
        heard.retain(|_, (_, at)| now.duration_since(*at) < FORGET_AFTER);
        drop(heard);
        self.changed.notify_waiters();
    }

    /// Records since when reports are heard without a break (`None`: they are not).
    fn listening(&self, since: Option<Instant>) {
        *self
            .listening_since
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = since;
    }

    /// The replicas heard from within `within`: (id, applied seq).
    fn within(&self, within: Duration) -> Vec<(String, u64)> {
        let now = Instant::now();
        let heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        heard
            .iter()
            .filter(|(_, (_, at))| now.duration_since(*at) < within)
            .map(|(id, (applied, _))| (id.clone(), *applied))
            .collect()
    }

    /// The least applied seq heard from within `recent`.
    fn slowest(&self, recent: Duration) -> Option<u64> {
        self.within(recent)
            .into_iter()
            .map(|(_, applied)| applied)
            .min()
    }

    /// The smallest id heard from within `recent`.
    fn first_recent(&self, recent: Duration) -> Option<String> {
        self.within(recent).into_iter().map(|(id, _)| id).min()
    }
}

/// The replica's series.
struct ReplicaMetrics {
    applied_seq: Gauge,
    lag_seqs: Gauge,
    lag_seconds: Gauge,
    lease_held: Gauge,
    peers: Gauge,
    applied: Counter,
    publish_ack: Histogram,
    acked_by_lease: Counter,
    publish_retries: Counter,
    skipped: Counter,
    read_failures: Counter,
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
            acked_by_lease: counter!("existence_replica_acked_by_lease_total"),
            publish_retries: counter!("existence_replica_publish_retries_total"),
            skipped: counter!("existence_replica_skipped_messages_total"),
            read_failures: counter!("existence_replica_stream_read_failures_total"),
        }
    }
}

/// One replica of the deployment.
pub struct Replica {
    stream: MutationStream,
    gate: Arc<Gate>,
    lease: Arc<ReadLease>,
    options: ReplicaOptions,
    /// The stream seq applied through (stream records included).
    applied: watch::Sender<u64>,
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
    waiting: Mutex<HashMap<String, oneshot::Sender<Option<Applied>>>>,
    peers: Peers,
    /// Message ids: this process's random prefix, then a counter (a restarted replica must not reuse the
    /// ids of its previous run within the stream's duplicate window, or its new writes would be dropped).
    id_prefix: String,
    next_id: AtomicU64,
    stopped: Mutex<Option<String>>,
    /// Since when the lease has not held (`None` while it holds).
    lease_lost_at: Mutex<Option<Instant>>,
    /// Held while a batch is applied: a snapshot holding it sees the state as of exactly the applied seq.
    applying: Arc<tokio::sync::Mutex<()>>,
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
        let timing = Timing {
            lease: options.read_lease.as_nanos() as u64,
            drift_ppm: options.max_clock_drift_ppm,
            margin: MARGIN.as_nanos() as u64,
        };
        let wanted = Arc::new(Notify::new());
        let wake = Arc::clone(&wanted);
        lease.on_wanted(move || wake.notify_one());
        Arc::new(Self {
            protocol: Mutex::new(Protocol::new(me, timing)),
            progress: Notify::new(),
            wanted,
            last_barrier: Mutex::new(None),
            last_asked: Mutex::new(None),
            fresh_at: Mutex::new(None),
            stream,
            gate,
            lease,
            id_prefix: format!("{}:{:016x}", options.id, rand::random::<u64>()),
            options,
            applied: watch::Sender::new(applied_seq),
            stream_seq: AtomicU64::new(applied_seq),
            caught_up_at: Mutex::new(Instant::now()),
            waiting: Mutex::new(HashMap::new()),
            peers: Peers::default(),
            next_id: AtomicU64::new(0),
            stopped: Mutex::new(None),
            lease_lost_at: Mutex::new(None),
            applying: Arc::default(),
            metrics: ReplicaMetrics::new(),
        })
    }

    /// Starts from a restored snapshot covering stream seq `seq` (before [`apply`](Self::apply) runs),
    /// reading the membership as of `seq` from the stream (see `MutationStream::membership_through`).
    pub async fn start_after(&self, seq: u64) -> Result<(), StreamError> {
        let members = if seq == 0 {
            Default::default()
        } else {
            let nonce = self.nonce();
            self.stream
                .membership_through(seq, &self.options.id, nonce)
                .await?
        };
        self.protocol().start_after(seq, members);
        self.applied.send_replace(seq);
        self.stream_seq.fetch_max(seq, Ordering::AcqRel);
        Ok(())
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

    /// Applies the stream from where the replica stands until `stop` resolves, following again after a
    /// read error; returns early (recording why) only if a message cannot be applied at all.
    pub async fn apply(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let mut pause = FIRST_RETRY_PAUSE;
        loop {
            let followed = tokio::select! {
                () = &mut stop => return,
                followed = self.follow_once() => followed,
            };
            match followed {
                Err(StreamError::Read(reason)) | Err(StreamError::Unreachable(reason)) => {
                    tracing::warn!(%reason, applied = self.applied_seq(), "following the stream again");
                    self.metrics.read_failures.increment(1);
                }
                Err(fatal) => {
                    let reason = fatal.to_string();
                    tracing::error!(%reason, "this replica stops applying the stream; restart it");
                    *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
                    return;
                }
                Ok(()) => pause = FIRST_RETRY_PAUSE,
            }
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(MAX_RETRY_PAUSE);
        }
    }

    /// Follows the stream after the applied seq until it ends or fails.
    async fn follow_once(&self) -> Result<(), StreamError> {
        let follow = self.stream.follow(self.applied_seq()).await?;
        let mut batches = std::pin::pin!(follow.ready_chunks(APPLY_BATCH));
        loop {
            let batch = match tokio::time::timeout(STALL, batches.next()).await {
                Ok(Some(batch)) => batch,
                Ok(None) => return Ok(()),
                Err(_) => {
                    self.check_not_stalled()?;
                    continue;
                }
            };
            let applying = self.applying.lock().await;
            let gap = self.apply_in_order(batch)?;
            drop(applying);
            self.settle();
            self.report().await;
            if let Some(missing) = gap {
                return Err(self.explain_gap(missing).await);
            }
        }
    }

    /// After `STALL` without a message: an error (so the stream is followed again with a new consumer) if
    /// the stream is known to hold more than was applied. A consumer whose server died (a NATS leader lost)
    /// can otherwise stay silent for many heartbeats.
    fn check_not_stalled(&self) -> Result<(), StreamError> {
        let (applied, stream) = (self.applied_seq(), self.stream_seq.load(Ordering::Acquire));
        if stream <= applied {
            return Ok(());
        }
        Err(StreamError::Read(format!(
            "the stream's consumer delivered nothing for {STALL:?} while the stream holds seq {stream} and \
             this replica has applied {applied}"
        )))
    }

    /// Applies `batch` in order; stops at a gap in stream seqs, returning the seqs missing (first, last).
    fn apply_in_order(
        &self,
        batch: Vec<Result<Streamed, StreamError>>,
    ) -> Result<Option<(u64, u64)>, StreamError> {
        for read in batch {
            let read = read?;
            let next = self.applied_seq() + 1;
            if read.seq > next {
                return Ok(Some((next, read.seq - 1)));
            }
            self.apply_one(read)?;
        }
        Ok(None)
    }

    /// Why the stream skipped `first..=last`, and what to do: if the stream still holds `first`, the consumer
    /// lost it (following again from the applied seq reads it). If not, either a purge removed it — purges
    /// reach only seqs at or below the oldest snapshot the bucket retains, and that index is written before
    /// the purge — and only a newer snapshot can replace it; or the messages were deleted one by one (junk an
    /// operator removed), which every replica passes over alike.
    async fn explain_gap(&self, (first, last): (u64, u64)) -> StreamError {
        match self.stream.holds(first).await {
            Ok(true) => StreamError::Read(format!(
                "the stream's consumer skipped seq {first}, which the stream holds; reading it again"
            )),
            Ok(false) => match oldest_retained(&self.stream).await {
                Ok(Some(oldest)) if first <= oldest => StreamError::Setup(format!(
                    "the JetStream stream {:?} no longer holds seq {first}: the mutations after seq {} were \
                     purged (covered by a shared snapshot) before this replica applied them; restart it to \
                     load the newest snapshot",
                    self.stream.name(),
                    first - 1
                )),
                Ok(_) => {
                    self.pass_over_deleted(first, last);
                    StreamError::Read(format!(
                        "seqs {first} to {last} were deleted from the stream (not purged: no retained snapshot \
                         covers them); passed over, following on"
                    ))
                }
                Err(error) => error,
            },
            Err(error) => error,
        }
    }

    /// Counts `first..=last`, deleted from the stream, as applied.
    fn pass_over_deleted(&self, first: u64, last: u64) {
        self.metrics.skipped.increment(last - first + 1);
        tracing::error!(first, last, "messages deleted from the stream; passed over");
        let mut protocol = self.protocol();
        protocol.apply(last, None, self.lease.now());
        drop(protocol);
        self.applied.send_replace(last);
    }

    /// Applies the message after the applied seq (an earlier one, read again, is skipped).
    fn apply_one(&self, read: Streamed) -> Result<(), StreamError> {
        if read.seq <= self.applied_seq() {
            return Ok(());
        }
        if let Some(junk) = &read.junk {
            // Every replica reads the same message and passes it over alike: the state stays the same everywhere.
            self.metrics.skipped.increment(1);
            tracing::error!(
                seq = read.seq,
                %junk,
                "passed over a message of the stream that no existence-gate replica wrote; only replicas \
                 should have publish rights on the stream's subjects (README, Scaling out)"
            );
        }
        let outcome = match read.mutation {
            Some(mutation) => {
                self.metrics.applied.increment(1);
                self.gate.apply_streamed(mutation).map_err(|reason| {
                    StreamError::Setup(format!("message {}: {reason}", read.seq))
                })?
            }
            None => None,
        };
        if read.member.is_some() {
            tracing::info!(seq = read.seq, record = ?read.member, "membership changed");
        }
        let mut protocol = self.protocol();
        protocol.apply(read.seq, read.member.as_ref(), self.lease.now());
        self.lease.set_until(protocol.lease_until());
        drop(protocol);
        self.applied.send_replace(read.seq);
        if let Some(waiter) = read.id.and_then(|id| {
            self.waiting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id)
        }) {
            let _ = waiter.send(outcome);
        }
        Ok(())
    }

    /// Tells the other replicas how far this one has applied; whether the report was sent.
    async fn report(&self) -> bool {
        let sent = self
            .stream
            .report_applied(&self.options.id, self.nonce(), self.applied_seq())
            .await;
        if let Err(error) = &sent {
            tracing::debug!(%error, "an applied-seq report was not sent");
        }
        sent.is_ok()
    }

    /// After a batch (or a barrier's acknowledgement): the protocol grants what it now may, and writers
    /// waiting to acknowledge look again.
    fn settle(&self) {
        let mut protocol = self.protocol();
        protocol.settle(self.lease.now());
        self.lease.set_until(protocol.lease_until());
        drop(protocol);
        let last_barrier = *self.last_barrier.lock().unwrap_or_else(|e| e.into_inner());
        match last_barrier {
            Some((at, seq)) if seq <= self.applied_seq() => {
                *self.caught_up_at.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                let mut fresh = self.fresh_at.lock().unwrap_or_else(|e| e.into_inner());
                *fresh = Some(fresh.map_or(at, |earlier| earlier.max(at)));
            }
            Some(_) => {}
            None => *self.caught_up_at.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now(),
        }
        self.progress.notify_waiters();
    }

    /// Every lease/4 until `stop`: report; publish a barrier when the lease is wanted (see [`Self::renew`]);
    /// join once caught up. At `stop`, leave.
    pub async fn keep_lease(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let mut ticks = tokio::time::interval(self.options.read_lease / 4);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut stop => return self.leave().await,
                _ = ticks.tick() => {}
                () = self.wanted.notified() => {}
            }
            self.report().await;
            if self.wants_barrier() {
                self.renew().await;
            }
            self.join_if_caught_up().await;
        }
    }

    /// Whether to publish a barrier now: while lookups have asked for the lease within [`IN_USE`] and less
    /// than three quarters of it are left (every tick: a renewal delayed by a busy machine still lands
    /// before the lease ends — renewing at half the lease let 0.2-0.9% of batch lookups fail open with both
    /// cores saturated), while not a member yet (to catch up and join), and once per [`PROBE`] in any case.
    fn wants_barrier(&self) -> bool {
        let mut last_asked = self.last_asked.lock().unwrap_or_else(|e| e.into_inner());
        if self.lease.take_asked() {
            *last_asked = Some(Instant::now());
        }
        let asked = last_asked.is_some_and(|at| at.elapsed() < IN_USE);
        drop(last_asked);
        let protocol = self.protocol();
        let renew_below = protocol.timing().lease / 4 * 3;
        let short = protocol.lease_until() < self.lease.now().saturating_add(renew_below);
        let joining = *protocol.standing() == Standing::Joining;
        drop(protocol);
        let probe_due = self
            .last_barrier
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none_or(|(at, _)| at.elapsed() >= PROBE);
        (asked && short) || joining || probe_due
    }

    /// Publishes a barrier and hands its seq to the protocol, which grants the lease once it is applied.
    async fn renew(&self) {
        let sent = self.lease.now();
        let barrier = self.stream.publish_barrier(&self.options.id, self.nonce());
        match tokio::time::timeout(self.options.read_lease, barrier).await {
            Ok(Ok(seq)) => {
                self.stream_seq.fetch_max(seq, Ordering::AcqRel);
                *self.last_barrier.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((Instant::now(), seq));
                self.protocol().barrier_acked(sent, seq, self.lease.now());
                self.settle();
            }
            Ok(Err(error)) => tracing::debug!(%error, "no lease barrier: the publish failed"),
            Err(_) => tracing::debug!("no lease barrier: not acknowledged within the read lease"),
        }
    }

    /// Publishes this process's join once it has caught up with the stream (applied a barrier).
    async fn join_if_caught_up(&self) {
        if !self.protocol().should_join() {
            return;
        }
        let record = MemberRecord::Join {
            id: self.options.id.clone(),
            nonce: self.nonce(),
            origin: self.options.origin.clone(),
        };
        match self.stream.publish_member(&record).await {
            Ok(seq) => {
                tracing::info!(seq, replica = %self.options.id, "joined the replicas");
                // Applied by the applier like any message; until then the join is retried each tick only if
                // it is still not a member, which a second stored join of the same nonce does not change.
                let _ = self.wait_applied(seq, APPLY_WAIT).await;
            }
            Err(error) => tracing::warn!(%error, "the join was not published; trying again"),
        }
    }

    /// A graceful stop: answer no `ABSENT` from now on, then publish the leave, so writers stop waiting for
    /// this process's reports without waiting the fallback each.
    async fn leave(&self) {
        let record = {
            let mut protocol = self.protocol();
            let record = protocol.leave();
            self.lease.set_until(protocol.lease_until());
            record
        };
        let Some(record) = record else { return };
        match tokio::time::timeout(LEAVE_WAIT, self.stream.publish_member(&record)).await {
            Ok(Ok(seq)) => tracing::info!(seq, "left the replicas"),
            Ok(Err(error)) => tracing::warn!(%error, "the leave was not published: writers wait the fallback for this replica until it restarts or is removed"),
            Err(_) => tracing::warn!("the leave was not acknowledged within {LEAVE_WAIT:?}: writers wait the fallback for this replica until it restarts or is removed"),
        }
    }

    fn heard(&self, report: AppliedReport) {
        self.protocol().heard(report.nonce, report.seq);
        self.peers.heard(report);
        self.progress.notify_waiters();
    }

    /// Listens to the other replicas' reports until `stop`.
    pub async fn hear_peers(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        loop {
            let reports = tokio::select! {
                () = &mut stop => return,
                reports = self.stream.applied_reports() => reports,
            };
            match reports {
                Ok(reports) => {
                    self.peers.listening(Some(Instant::now()));
                    let mut reports = std::pin::pin!(reports);
                    loop {
                        tokio::select! {
                            () = &mut stop => return,
                            report = reports.next() => match report {
                                Some(report) => self.heard(report),
                                None => break,
                            },
                        }
                    }
                    self.peers.listening(None);
                }
                Err(error) => tracing::warn!(%error, "cannot hear the other replicas; retrying"),
            }
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(MAX_RETRY_PAUSE) => {}
            }
        }
    }

    /// Why the replica should not take traffic now, if it should not; refreshes its gauges.
    pub fn lagging(&self) -> Option<Lagging> {
        let (applied, stream) = (self.applied_seq(), self.stream_seq.load(Ordering::Acquire));
        let stream = stream.max(applied);
        let held = self.lease.holds_at(self.lease.now());
        let lag_time = if stream > applied {
            self.caught_up_at
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .elapsed()
        } else {
            Duration::ZERO
        };
        let (standing, members) = {
            let protocol = self.protocol();
            (
                protocol.standing().clone(),
                protocol.members().iter().count(),
            )
        };
        self.metrics.applied_seq.set(applied as f64);
        self.metrics.lag_seqs.set((stream - applied) as f64);
        self.metrics.lag_seconds.set(lag_time.as_secs_f64());
        self.metrics.lease_held.set(f64::from(u8::from(held)));
        self.metrics.peers.set(members as f64);
        if let Some(reason) = self
            .stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Some(Lagging::Stopped(reason));
        }
        let id = self.options.id.clone();
        match standing {
            Standing::Departed {
                seq,
                cause: Cause::Displaced(by),
            } => return Some(Lagging::Displaced { id, seq, by }),
            Standing::Departed {
                seq,
                cause: Cause::Removed,
            } => return Some(Lagging::Removed { id, seq }),
            Standing::Departed {
                cause: Cause::Left, ..
            } => {
                return Some(Lagging::Stopped(
                    "left the replicas (shutting down)".to_string(),
                ))
            }
            Standing::Joining | Standing::Member { .. } => {}
        }
        if stream - applied > self.options.max_lag {
            return Some(Lagging::Behind {
                applied,
                stream,
                max: self.options.max_lag,
            });
        }
        // Called whether or not the lease holds: that is what ends a blip.
        let blip = self.lease_blip(held);
        let fresh = held || self.recently_fresh();
        (!fresh && !blip).then_some(Lagging::NoLease { applied, stream })
    }

    /// Whether, though no lookup keeps the lease renewed, a member applied through a barrier acknowledged
    /// within the last two probes: it would get a lease at the first lookup.
    fn recently_fresh(&self) -> bool {
        let member = matches!(self.protocol().standing(), Standing::Member { .. });
        let fresh = *self.fresh_at.lock().unwrap_or_else(|e| e.into_inner());
        member && fresh.is_some_and(|at| at.elapsed() < PROBE * 2)
    }

    /// Whether a lease that held before has been lost for less than one lease length: the renewal is late
    /// (a busy machine), which lookups answer by failing open, but which is not worth turning a load
    /// balancer away for. Before the first lease there is no blip: the replica is not caught up.
    fn lease_blip(&self, held: bool) -> bool {
        let mut lost_at = self.lease_lost_at.lock().unwrap_or_else(|e| e.into_inner());
        if held {
            *lost_at = None;
            return false;
        }
        let since = *lost_at.get_or_insert_with(Instant::now);
        self.lease.ever_held() && since.elapsed() < self.options.read_lease
    }

    /// `Add`: published, applied here, and acknowledged under the safety rule.
    pub async fn add(&self, namespace: &str, keys: Vec<Bytes>) -> Result<Added, GateError> {
        let mutation = self.gate.prepare_add(namespace, keys)?;
        let (seq, applied) = self.publish_and_apply(mutation).await?;
        let tombstones_cleared = match applied {
            Some(Applied::Added { tombstones_cleared }) => tombstones_cleared,
            _ => 0,
        };
        Ok(Added {
            seq,
            tombstones_cleared,
        })
    }

    /// `RecordAbsent`: decided here where it can be (`REDUNDANT`, `SUPERSEDED`, `THROTTLED` publish
    /// nothing), else published, and `RECORDED` or `SUPERSEDED` as applying it in stream order decides.
    pub async fn record_absent(
        &self,
        namespace: &str,
        report: AbsenceReport,
    ) -> Result<Recorded, GateError> {
        let mut latest_known = self.stream_seq.load(Ordering::Acquire);
        if report.observed_seq > latest_known {
            // Observed on a replica that sampled the stream more recently: ask the stream itself.
            latest_known = self.stream.last_seq().await.map_err(unavailable)?;
        }
        let (mutation, recorded) =
            match self.gate.prepare_absence(namespace, report, latest_known)? {
                Absence::Answered(recorded) => return Ok(recorded),
                Absence::Store { mutation, recorded } => (mutation, recorded),
            };
        let (seq, applied) = self.publish_and_apply(mutation).await?;
        Ok(match applied {
            Some(Applied::Superseded) => Recorded {
                outcome: RecordOutcome::Superseded,
                seq,
                expires_in_ms: 0,
            },
            _ => Recorded { seq, ..recorded },
        })
    }

    /// The gate it applies into.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// Publishes `mutation`, waits until this replica has applied it, then for the safety rule; returns its
    /// seq and what applying it did.
    pub(super) async fn publish_and_apply(
        &self,
        mutation: Mutation,
    ) -> Result<(u64, Option<Applied>), GateError> {
        let id = self.message_id()?;
        let (applied_tx, applied_rx) = oneshot::channel();
        let waiting = Waiting::register(&self.waiting, id.clone(), applied_tx);
        let published = self.publish_retrying(&mutation, &id).await?;
        let acked = self.lease.now();
        let applied = tokio::time::timeout(APPLY_WAIT, applied_rx)
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or_else(|| {
                GateError::Unavailable(format!(
                    "the write is stored in the JetStream stream {:?} at seq {} but this replica has not \
                     applied it within {APPLY_WAIT:?} (it is behind or cut off from NATS); it will apply \
                     everywhere, and retrying is safe",
                    self.stream.name(),
                    published
                ))
            })?;
        drop(waiting);
        self.wait_for_replicas(published, acked).await;
        Ok((published, applied))
    }

    /// Publishes `mutation` without waiting for any replica to apply it: for a step of a larger write whose
    /// last step is waited for.
    pub(super) async fn publish_unapplied(&self, mutation: &Mutation) -> Result<(), GateError> {
        let id = self.message_id()?;
        self.publish_retrying(mutation, &id).await.map(drop)
    }

    /// A message id no other write of any replica uses, or `UNAVAILABLE` while NATS is unreachable.
    fn message_id(&self) -> Result<String, GateError> {
        if !self.stream.connected() {
            return Err(GateError::Unavailable(format!(
                "NATS is unreachable: the write was not published to the JetStream stream {:?}; retry \
                 (lookups are still answered)",
                self.stream.name()
            )));
        }
        Ok(format!(
            "{}:{}",
            self.id_prefix,
            self.next_id.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Publishes with retries under one message id (a retry of a publish that was stored is dropped as a
    /// duplicate by the stream), for up to `PUBLISH_RETRY_FOR`.
    async fn publish_retrying(&self, mutation: &Mutation, id: &str) -> Result<u64, GateError> {
        let give_up = Instant::now() + PUBLISH_RETRY_FOR;
        let mut pause = FIRST_RETRY_PAUSE;
        loop {
            let started = Instant::now();
            match self.stream.publish(mutation, id).await {
                Ok(published) => {
                    self.stream_seq.fetch_max(published.seq, Ordering::AcqRel);
                    self.metrics
                        .publish_ack
                        .record(started.elapsed().as_secs_f64());
                    return Ok(published.seq);
                }
                Err(StreamError::Publish(reason)) if Instant::now() + pause < give_up => {
                    tracing::debug!(%reason, "publish failed; retrying");
                    self.metrics.publish_retries.increment(1);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_RETRY_PAUSE);
                }
                Err(error) => return Err(unavailable(error)),
            }
        }
    }

    /// Waits until the protocol lets the write at `seq` be acknowledged: every member reported it, or the
    /// fallback passed since its publish was acknowledged at `published_at`.
    async fn wait_for_replicas(&self, seq: u64, published_at: u64) {
        loop {
            let changed = self.progress.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            let now = self.lease.now();
            let until = match self.protocol().ack(seq, published_at, now) {
                Ack::Early => return,
                Ack::ByFallback => {
                    self.metrics.acked_by_lease.increment(1);
                    return;
                }
                Ack::Wait(until) => until,
            };
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep(Duration::from_nanos(until.saturating_sub(now))) => {}
            }
        }
    }
}

/// A replica's writes are published to its stream and acknowledged as the replication protocol requires.
impl Writes for Replica {
    fn add<'a>(
        &'a self,
        namespace: &'a str,
        keys: Vec<Bytes>,
    ) -> Pending<'a, Result<Added, GateError>> {
        Box::pin(Replica::add(self, namespace, keys))
    }

    fn record_absent<'a>(
        &'a self,
        namespace: &'a str,
        report: AbsenceReport,
    ) -> Pending<'a, Result<Recorded, GateError>> {
        Box::pin(Replica::record_absent(self, namespace, report))
    }

    fn reach(&self, seq: u64, bound: Duration) -> Pending<'_, bool> {
        Box::pin(self.wait_applied(seq, bound))
    }
}

/// A write's place among those waiting to be applied, removed when the write stops waiting.
struct Waiting<'a> {
    waiting: &'a Mutex<HashMap<String, oneshot::Sender<Option<Applied>>>>,
    id: String,
}

impl<'a> Waiting<'a> {
    fn register(
        waiting: &'a Mutex<HashMap<String, oneshot::Sender<Option<Applied>>>>,
        id: String,
        sender: oneshot::Sender<Option<Applied>>,
    ) -> Self {
        waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), sender);
        Self { waiting, id }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

fn unavailable(error: StreamError) -> GateError {
    GateError::Unavailable(format!("NATS: {error}"))
}
