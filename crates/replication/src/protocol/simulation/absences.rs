//! Tombstones in the simulation: clients that look a key up, read the source, find nothing and record the
//! absence (`RecordAbsent`) through some replica — while the key is being inserted and `Add`ed elsewhere.
//!
//! A client's flow is production's recommended read path: a lookup at a replica (its `observed_seq` is that
//! replica's applied seq, no later than its copy of the stream is vouched for: `ReadLease::observed_seq`), a read of the source (which holds the key from the moment its writer first
//! publishes its `Add`: the insert comes first), and, if the source had nothing, a `RecordAbsent` carrying
//! that seq to a replica picked at random. So every tombstone the run stores is for a key the source lacked
//! when its client looked; one that answers `ABSENT` for an acknowledged key is a false `ABSENT`, whatever
//! order the stream put the two in. The rules the run exercises, each production's:
//! - a replica decides `REDUNDANT` (the gate already answers `ABSENT`) from its filter only under its read
//!   lease — else it may lack an `Add` acknowledged elsewhere (checked: a `REDUNDANT` for an acknowledged key
//!   fails the run);
//! - a tombstone is stored only if the key was not added after the client's observation, decided as it is
//!   applied, in stream order, by production's memory of recent adds ([`RecentAdds`]), which snapshots carry
//!   (own and shared) — and an `Add` clears the key's tombstone;
//! - its TTL counts from the earlier of its writer's and the stream leader's stamps ([`Mutation::agreed`]),
//!   and a replica reads tombstones by the later of its clock and the stream's time ([`ReadTime::agreed`]): a
//!   tombstone answering more than [`TTL`] plus two leases after it was stored, in true time, fails the run
//!   (the slack is the stream time's lag at a replica whose clock is behind: docs/time.md).
//!
//! - the `observed_seq` a replica's answer claims is no later than its copy of the stream is vouched for
//!   ([`observable_seq`]): a replica reading a diverged copy counts ahead of the stream.
//!
//! Removing a rule fails a seed within the default run: `REDUNDANT` without the lease, seed 538; the
//! `SUPERSEDED` check as a tombstone is applied, seed 6; an `Add` that leaves the key's tombstone, seed 6;
//! snapshots without the memory of recent adds, seed 3142; tombstones read by the earlier clock, seed 150;
//! the TTL from the later stamp, seed 38; `observed_seq` from the applied seq alone, seed 174 (a replica
//! reading a diverged copy tells a client a seq ahead of the stream; the key's `Add` is stored below it,
//! and the client's tombstone, stored after, stands on every replica over the acknowledged key).

use std::collections::{BTreeMap, HashMap};

use rand::Rng;

use crate::core::hashing::KeyHash;
use crate::core::lease::observable_seq;
use crate::core::recent_adds::RecentAdds;

use super::{Event, Key, Mutation, Nanos, ReadTime, Sim, MS};

/// How long a tombstone answers, from its recording as its writer and the stream's leader agree it.
pub(super) const TTL: Nanos = 30 * MS;

/// Clients that look a key up and may record its absence, per run.
pub(super) const CLIENTS: usize = 16;

/// A stored tombstone.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tombstone {
    key: Key,
    /// The seq it was read at.
    seq: u64,
    /// When it stops answering, on the time tombstones are read by (agreed, [`Mutation::agreed`]).
    expires: Nanos,
    /// When the stream stored it, in true time.
    stored: u64,
}

/// What a snapshot carries of a replica's tombstones: every `Add` and every stored tombstone it applied,
/// through the seq it covers. (Production's image holds the memory's cells and the live tombstones; both
/// are what replaying these gives.)
#[derive(Debug, Clone, Default)]
pub(super) struct Carried {
    adds: BTreeMap<u64, Key>,
    stored: BTreeMap<u64, Tombstone>,
}

/// A replica's tombstones and its memory of recent adds.
#[derive(Debug)]
pub(super) struct Tombstones {
    carried: Carried,
    memory: RecentAdds,
    /// The tombstones no later `Add` cleared, by key (expired ones too: a lookup checks the expiry).
    live: HashMap<Key, Tombstone>,
}

impl Default for Tombstones {
    fn default() -> Self {
        Self::restore(Carried::default())
    }
}

/// The key's hash, as production's keyed hash would give one: the memory's cells come from its bits.
fn hash((writer, counter): Key) -> KeyHash {
    let mut z = writer.rotate_left(29) ^ counter.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    KeyHash(z ^ (z >> 31))
}

impl Tombstones {
    /// A replica's state restored from what a snapshot carries: the memory of recent adds replayed, the
    /// tombstones no `Add` after them cleared.
    pub(super) fn restore(carried: Carried) -> Self {
        let mut memory = RecentAdds::default();
        let mut live = HashMap::new();
        let mut adds = carried.adds.iter().peekable();
        for tombstone in carried.stored.values() {
            while let Some((seq, key)) = adds.next_if(|(seq, _)| **seq < tombstone.seq) {
                memory.record_all(&[hash(*key)], *seq);
                live.remove(key);
            }
            live.insert(tombstone.key, *tombstone);
        }
        for (seq, key) in adds {
            memory.record_all(&[hash(*key)], *seq);
            live.remove(key);
        }
        Self {
            carried,
            memory,
            live,
        }
    }

    /// What a snapshot of this state covering `seq` carries.
    pub(super) fn through(&self, seq: u64) -> Carried {
        Carried {
            adds: self
                .carried
                .adds
                .range(..=seq)
                .map(|(s, k)| (*s, *k))
                .collect(),
            stored: self
                .carried
                .stored
                .range(..=seq)
                .map(|(s, t)| (*s, *t))
                .collect(),
        }
    }

    /// Applies an `Add` of `key` read at `seq`: remembered, and its tombstone cleared.
    pub(super) fn added(&mut self, seq: u64, key: Key) {
        self.carried.adds.insert(seq, key);
        self.memory.record_all(&[hash(key)], seq);
        self.live.remove(&key);
    }

    /// Whether a `RecordAbsent` of `key` observed at `observed` is `SUPERSEDED` here: the key may have been
    /// added after the observation.
    pub(super) fn superseded(&self, key: Key, observed: u64) -> bool {
        self.memory.may_have_been_added_after(hash(key), observed)
    }

    /// Applies a `RecordAbsent` read at `seq`: stored unless superseded; whether it was.
    pub(super) fn absent(
        &mut self,
        seq: u64,
        (key, observed): (Key, u64),
        expires: Nanos,
        stored: u64,
    ) -> bool {
        if self.superseded(key, observed) {
            return false;
        }
        let tombstone = Tombstone {
            key,
            seq,
            expires,
            stored,
        };
        self.carried.stored.insert(seq, tombstone);
        self.live.insert(key, tombstone);
        true
    }

    /// The tombstones that answer `ABSENT` when read at `read_at`.
    fn answering(&self, read_at: Nanos) -> impl Iterator<Item = &Tombstone> {
        self.live.values().filter(move |t| t.expires > read_at)
    }
}

/// When a tombstone written at `at` on its writer's clock with a TTL of [`TTL`], stored by a leader whose
/// clock read `stored`, stops answering, as every replica agrees it ([`Mutation::agreed`], whose rule this
/// runs: from the earlier of the two).
pub(super) fn agreed_expiry(at: Nanos, stored: Nanos) -> Nanos {
    let absence = Mutation::RecordAbsent {
        namespace: "sim".into(),
        seq: 0,
        at_ms: at,
        key: bytes::Bytes::new(),
        kind: crate::core::tombstones::AbsenceKind::Missing,
        expires_at_ms: at + TTL,
        observed_seq: 0,
    };
    match absence.agreed(stored) {
        Mutation::RecordAbsent { expires_at_ms, .. } => expires_at_ms,
        _ => unreachable!("a RecordAbsent stays one"),
    }
}

impl Sim {
    /// A client looks a key up at some replica: the next key a replica will add (which it then often adds
    /// soon), or one nobody adds. Its `observed_seq` is that replica's applied seq; a replica that does not
    /// answer (down or paused) leaves the client nothing to go on.
    pub(super) fn absence_lookup(&mut self, client: u64) {
        let r = self.rng.random_range(0..self.procs.len());
        let w = self.rng.random_range(0..self.procs.len());
        let p = &self.procs[r];
        if !p.alive || p.paused_until > self.now {
            return;
        }
        // As `ReadLease::observed_seq`: no later than what its copy is vouched for through.
        let observed = observable_seq(p.proto.applied(), p.proto.checked_through().unwrap_or(0));
        let key = if self.procs[w].alive && self.rng.random_bool(0.7) {
            let writer = &self.procs[w];
            let key = (writer.proto.me().nonce, writer.counter);
            let when = self.now + self.rng.random_range(0..4 * MS);
            self.at(when, Event::NewAdd(w));
            key
        } else {
            (u64::MAX, client)
        };
        self.note(|| format!("a client looks up {key:?} at r{r}: observed seq {observed}"));
        let when = self.now + self.rng.random_range(0..3 * MS);
        self.at(when, Event::SourceRead { key, observed });
    }

    /// The client reads the source: if the key's `Add` was published, the source has it; else it records
    /// the absence through some replica.
    pub(super) fn source_read(&mut self, key: Key, observed: u64) {
        if self.added.contains_key(&key) {
            self.note(|| format!("the source holds {key:?}"));
            return;
        }
        let r = self.rng.random_range(0..self.procs.len());
        let when = self.now + self.rng.random_range(0..3 * MS);
        self.at(when, Event::RecordAbsent { r, key, observed });
    }

    /// Replica `r` decides a `RecordAbsent` as `prepare_absence` does: `REDUNDANT` from its filter under
    /// its lease, `SUPERSEDED` by its memory of recent adds, else the tombstone is published, stamped on its
    /// wall clock.
    pub(super) fn record_absent(
        &mut self,
        r: usize,
        (key, observed): (Key, u64),
        local: Nanos,
    ) -> Result<(), String> {
        let p = &self.procs[r];
        if p.proto.may_answer_absent(local) && !p.finds(&key, self.now) {
            if self.must_find(&key) {
                return Err(format!(
                    "r{r} answered a RecordAbsent of the acknowledged key {key:?} REDUNDANT at {:.3} ms: \
                     it claimed the gate answers ABSENT for it",
                    self.now as f64 / MS as f64
                ));
            }
            self.note(|| format!("r{r}: RecordAbsent {key:?} REDUNDANT"));
            return Ok(());
        }
        if p.tombstones.superseded(key, observed) {
            self.note(|| format!("r{r}: RecordAbsent {key:?} SUPERSEDED"));
            self.superseded += 1;
            return Ok(());
        }
        let at = p.wall(self.now);
        let entry = super::Entry::Absent {
            key,
            observed,
            at,
            stored: 0,
        };
        self.recorded += 1;
        self.publish(r, entry, local);
        Ok(())
    }

    /// Replica `r`, under its lease: no tombstone it holds may answer `ABSENT` for an acknowledged key, nor
    /// longer than its TTL (and the slack) after the stream stored it.
    pub(super) fn check_tombstones(&mut self, r: usize) -> Result<(), String> {
        let p = &self.procs[r];
        let read_at = ReadTime::agreed(p.wall(self.now), p.stream_time).tombstones_ms;
        let slack = 2 * self.timing.lease;
        let mut answering = 0;
        for tombstone in p.tombstones.answering(read_at) {
            answering += 1;
            let key = tombstone.key;
            if self.must_find(&key) {
                return Err(format!(
                    "P1 violated: r{r} answers ABSENT at {:.3} ms for the acknowledged key {key:?} from the \
                     tombstone read at seq {} (applied through {})",
                    self.now as f64 / MS as f64,
                    tombstone.seq,
                    p.proto.applied()
                ));
            }
            if self.now > tombstone.stored + TTL + slack {
                return Err(format!(
                    "r{r}'s tombstone of {key:?}, stored at {:.3} ms, answers ABSENT at {:.3} ms: past its \
                     TTL of {TTL} ns (tombstones read at {:.3} ms, expiring at {:.3} ms)",
                    tombstone.stored as f64 / MS as f64,
                    self.now as f64 / MS as f64,
                    read_at as f64 / MS as f64,
                    tombstone.expires as f64 / MS as f64
                ));
            }
        }
        self.tombstone_answers += answering;
        Ok(())
    }
}
