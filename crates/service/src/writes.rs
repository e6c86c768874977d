//! The single server's writes: the local gate, through its log (see [`Writes`]).

use std::sync::Arc;
use std::time::Duration;

use crate::core::gate::{Gate, GateError, Logged};
use crate::core::keys::PackedKeys;
use crate::core::namespace::{AbsenceReport, Added, NewKeys, Recorded};
use crate::core::writes::{Pending, Writes};
use crate::mirror::MirrorRegistry;
use crate::request_keys::BLOCKING_BATCH_BYTES;

/// How long a write that arrives while the state loads waits for it before it is refused "still loading".
const LOADING_WAIT: Duration = Duration::from_secs(10);

/// Writes applied to the local gate and logged by it.
#[derive(Debug)]
pub struct LocalWrites {
    gate: Arc<Gate>,
    /// The mirrors attached to this gate, whose sub-leases an `Add` waits on (rule 3 of
    /// [`crate::core::sublease`]); `None` with mirrors off.
    mirrors: Option<Arc<MirrorRegistry>>,
}

impl LocalWrites {
    /// Writes to `gate`.
    pub fn new(gate: Arc<Gate>) -> Self {
        Self {
            gate,
            mirrors: None,
        }
    }

    /// These writes, each `Add` acknowledged only once `mirrors` count it applied.
    pub fn with_mirrors(mut self, mirrors: Arc<MirrorRegistry>) -> Self {
        self.mirrors = Some(mirrors);
        self
    }

    /// Runs `write` (`large`: over [`BLOCKING_BATCH_BYTES`] of keys) and waits for the log before its
    /// answer. Applying and appending never wait for a disk, so they run on the caller's task — a large
    /// write on the blocking pool, as a large lookup is, so that no request thread is busy with it for long.
    /// The wait for the log is where the modes differ:
    /// - a log that wakes its waiters itself (the write-ahead log, [`Log::commits_without_thread`]) is
    ///   awaited on the task: thousands of writes in flight cost no thread each, and one group write wakes
    ///   only the writes it made durable; a log that never waits (`--in-memory`) is done at once;
    /// - any other log is waited for on the blocking pool — a request thread that waited would stall every
    ///   call queued behind it, health checks included (the runtime has one per core).
    ///
    /// [`Log::commits_without_thread`]: crate::core::log::Log::commits_without_thread
    async fn run<T: Send + 'static>(
        &self,
        large: bool,
        write: impl FnOnce(&Gate) -> Result<Logged<T>, GateError> + Send + 'static,
    ) -> Result<T, GateError> {
        if !self.gate.is_ready() {
            let _ = tokio::time::timeout(LOADING_WAIT, self.gate.until_ready()).await;
        }
        if self.gate.commits_without_thread() || !self.gate.writes_may_wait() {
            let logged = if large {
                self.on_blocking_pool(write).await?
            } else {
                write(&self.gate)?
            };
            return self.gate.committed(logged).await;
        }
        self.on_blocking_pool(move |gate| gate.commit(write(gate)?))
            .await
    }

    /// Runs `work` on the blocking pool.
    async fn on_blocking_pool<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Gate) -> Result<T, GateError> + Send + 'static,
    ) -> Result<T, GateError> {
        let gate = Arc::clone(&self.gate);
        tokio::task::spawn_blocking(move || work(&gate))
            .await
            .unwrap_or_else(|e| {
                Err(GateError::Unavailable(format!(
                    "the write's task failed: {e}"
                )))
            })
    }
}

impl Writes for LocalWrites {
    fn add<'a>(
        &'a self,
        namespace: &'a str,
        keys: PackedKeys,
        new_keys: NewKeys,
    ) -> Pending<'a, Result<Added, GateError>> {
        let name = namespace.to_string();
        let large = keys.bytes() >= BLOCKING_BATCH_BYTES;
        Box::pin(async move {
            let added = self
                .run(large, move |gate| gate.add_logged(&name, keys, new_keys))
                .await?;
            if let Some(mirrors) = &self.mirrors {
                mirrors.applied(namespace, added.seq).await;
            }
            Ok(added)
        })
    }

    fn record_absent<'a>(
        &'a self,
        namespace: &'a str,
        report: AbsenceReport,
    ) -> Pending<'a, Result<Recorded, GateError>> {
        let namespace = namespace.to_string();
        Box::pin(self.run(false, move |gate| {
            gate.record_absent_logged(&namespace, report)
        }))
    }

    fn reach(&self, _seq: u64, _bound: Duration) -> Pending<'_, bool> {
        Box::pin(std::future::ready(true))
    }

    fn vouch(&self, _bound: Duration) -> Pending<'_, bool> {
        Box::pin(std::future::ready(true))
    }
}
