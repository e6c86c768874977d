//! The replication protocol: when a replica may answer `ABSENT`, and when a writer may acknowledge an
//! `Add`. Pure rules: no NATS, no runtime, no clock of its own — the replica (and the simulation in this
//! module's tests) passes in every event and the time it happened on that process's monotonic clock.
//!
//! # The rule and the fault model
//! **P1**: a lookup sent after an `Add`'s acknowledgement never answers `ABSENT` for its keys, on any
//! replica. It holds when messages on core NATS are lost, duplicated, delayed without bound or reordered;
//! processes pause for any time, crash and restart with or without their data; NATS servers crash, leaders
//! change, and partitions take any shape — non-transitive ones, and an isolated stream leader that still
//! believes it leads; and monotonic clocks' *rates* differ by at most ρ (`--max-clock-drift`, 1% by
//! default): over any real interval, one clock advances at most (1 + ρ) times as much as another. Wall
//! clocks may be anything. The one thing assumed of JetStream is what its Raft gives: a publish is
//! acknowledged only once a quorum stored it, and stored messages are read back in seq order.
//!
//! # The three rules
//! - **Lease (reader).** At time `s` on its clock, replica R publishes a *barrier* record and is
//!   acknowledged seq `B`. Once R has applied through `B` while being a member, it may answer `ABSENT`
//!   until `s + lease` on its clock, and it checks the lease *before* it looks a key up. A barrier is a
//!   publish, so only a leader with a quorum can acknowledge it: an isolated leader answers nothing, and
//!   R's lease runs out (lookups fail open) instead of resting on a stale read of the stream's end.
//! - **Membership.** Replicas join (once caught up), leave and are removed by records in the stream, so
//!   every replica computes the same members as of any seq ([`membership`]). A process that is not a
//!   member — not yet joined, displaced by a twin with its id, removed — takes no lease.
//! - **Acknowledgement (writer).** The writer W of `Add` at seq N, having read it at N itself and received
//!   the publish acknowledgement at `p` on its clock, acknowledges once every incarnation that joined
//!   before N and is a member, or was removed or displaced less than `lease × (1 + ρ) + margin` ago on W's
//!   clock, has reported reading that very `Add` (its message id) at N; and in any case at
//!   `p + lease × (1 + ρ) + margin` (the fallback); a write published more than once (a retry under its
//!   message id) only by the fallback (see "What JetStream is trusted with"). An incarnation that left by its own record is no longer
//!   waited for once W has applied it: it published it only after giving up its lease. A process that started from a snapshot acknowledges only by the fallback until a
//!   fallback has passed since it started ([`start_after`](Protocol::start_after)): the snapshot records
//!   the members, not the graces.
//!
//! # Why no replica answers `ABSENT` for an acknowledged `Add`
//! Take a lookup at R after the acknowledgement of N, under a lease from a barrier sent at `s`, stored at
//! seq `B`, with R applied through `B` and a member then (else it holds no lease).
//! 1. `B > N`: R has applied N before it looked (the lease is checked first, and granted only after the
//!    apply): it answers `MAY_EXIST`.
//! 2. `B < N`, R's incarnation joined at `J < N`, and W counted it — a member when W decided, or removed
//!    or displaced less than a fallback before (whether it departed before or after N): W waited for its report of N, which it sends only after applying
//!    N — so R has N — unless W acknowledged by the fallback, at `p + fallback`. The barrier was stored
//!    before N, so `s` precedes N's storing, which precedes `p`. R's lease lasts `lease` on R's clock;
//!    W waited `lease × (1 + ρ)` on its own, which covers at least as much real time since clock rates
//!    differ by at most ρ: R's lease had ended.
//! 3. `B < N` and R's incarnation joined at `J > N`: R has applied J, so N.
//! 4. `B < N`, R's incarnation joined at `J < N` and departed at `D` longer than a fallback before W
//!    decided: R's lease came from a barrier before D (one after D needs R to have applied D, and then R
//!    is no member), so `s` precedes `D`'s storing, which precedes the moment W applied D; W's grace ran a
//!    fallback from that moment, so again R's lease had ended. A W that started from a snapshot covering
//!    `D` never applied it: `D` was stored before W started at `w`, and W acknowledges early only from
//!    `w + fallback` on, so again R's lease had ended.
//! 5. `B < N`, R's incarnation joined at `J < N` and left by its own record at `L`, which W had applied
//!    when it decided: R gave up its lease before it published `L` (and takes none again: it is no
//!    member), so before `L` was stored, before W applied it, before the acknowledgement, before the
//!    lookup was sent.
//!
//! # What JetStream is trusted with, and what is checked
//! The argument needs a replica's consumer to read the quorum's history. nats-server 2.9.10 does not always
//! give that: a stream leader cut off from the others stored proposals that never reached a quorum — its
//! own replica's barriers and an `Add` — and, once the partition healed, went on with the quorum's messages
//! one seq off, so a replica reading that server's copy applied a history missing 90 acknowledged `Add`s
//! and, reading the seqs its barriers were acknowledged at, took leases over it (the partition test with
//! real servers, about once in 40 runs on a loaded machine; the stores showed it). So a barrier carries
//! its send time, and grants a lease only if what the replica read at its acknowledged seq is that very
//! barrier: a copy that differs from the quorum's at a barrier's seq is caught there, and the replica
//! stops ([`diverged`](Protocol::diverged)) rather than answer from it. A barrier whose seq was passed
//! over (deleted, purged) grants nothing either. A lease taken before the copy diverged still holds for up
//! to a lease, so the writer's rule does not count a report of how far a process applied — seqs of *its*
//! copy — but only a report that it read the writer's very message at its seq ([`WriteRead`]): a diverged
//! copy holds something else there, and the writer waits the fallback, by which that lease has ended.
//! The writer's own copy is checked the same way, by its write read at the seq it was acknowledged at: the
//! members it waits for are read from that copy. That check vouches only for a write published once. A
//! retried one may have been stored by a cut-off server alone on its first attempt, at the very seq where
//! the quorum stored the retry; the writer's copy then holds its write there and differs before, so it is
//! acknowledged only by the fallback ([`Acked`]).
//!
//! # Mirrors of a replica
//! A client's mirror attached to R answers `ABSENT` in its own process under a *sub-lease* from R. Take
//! such a lookup after N's acknowledgement. If W waited for R's report of N: R reports another writer's `Add`
//! (`replica/applier.rs`), and acknowledges its own (`replica/writes.rs`), only once every mirror holding a
//! sub-lease has applied it or that sub-lease has ended — so the mirror has N, or its sub-lease of then
//! ended, and any later grant names a `from_seq` at or past N, which the mirror applies before it holds. If
//! W acknowledged by the fallback, or counted R within its grace (cases 2 and 4), R's lease had ended, and a
//! sub-lease ends no later than R's lease on R's clock, carried to the mirror's clock with ρ and a margin.
//! If R joined after N (case 3), every grant names a `from_seq` past N. If R left by its own record (case
//! 5), it published the leave only once every sub-lease it granted had ended. The rules, their argument and
//! a simulation that fails without each are in `existence_gate_core::sublease`.
//!
//! Restarted and wiped replicas are new incarnations: they hold no lease until they have joined and applied
//! a barrier, both after anything acknowledged before they started. No step trusts a report's timing, the
//! stream's reported end, or an upper bound on any delay; delays cost only liveness.
//!
//! # What it costs
//! With every member up and reporting, an `Add` waits for one apply and one report from each member (about
//! a millisecond on a LAN). With a member silent — cut off, paused, crashed without leaving — each `Add`
//! waits the fallback (`lease × (1 + ρ) + margin`, 101 ms + 1 ms by default) until it reports again, leaves,
//! is displaced by its restart, or is removed by an operator. A replica without a lease answers `MAY_EXIST`
//! + `WARMING`: callers read the source, never a wrong `ABSENT`.

pub mod copy;
pub mod gap;
pub mod history;
pub mod index;
pub mod membership;
#[cfg(test)]
mod simulation;

use std::collections::{BTreeMap, HashMap, VecDeque};

pub use membership::{Cause, Departure, Member, MemberRecord, Membership};

/// A moment on one process's monotonic clock, in nanoseconds from an origin of that process's choosing.
pub type Nanos = u64;

/// The protocol's durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long a barrier lets its replica answer `ABSENT`, from when it was sent.
    pub lease: Nanos,
    /// ρ, in parts per million: how much faster one process's monotonic clock may run than another's.
    pub drift_ppm: u64,
    /// Added to every wait for clock granularity.
    pub margin: Nanos,
}

impl Timing {
    /// `lease × (1 + ρ) + margin`: how long after an `Add`'s publish acknowledgement (or after a member's
    /// departure) no lease from before it can still hold anywhere.
    pub fn fallback(&self) -> Nanos {
        crate::core::lease::outlasted(self.lease, self.drift_ppm, self.margin)
    }
}

/// A process taking part: its replica id and the nonce it drew when it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incarnation {
    /// `--replica-id`.
    pub id: String,
    /// Drawn at start: tells this process apart from any other using the same id.
    pub nonce: u64,
}

/// Where this process stands in the membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Not a member yet: it joins once it has applied a barrier (caught up with the stream).
    Joining,
    /// A member since its join at `joined`.
    Member {
        /// The seq of its join.
        joined: u64,
    },
    /// No longer a member (it takes no lease): left, removed, or displaced by a twin, at `seq`.
    Departed {
        /// The seq of the record that ended its membership.
        seq: u64,
        /// Why.
        cause: Cause,
    },
}

/// What the writer of an `Add` may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// Acknowledge: every member that must have it reported applying it.
    Early,
    /// Acknowledge: the fallback has passed.
    ByFallback,
    /// Not yet: ask again when a report arrives, or at this time at the latest.
    Wait(Nanos),
}

/// Who must hear that this process applied a batch, so that writers waiting on it acknowledge early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipients {
    /// Nobody waits on this process for the batch: it held no other process's write (the writers' own
    /// applies count without a report, and everyone hears the periodic report anyway).
    Nobody,
    /// Only the member with this nonce wrote in the batch: the report goes to it alone.
    Writer(u64),
    /// Several writers, or one this process does not know as a member: one report to everyone.
    Everyone,
}

/// A departed incarnation still counted for acknowledgements: a lease it took before departing may hold
/// until `until`.
#[derive(Debug, Clone, Copy)]
struct Grace {
    nonce: u64,
    joined: u64,
    until: Nanos,
}

/// A write as its writer numbered it: the writer's nonce and the counter of its message ids. No two
/// messages of the stream share one (a retry of a publish under the same id is dropped by the stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WriteId {
    /// The nonce of the process that published it.
    pub writer: u64,
    /// Its number among that process's writes.
    pub counter: u64,
}

/// When and how the stream acknowledged a write of this process, as its writer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    /// When the publish acknowledgement arrived, on the writer's clock: the fallback runs from here.
    pub at: Nanos,
    /// How many times the write was published (under its one message id) until the stream acknowledged
    /// it: more than once, the writer's own copy may hold an earlier attempt at the seq the quorum stored a
    /// later one at, so reading its write there vouches for nothing ([`Protocol::ack`]).
    pub attempts: u32,
}

impl Acked {
    /// A write acknowledged at `at` on its first publish.
    pub fn first_time(at: Nanos) -> Self {
        Self { at, attempts: 1 }
    }
}

/// What a process read at a seq of its copy of the stream: the write stored there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteRead {
    /// The seq it was read at.
    pub seq: u64,
    /// The write read there.
    pub write: WriteId,
}

/// An acknowledged barrier not yet applied.
#[derive(Debug, Clone, Copy)]
struct Barrier {
    sent_at: Nanos,
    seq: u64,
}

/// How many of its own barriers a process remembers having read (seq, send time), and how many stretches
/// of seqs passed over, for acknowledgements that arrive after the consumer delivered the barrier (a
/// barrier's acknowledgement is awaited for one lease: a few of a process's barriers at most).
const REMEMBERED: usize = 256;

/// Reports kept from incarnations that are not (yet) known members: a joiner's reports can arrive before
/// its join is applied here. Beyond this many, unknown reporters are forgotten (a wait by the fallback).
const UNKNOWN_REPORTERS: usize = 256;

/// How many of its writes read at their seqs a process remembers per reader (itself included), by seq:
/// a write waits for them for one fallback at most, and a process with more writes than this waiting at
/// once acknowledges the oldest by the fallback.
const CONFIRMED: usize = 4_096;

/// One process's view of the protocol.
#[derive(Debug, Clone)]
pub struct Protocol {
    me: Incarnation,
    timing: Timing,
    members: Membership,
    standing: Standing,
    applied: u64,
    /// The highest applied seq each incarnation reported, by nonce.
    reports: HashMap<u64, u64>,
    /// Where each incarnation (this one included), by nonce, read this process's writes: counter by seq.
    confirmed: HashMap<u64, BTreeMap<u64, u64>>,
    /// Its own writes the stream acknowledged at a seq not yet applied: checked against what it reads there.
    written: Vec<(u64, WriteId)>,
    /// The seqs its join was acknowledged at, and those it read its own join at: it is a member once one
    /// seq is both (a join only its own server's copy holds makes no member of it on the quorum).
    joins_acked: Vec<u64>,
    joins_read: Vec<u64>,
    graces: Vec<Grace>,
    barriers: VecDeque<Barrier>,
    /// Its own barriers read from the stream, (seq, send time), oldest first.
    barriers_read: VecDeque<(u64, Nanos)>,
    /// Stretches of seqs passed over (gone from the stream), oldest first.
    passed_over: VecDeque<(u64, u64)>,
    /// The seq at which what this process read is not what the quorum acknowledged: no lease ever again.
    diverged: Option<u64>,
    /// Whether a barrier has been applied since this process started: it has caught up once.
    caught_up: bool,
    /// The seq of the newest of its barriers read as sent: what it applied up to there was checked against
    /// the quorum's copy there (see [`checked_through`](Self::checked_through)).
    checked_through: u64,
    lease_until: Nanos,
    /// Before this (its clock), its writes are acknowledged only by the fallback: it started from a
    /// snapshot, which records the members but not the graces of those who departed just before.
    early_from: Nanos,
}

impl Protocol {
    /// A process that has applied nothing yet (see [`start_after`](Self::start_after)).
    pub fn new(me: Incarnation, timing: Timing) -> Self {
        Self {
            me,
            timing,
            members: Membership::default(),
            standing: Standing::Joining,
            applied: 0,
            reports: HashMap::new(),
            confirmed: HashMap::new(),
            written: Vec::new(),
            joins_acked: Vec::new(),
            joins_read: Vec::new(),
            graces: Vec::new(),
            barriers: VecDeque::new(),
            barriers_read: VecDeque::new(),
            passed_over: VecDeque::new(),
            diverged: None,
            caught_up: false,
            checked_through: 0,
            lease_until: 0,
            early_from: 0,
        }
    }

    /// Starts, at `now`, from a snapshot covering seqs through `seq` (0: none, the stream from its start),
    /// with the membership it recorded.
    ///
    /// A snapshot records who is a member, not who departed less than a fallback before it: an
    /// incarnation removed while cut off may still hold a lease, which a process applying the removal
    /// would have waited out as a grace. So until a fallback has passed since its start, this process
    /// acknowledges its writes only by the fallback: a lease taken before the snapshot was read began
    /// before `now`, and has ended by `now` + fallback. (A process that applies the stream from its start
    /// applies every departure itself, and its graces run from when it applied them: later, so longer.)
    pub fn start_after(&mut self, seq: u64, members: Membership, now: Nanos) {
        self.applied = seq;
        self.members = members;
        if seq > 0 {
            self.early_from = now.saturating_add(self.timing.fallback());
        }
    }

    /// This process.
    pub fn me(&self) -> &Incarnation {
        &self.me
    }

    /// The timing.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// The seq applied through.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The membership as of the applied seq.
    pub fn members(&self) -> &Membership {
        &self.members
    }

    /// Where this process stands.
    pub fn standing(&self) -> &Standing {
        &self.standing
    }

    /// Until when (this process's clock) it may answer `ABSENT`; 0 if never.
    pub fn lease_until(&self) -> Nanos {
        self.lease_until
    }

    /// The seq at which this process's copy of the stream was found to differ from the quorum's: an
    /// acknowledged barrier of its own was not what it read there. It takes no lease from then on.
    pub fn diverged(&self) -> Option<u64> {
        self.diverged
    }

    /// The copy of the stream its consumer now reads (a new consumer, maybe on another server) holds
    /// something else at `seq` than what this process read there: what it applied is no one copy's
    /// history, and may lack messages of the quorum's. It takes no lease from then on.
    pub fn copy_differs(&mut self, seq: u64) {
        self.diverge(seq);
    }

    /// Every other replica heard from applied another history through `seq` than this process, and none
    /// the same ([`history`]): it takes its own for the one read off a diverged copy, and no lease from it
    /// from then on.
    pub fn history_differs(&mut self, seq: u64) {
        self.diverge(seq);
    }

    /// Through which seq what this process applied is vouched for: the seq of its newest barrier read as
    /// sent (0: none yet), or `None` once it found its copy diverged. A barrier read at the seq the quorum
    /// acknowledged it at shows the copy read agrees with the quorum's there, and a copy that went wrong
    /// before stays wrong (shifted) unless it comes back into line — a case the replicas' history digests
    /// catch instead ([`history`]; docs/replication.md, "What is checked of JetStream, not trusted"); a
    /// move to another copy is checked by itself ([`copy`]). So a
    /// snapshot covering no more than this may be shared: one from a history read off a diverged copy would
    /// hand every replica loading it that history.
    pub fn checked_through(&self) -> Option<u64> {
        self.diverged.is_none().then_some(self.checked_through)
    }

    /// Whether it may answer `ABSENT` at `now`.
    pub fn may_answer_absent(&self, now: Nanos) -> bool {
        now < self.lease_until
    }

    /// Whether it should publish its join now: caught up, and not a member.
    pub fn should_join(&self) -> bool {
        self.caught_up && self.standing == Standing::Joining
    }

    /// Notes that the message at `seq`, about to be applied, is a barrier of this process sent at `sent_at`
    /// (its payload says so).
    pub fn read_own_barrier(&mut self, seq: u64, sent_at: Nanos) {
        remember(&mut self.barriers_read, (seq, sent_at));
    }

    /// Notes that the message at `seq`, about to be applied, is `write` (its message id says so): a write
    /// of this process's own counts towards its acknowledgement only if read at the seq it was stored at.
    pub fn read_write(&mut self, seq: u64, write: WriteId) {
        let me = self.me.nonce;
        self.heard_reads(me, &[WriteRead { seq, write }]);
    }

    /// The stream acknowledged this process's join at `seq`. It becomes a member once it has read that very
    /// join there; anything else read at `seq` means its copy of the stream differs from the quorum's.
    pub fn join_acked(&mut self, seq: u64) {
        self.joins_acked.push(seq);
        self.check_joins();
    }

    /// Makes this process a member once a join of its own is both acknowledged and read at one seq.
    fn check_joins(&mut self) {
        if self.standing != Standing::Joining {
            return;
        }
        let applied = self.applied;
        let acked: Vec<u64> = self
            .joins_acked
            .extract_if(.., |seq| *seq <= applied)
            .collect();
        for seq in acked {
            if self.joins_read.contains(&seq) {
                let joined = self
                    .members
                    .iter()
                    .find(|(_, m)| m.nonce == self.me.nonce)
                    .map_or(seq, |(_, m)| m.joined);
                self.standing = Standing::Member { joined };
            } else if !self.was_passed_over(seq) {
                self.diverge(seq);
            }
        }
    }

    /// The stream acknowledged this process's `write` at `seq`. Like a barrier, what the process reads at
    /// `seq` must be that write: anything else there means its copy of the stream differs from the
    /// quorum's ([`diverged`](Self::diverged)) — a copy it may have read only for a stretch, before its
    /// consumer moved to another server, between two of its barriers.
    pub fn write_acked(&mut self, seq: u64, write: WriteId) {
        self.written.push((seq, write));
        self.check_written();
    }

    /// Checks the acknowledged writes now applied against what was read at their seqs.
    fn check_written(&mut self) {
        let applied = self.applied;
        let checked: Vec<(u64, WriteId)> = self
            .written
            .extract_if(.., |(seq, _)| *seq <= applied)
            .collect();
        for (seq, write) in checked {
            let own = self.confirmed.get(&self.me.nonce);
            let read = own.and_then(|reads| reads.get(&seq));
            let forgotten = own.is_some_and(|reads| {
                reads.len() >= CONFIRMED && reads.first_key_value().is_some_and(|(s, _)| seq < *s)
            });
            if read != Some(&write.counter) && !forgotten && !self.was_passed_over(seq) {
                self.diverge(seq);
            }
        }
    }

    /// Incarnation `nonce` reported having read `reads` (reports may arrive late, twice, or out of order).
    /// Only this process's writes are kept.
    pub fn heard_reads(&mut self, nonce: u64, reads: &[WriteRead]) {
        let mine = reads
            .iter()
            .filter(|read| read.write.writer == self.me.nonce);
        let mut mine = mine.peekable();
        if mine.peek().is_none() {
            return;
        }
        let kept = self.confirmed.entry(nonce).or_default();
        for read in mine {
            kept.insert(read.seq, read.write.counter);
        }
        while kept.len() > CONFIRMED {
            kept.pop_first();
        }
    }

    /// Applies the message at `seq` (a membership record, or anything else), at `now`. Seqs at or below the
    /// applied one are ignored. Call [`settle`](Self::settle) after a batch. A barrier of this process's own
    /// is noted first ([`read_own_barrier`](Self::read_own_barrier)).
    pub fn apply(&mut self, seq: u64, record: Option<&MemberRecord>, now: Nanos) {
        if seq <= self.applied {
            return;
        }
        self.applied = seq;
        let Some(record) = record else { return };
        if let MemberRecord::Join { id, nonce, .. } = record {
            if *id == self.me.id && *nonce == self.me.nonce {
                self.joins_read.push(seq);
            }
        }
        let Some(departure) = self.members.apply(seq, record) else {
            return;
        };
        if departure.nonce == self.me.nonce && departure.id == self.me.id {
            self.standing = Standing::Departed {
                seq,
                cause: departure.cause,
            };
            self.lease_until = 0;
            return;
        }
        if departure.cause == Cause::Left {
            // Its own leave, published only after it gave up its lease (`leave`): nothing to wait out. A
            // grace here slowed every `Add` by a fallback for a fallback after each graceful stop.
            return;
        }
        self.graces.push(Grace {
            nonce: departure.nonce,
            joined: departure.joined,
            until: now.saturating_add(self.timing.fallback()),
        });
    }

    /// Counts `first..=last`, gone from the stream (see [`gap`]), as applied: nothing read there, so no
    /// barrier acknowledged there grants a lease.
    pub fn pass_over(&mut self, last: u64) {
        let first = self.applied + 1;
        if first > last {
            return;
        }
        self.barriers.retain(|b| !(first..=last).contains(&b.seq));
        remember(&mut self.passed_over, (first, last));
        self.applied = last;
    }

    /// What became of this process's barrier sent at `sent_at`, acknowledged at `seq`, now applied:
    /// `Some(true)` read as sent, `Some(false)` something else was read there, `None` not known (passed
    /// over, or read too long before its acknowledgement to be remembered).
    fn read_as_sent(&self, seq: u64, sent_at: Nanos) -> Option<bool> {
        if self.barriers_read.contains(&(seq, sent_at)) {
            return Some(true);
        }
        let passed = self.was_passed_over(seq);
        let forgotten = self.barriers_read.len() == REMEMBERED
            && self
                .barriers_read
                .front()
                .is_some_and(|(oldest, _)| seq < *oldest);
        (!passed && !forgotten).then_some(false)
    }

    /// Whether `seq` lies in a stretch passed over (nothing was read there).
    fn was_passed_over(&self, seq: u64) -> bool {
        self.passed_over
            .iter()
            .any(|(a, b)| (*a..=*b).contains(&seq))
    }

    fn diverge(&mut self, seq: u64) {
        self.diverged.get_or_insert(seq);
        self.lease_until = 0;
    }

    /// After applying: checks the acknowledged writes now applied, grants the lease of the newest
    /// acknowledged barrier now applied and read as sent, and forgets what no longer matters.
    pub fn settle(&mut self, now: Nanos) {
        self.check_written();
        self.check_joins();
        let mut reached = None;
        while let Some(barrier) = self.barriers.front().copied() {
            if barrier.seq > self.applied {
                break;
            }
            self.barriers.pop_front();
            // Acknowledged before or after it was read, it grants a lease only if it was read as sent.
            match self.read_as_sent(barrier.seq, barrier.sent_at) {
                Some(true) => reached = Some(barrier),
                Some(false) => self.diverge(barrier.seq),
                None => {}
            }
        }
        if let Some(barrier) = reached.filter(|_| self.diverged.is_none()) {
            self.caught_up = true;
            self.checked_through = barrier.seq;
            if matches!(self.standing, Standing::Member { .. }) {
                self.lease_until = self
                    .lease_until
                    .max(barrier.sent_at.saturating_add(self.timing.lease));
            }
        }
        self.graces.retain(|g| now < g.until);
        let (members, graces, me) = (&self.members, &self.graces, self.me.nonce);
        let counted = |nonce: &u64| {
            *nonce == me
                || members.iter().any(|(_, m)| m.nonce == *nonce)
                || graces.iter().any(|g| g.nonce == *nonce)
        };
        if self.reports.len() > UNKNOWN_REPORTERS {
            self.reports.retain(|nonce, _| counted(nonce));
        }
        if self.confirmed.len() > UNKNOWN_REPORTERS {
            self.confirmed.retain(|nonce, _| counted(nonce));
        }
    }

    /// A graceful stop: no lease from now on; the leave record to publish (`None` if not a member).
    pub fn leave(&mut self) -> Option<MemberRecord> {
        let was_member = matches!(self.standing, Standing::Member { .. });
        self.standing = Standing::Departed {
            seq: self.applied,
            cause: Cause::Left,
        };
        self.lease_until = 0;
        was_member.then(|| MemberRecord::Leave {
            id: self.me.id.clone(),
            nonce: self.me.nonce,
        })
    }

    /// A barrier sent at `sent_at` was stored at `seq`.
    pub fn barrier_acked(&mut self, sent_at: Nanos, seq: u64, now: Nanos) {
        self.barriers.push_back(Barrier { sent_at, seq });
        self.barriers.make_contiguous().sort_by_key(|b| b.seq);
        self.settle(now);
    }

    /// Incarnation `nonce` reported having applied through `applied` (reports may arrive late, twice, or out
    /// of order: the highest counts).
    pub fn heard(&mut self, nonce: u64, applied: u64) {
        let reported = self.reports.entry(nonce).or_insert(0);
        *reported = (*reported).max(applied);
    }

    /// Whether `write`, stored at `seq`, whose publish this process saw `acked`, may be acknowledged at
    /// `now`. The caller has applied `seq`.
    pub fn ack(&self, seq: u64, write: WriteId, acked: Acked, now: Nanos) -> Ack {
        let fallback = acked.at.saturating_add(self.timing.fallback());
        if now >= fallback {
            return Ack::ByFallback;
        }
        if self.diverged.is_some() {
            // Its membership, read from a copy that is not the quorum's, may miss members (their joins at
            // other seqs): only the fallback, which needs no membership, is sound.
            return Ack::Wait(fallback);
        }
        if acked.attempts > 1 {
            // Published more than once, the write may sit in this process's copy at `seq` as an attempt a
            // cut-off server stored alone, while the quorum stored a later attempt there by coincidence: the
            // copy then passes the check of `write_acked` yet differs before `seq`, and the membership read
            // from it may place a member's join after `seq` (the simulation at `LOOKUP_PAUSES` 0.2, seed
            // 179: a member holding a lease was not waited for and answered `ABSENT`). A write published
            // once is stored by one leader: read at its seq, it vouches for the copy as a barrier does.
            return Ack::Wait(fallback);
        }
        if now < self.early_from {
            // Just started from a snapshot, it knows no graces (`start_after`).
            return Ack::Wait(self.early_from.min(fallback));
        }
        let reported = |nonce: u64| self.read_there(nonce, seq, write);
        let members_missing = self
            .members
            .iter()
            .any(|(_, m)| m.joined < seq && !reported(m.nonce));
        let graces_missing = self
            .graces
            .iter()
            .filter(|g| g.joined < seq && now < g.until && !reported(g.nonce));
        let grace_end = graces_missing.map(|g| g.until).min();
        match (members_missing, grace_end) {
            (false, None) => Ack::Early,
            (true, _) => Ack::Wait(fallback),
            (false, Some(until)) => Ack::Wait(until.min(fallback)),
        }
    }

    /// Whether `write`, stored at `seq`, is held back at `now` by a departed incarnation's grace: what the
    /// replica counts (`existence_replica_grace_waits_total`), since each such wait is a departure's cost.
    pub fn held_by_grace(&self, seq: u64, write: WriteId, now: Nanos) -> bool {
        self.graces
            .iter()
            .any(|g| g.joined < seq && now < g.until && !self.read_there(g.nonce, seq, write))
    }

    /// Who must hear that this process applied a batch holding writes by the incarnations `writers`. A
    /// report sent to everyone costs NATS a delivery per replica (and each replica a wake-up) where only the
    /// writer waits for it; at one write in flight per replica on three R3 servers, reports broadcast after
    /// every apply were most of NATS's messages. Whom a report reaches is liveness only: no rule above
    /// trusts a report's delivery, so a report sent to the wrong process costs a wait by the fallback.
    pub fn recipients(&self, writers: impl IntoIterator<Item = u64>) -> Recipients {
        let mut others = writers.into_iter().filter(|nonce| *nonce != self.me.nonce);
        let Some(first) = others.next() else {
            return Recipients::Nobody;
        };
        let member = self.members.iter().any(|(_, m)| m.nonce == first);
        if member && others.all(|nonce| nonce == first) {
            Recipients::Writer(first)
        } else {
            Recipients::Everyone
        }
    }

    /// The highest applied seq incarnation `nonce` reported (this process's own: its applied seq).
    pub fn reported(&self, nonce: u64) -> u64 {
        if nonce == self.me.nonce {
            return self.applied;
        }
        self.reports.get(&nonce).copied().unwrap_or(0)
    }

    /// Whether incarnation `nonce` reported reading `write` at `seq` — this process's own `write`, so the one
    /// the quorum stored there. A report of how far it applied is not enough: a process whose server's copy
    /// of the stream diverged from the quorum's applies other messages at the same seqs (see "What
    /// JetStream is trusted with"), and while a lease it took before still holds, counting it would let it
    /// answer `ABSENT` for `write`.
    fn read_there(&self, nonce: u64, seq: u64, write: WriteId) -> bool {
        write.writer == self.me.nonce
            && self
                .confirmed
                .get(&nonce)
                .and_then(|reads| reads.get(&seq))
                .is_some_and(|counter| *counter == write.counter)
    }

    /// The incarnations a writer still waits for before acknowledging `write` at `seq` early: (id, nonce).
    pub fn missing_reports(&self, seq: u64, write: WriteId) -> Vec<(String, u64)> {
        self.members
            .iter()
            .filter(|(_, m)| m.joined < seq && m.nonce != self.me.nonce)
            .filter(|(_, m)| !self.read_there(m.nonce, seq, write))
            .map(|(id, m)| (id.clone(), m.nonce))
            .collect()
    }

    /// The least applied seq every member has reported (this process counts with its own), 0 if one has
    /// not reported: what is safe to purge below.
    pub fn applied_by_every_member(&self) -> u64 {
        self.members
            .iter()
            .map(|(_, m)| {
                if m.nonce == self.me.nonce {
                    self.applied
                } else {
                    self.reports.get(&m.nonce).copied().unwrap_or(0)
                }
            })
            .min()
            .unwrap_or(self.applied)
            .min(self.applied)
    }
}

/// Pushes `item` onto `list`, forgetting the oldest beyond [`REMEMBERED`].
fn remember<T>(list: &mut VecDeque<T>, item: T) {
    if list.len() == REMEMBERED {
        list.pop_front();
    }
    list.push_back(item);
}

#[cfg(test)]
mod tests;
