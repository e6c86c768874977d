//! Time as the core sees it: the only place in the core that reads the operating system's clocks.
//!
//! Windows are aligned to absolute unix time (so replicas agree on window ids) and tombstones carry absolute
//! expiry times (so a replayed log yields the same state), so the core reads wall-clock time only through
//! [`Clock`]. The read lease runs on a [`MonotonicClock`] instead: a wall clock may step, and the replication
//! protocol's safety needs only that clocks on different machines run at about the same *rate*. Tests drive
//! a [`ManualClock`] (both kinds) to cross window boundaries, TTLs and lease ends without sleeping.
//!
//! # Steps of the wall clock
//!
//! A wall clock may be stepped, forward or back, by any amount, while the gate runs (an operator, an NTP
//! daemon correcting a bad start, a VM restored). A step forward of two hours read straight from the wall
//! clock expired every window of a namespace with a one-hour retention on the next maintenance tick, and a
//! step back stamped `Add`s into windows already past. So a server reads time from a [`SteadyClock`]: the
//! wall clock read once, at start, carried forward by the monotonic clock, which steps never move (Linux
//! slews `CLOCK_MONOTONIC` at NTP's rate, so the two do not drift apart while the wall clock is only
//! slewed). A step is seen as the wall clock's offset from it changing ([`Clock::check_wall`]),
//! logged and counted, and changes nothing the gate answers. Across a restart the wall clock is read anew:
//! a single node cannot tell a clock stepped forward while it was down from the time it was down, and
//! expires what that much time would have expired.
//!
//! A replica also bounds its reads by [`StreamTime`], the time the stream's leader stored messages at, so
//! that no one host's clock decides what has expired (see [`Gate::with_stream_time`](crate::gate::Gate)).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of unix time in milliseconds.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the unix epoch.
    fn now_ms(&self) -> u64;

    /// For a clock that steps of the wall clock do not move ([`SteadyClock`]): how the wall clock stands
    /// against it now, and whether it stepped since the last call. `None` for the others.
    fn check_wall(&self) -> Option<WallCheck> {
        None
    }
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

/// Wall-clock time that steps of the wall clock do not move: the wall clock read once, when this value was
/// made, carried forward by a monotonic clock (see the [module docs](self)).
pub struct SteadyClock {
    wall: Arc<dyn Clock>,
    monotonic: Arc<dyn MonotonicClock>,
    /// The wall clock's reading when this value was made, and the monotonic clock's then.
    anchor_ms: u64,
    anchor_ns: u64,
    /// The wall clock's offset from this clock at the last [`check_wall`](Clock::check_wall), in ms.
    last_offset_ms: AtomicI64,
}

/// A wall-clock step smaller than this between two checks is taken for NTP's slewing or a late check; at
/// NTP's largest slew rate (500 ppm) a minute passes between checks before slewing alone moves 30 ms.
pub const STEP_THRESHOLD_MS: i64 = 1_000;

/// What [`Clock::check_wall`] found for a [`SteadyClock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WallCheck {
    /// How far the wall clock stands from the steady clock now, in ms (positive: the wall clock is ahead).
    pub offset_ms: i64,
    /// How far the wall clock stepped since the previous check, if it stepped at least
    /// [`STEP_THRESHOLD_MS`] (positive: forward).
    pub stepped_ms: Option<i64>,
}

impl SteadyClock {
    /// The operating system's wall clock, carried by its monotonic clock from now on.
    pub fn system() -> Self {
        Self::new(Arc::new(SystemClock), Arc::new(SystemMonotonicClock::new()))
    }

    /// `wall`, read now, carried forward by `monotonic`.
    pub fn new(wall: Arc<dyn Clock>, monotonic: Arc<dyn MonotonicClock>) -> Self {
        Self {
            anchor_ms: wall.now_ms(),
            anchor_ns: monotonic.now_ns(),
            wall,
            monotonic,
            last_offset_ms: AtomicI64::new(0),
        }
    }
}

impl Clock for SteadyClock {
    fn now_ms(&self) -> u64 {
        let elapsed_ns = self.monotonic.now_ns().saturating_sub(self.anchor_ns);
        self.anchor_ms.saturating_add(elapsed_ns / 1_000_000)
    }

    /// Compares the wall clock with this clock: its offset now, and whether it stepped since the last check.
    fn check_wall(&self) -> Option<WallCheck> {
        let offset_ms = self.wall.now_ms() as i64 - self.now_ms() as i64;
        let stepped = offset_ms - self.last_offset_ms.swap(offset_ms, Ordering::Relaxed);
        Some(WallCheck {
            offset_ms,
            stepped_ms: (stepped.abs() >= STEP_THRESHOLD_MS).then_some(stepped),
        })
    }
}

/// The time a replicated stream has reached: when the stream's leader stored the latest message this
/// replica applied.
///
/// A replica's windows expire by the earlier of this and its own clock, so that neither its own clock ahead
/// nor a leader's ahead expires anything: each alone is bounded by the other; its tombstones by the later
/// ([`ReadTime::agreed`]). It is the latest message's stamp, not the largest seen: a leader whose clock ran
/// two hours ahead and was set right (or lost its leadership) must not leave the stream two hours ahead,
/// where a later step of the replica's own clock would find no bound. It lags the true time by the gap
/// since the last message applied, which the lease's barriers keep to a fraction of a second while a
/// replica may answer `ABSENT` at all; lagging only keeps keys a little longer.
#[derive(Debug, Default)]
pub struct StreamTime {
    reached_ms: AtomicU64,
}

impl StreamTime {
    /// A message stored at `stored_at_ms` was applied (messages are applied one at a time, in order).
    pub fn passed(&self, stored_at_ms: u64) {
        self.reached_ms.store(stored_at_ms, Ordering::Release);
    }

    /// When the latest message applied was stored; 0 before the first.
    pub fn reached_ms(&self) -> u64 {
        self.reached_ms.load(Ordering::Acquire)
    }
}

/// The times one read of a namespace goes by: one for the filter's windows, one for tombstones.
///
/// A single node reads both on its one clock. A replica has two clocks that may disagree, its own and the
/// stream's ([`StreamTime`]), and takes for each structure the one that errs toward `MAY_EXIST`: windows
/// expire by the **earlier** (a key is kept, never dropped early), tombstones by the **later** (a tombstone
/// stops answering `ABSENT` sooner, never later). So neither a replica's clock behind nor one ahead, nor
/// a leader's, makes it answer `ABSENT` where the true time would not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadTime {
    /// What decides which windows are live.
    pub windows_ms: u64,
    /// What decides which tombstones are live.
    pub tombstones_ms: u64,
}

impl ReadTime {
    /// The read times of a replica whose clock reads `local_ms` and whose stream has reached `stream_ms`.
    pub fn agreed(local_ms: u64, stream_ms: u64) -> Self {
        Self {
            windows_ms: local_ms.min(stream_ms),
            tombstones_ms: local_ms.max(stream_ms),
        }
    }
}

impl ReadTime {
    /// The same time for tombstones, at which no window has expired: for freeing memory when the windows'
    /// time cannot be trusted yet.
    pub fn keeping_windows(self) -> Self {
        Self {
            windows_ms: 0,
            ..self
        }
    }
}

/// One clock: both structures read at the same time.
impl From<u64> for ReadTime {
    fn from(now_ms: u64) -> Self {
        Self {
            windows_ms: now_ms,
            tombstones_ms: now_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    /// The wall clock stepped two hours ahead, then back, then one hour back: the steady clock moves only with
    /// the monotonic clock, and each step is reported once, by its size.
    #[test]
    fn steps_of_the_wall_clock_move_nothing_and_are_reported() {
        let wall = Arc::new(ManualClock::new(1_000 * HOUR));
        let monotonic = Arc::new(ManualClock::new(5));
        let clock = SteadyClock::new(wall.clone(), monotonic.clone());
        assert_eq!(clock.now_ms(), 1_000 * HOUR);
        wall.advance(2 * HOUR);
        assert_eq!(
            clock.now_ms(),
            1_000 * HOUR,
            "a step forward moved the clock"
        );
        let check = clock.check_wall().unwrap();
        assert_eq!(check.offset_ms, 2 * HOUR as i64);
        assert_eq!(check.stepped_ms, Some(2 * HOUR as i64));
        assert_eq!(
            clock.check_wall().unwrap().stepped_ms,
            None,
            "one step, reported once"
        );
        wall.set(1_000 * HOUR - HOUR);
        assert_eq!(clock.now_ms(), 1_000 * HOUR, "a step back moved the clock");
        assert_eq!(
            clock.check_wall().unwrap().stepped_ms,
            Some(-3 * HOUR as i64)
        );
        // Time passing moves both alike: no step.
        wall.advance(10_000);
        monotonic.advance(10_000);
        assert_eq!(clock.now_ms(), 1_000 * HOUR + 10_000);
        assert_eq!(clock.check_wall().unwrap().stepped_ms, None);
        assert_eq!(clock.check_wall().unwrap().offset_ms, -(HOUR as i64));
    }

    /// A leader two hours ahead, then one set right: the stream's time follows the latest stamp, and the
    /// replica's reads take the earlier for windows, the later for tombstones.
    #[test]
    fn stream_time_follows_the_latest_stamp() {
        let time = StreamTime::default();
        assert_eq!(time.reached_ms(), 0);
        time.passed(20 + 2 * HOUR);
        time.passed(30);
        assert_eq!(time.reached_ms(), 30);
        let read = ReadTime::agreed(35, time.reached_ms());
        assert_eq!((read.windows_ms, read.tombstones_ms), (30, 35));
    }
}
