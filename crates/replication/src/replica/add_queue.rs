//! Concurrent small `Add`s of one namespace leave a replica together, as one stream message.
//!
//! Why: a message costs about as much again as the keys it carries. Measured with three replicas on one
//! `nats-server` (16-byte keys): a single-key `Add` cost NATS ~220 µs and the replicas ~310 µs of CPU, a
//! 1,000-key `Add` ~420 and ~600 — the message, its three deliveries, the reports and the wake-ups it
//! causes are paid per message, whatever it carries. Many callers adding a key each pay that per key.
//!
//! So a replica has at most [`PUBLISHING`] messages of small `Add`s being published at a time; the small
//! `Add`s that arrive meanwhile wait here and leave together when the publish is acknowledged. There is no
//! timer: an `Add` reaching a replica with a free slot is published at once, so a lone `Add` waits for
//! nothing, and how many share a message follows the load. A merged message is bounded by
//! [`MERGED_BYTES`]; an `Add` of [`ALONE_BYTES`] or more leaves at once, alone (see there why), and no
//! `Add` is ever split.
//!
//! Measured (`nats-server` R1, three replicas, 30 single-key `Add`s in flight on each, 8 s, four pairs
//! alternating with the build before): 4.6–5.2 `Add`s per message; NATS messages in per `Add` 1.20 →
//! 0.40; NATS CPU per `Add` 39 → 26, 44 → 26, 50 → 39, 64 → 36 µs; the three replicas' 79 → 61, 86 → 58,
//! 98 → 92, 120 → 84 µs; `Add`s/s 12.2k → 15.6k, 11.3k → 16.2k, 9.8k → 10.1k, 7.8k → 11.0k. Three 1,000-key
//! `Add`s in flight per replica are unchanged (each leaves alone, as before).
//!
//! Each caller is answered as if it had been alone: the message's seq (its keys' seq), the tombstones of
//! its own keys that applying the message cleared, which of its keys were new if it asked (a key two
//! callers of one message both add is new for the earlier one only, as if their `Add`s had applied one
//! after the other), and the safety rule applied to that seq — its keys are in the message, so every
//! replica applying through the seq has them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use metrics::Gauge;
use tokio::sync::oneshot;

use crate::core::gate::GateError;
use crate::core::keys::PackedKeys;
use crate::core::log::Mutation;
use crate::core::namespace::{Added, NewKeys};

/// Messages of small `Add`s one replica publishes at once. One: while a message waits for its publish
/// acknowledgement (~0.4 ms on one `nats-server`, ~1 ms at R3) the `Add`s arriving gather for the next;
/// the waits after the acknowledgement (applied here, the members' reports) overlap the next publish.
pub(super) const PUBLISHING: usize = 1;

/// Keys' bytes (4 bytes per key of framing counted) past which no further `Add` joins a message: well under
/// NATS's default `max_payload` (1 MiB), which refuses a larger message.
pub(super) const MERGED_BYTES: usize = 64 * 1024;

/// An `Add` whose keys take this many bytes or more leaves at once and alone, beside any publish in
/// progress: its message already carries enough keys to pay for itself. Measured (three replicas, 3
/// 1,000-key `Add`s of 16-byte keys in flight on each): queued behind the publish in progress, 1.2 of them
/// shared a message and the replicas' apply reports coalesced less (2.30 instead of 2.16 NATS messages in per
/// `Add`): 5% fewer `Add`s/s and 10% more replica CPU per `Add`. At R3 (three nats-servers, the `compare` bench's
/// 9 1,000-key `Add`s in flight), with no size past which an `Add` leaves alone: 1.35 `Add`s per message, NATS
/// CPU per `Add` 986 instead of 848 µs and 14% fewer `Add`s/s — NATS's Raft already sends the publishes that
/// arrive together as one append, and holding `Add`s back here leaves it fewer to put together.
pub(super) const ALONE_BYTES: usize = 8 * 1024;

/// An `Add` prepared against the gate, waiting for its message.
pub(super) struct QueuedAdd {
    pub namespace: Arc<str>,
    pub at_ms: u64,
    pub keys: PackedKeys,
    pub new_keys: NewKeys,
    pub answer: oneshot::Sender<Result<Added, GateError>>,
}

/// What applying a batch's message did, by position among its merged keys (ascending).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Stored {
    pub seq: u64,
    pub cleared: Vec<u32>,
    pub new: Option<Vec<u32>>,
}

/// `Add`s that leave in one message; `slotted` while it holds a publish slot (a large `Add` leaving alone
/// holds none).
pub(super) struct Batch {
    adds: Vec<QueuedAdd>,
    pub slotted: bool,
}

/// The `Add`s waiting for a publish slot, and how many slots are taken.
pub(super) struct AddQueue {
    state: Mutex<State>,
    /// How many `Add`s wait (`existence_replica_adds_waiting`).
    waiting: Gauge,
}

#[derive(Default)]
struct State {
    queued: VecDeque<QueuedAdd>,
    publishing: usize,
}

impl AddQueue {
    pub fn new(waiting: Gauge) -> Self {
        waiting.set(0.0);
        Self {
            state: Mutex::default(),
            waiting,
        }
    }

    /// Queues `add`; the batch to publish now: `add` alone if it is large, else if a slot is free (the
    /// caller then holds the slot until it calls [`published`](Self::published)).
    pub fn push(&self, add: QueuedAdd) -> Option<Batch> {
        if add.keys.bytes() >= ALONE_BYTES {
            return Some(Batch {
                adds: vec![add],
                slotted: false,
            });
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.queued.push_back(add);
        self.take_slot(&mut state)
    }

    /// A slot's publish is over (acknowledged or failed): the next batch to publish in it, if any waits.
    pub fn published(&self) -> Option<Batch> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.publishing -= 1;
        self.take_slot(&mut state)
    }

    /// [`State::take_slot`], then the gauge of those still waiting.
    fn take_slot(&self, state: &mut State) -> Option<Batch> {
        let batch = state.take_slot();
        self.waiting.set(state.queued.len() as f64);
        batch
    }
}

impl State {
    /// The `Add`s at the front that share its namespace and fit one message, if a slot is free.
    fn take_slot(&mut self) -> Option<Batch> {
        if self.publishing == PUBLISHING {
            return None;
        }
        let first = self.queued.pop_front()?;
        self.publishing += 1;
        let mut bytes = first.keys.bytes();
        let mut batch = vec![first];
        while let Some(next) = self.queued.front() {
            if next.namespace != batch[0].namespace || bytes + next.keys.bytes() > MERGED_BYTES {
                break;
            }
            bytes += next.keys.bytes();
            batch.extend(self.queued.pop_front());
        }
        Some(Batch {
            adds: batch,
            slotted: true,
        })
    }
}

impl Batch {
    /// How many `Add`s share the message.
    pub fn len(&self) -> usize {
        self.adds.len()
    }

    /// The one `Add` carrying every key of the batch, in order, at the latest time among them (a key's
    /// window is never earlier than its caller's clock said).
    pub fn mutation(&self) -> Mutation {
        let parts: Vec<&PackedKeys> = self.adds.iter().map(|add| &add.keys).collect();
        Mutation::Add {
            namespace: Arc::clone(&self.adds[0].namespace),
            seq: 0,
            at_ms: self.adds.iter().map(|add| add.at_ms).max().unwrap_or(0),
            keys: PackedKeys::concat(&parts),
        }
    }

    /// Whether a caller asked which of its keys were new: then the message reports them.
    pub fn new_keys(&self) -> NewKeys {
        match self.adds.iter().any(|add| add.new_keys == NewKeys::Report) {
            true => NewKeys::Report,
            false => NewKeys::Skip,
        }
    }

    /// Answers every caller: stored at `seq`, each told of the tombstones cleared among its own keys and,
    /// if it asked, which of its keys were new (positions counted from its first key); or the error, to all.
    pub fn answer(self, outcome: Result<Stored, GateError>) {
        let Stored { seq, cleared, new } = match outcome {
            Ok(stored) => stored,
            Err(error) => {
                for add in self.adds {
                    // A caller that went away is not waiting for its answer.
                    let _ = add.answer.send(Err(error.clone()));
                }
                return;
            }
        };
        let mut start = 0;
        for add in self.adds {
            let end = start + add.keys.len() as u32;
            let tombstones_cleared = cleared
                .iter()
                .filter(|&&position| (start..end).contains(&position))
                .count() as u32;
            let new = new
                .as_ref()
                .filter(|_| add.new_keys == NewKeys::Report)
                .map(|new| {
                    new.iter()
                        .filter(|&&position| (start..end).contains(&position))
                        .map(|position| position - start)
                        .collect()
                });
            let _ = add.answer.send(Ok(Added {
                seq,
                tombstones_cleared,
                new,
            }));
            start = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn add(
        namespace: &str,
        at_ms: u64,
        keys: &[&str],
    ) -> (QueuedAdd, oneshot::Receiver<Result<Added, GateError>>) {
        let (answer, answered) = oneshot::channel();
        let keys: Vec<Bytes> = keys
            .iter()
            .map(|k| Bytes::copy_from_slice(k.as_bytes()))
            .collect();
        let queued = QueuedAdd {
            namespace: namespace.into(),
            at_ms,
            keys: PackedKeys::pack(&keys),
            new_keys: NewKeys::Skip,
            answer,
        };
        (queued, answered)
    }

    fn keys(mutation: &Mutation) -> Vec<&[u8]> {
        match mutation {
            Mutation::Add { keys, .. } => keys.slices().collect(),
            other => panic!("expected an Add, got {other:?}"),
        }
    }

    #[test]
    fn an_add_at_an_idle_replica_leaves_at_once_and_alone() {
        let queue = AddQueue::new(Gauge::noop());
        let (a, _answer) = add("default", 5, &["a"]);
        let batch = queue.push(a).expect("a free slot publishes at once");
        assert_eq!(batch.len(), 1);
        assert_eq!(keys(&batch.mutation()), [b"a"]);
        assert!(queue.published().is_none(), "nothing else waits");
    }

    #[test]
    fn adds_arriving_during_a_publish_leave_together_in_order_then_the_rest() {
        let queue = AddQueue::new(Gauge::noop());
        let (first, _) = add("default", 5, &["a"]);
        assert!(queue.push(first).is_some());
        for (name, at_ms, key) in [
            ("default", 9, "b"),
            ("default", 7, "c"),
            ("other", 8, "d"),
            ("default", 6, "e"),
        ] {
            let (waiting, _) = add(name, at_ms, &[key]);
            assert!(
                queue.push(waiting).is_none(),
                "the slot is taken until the publish is over"
            );
        }
        let merged = queue
            .published()
            .expect("the slot freed takes the queue's front");
        assert_eq!(merged.len(), 2, "only the front's namespace joins it");
        let mutation = merged.mutation();
        assert_eq!(keys(&mutation), [b"b", b"c"]);
        assert_eq!(mutation.namespace(), "default");
        let Mutation::Add { at_ms, .. } = mutation else {
            unreachable!()
        };
        assert_eq!(
            at_ms, 9,
            "the latest caller's time: no key's window is earlier than its own"
        );
        assert_eq!(keys(&queue.published().unwrap().mutation()), [b"d"]);
        assert_eq!(keys(&queue.published().unwrap().mutation()), [b"e"]);
        assert!(queue.published().is_none());
        let (later, _) = add("default", 10, &["f"]);
        assert!(queue.push(later).is_some(), "the slot is free again");
    }

    #[test]
    fn a_message_stops_growing_at_the_merged_bound_and_a_large_add_leaves_at_once() {
        let queue = AddQueue::new(Gauge::noop());
        let (first, _) = add("default", 1, &["x"]);
        assert!(queue.push(first).unwrap().slotted);
        let small = "k".repeat(ALONE_BYTES - 5);
        let per_message = MERGED_BYTES / (small.len() + 4);
        for _ in 0..=per_message {
            let (waiting, _) = add("default", 1, &[&small]);
            assert!(queue.push(waiting).is_none());
        }
        let large = "h".repeat(ALONE_BYTES);
        let (alone, _) = add("default", 1, &[&large]);
        let batch = queue
            .push(alone)
            .expect("a large Add leaves at once, beside the publish in progress");
        assert!(!batch.slotted, "and takes no slot");
        assert_eq!(keys(&batch.mutation()), [large.as_bytes()]);
        assert_eq!(queue.published().unwrap().len(), per_message);
        assert_eq!(queue.published().unwrap().len(), 1);
        assert!(queue.published().is_none());
    }

    #[tokio::test]
    async fn each_caller_is_told_the_shared_seq_and_only_its_own_cleared_tombstones() {
        let queue = AddQueue::new(Gauge::noop());
        let (first, _) = add("default", 1, &["a", "b"]);
        let (second, second_answer) = add("default", 1, &["c"]);
        let (third, third_answer) = add("default", 1, &["d", "e", "f"]);
        assert!(queue.push(first).is_some());
        assert!(queue.push(second).is_none());
        assert!(queue.push(third).is_none());
        let merged = queue.published().unwrap();
        assert_eq!(merged.len(), 2);
        merged.answer(Ok(Stored {
            seq: 42,
            cleared: vec![1, 3],
            new: Some(vec![0, 2, 3]),
        }));
        assert_eq!(
            second_answer.await.unwrap(),
            Ok(Added {
                seq: 42,
                tombstones_cleared: 0,
                new: None,
            })
        );
        assert_eq!(
            third_answer.await.unwrap(),
            Ok(Added {
                seq: 42,
                tombstones_cleared: 2,
                new: None,
            })
        );
    }

    #[tokio::test]
    async fn a_caller_that_asked_is_told_which_of_its_own_keys_were_new() {
        let queue = AddQueue::new(Gauge::noop());
        let (first, _) = add("default", 1, &["a"]);
        let (mut second, second_answer) = add("default", 1, &["b", "c"]);
        second.new_keys = NewKeys::Report;
        let (third, third_answer) = add("default", 1, &["d"]);
        assert!(queue.push(first).is_some());
        assert!(queue.push(second).is_none());
        assert!(queue.push(third).is_none());
        let merged = queue.published().unwrap();
        assert_eq!(merged.new_keys(), NewKeys::Report);
        merged.answer(Ok(Stored {
            seq: 9,
            cleared: Vec::new(),
            new: Some(vec![0, 1, 2]),
        }));
        let second = second_answer.await.unwrap().unwrap();
        assert_eq!(second.new, Some(vec![0, 1]), "b and c, counted from b");
        assert_eq!(third_answer.await.unwrap().unwrap().new, None, "not asked");
    }

    #[tokio::test]
    async fn a_failed_publish_is_every_callers_error() {
        let queue = AddQueue::new(Gauge::noop());
        let (first, first_answer) = add("default", 1, &["a"]);
        let (second, second_answer) = add("default", 1, &["b"]);
        let (third, third_answer) = add("default", 1, &["c"]);
        let lone = queue.push(first).unwrap();
        assert!(queue.push(second).is_none());
        assert!(queue.push(third).is_none());
        lone.answer(Ok(Stored {
            seq: 7,
            cleared: vec![0],
            new: None,
        }));
        assert_eq!(
            first_answer.await.unwrap(),
            Ok(Added {
                seq: 7,
                tombstones_cleared: 1,
                new: None,
            })
        );
        let error = GateError::Unavailable("NATS: down".into());
        queue.published().unwrap().answer(Err(error.clone()));
        assert_eq!(second_answer.await.unwrap(), Err(error.clone()));
        assert_eq!(third_answer.await.unwrap(), Err(error));
    }
}
