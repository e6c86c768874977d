//! Gathers concurrent single-key lookups into batches: the first key waits at most `window` for others,
//! and a batch leaves as soon as it holds `max_keys`.
//!
//! Why a thread: tokio's timer wheel has a 1 ms resolution, five times the default window, so an async
//! timer would add up to 1 ms to every lone lookup. A condition variable's timed wait is a futex with
//! microsecond precision; the thread only gathers and hands each batch to the runtime, where it is sent.
//! Its cost is one wake-up per batch, on the client.
//!
//! Each caller waits on its own oneshot: a caller that gives up (deadline, cancellation) just drops its end,
//! and the batch goes on for the others.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::oneshot;

use crate::endpoints::lock;

/// One caller's key and where its answer goes.
pub struct Waiter<A> {
    /// The key looked up.
    pub key: Bytes,
    /// The caller's end; sending fails harmlessly when the caller has gone.
    pub reply: oneshot::Sender<A>,
}

/// Where a full or due batch is handed (it must not block: it spawns the call).
pub type Sink<A> = Box<dyn Fn(Vec<Waiter<A>>) + Send + 'static>;

struct Pending<A> {
    waiters: Vec<Waiter<A>>,
    /// When the oldest waiter arrived.
    since: Option<Instant>,
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
        let max_keys = max_keys.max(1);
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                waiters: Vec::with_capacity(max_keys),
                since: None,
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

    /// Queues `key`; the answer arrives on the returned receiver (closed without one if the coalescer
    /// stops first).
    pub fn submit(&self, key: Bytes) -> oneshot::Receiver<A> {
        let (reply, answer) = oneshot::channel();
        let mut pending = lock(&self.shared.pending);
        pending.waiters.push(Waiter { key, reply });
        let queued = pending.waiters.len();
        if queued == 1 {
            pending.since = Some(Instant::now());
        }
        drop(pending);
        // The thread sleeps with nothing queued (needs the first key) or until the window ends (needs a
        // full batch); other arrivals need not wake it.
        if queued == 1 || queued == self.max_keys {
            self.shared.wake.notify_one();
        }
        answer
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

/// The thread: waits for a first key, then until the window ends or the batch is full, and hands the batch
/// to `sink`. On close, what is queued is still sent.
fn gather<A>(shared: &Shared<A>, window: Duration, max_keys: usize, sink: Sink<A>) {
    let mut pending = lock(&shared.pending);
    loop {
        let Some(since) = pending.since else {
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
        if pending.waiters.len() >= max_keys || now >= due || pending.closed {
            let take = pending.waiters.len().min(max_keys);
            let batch: Vec<_> = pending.waiters.drain(..take).collect();
            pending.since = (!pending.waiters.is_empty()).then(Instant::now);
            drop(pending);
            sink(batch);
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
