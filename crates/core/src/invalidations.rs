//! Invalidations: telling clients that cache absences locally when one became wrong.
//!
//! Each `Add` publishes one [`Invalidation`] carrying its keys and seq into the namespace's [`Hub`]: a
//! replay buffer of recent invalidations bounded in bytes, plus a `watch` of the newest seq that wakes
//! subscribers. Subscribers hold no queue of their own — only a cursor (the last seq they delivered) — so
//! memory stays bounded by the buffer however many subscribers there are and however slowly they read.
//!
//! A subscriber whose next invalidation has already left the buffer (it resumed from too old a seq, or fell
//! too far behind) gets a [`Delivery::Resync`] with the namespace's latest seq — "drop every cached absence"
//! — and continues after it. Resuming by seq is exact otherwise: one invalidation per `Add` seq, in order.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::keys::PackedKeys;

/// Bytes counted per invalidation on top of its keys' bytes and offsets: the `Arc` holding it (counts and
/// fields, 72 bytes), its slot in the buffer (8), and malloc's rounding of its three allocations (up to 16
/// each). Counting them keeps [`Hub::bytes`] what the buffer really holds, not an estimate below it.
const PER_EVENT_OVERHEAD: usize = 128;

/// The keys of one `Add`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalidation {
    /// The `Add`'s seq.
    pub seq: u64,
    /// Its time (unix ms), which decides the filter window its keys went into: what a mirror of the filter
    /// needs to put them in the same one.
    pub at_ms: u64,
    /// Its keys.
    pub keys: PackedKeys,
}

impl Invalidation {
    fn cost(&self) -> usize {
        self.keys.bytes() + PER_EVENT_OVERHEAD
    }
}

/// What a subscription yields next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// Keys were added: drop their cached absences.
    Added(Arc<Invalidation>),
    /// Invalidations were missed: drop every cached absence; the stream continues after `seq`.
    Resync {
        /// The namespace's latest seq.
        seq: u64,
    },
}

/// The recent invalidations of a namespace.
#[derive(Debug, Default)]
struct Replay {
    /// Oldest first; seqs strictly increase.
    events: VecDeque<Arc<Invalidation>>,
    /// Sum of the events' costs.
    bytes: usize,
    /// Every invalidation with a seq above this is still in `events` (the seq of the last one evicted).
    floor: u64,
    /// Counts [`Hub::reset`]s: a subscription from before the latest one resyncs, wherever its cursor is.
    generation: u64,
}

/// A namespace's invalidation fan-out.
#[derive(Debug)]
pub struct Hub {
    replay: Mutex<Replay>,
    /// Most bytes `replay` keeps.
    max_bytes: usize,
    /// Wakes subscribers when an invalidation is published.
    newest: watch::Sender<u64>,
    /// Open subscriptions.
    subscribers: std::sync::atomic::AtomicUsize,
}

impl Hub {
    /// An empty hub keeping up to `max_bytes` of recent invalidations.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            replay: Mutex::new(Replay::default()),
            max_bytes,
            newest: watch::channel(0).0,
            subscribers: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn replay(&self) -> std::sync::MutexGuard<'_, Replay> {
        self.replay.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes `invalidation` and, under the same lock, raises the namespace's `latest_seq` to its seq: a
    /// subscriber that reads `latest_seq` for a `RESYNC` can then never skip an invalidation it has not seen.
    pub fn publish(&self, invalidation: Invalidation, latest_seq: &AtomicU64) {
        let seq = invalidation.seq;
        let mut replay = self.replay();
        replay.bytes += invalidation.cost();
        replay.events.push_back(Arc::new(invalidation));
        while replay.bytes > self.max_bytes && replay.events.len() > 1 {
            let evicted = replay.events.pop_front().expect("more than one event");
            replay.bytes -= evicted.cost();
            replay.floor = evicted.seq;
        }
        latest_seq.store(seq, Ordering::Release);
        drop(replay);
        self.newest.send_replace(seq);
    }

    /// The namespace's filter was replaced whole (a restore, a rebuild swapped in): forgets every buffered
    /// invalidation, declares everything up to `seq` unservable, and has every open subscription resync —
    /// a rebuilt filter may hold keys no `Add` announced, so every cached absence and every mirror is
    /// suspect.
    pub fn reset(&self, seq: u64) {
        let mut replay = self.replay();
        *replay = Replay {
            floor: seq,
            generation: replay.generation + 1,
            ..Replay::default()
        };
        drop(replay);
        self.newest.send_modify(|_| {});
    }

    /// The seq of the newest invalidation published: the latest `Add` (0: none since start).
    pub fn newest_seq(&self) -> u64 {
        *self.newest.borrow()
    }

    /// Bytes held in the replay buffer.
    pub fn bytes(&self) -> usize {
        self.replay().bytes
    }

    /// Open subscriptions.
    pub fn subscribers(&self) -> usize {
        self.subscribers.load(Ordering::Relaxed)
    }

    /// A subscription to invalidations with seq > `after_seq` (0 = from now on), or `None` if `max`
    /// subscriptions are already open.
    pub fn subscribe(
        self: &Arc<Self>,
        after_seq: u64,
        latest_seq: &Arc<AtomicU64>,
        max: usize,
    ) -> Option<Subscription> {
        if self.subscribers.fetch_add(1, Ordering::Relaxed) >= max {
            self.subscribers.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let wake = self.newest.subscribe();
        let replay = self.replay();
        let generation = replay.generation;
        let latest = latest_seq.load(Ordering::Acquire);
        let exact = after_seq <= latest && after_seq >= replay.floor;
        let (cursor, resync_first) = match after_seq {
            0 => (latest, false),
            _ if exact => (after_seq, false),
            _ => (latest, true),
        };
        drop(replay);
        Some(Subscription {
            hub: Arc::clone(self),
            latest_seq: Arc::clone(latest_seq),
            cursor,
            resync_first,
            generation,
            wake,
        })
    }
}

/// One subscriber's position in a namespace's invalidations.
#[derive(Debug)]
pub struct Subscription {
    hub: Arc<Hub>,
    latest_seq: Arc<AtomicU64>,
    /// The seq up to which everything has been delivered.
    cursor: u64,
    /// Whether the next delivery must be a resync (the requested `after_seq` could not be served exactly).
    resync_first: bool,
    /// The hub's [`Replay::generation`] this subscription has caught up with.
    generation: u64,
    wake: watch::Receiver<u64>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.subscribers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Subscription {
    /// The next delivery, waiting for one if needed. Cancel-safe: dropping the future loses nothing.
    pub async fn next(&mut self) -> Delivery {
        loop {
            if let Some(delivery) = self.poll_ready() {
                return delivery;
            }
            if self.wake.changed().await.is_err() {
                // The hub is gone with its namespace; nothing more will come.
                std::future::pending::<()>().await;
            }
        }
    }

    /// The next delivery if one is ready now.
    pub fn poll_ready(&mut self) -> Option<Delivery> {
        self.wake.borrow_and_update();
        let replay = self.hub.replay();
        if self.resync_first || self.cursor < replay.floor || self.generation != replay.generation {
            self.resync_first = false;
            self.generation = replay.generation;
            self.cursor = self.latest_seq.load(Ordering::Acquire);
            return Some(Delivery::Resync { seq: self.cursor });
        }
        let next = replay.events.partition_point(|e| e.seq <= self.cursor);
        let event = replay.events.get(next)?;
        self.cursor = event.seq;
        Some(Delivery::Added(Arc::clone(event)))
    }

    /// The seq up to which everything has been delivered.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn publish(hub: &Hub, latest: &AtomicU64, seq: u64, key: &'static [u8]) {
        hub.publish(
            Invalidation {
                seq,
                at_ms: 0,
                keys: PackedKeys::pack(&[Bytes::from_static(key)]),
            },
            latest,
        );
    }

    fn added_seq(delivery: Option<Delivery>) -> u64 {
        match delivery {
            Some(Delivery::Added(event)) => event.seq,
            other => panic!("expected an invalidation, got {other:?}"),
        }
    }

    #[test]
    fn live_subscription_sees_each_add_once_in_order() {
        let hub = Arc::new(Hub::new(1 << 20));
        let latest = Arc::new(AtomicU64::new(0));
        let mut sub = hub.subscribe(0, &latest, usize::MAX).unwrap();
        assert_eq!(sub.poll_ready(), None);
        publish(&hub, &latest, 1, b"a");
        publish(&hub, &latest, 3, b"b");
        assert_eq!(added_seq(sub.poll_ready()), 1);
        assert_eq!(added_seq(sub.poll_ready()), 3);
        assert_eq!(sub.poll_ready(), None);
    }

    #[test]
    fn resume_by_seq_is_exact_and_from_now_skips_history() {
        let hub = Arc::new(Hub::new(1 << 20));
        let latest = Arc::new(AtomicU64::new(0));
        for seq in 1..=5 {
            publish(&hub, &latest, seq, b"k");
        }
        let mut resumed = hub.subscribe(3, &latest, usize::MAX).unwrap();
        assert_eq!(added_seq(resumed.poll_ready()), 4);
        assert_eq!(added_seq(resumed.poll_ready()), 5);
        let mut fresh = hub.subscribe(0, &latest, usize::MAX).unwrap();
        assert_eq!(fresh.poll_ready(), None);
    }

    #[test]
    fn a_seq_from_the_future_or_evicted_gets_a_resync() {
        let hub = Arc::new(Hub::new(4 * (PER_EVENT_OVERHEAD + 5)));
        let latest = Arc::new(AtomicU64::new(0));
        for seq in 1..=10 {
            publish(&hub, &latest, seq, b"k");
        }
        let mut future = hub.subscribe(11, &latest, usize::MAX).unwrap();
        assert_eq!(future.poll_ready(), Some(Delivery::Resync { seq: 10 }));
        assert_eq!(future.poll_ready(), None);
        let mut old = hub.subscribe(1, &latest, usize::MAX).unwrap();
        assert_eq!(old.poll_ready(), Some(Delivery::Resync { seq: 10 }));
        publish(&hub, &latest, 11, b"k");
        assert_eq!(added_seq(old.poll_ready()), 11);
    }

    #[test]
    fn a_reset_resyncs_every_subscription_even_one_that_was_caught_up() {
        let hub = Arc::new(Hub::new(1 << 20));
        let latest = Arc::new(AtomicU64::new(0));
        publish(&hub, &latest, 1, b"k");
        let mut caught_up = hub.subscribe(0, &latest, usize::MAX).unwrap();
        assert_eq!(caught_up.poll_ready(), None);
        hub.reset(1);
        assert_eq!(caught_up.poll_ready(), Some(Delivery::Resync { seq: 1 }));
        assert_eq!(caught_up.poll_ready(), None);
        let mut after = hub.subscribe(0, &latest, usize::MAX).unwrap();
        publish(&hub, &latest, 2, b"k");
        assert_eq!(added_seq(after.poll_ready()), 2);
        assert_eq!(added_seq(caught_up.poll_ready()), 2);
    }

    #[test]
    fn a_lagging_subscriber_gets_a_resync_and_memory_stays_bounded() {
        let hub = Arc::new(Hub::new(1_000));
        let latest = Arc::new(AtomicU64::new(0));
        let mut slow = hub.subscribe(0, &latest, usize::MAX).unwrap();
        for seq in 1..=1_000 {
            publish(&hub, &latest, seq, b"0123456789");
        }
        assert!(hub.bytes() <= 1_000);
        assert_eq!(slow.poll_ready(), Some(Delivery::Resync { seq: 1_000 }));
        assert_eq!(slow.poll_ready(), None);
    }

    #[test]
    fn subscriptions_are_bounded_and_release_their_slot() {
        let hub = Arc::new(Hub::new(1 << 20));
        let latest = Arc::new(AtomicU64::new(0));
        let first = hub.subscribe(0, &latest, 2).unwrap();
        let _second = hub.subscribe(0, &latest, 2).unwrap();
        assert!(hub.subscribe(0, &latest, 2).is_none());
        drop(first);
        assert!(hub.subscribe(0, &latest, 2).is_some());
    }

    #[tokio::test]
    async fn next_waits_for_a_publication() {
        let hub = Arc::new(Hub::new(1 << 20));
        let latest = Arc::new(AtomicU64::new(0));
        let mut sub = hub.subscribe(0, &latest, usize::MAX).unwrap();
        let publisher = {
            let (hub, latest) = (Arc::clone(&hub), Arc::clone(&latest));
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                publish(&hub, &latest, 7, b"x");
            })
        };
        match sub.next().await {
            Delivery::Added(event) => assert_eq!(event.seq, 7),
            other => panic!("{other:?}"),
        }
        publisher.await.unwrap();
    }
}
