//! Loading the durable state in the background while the ports already serve (lookups fail open as
//! `WARMING`, writes are refused): recover, start the loops that keep the log and snapshots, then move the
//! lifecycle to ready — or to failed, with the reason, if recovery cannot complete.

use std::sync::Arc;

use super::background::{sync_periodically, take_snapshots, watch_log, Background};
use super::DurabilityOptions;
use crate::core::gate::Gate;
use crate::service::lifecycle::Lifecycle;
use crate::storage::{self, DataDir, Persistence, Snapshotter, SyncMode, Wal};

/// The background work of loading state and then opening the gate.
pub(super) struct Load {
    pub(super) gate: Arc<Gate>,
    pub(super) lifecycle: Arc<Lifecycle>,
    pub(super) background: Background,
}

impl Load {
    pub(super) async fn recover(self, dir: DataDir, durability: DurabilityOptions) {
        let gate = Arc::clone(&self.gate);
        let (sync, files) = (durability.sync, Arc::clone(&durability.segment_files));
        let recovered = tokio::task::spawn_blocking(move || {
            storage::recover_with_files(&dir, &gate, sync, files)
                .map(|(wal, recovered)| (dir, wal, recovered))
        })
        .await;
        let (dir, wal, recovered) = match recovered {
            Ok(Ok(done)) => done,
            Ok(Err(error)) => return self.lifecycle.fail(error.to_string()),
            Err(panic) => return self.lifecycle.fail(format!("loading panicked: {panic}")),
        };
        tracing::info!(
            snapshot = ?recovered.snapshot,
            log_records = recovered.records,
            log_bytes = recovered.log_bytes,
            elapsed = ?recovered.elapsed,
            "state loaded"
        );
        let wal = Arc::new(wal);
        if let Err(error) = Wal::start_flusher(&wal) {
            // Writes then wait for the log on the blocking pool, as before the flusher existed.
            tracing::warn!(%error, "writes wait for the log on threads of their own");
        }
        let snapshots = Arc::new(Snapshotter::new(Arc::new(dir), Arc::clone(&wal)));
        let shutdown = self.lifecycle.shutdown();
        self.background.spawn(take_snapshots(
            Arc::clone(&self.gate),
            Arc::clone(&snapshots),
            durability,
            shutdown.clone(),
        ));
        if let SyncMode::Interval(every) = sync {
            self.background
                .spawn(sync_periodically(Arc::clone(&wal), every, shutdown.clone()));
        }
        self.background.spawn(watch_log(
            Arc::clone(&wal),
            Arc::clone(&self.gate),
            shutdown.clone(),
        ));
        let persistence = Persistence {
            wal: Arc::clone(&wal),
            snapshots,
        };
        self.lifecycle
            .ready(&self.gate, wal, Some(persistence))
            .await;
    }
}
