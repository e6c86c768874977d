//! Subscriptions per token: how many invalidation streams one token holds at once, on the gRPC port and the
//! RESP port together.
//!
//! Why: a namespace serves at most `max_subscribers_per_namespace` subscribers (1,024 by default), and one
//! read-role client could take them all — as many connections as it liked, each with a subscription (on
//! RESP, `invalidations:ns@N` channels under different seqs) — after which every other client's
//! `SubscribeInvalidations` failed. With tokens configured, each token holds at most
//! `limits.max_subscriptions_per_token`; without tokens there is nobody to count, and only the per-namespace
//! limit (and on RESP, one subscription per namespace and connection) applies.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The subscriptions each token holds.
#[derive(Debug)]
pub struct SubscriptionQuota {
    max: usize,
    held: Mutex<HashMap<String, usize>>,
}

/// One subscription counted against its token; given back when dropped (the stream ended, the channel was
/// unsubscribed, the connection closed).
#[derive(Debug)]
pub struct Held {
    quota: Arc<SubscriptionQuota>,
    token: String,
}

impl SubscriptionQuota {
    /// At most `max` subscriptions per token.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Counts one more subscription of `token`, or says why not: the token's name, how many it holds and the
    /// limit.
    pub fn hold(self: &Arc<Self>, token: &str) -> Result<Held, String> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry(token.to_string()).or_default();
        if *count >= self.max {
            return Err(format!(
                "token {token:?} holds {count} subscriptions, the limit (limits.max_subscriptions_per_token \
                 = {}): end one first, or give each client its own token",
                self.max
            ));
        }
        *count += 1;
        Ok(Held {
            quota: Arc::clone(self),
            token: token.to_string(),
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.quota.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = held.get_mut(&self.token) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.token);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_holds_at_most_the_limit_and_gets_each_back() {
        let quota = SubscriptionQuota::new(2);
        let (a, b) = (quota.hold("reader").unwrap(), quota.hold("reader").unwrap());
        let refused = quota.hold("reader").unwrap_err();
        assert!(
            refused.contains("\"reader\" holds 2") && refused.contains("= 2"),
            "{refused}"
        );
        let other = quota.hold("writer").expect("each token counts alone");
        drop(a);
        let c = quota.hold("reader").expect("given back");
        drop((b, c, other));
        assert!(quota.held.lock().unwrap().is_empty());
    }
}
