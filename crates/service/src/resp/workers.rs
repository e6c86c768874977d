//! The threads RESP connections are served on: by default one per core, each running a single-threaded
//! tokio runtime, as Redis serves its clients from an event loop that keeps a connection on one thread. A
//! connection's reads, commands and writes stay on the thread whose event loop saw it readable, apart from
//! the gRPC port's runtime; writes still reach the gate's writer (the log, or the replica's stream) through
//! channels that work across runtimes.
//!
//! Measured (`cargo bench --bench load -- resp`, docs/performance.md): served on the shared runtime instead,
//! CPU per command was the same within the noise; the count is what matters. One thread costs ~15% less per
//! unpipelined command than two (one loop finds more connections ready per wake-up) and holds a pipelined
//! load to one core, so the default is one per core and `--resp-threads` chooses.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::{Builder, Handle};
use tokio::sync::{mpsc, watch};

use crate::shutdown::Shutdown;

/// How long a worker waits, once the port closes, for its connections to finish their last replies.
const DRAIN: Duration = Duration::from_secs(10);

/// The connection threads of one RESP port; dropping it (the accept loop ended) lets them finish, and
/// [`finish`](Self::finish) waits until they have.
#[derive(Debug)]
pub struct Workers {
    handles: Vec<(Handle, Arc<AtomicUsize>)>,
    next: AtomicUsize,
    closed: watch::Sender<bool>,
    /// Closed once every thread has ended (each holds a sender until then).
    ended: mpsc::Receiver<()>,
}

impl Workers {
    /// `count` threads, which run until `shutdown` or until this is dropped, then give their connections
    /// up to [`DRAIN`] to end.
    pub fn start(count: usize, shutdown: &Shutdown) -> std::io::Result<Self> {
        let (closed, _) = watch::channel(false);
        let (running, ended) = mpsc::channel(1);
        let mut handles = Vec::with_capacity(count);
        for index in 0..count {
            let runtime = Builder::new_current_thread().enable_all().build()?;
            let handle = runtime.handle().clone();
            let open = Arc::new(AtomicUsize::new(0));
            let (shutdown, mut closed, served) =
                (shutdown.clone(), closed.subscribe(), Arc::clone(&open));
            let running = running.clone();
            std::thread::Builder::new()
                .name(format!("resp-{index}"))
                .spawn(move || {
                    let _running = running;
                    runtime.block_on(async {
                        tokio::select! {
                            () = shutdown.wait() => {}
                            _ = closed.wait_for(|closed| *closed) => {}
                        }
                        let deadline = Instant::now() + DRAIN;
                        while served.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    });
                })?;
            handles.push((handle, open));
        }
        Ok(Self {
            handles,
            next: AtomicUsize::new(0),
            closed,
            ended,
        })
    }

    /// Lets the threads finish — each gives its connections up to [`DRAIN`] to end — and waits until they
    /// have: the process must not exit under a connection still writing its last reply.
    pub async fn finish(mut self) {
        self.closed.send_replace(true);
        while self.ended.recv().await.is_some() {}
    }

    /// Runs `serve` with `tcp` on the next thread in turn; `tcp` is moved to that thread's event loop.
    pub fn spawn<F>(
        &self,
        tcp: tokio::net::TcpStream,
        serve: impl FnOnce(tokio::net::TcpStream) -> F + Send + 'static,
    ) where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let (handle, open) =
            &self.handles[self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len()];
        let Ok(std) = tcp.into_std() else {
            return;
        };
        let open = Arc::clone(open);
        open.fetch_add(1, Ordering::AcqRel);
        handle.spawn(async move {
            let counted = Counted(open);
            if let Ok(tcp) = tokio::net::TcpStream::from_std(std) {
                serve(tcp).await;
            }
            drop(counted);
        });
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.closed.send_replace(true);
    }
}

/// A connection in a worker's count until dropped.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
