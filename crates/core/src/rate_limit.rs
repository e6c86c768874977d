//! The token bucket that caps how fast a namespace stores tombstones.
//!
//! Keys that pass the filter (false positives, or keys whose windows hold them) can be recorded absent; an
//! attacker who finds such keys could otherwise churn the tombstone store and evict the entries that matter.
//! The bucket admits `rate` tombstones per second on average with bursts of up to one second's worth.

/// A token bucket driven by the caller's clock.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Tokens added per millisecond.
    per_ms: f64,
    /// Most tokens held at once.
    burst: f64,
    /// Tokens now.
    tokens: f64,
    /// When tokens were last added.
    refilled_at_ms: u64,
}

impl TokenBucket {
    /// A full bucket admitting `rate_per_second` on average.
    pub fn new(rate_per_second: u64) -> Self {
        let burst = rate_per_second as f64;
        Self {
            per_ms: burst / 1_000.0,
            burst,
            tokens: burst,
            refilled_at_ms: 0,
        }
    }

    /// Takes one token if there is one at `now_ms`.
    pub fn try_take(&mut self, now_ms: u64) -> bool {
        let elapsed = now_ms.saturating_sub(self.refilled_at_ms);
        self.tokens = (self.tokens + elapsed as f64 * self.per_ms).min(self.burst);
        self.refilled_at_ms = self.refilled_at_ms.max(now_ms);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_a_burst_then_the_rate() {
        let mut bucket = TokenBucket::new(10);
        let start = 1_000_000;
        let burst = (0..20).filter(|_| bucket.try_take(start)).count();
        assert_eq!(burst, 10);
        assert!(!bucket.try_take(start + 50));
        assert!(bucket.try_take(start + 100));
        let next_second = (0..100).filter(|_| bucket.try_take(start + 1_100)).count();
        assert_eq!(next_second, 10);
    }

    #[test]
    fn a_clock_stepping_back_adds_nothing() {
        let mut bucket = TokenBucket::new(1);
        assert!(bucket.try_take(10_000));
        assert!(!bucket.try_take(5_000));
        assert!(!bucket.try_take(10_500));
        assert!(bucket.try_take(11_000));
    }
}
