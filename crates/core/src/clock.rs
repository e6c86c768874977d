//! Time as the core sees it: the only place in the core that reads the operating system's clocks.
//!
//! Windows are aligned to absolute unix time (so replicas agree on window ids) and tombstones carry absolute
//! expiry times (so a replayed log yields the same state), so the core reads wall-clock time only through
//! [`Clock`]. The read lease runs on a [`MonotonicClock`] instead: a wall clock may step, and the replication
//! protocol's safety needs only that clocks on different machines run at about the same *rate*. Tests drive
//! a [`ManualClock`] (both kinds) to cross window boundaries, TTLs and lease ends without sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of unix time in milliseconds.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the unix epoch.
    fn now_ms(&self) -> u64;
}

/// The operating system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_millis() as u64)
    }
}

/// A source of monotonic time: nanoseconds since an origin of its own, never going backwards.
pub trait MonotonicClock: Send + Sync + 'static {
    /// Nanoseconds since this clock's origin.
    fn now_ns(&self) -> u64;
}

/// The operating system's monotonic clock ([`Instant`]), counted from when this value was made.
#[derive(Debug, Clone, Copy)]
pub struct SystemMonotonicClock {
    origin: Instant,
}

impl SystemMonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemMonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl MonotonicClock for SystemMonotonicClock {
    fn now_ns(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.origin)
            .as_nanos() as u64
    }
}

/// A clock that moves only when told to: the property and concurrency tests use it to rotate windows and
/// expire tombstones deterministically.
#[derive(Debug)]
pub struct ManualClock {
    now_ms: AtomicU64,
}

impl ManualClock {
    /// A clock stopped at `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self {
            now_ms: AtomicU64::new(start_ms),
        }
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `ms` (which may move it backwards, as a stepped system clock can).
    pub fn set(&self, ms: u64) {
        self.now_ms.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// The same time in nanoseconds, so that one manual clock drives a lease as well (set it only forwards
/// there: a monotonic clock never goes back).
impl MonotonicClock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now_ms().saturating_mul(1_000_000)
    }
}
