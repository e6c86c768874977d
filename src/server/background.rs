//! The loops that run beside serving — maintenance, snapshots, log syncing and watching — and the last
//! snapshot at shutdown. Each ends when shutdown is triggered; [`Background::stop`] waits for them (aborting
//! past a bound) so that none still writes when the final snapshot is taken.

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;

use super::DurabilityOptions;
use crate::core::gate::Gate;
use crate::service::shutdown::Shutdown;
use crate::storage::{Persistence, PersistenceError, Snapshotter, Wal};

/// How often dead windows and expired tombstones are freed.
const MAINTENANCE_INTERVAL: Duration = Duration::from_secs(5);
/// How often the log size is checked against the snapshot threshold.
const SNAPSHOT_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How often the log's files and write health are checked.
const LOG_WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// The server's background loops, which shutdown waits for (and aborts past a bound) before the final
/// snapshot, so that none of them still writes when it is taken.
#[derive(Debug, Clone, Default)]
pub(super) struct Background(Arc<std::sync::Mutex<tokio::task::JoinSet<()>>>);

impl Background {
    pub(super) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).spawn(task);
    }

    /// Waits for every loop to end (they end at shutdown), aborting those still running after `bound`.
    pub(super) async fn stop(&self, bound: Duration) {
        let mut tasks = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        if tokio::time::timeout(bound, async { while tasks.join_next().await.is_some() {} })
            .await
            .is_err()
        {
            tracing::warn!("background tasks still running after {bound:?}; aborting them");
            tasks.shutdown().await;
        }
    }
}

/// Runs `tick` every `every` until shutdown, each time on the blocking pool (the work scans tables or
/// touches the disk), one at a time.
async fn every_tick(every: Duration, shutdown: Shutdown, tick: impl Fn() + Clone + Send + 'static) {
    let mut ticks = tokio::time::interval(every);
    loop {
        tokio::select! {
            () = shutdown.wait() => break,
            _ = ticks.tick() => {
                let _ = tokio::task::spawn_blocking(tick.clone()).await;
            }
        }
    }
}

/// Every `MAINTENANCE_INTERVAL`: checks the wall clock against the gate's own (a step is logged and counted),
/// frees dead windows and expired tombstones, and folds the latency samples
/// recorded since into the Prometheus histograms (which otherwise keep every sample until a scrape, so a
/// server nobody scrapes would grow by ~17 bytes per call).
pub(super) async fn maintenance(gate: Arc<Gate>, prometheus: PrometheusHandle, shutdown: Shutdown) {
    every_tick(MAINTENANCE_INTERVAL, shutdown, move || {
        if let Some(check) = gate.check_wall_clock() {
            crate::service::metrics::wall_clock(check);
        }
        gate.maintain();
        prometheus.run_upkeep();
    })
    .await;
}

/// Takes a snapshot every `snapshot_interval`, or sooner once `snapshot_log_bytes` were logged.
pub(super) async fn take_snapshots(
    gate: Arc<Gate>,
    snapshots: Arc<Snapshotter>,
    durability: DurabilityOptions,
    shutdown: Shutdown,
) {
    let last = Arc::new(std::sync::Mutex::new(std::time::Instant::now()));
    every_tick(SNAPSHOT_CHECK_INTERVAL, shutdown, move || {
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        let due = last.elapsed() >= durability.snapshot_interval
            || snapshots.log_bytes_since() >= durability.snapshot_log_bytes;
        if !due {
            return;
        }
        if let Err(error) = snapshots.take(&gate) {
            tracing::error!(%error, "snapshot failed; the log keeps everything");
        }
        *last = std::time::Instant::now();
    })
    .await;
}

/// Every `LOG_WATCH_INTERVAL`: checks that the log's segment is still the file its name leads to (a data
/// directory deleted under the server poisons the log rather than acknowledging writes no restart reads),
/// retries records a full disk held back, and publishes whether writes are refused.
pub(super) async fn watch_log(wal: Arc<Wal>, gate: Arc<Gate>, shutdown: Shutdown) {
    every_tick(LOG_WATCH_INTERVAL, shutdown, move || {
        wal.check_segment_linked();
        wal.retry_writes();
        crate::service::metrics::writes_refused(gate.write_failure().is_some());
    })
    .await;
}

/// Fsyncs the log every `every` (`--sync interval`).
pub(super) async fn sync_periodically(wal: Arc<Wal>, every: Duration, shutdown: Shutdown) {
    every_tick(every, shutdown, move || {
        if let Err(error) = wal.sync_now() {
            tracing::error!(%error, "periodic log sync failed");
        }
    })
    .await;
}

/// Syncs the log and takes the snapshot that lets the next start replay nothing; a failure is logged with
/// what it means for the next start.
pub(super) async fn final_snapshot(gate: &Arc<Gate>, persistence: &Persistence) {
    let (wal, snapshots, snapshot_gate) = (
        Arc::clone(&persistence.wal),
        Arc::clone(&persistence.snapshots),
        Arc::clone(gate),
    );
    let closed = tokio::task::spawn_blocking(move || {
        wal.sync_now()
            .map_err(|e| PersistenceError::io(std::path::Path::new("log"), "sync", e.0))?;
        snapshots.take(&snapshot_gate)
    })
    .await;
    match closed {
        Ok(Ok(_)) => tracing::info!("final snapshot taken"),
        Ok(Err(error)) => match gate.write_failure() {
            None => tracing::error!(
                %error,
                "final snapshot failed; the log holds every acknowledged write, and the next start \
                 replays it"
            ),
            Some(reason) => tracing::error!(
                %error,
                %reason,
                "final snapshot failed, and writes were refused before it for the reason given: check \
                 the data directory before restarting"
            ),
        },
        Err(panic) => tracing::error!(%panic, "final snapshot panicked"),
    }
}
