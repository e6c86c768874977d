//! The read lease: how a replica knows its state is recent enough to answer `ABSENT`.
//!
//! A replica applies a shared log that other replicas write to. An `Add` acknowledged elsewhere may not have
//! reached it yet, and answering `ABSENT` for that key would be the one error the gate must never make. So a
//! replica answers `ABSENT` only while it holds a lease: it has applied everything the log held at a moment
//! less than the lease's length ago (the wiring decides that moment and the length; see the replication
//! module). Without a lease it fails open — `MAY_EXIST` with basis `WARMING` — which costs the caller a read
//! of the source, never a wrong answer.
//!
//! The lease is measured on the monotonic clock ([`Instant`]), never the wall clock: a replica's wall clock
//! may step, and the safety argument needs only that clocks on different machines run at the same *rate*.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Until when this replica may answer `ABSENT`.
#[derive(Debug)]
pub struct ReadLease {
    /// What `until` counts from.
    origin: Instant,
    /// Nanoseconds after `origin` at which the lease ends; 0 = never held.
    until_ns: AtomicU64,
}

impl Default for ReadLease {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadLease {
    /// A lease not yet held.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            until_ns: AtomicU64::new(0),
        }
    }

    fn nanos_since_origin(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_nanos() as u64
    }

    /// Whether the lease holds now.
    #[inline]
    pub fn holds(&self) -> bool {
        self.holds_at(Instant::now())
    }

    /// Whether the lease holds at `at`.
    pub fn holds_at(&self, at: Instant) -> bool {
        self.nanos_since_origin(at) < self.until_ns.load(Ordering::Acquire)
    }

    /// Extends the lease to `until` (never shortens it: grants can arrive out of order).
    pub fn extend_to(&self, until: Instant) {
        self.until_ns
            .fetch_max(self.nanos_since_origin(until), Ordering::AcqRel);
    }

    /// Whether the lease was ever granted.
    pub fn ever_held(&self) -> bool {
        self.until_ns.load(Ordering::Acquire) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_lease_holds_until_its_end_and_is_never_shortened() {
        let lease = ReadLease::new();
        let start = Instant::now();
        assert!(!lease.holds_at(start), "a new lease is not held");
        lease.extend_to(start + Duration::from_millis(100));
        assert!(lease.holds_at(start + Duration::from_millis(99)));
        assert!(!lease.holds_at(start + Duration::from_millis(100)));
        lease.extend_to(start + Duration::from_millis(50));
        assert!(
            lease.holds_at(start + Duration::from_millis(99)),
            "an older grant arriving late does not shorten the lease"
        );
    }
}
