//! The mirror's clock: the monotonic clock, read coarsely, because a precise reading costs a lookup more
//! than its filter probe does.
//!
//! `Instant::now()` costs about 30 ns here, and worse, the vDSO reads the TSC behind a fence, so a loop of
//! lookups no longer overlaps their cache misses: 208 ns per lookup against 81 ns for the probe alone
//! (10M keys, one thread). `CLOCK_MONOTONIC_COARSE` is the same clock as of the kernel's last tick (a grain
//! of 4 ms here): 4 ns, no fence. A reading may be up to a grain early, which is what the sub-lease's
//! margin must cover (two grains: `existence_gate_core::sublease::Terms::margin`), so the mirror adds two
//! grains to the margin the gate sends. Where there is no coarse clock, `Instant`, with no grain.

use existence_gate_core::sublease::Nanos;

/// Nanoseconds since the clock was made, read coarsely.
#[derive(Debug)]
pub struct Clock {
    #[cfg(target_os = "linux")]
    zero: Nanos,
    #[cfg(not(target_os = "linux"))]
    zero: std::time::Instant,
}

impl Clock {
    pub fn new() -> Self {
        #[cfg(target_os = "linux")]
        let zero = coarse();
        #[cfg(not(target_os = "linux"))]
        let zero = std::time::Instant::now();
        Self { zero }
    }

    /// Now, at most a [`grain`](Self::grain) early.
    #[inline]
    pub fn now(&self) -> Nanos {
        #[cfg(target_os = "linux")]
        return coarse().saturating_sub(self.zero);
        #[cfg(not(target_os = "linux"))]
        return self.zero.elapsed().as_nanos() as Nanos;
    }

    /// How early a reading may be.
    pub fn grain(&self) -> Nanos {
        #[cfg(target_os = "linux")]
        {
            let res = rustix::time::clock_getres(rustix::time::ClockId::MonotonicCoarse);
            // An unknown resolution is taken as the slowest tick Linux has (HZ = 100).
            match res.tv_sec as u64 * 1_000_000_000 + res.tv_nsec as u64 {
                0 => 10_000_000,
                grain => grain,
            }
        }
        #[cfg(not(target_os = "linux"))]
        0
    }
}

#[cfg(target_os = "linux")]
#[inline]
fn coarse() -> Nanos {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    now.tv_sec as Nanos * 1_000_000_000 + now.tv_nsec as Nanos
}
