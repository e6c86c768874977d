//! The read lease: how a replica knows its state is recent enough to answer `ABSENT`.
//!
//! A replica applies a shared log that other replicas write to. An `Add` acknowledged elsewhere may not have
//! reached it yet, and answering `ABSENT` for that key would be the one error the gate must never make. So a
//! replica answers `ABSENT` only while it holds a lease: it has applied everything the log held at a moment
//! less than the lease's length ago (the wiring decides that moment and the length; see the replication
//! module). Without a lease it fails open — `MAY_EXIST` with basis `WARMING` — which costs the caller a read
//! of the source, never a wrong answer.
//!
//! The lease is measured on an injected [`MonotonicClock`], never the wall clock: a replica's wall clock
//! may step, and the safety argument needs only that clocks on different machines run at the same *rate*.
//!
//! It also bounds the `observed_seq` a replica's answers carry ([`ReadLease::observed_seq`]). A client
//! sends that seq back with `RecordAbsent`, and the tombstone is refused (`SUPERSEDED`) if the key was added
//! after it — a rule that holds only if the seq is no later, in the shared log's numbering, than what the
//! replica had really applied. A replica reading a copy of the log that went its own way (a cut-off server
//! that stored messages no quorum took, then goes on with the quorum's that many seqs later) counts ahead of
//! the shared log until it notices; an `observed_seq` from that count let a tombstone stand over an `Add`
//! stored after the client's lookup, at a seq below the inflated one, and every replica answered `ABSENT`
//! for the acknowledged key (the replication simulation's seed 174 without the bound). So answers claim no
//! more than the seq of the replica's newest barrier read where the shared log stored it — its copy is the
//! log's through there.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::clock::MonotonicClock;
use crate::log::GENESIS_SEQ;

/// Until when this replica may answer `ABSENT`: the end the replication protocol last granted, read by every
/// lookup (one atomic load), and whether lookups have asked since the replica last looked, so it renews the
/// lease only while it is used.
pub struct ReadLease {
    /// The clock `until_ns` is read on.
    clock: Arc<dyn MonotonicClock>,
    /// The clock's time in nanoseconds at which the lease ends; 0 = not held.
    until_ns: AtomicU64,
    /// Whether ever granted.
    ever: AtomicBool,
    /// The seq through which the copy of the log this replica applied is known to be the shared log's (0:
    /// not known).
    vouched_seq: AtomicU64,
    /// Set by lookups, taken by the replica's lease keeper.
    asked: AtomicBool,
    /// Called when a lookup finds the lease not held and it was not already asked for: wakes the keeper, so
    /// a replica idle long enough to have stopped renewing renews at once, not at its next tick.
    wake: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for ReadLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadLease")
            .field("until_ns", &self.until_ns)
            .field("asked", &self.asked)
            .finish_non_exhaustive()
    }
}

impl ReadLease {
    /// A lease not yet held, measured on `clock`.
    pub fn new(clock: Arc<dyn MonotonicClock>) -> Self {
        Self {
            clock,
            until_ns: AtomicU64::new(0),
            ever: AtomicBool::new(false),
            vouched_seq: AtomicU64::new(0),
            asked: AtomicBool::new(false),
            wake: OnceLock::new(),
        }
    }

    /// Sets what a lookup calls when it finds the lease not held and not yet asked for (once).
    pub fn on_wanted(&self, wake: impl Fn() + Send + Sync + 'static) {
        let _ = self.wake.set(Box::new(wake));
    }

    /// Now, in nanoseconds on the lease's clock: the clock the replication protocol runs on.
    pub fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Whether the lease holds now; a lookup asking marks the lease as wanted.
    #[inline]
    pub fn holds(&self) -> bool {
        let held = self.holds_at(self.now());
        if !self.asked.load(Ordering::Relaxed) {
            // Written only when not yet set: lookups on every core read the flag without contending for it.
            self.asked.store(true, Ordering::Relaxed);
            if let (false, Some(wake)) = (held, self.wake.get()) {
                wake();
            }
        }
        held
    }

    /// The lease's end on its clock (0: not held), as last granted: what bounds the sub-leases a replica
    /// grants its mirrors ([`crate::sublease`], rule 1).
    pub fn until(&self) -> u64 {
        self.until_ns.load(Ordering::Acquire)
    }

    /// Whether the lease holds at `at` (nanoseconds on the lease's clock).
    pub fn holds_at(&self, at: u64) -> bool {
        at < self.until_ns.load(Ordering::Acquire)
    }

    /// Sets the lease's end (0 revokes it).
    pub fn set_until(&self, until: u64) {
        if until != 0 {
            self.ever.store(true, Ordering::Release);
        }
        self.until_ns.store(until, Ordering::Release);
    }

    /// Sets the seq through which the copy of the log applied is known to be the shared log's (0: not known,
    /// or no longer: a copy found to have diverged).
    pub fn set_vouched_seq(&self, seq: u64) {
        self.vouched_seq.store(seq, Ordering::Release);
    }

    /// The `observed_seq` an answer carries when its namespace's latest applied seq is `latest`: no later
    /// than the vouched seq ([`observable_seq`]).
    pub fn observed_seq(&self, latest: u64) -> u64 {
        observable_seq(latest, self.vouched_seq.load(Ordering::Acquire))
    }

    /// Whether lookups asked since the last call.
    pub fn take_asked(&self) -> bool {
        self.asked.swap(false, Ordering::Relaxed)
    }

    /// Whether the lease was ever granted.
    pub fn ever_held(&self) -> bool {
        self.ever.load(Ordering::Acquire)
    }
}

/// `length × (1 + ρ) + margin` (ρ = `drift_ppm` parts per million): how long after a lease of `length` was
/// granted on one clock no holder measuring it on another, running up to ρ slower, can still hold it. The
/// replicas' fallback (`Timing::fallback`)
/// and a sub-lease's ([`Terms::outlasted`](crate::sublease::Terms::outlasted)) both wait this long.
pub fn outlasted(length: u64, drift_ppm: u64, margin: u64) -> u64 {
    let stretch = u128::from(length) * u128::from(drift_ppm) / 1_000_000;
    length
        .saturating_add(u64::try_from(stretch).unwrap_or(u64::MAX))
        .saturating_add(margin)
}

/// The `observed_seq` a replica may claim for a namespace whose latest applied seq is `latest`, its copy of
/// the log being the shared log's through `vouched`: the earlier of the two, and never 0 (which in a request
/// means "not observed" and skips the `SUPERSEDED` check). An earlier seq only makes more tombstones
/// `SUPERSEDED` — a key added between the two, then reported absent, is not recorded: a lost tombstone,
/// never a wrong one. A replica holding its lease read a barrier less than a lease ago, so its answers
/// claim at most a lease less than they could.
pub fn observable_seq(latest: u64, vouched: u64) -> u64 {
    latest.min(vouched).max(GENESIS_SEQ)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn lease_at(clock: &Arc<ManualClock>) -> ReadLease {
        ReadLease::new(Arc::clone(clock) as Arc<dyn MonotonicClock>)
    }

    #[test]
    fn a_lease_holds_until_its_end_and_can_be_revoked() {
        let clock = Arc::new(ManualClock::new(1));
        let lease = lease_at(&clock);
        assert!(
            !lease.holds_at(0) && !lease.ever_held(),
            "a new lease is not held"
        );
        lease.set_until(100);
        assert!(lease.holds_at(99));
        assert!(!lease.holds_at(100));
        lease.set_until(0);
        assert!(!lease.holds_at(1) && lease.ever_held());
        lease.set_until(clock.now_ns() + 5_000_000);
        assert!(lease.holds(), "held 5 ms before its end");
        clock.advance(4);
        assert!(lease.holds(), "held 1 ms before its end");
        clock.advance(1);
        assert!(!lease.holds(), "not held at its end, on the lease's clock");
    }

    #[test]
    fn lookups_mark_the_lease_wanted_until_the_keeper_takes_it() {
        let lease = lease_at(&Arc::new(ManualClock::new(1)));
        let woken = std::sync::Arc::new(AtomicU64::new(0));
        let counter = std::sync::Arc::clone(&woken);
        lease.on_wanted(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        assert!(!lease.take_asked());
        lease.holds();
        lease.holds();
        assert_eq!(
            woken.load(Ordering::Relaxed),
            1,
            "woken once until the keeper takes the ask"
        );
        assert!(lease.take_asked());
        assert!(!lease.take_asked());
        lease.set_until(u64::MAX);
        lease.holds();
        assert_eq!(
            woken.load(Ordering::Relaxed),
            1,
            "a lease that holds wakes nobody"
        );
    }
}
