//! The local absences, and the rule that keeps them true.
//!
//! A local absence is a key the gate (or the source) said does not exist, kept for a short TTL in a
//! bounded LRU so repeated lookups cost no call. The invalidation stream drops one when an `Add` makes it
//! false. The stream is asynchronous, so a lookup's answer can arrive *after* the invalidation that made it
//! stale: writing it then would resurrect a false "absent". Hence an absence is written only if
//! - the same subscription was live from before the lookup until the write (no gap in which an
//!   invalidation went unseen), and
//! - it has applied no seq beyond the answer's `observed_seq` (an applied invalidation past it may be for
//!   this key),
//!
//! both checked under the one lock that also orders applying invalidations.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::endpoints::lock;

/// A bounded LRU of keys, each trusted until its expiry.
#[derive(Debug)]
pub struct AbsenceCache {
    capacity: usize,
    ttl: Duration,
    entries: HashMap<Bytes, Entry>,
    /// Use stamp → key: the first is the least recently used.
    order: BTreeMap<u64, Bytes>,
    stamp: u64,
}

#[derive(Debug)]
struct Entry {
    expires: Instant,
    stamp: u64,
}

impl AbsenceCache {
    /// An empty cache of at most `capacity` keys, each kept `ttl`.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            capacity,
            ttl,
            entries: HashMap::new(),
            order: BTreeMap::new(),
            stamp: 0,
        }
    }

    /// Whether `key` is a live absence at `now` (a hit makes it the most recently used).
    pub fn contains(&mut self, key: &[u8], now: Instant) -> bool {
        let Some(entry) = self.entries.get_mut(key) else {
            return false;
        };
        if entry.expires <= now {
            self.remove(key);
            return false;
        }
        self.stamp += 1;
        let key = self
            .order
            .remove(&entry.stamp)
            .expect("every entry is ordered");
        entry.stamp = self.stamp;
        self.order.insert(self.stamp, key);
        true
    }

    /// Keeps `key` as absent from `now`, evicting the least recently used beyond the capacity.
    pub fn insert(&mut self, key: Bytes, now: Instant) {
        if self.capacity == 0 {
            return;
        }
        self.remove(&key);
        self.stamp += 1;
        self.order.insert(self.stamp, key.clone());
        let expires = now + self.ttl;
        self.entries.insert(
            key,
            Entry {
                expires,
                stamp: self.stamp,
            },
        );
        while self.entries.len() > self.capacity {
            let (_, oldest) = self.order.pop_first().expect("a full cache has an oldest");
            self.entries.remove(&oldest);
        }
    }

    /// Forgets `key`.
    pub fn remove(&mut self, key: &[u8]) {
        if let Some(entry) = self.entries.remove(key) {
            self.order.remove(&entry.stamp);
        }
    }

    /// Forgets every key.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
    }

    /// How many keys are kept (expired ones included until looked at or evicted).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The cache with the state of the subscription that keeps it true.
#[derive(Debug)]
pub struct Absences {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    cache: AbsenceCache,
    /// Counts subscriptions that went live: a changed value means a gap.
    generation: u64,
    live: bool,
    /// The last seq applied from the stream.
    applied_seq: u64,
}

/// Taken before a lookup: which live subscription the answer may be written under.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    generation: u64,
}

impl Absences {
    /// No absences, no live subscription.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            state: Mutex::new(State {
                cache: AbsenceCache::new(capacity, ttl),
                generation: 0,
                live: false,
                applied_seq: 0,
            }),
        }
    }

    /// Whether `key` is a live local absence.
    pub fn contains(&self, key: &[u8]) -> bool {
        lock(&self.state).cache.contains(key, Instant::now())
    }

    /// The ticket for a lookup starting now, if a subscription is live (else nothing may be cached).
    pub fn ticket(&self) -> Option<Ticket> {
        let state = lock(&self.state);
        state.live.then_some(Ticket {
            generation: state.generation,
        })
    }

    /// Caches `key` as absent, observed at `observed_seq`, if the rule above allows: whether it did.
    pub fn insert(&self, ticket: Ticket, key: Bytes, observed_seq: u64) -> bool {
        let mut state = lock(&self.state);
        let allowed = state.live
            && state.generation == ticket.generation
            && state.applied_seq <= observed_seq;
        if allowed {
            state.cache.insert(key, Instant::now());
        }
        allowed
    }

    /// A subscription went live; one opened "from now on" (`after_seq = 0`) follows an unknown gap, so the
    /// cache is cleared.
    pub fn went_live(&self, from_now: bool) {
        let mut state = lock(&self.state);
        state.generation += 1;
        state.live = true;
        if from_now {
            state.cache.clear();
        }
    }

    /// The subscription ended: nothing more is cached until one is live again.
    pub fn went_down(&self) {
        lock(&self.state).live = false;
    }

    /// `ADDED` at `seq`: drops `keys`.
    pub fn added(&self, keys: &[Bytes], seq: u64) {
        let mut state = lock(&self.state);
        for key in keys {
            state.cache.remove(key);
        }
        state.applied_seq = state.applied_seq.max(seq);
    }

    /// `RESYNC` at `seq`: events were lost, so every absence goes, and `seq` is where the stream goes on
    /// from — even below the last seq applied, as when the subscription moved to a gate with a shorter log
    /// (keeping the higher one would refuse every answer of that gate from then on).
    pub fn resync(&self, seq: u64) {
        let mut state = lock(&self.state);
        state.cache.clear();
        state.applied_seq = seq;
    }

    /// How many absences are kept.
    pub fn len(&self) -> usize {
        lock(&self.state).cache.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn evicts_the_least_recently_used_and_expires_after_the_ttl() {
        let start = Instant::now();
        let mut cache = AbsenceCache::new(2, Duration::from_secs(5));
        cache.insert(key("a"), start);
        cache.insert(key("b"), start);
        assert!(cache.contains(b"a", start)); // a is now more recent than b
        cache.insert(key("c"), start);
        assert!(
            !cache.contains(b"b", start),
            "b was the least recently used"
        );
        assert!(cache.contains(b"a", start) && cache.contains(b"c", start));
        assert!(
            !cache.contains(b"a", start + Duration::from_secs(5)),
            "expired"
        );
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn an_absence_is_cached_only_under_the_same_live_subscription_before_any_later_seq() {
        let absences = Absences::new(10, Duration::from_secs(5));
        assert!(
            absences.ticket().is_none(),
            "nothing is cached before a subscription is live"
        );
        absences.went_live(true);
        let ticket = absences.ticket().unwrap();
        assert!(absences.insert(ticket, key("a"), 0));

        absences.added(&[key("x")], 7);
        assert!(
            !absences.insert(ticket, key("b"), 6),
            "seq 7 was applied after an answer at 6"
        );
        assert!(absences.insert(ticket, key("b"), 7));

        let stale = absences.ticket().unwrap();
        absences.went_down();
        assert!(!absences.insert(stale, key("c"), 9), "no subscription");
        absences.went_live(false);
        assert!(
            !absences.insert(stale, key("c"), 9),
            "a gap between two subscriptions"
        );
        assert!(absences.contains(b"a"), "resuming by seq keeps the cache");
        absences.added(&[key("a")], 8);
        assert!(!absences.contains(b"a"));
        absences.resync(9);
        assert!(absences.is_empty());
    }
}
