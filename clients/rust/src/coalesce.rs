//! Gathers concurrent lookups into batches. A pending batch leaves when
//! - no batch is in flight (an idle client adds no latency: the first lookup leaves at once),
//! - its oldest lookup has waited `window`, or
//! - it holds `max_keys` keys,
//!
//! so under load each batch carries what arrived while the previous ones were out, and a lone caller pays
//! one round trip, not a window. A waiter may bring several keys (`may_exist_many`); a batch never splits
//! one, and never exceeds `MAX_BATCH_KEYS`.
//!
//! Why a thread: tokio's timer wheel has a 1 ms resolution, five times the default window, so an async
//! timer would stretch every window to a millisecond. A condition variable's timed wait is a futex with
//! microsecond precision; the thread only gathers and hands each batch to the runtime, where it is sent.
//!
//! Each caller waits on its own oneshot: a caller that gives up (cancellation) just drops its end, and the
//! batch goes on for the others. A caller sets no timer of its own: its batch leaves within the window and
//! gives up at the deadline of its oldest waiter, so every caller is answered within its deadline. (A timer
//! per lookup cost two trips through tokio's timer wheel, each under its lock, on every lookup.)

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::sync::oneshot;

use crate::endpoints::lock;

/// The most keys one batch carries: the gate's default `max_batch_keys`.
pub const MAX_BATCH_KEYS: usize = 10_000;

/// A caller's keys: one key as given (no copy until its batch is packed), or several already packed.
pub enum Keys {
    /// One key (`may_exist`).
    One(Bytes),
    /// `count` keys packed as `packed_keys` wants them, each preceded by its varint length
    /// (`may_exist_many`).
    Packed {
        /// The keys, packed.
        packed: Bytes,
        /// How many.
        count: usize,
    },
}

impl Keys {
    /// How many keys.
    pub fn count(&self) -> usize {
        match self {
            Keys::One(_) => 1,
            Keys::Packed { count, .. } => *count,
        }
    }

    /// Bytes they take packed.
    pub fn packed_len(&self) -> usize {
        match self {
            Keys::One(key) => prost::encoding::encoded_len_varint(key.len() as u64) + key.len(),
            Keys::Packed { packed, .. } => packed.len(),
        }
    }

    /// Appends them, packed, to a batch's keys.
    pub fn pack_into(&self, batch: &mut BytesMut) {
        match self {
            Keys::One(key) => {
                prost::encoding::encode_varint(key.len() as u64, batch);
                batch.put_slice(key);
            }
            Keys::Packed { packed, .. } => batch.put_slice(packed),
        }
    }
}

/// One caller's keys and where their answer goes.
pub struct Waiter<A> {
    /// The keys looked up: a batch packs its waiters' keys end to end.
    pub keys: Keys,
    /// The caller's end; sending fails harmlessly when the caller has gone.
    pub reply: oneshot::Sender<A>,
    /// When it was queued: the batch that carries it gives up at the deadline of its oldest waiter.
    pub arrived: Instant,
}

/// Held by a batch until it is answered: dropping it tells the gatherer one batch fewer is in flight.
pub struct InFlight<A> {
    shared: Arc<Shared<A>>,
}

/// Where a batch is handed (it must not block: it spawns the call), with its [`InFlight`] to drop once
/// answered.
pub type Sink<A> = Box<dyn Fn(Vec<Waiter<A>>, InFlight<A>) + Send + 'static>;

struct Pending<A> {
    waiters: Vec<Waiter<A>>,
    /// Keys of all waiters.
    keys: usize,
    /// Batches sent and not yet answered.
    in_flight: usize,
    closed: bool,
}

struct Shared<A> {
    pending: Mutex<Pending<A>>,
    wake: Condvar,
}

/// The gathering thread and the queue it drains.
pub struct Coalescer<A: Send + 'static> {
    shared: Arc<Shared<A>>,
    max_keys: usize,
    thread: Option<JoinHandle<()>>,
}

impl<A: Send + 'static> Coalescer<A> {
    /// Starts the thread; each batch goes to `sink`.
    pub fn start(window: Duration, max_keys: usize, sink: Sink<A>) -> Self {
        let max_keys = max_keys.clamp(1, MAX_BATCH_KEYS);
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                waiters: Vec::new(),
                keys: 0,
                in_flight: 0,
                closed: false,
            }),
            wake: Condvar::new(),
        });
        let gathering = shared.clone();
        let thread = std::thread::Builder::new()
            .name("existence-gate-coalescer".to_string())
            .spawn(move || gather(&gathering, window, max_keys, sink))
            .expect("spawns the coalescing thread");
        Self {
            shared,
            max_keys,
            thread: Some(thread),
        }
    }

    /// Queues `keys` (at most [`MAX_BATCH_KEYS`]); the answer arrives on the returned receiver (closed
    /// without one if the coalescer stops first).
    pub fn submit(&self, keys: Keys) -> oneshot::Receiver<A> {
        let count = keys.count();
        debug_assert!(count <= MAX_BATCH_KEYS);
        let (reply, answer) = oneshot::channel();
        let arrived = Instant::now();
        let mut pending = lock(&self.shared.pending);
        let was_full = pending.keys >= self.max_keys;
        let first = pending.waiters.is_empty();
        pending.keys += count;
        pending.waiters.push(Waiter {
            keys,
            reply,
            arrived,
        });
        let now_full = !was_full && pending.keys >= self.max_keys;
        drop(pending);
        // The thread sleeps with nothing queued (needs the first waiter) or until the window ends or a batch
        // comes back (needs a full batch); other arrivals need not wake it.
        if first || now_full {
            self.shared.wake.notify_one();
        }
        answer
    }
}

impl<A> Drop for InFlight<A> {
    fn drop(&mut self) {
        let mut pending = lock(&self.shared.pending);
        pending.in_flight -= 1;
        if pending.in_flight == 0 && !pending.waiters.is_empty() {
            self.shared.wake.notify_one();
        }
    }
}

impl<A: Send + 'static> Drop for Coalescer<A> {
    fn drop(&mut self) {
        lock(&self.shared.pending).closed = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread: waits for a first waiter, then until a rule at the top of this file sends the batch, and
/// hands it to `sink`. On close, what is queued is still sent.
fn gather<A>(shared: &Arc<Shared<A>>, window: Duration, max_keys: usize, sink: Sink<A>) {
    let mut pending = lock(&shared.pending);
    loop {
        let Some(since) = pending.waiters.first().map(|oldest| oldest.arrived) else {
            if pending.closed {
                return;
            }
            pending = shared
                .wake
                .wait(pending)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            continue;
        };
        let due = since + window;
        let now = Instant::now();
        let leave =
            pending.in_flight == 0 || pending.keys >= max_keys || now >= due || pending.closed;
        if leave {
            let batch = take_batch(&mut pending, max_keys);
            pending.in_flight += 1;
            drop(pending);
            let in_flight = InFlight {
                shared: Arc::clone(shared),
            };
            sink(batch, in_flight);
            pending = lock(&shared.pending);
            continue;
        }
        pending = shared
            .wake
            .wait_timeout(pending, due - now)
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .0;
    }
}

/// The oldest waiters, up to `max_keys` keys (at least one waiter, never past `MAX_BATCH_KEYS`).
fn take_batch<A>(pending: &mut Pending<A>, max_keys: usize) -> Vec<Waiter<A>> {
    let mut keys = 0;
    let mut count = 0;
    for waiter in &pending.waiters {
        let more = waiter.keys.count();
        if count > 0 && (keys >= max_keys || keys + more > MAX_BATCH_KEYS) {
            break;
        }
        keys += more;
        count += 1;
    }
    pending.keys -= keys;
    pending.waiters.drain(..count).collect()
}
