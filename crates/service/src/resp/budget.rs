//! One memory budget for every connection's unfinished requests.
//!
//! A request may be large — `max_batch_keys` arguments of up to `max_key_bytes` each: about 10 MB with the
//! default limits, 41 MB at a 4 KiB key limit — and a connection holds it whole until it is complete. So
//! every connection that holds one, at once, held it all: 100 connections, each with a 10 MB `BF.MADD` one
//! byte short, took the gate from 22 MB to 1 GB; the default 1,024 to about 10 GB, and an allocation
//! failure aborts the process (the gRPC port with it). Where tokens are configured, a connection may not
//! send that before `AUTH` ([`RequestLimits::before_auth`](super::RequestLimits::before_auth)); without
//! tokens, every client may.
//!
//! So a connection's input buffer is free up to [`FREE_BYTES`] (enough for every ordinary command and
//! pipeline read), and what it holds beyond is taken from one budget shared by the port
//! (`--resp-request-memory-mib`, 256 by default). A connection that needs more than the budget has left is
//! told so and closed; the others go on. Bytes come back as requests complete and the buffer shrinks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes of input buffer a connection holds outside the budget.
pub const FREE_BYTES: usize = 64 * 1024;

/// The port's budget for input buffers beyond [`FREE_BYTES`] each.
#[derive(Debug)]
pub struct Budget {
    total: usize,
    left: AtomicUsize,
}

impl Budget {
    pub fn new(total: usize) -> Arc<Self> {
        Arc::new(Self {
            total,
            left: AtomicUsize::new(total),
        })
    }

    /// The budget, in bytes.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Bytes held by connections now.
    pub fn held(&self) -> usize {
        self.total - self.left.load(Ordering::Acquire)
    }

    fn take(&self, bytes: usize) -> bool {
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(bytes)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.left.fetch_add(bytes, Ordering::AcqRel);
    }
}

/// What one connection holds of the budget; given back when dropped.
#[derive(Debug)]
pub struct Held {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Held {
    pub fn new(budget: Arc<Budget>) -> Self {
        Self { budget, bytes: 0 }
    }

    /// Holds what a buffer of `capacity` bytes needs beyond [`FREE_BYTES`], taking more or giving some
    /// back; `false` if the budget cannot cover it (nothing more is taken then).
    pub fn cover(&mut self, capacity: usize) -> bool {
        let wanted = capacity.saturating_sub(FREE_BYTES);
        if wanted > self.bytes {
            if !self.budget.take(wanted - self.bytes) {
                return false;
            }
        } else {
            self.budget.give_back(self.bytes - wanted);
        }
        self.bytes = wanted;
        true
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_share_the_budget_beyond_their_free_bytes_and_give_it_back() {
        let budget = Budget::new(1_000_000);
        let (mut a, mut b) = (
            Held::new(Arc::clone(&budget)),
            Held::new(Arc::clone(&budget)),
        );
        assert!(a.cover(FREE_BYTES), "free");
        assert_eq!(budget.left.load(Ordering::Relaxed), 1_000_000);
        assert!(a.cover(FREE_BYTES + 600_000));
        assert!(!b.cover(FREE_BYTES + 500_000), "400,000 left");
        assert!(b.cover(FREE_BYTES + 400_000));
        assert!(a.cover(FREE_BYTES + 100_000), "shrinks");
        assert!(b.cover(FREE_BYTES + 900_000));
        drop(a);
        drop(b);
        assert_eq!(budget.left.load(Ordering::Relaxed), 1_000_000);
    }
}
