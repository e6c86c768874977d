//! Replicated mode's wiring: join the stream before the gate exists (its hash seed and every namespace's
//! sizing come from the stream), then run the replica's loops — apply, keep the lease, hear the others —
//! and move the lifecycle to ready once caught up, and to lagging and back as the replica falls behind.

use std::sync::Arc;
use std::time::Duration;

use super::background::Background;
use super::ServerError;
use crate::core::config::GateConfig;
use crate::core::gate::Gate;
use crate::core::lease::ReadLease;
use crate::replication::replica::{Replica, ReplicaOptions};
use crate::replication::replica_snapshots::{ReadPoint, ReplicaSnapshots, Sharing};
use crate::replication::snapshot_store::SnapshotStore;
use crate::replication::stream::{MutationStream, StreamError, StreamOptions};
use crate::service::lifecycle::Lifecycle;
use crate::service::shutdown::Shutdown;

/// How a replica reaches the stream and takes part.
#[derive(Debug, Clone)]
pub struct ReplicationOptions {
    /// The NATS servers and the stream.
    pub stream: StreamOptions,
    /// The replica's id, read lease and lag bound.
    pub replica: ReplicaOptions,
}

/// How often health follows the replica's lag and lease.
const HEALTH_INTERVAL: Duration = Duration::from_millis(20);

/// Opens the stream (creating it if this is the first replica) and its snapshot bucket, and checks that
/// every configured namespace is sized, and the read lease and clock drift set, as the stream records;
/// fails with what to fix.
pub(super) async fn join(
    options: &ReplicationOptions,
    config: &GateConfig,
) -> Result<(MutationStream, SnapshotStore), ServerError> {
    let failed = |e: StreamError| ServerError::Replication(e.to_string());
    let stream = MutationStream::open(&options.stream)
        .await
        .map_err(failed)?;
    for (name, settings) in &config.namespaces {
        stream
            .agree_sizing(name, &settings.filter_spec())
            .await
            .map_err(failed)?;
    }
    stream
        .agree_timing(
            options.replica.read_lease,
            options.replica.max_clock_drift_ppm,
        )
        .await
        .map_err(failed)?;
    let store = SnapshotStore::open(&stream, options.stream.replicas)
        .await
        .map_err(failed)?;
    tracing::info!(
        stream = stream.name(),
        bucket = store.bucket(),
        servers = options.stream.servers.join(","),
        replica = options.replica.id,
        "joined the replicated stream"
    );
    Ok((stream, store))
}

/// A replica ready to load: what its loops need.
pub(super) struct Replicated {
    pub(super) replica: Arc<Replica>,
    /// The replica's read lease: what the sub-leases it grants its mirrors rest on.
    pub(super) lease: Arc<ReadLease>,
    pub(super) snapshots: ReplicaSnapshots,
    /// How often it takes a snapshot (with a data directory).
    pub(super) snapshot_interval: Duration,
}

impl Replicated {
    /// Loads the newest snapshot, then starts the replica's loops; the lifecycle turns ready once it has
    /// caught up and holds a lease (or failed, if the snapshot cannot be loaded).
    pub(super) async fn run(
        self,
        gate: Arc<Gate>,
        lifecycle: Arc<Lifecycle>,
        background: Background,
    ) {
        let stop = || {
            let shutdown = lifecycle.shutdown().clone();
            async move { shutdown.wait().await }
        };
        let replica = &self.replica;
        // Reporting starts before loading: while it loads, this replica reports seq 0, which holds back
        // every purge, so the stream still holds what follows the snapshot it is loading.
        background.spawn(Arc::clone(replica).keep_lease(stop()));
        background.spawn(Arc::clone(replica).hear_peers(stop()));
        let (covered, origin) = match self.snapshots.load(&gate).await {
            Ok(loaded) => loaded,
            Err(reason) => return lifecycle.fail(reason),
        };
        tracing::info!(
            covered,
            ?origin,
            "state loaded; applying the stream after it"
        );
        metrics::gauge!("existence_replica_start_seq").set(covered as f64);
        let point = origin.read_point();
        if let Err(error) = replica
            .start_after(covered, point.last_read, point.history)
            .await
        {
            return lifecycle.fail(format!(
                "cannot read the replicas' membership from the stream: {error}; restart when NATS is reachable"
            ));
        }
        // The applier goes on past the shutdown signal until the replica's leave is applied here, reporting
        // what it applied, so that no writer waits the fallback for it (`Replica::leave`).
        let (stopping, leaving) = (stop(), Arc::clone(replica));
        let stop_applying = async move {
            stopping.await;
            leaving.left().await;
        };
        background.spawn(Arc::clone(replica).apply(stop_applying));
        background.spawn(follow_health(
            Arc::clone(replica),
            Arc::clone(&gate),
            Arc::clone(&lifecycle),
        ));
        if self.snapshots.takes_snapshots() {
            background.spawn(take_snapshots(self, gate, lifecycle.shutdown().clone()));
        }
    }
}

/// How long a sharer waits for a barrier of its own, read as sent, at or past the seq a snapshot covers
/// before it shares that snapshot (one comes within a second even at rest); past it, the snapshot stays
/// local this time.
const VOUCH_WAIT: Duration = Duration::from_secs(5);

/// Every snapshot interval: a local snapshot covering what the replica had applied, shared by one replica
/// — until the replica finds it read a diverged copy of the stream: then its snapshots are removed (a
/// restart loads the shared one, or reads the stream from its start), and it takes no more.
async fn take_snapshots(replicated: Replicated, gate: Arc<Gate>, shutdown: Shutdown) {
    let namespaces: Vec<String> = gate
        .namespaces()
        .iter()
        .map(|n| n.name().to_string())
        .collect();
    // A replica heard from within three snapshot intervals holds purges back to what it has applied: one
    // that is slow (or was stopped briefly) must not find mutations it has not applied purged.
    let purge_horizon = replicated.snapshot_interval.saturating_mul(3);
    let mut ticks = tokio::time::interval(replicated.snapshot_interval);
    ticks.tick().await;
    let mut last = 0;
    let replica = &replicated.replica;
    loop {
        tokio::select! {
            () = shutdown.wait() => return,
            () = replica.diverged() => return replicated.snapshots.discard_local().await,
            _ = ticks.tick() => {}
        }
        if replica.applied_seq() == last || !gate.is_ready() {
            continue;
        }
        let (exporter, reader) = (Arc::clone(&gate), Arc::clone(replica));
        let cut = replica
            .while_still(move |applied| {
                let point = ReadPoint {
                    last_read: reader.last_read(),
                    history: reader.history_digest(),
                };
                exporter
                    .export_detached()
                    .map(|images| (applied, point, images))
            })
            .await;
        let taken = match cut.and_then(|cut| cut) {
            Ok((covered, point, images)) => {
                last = covered;
                // Shared only once a barrier of this replica read as sent vouches for the state: one read
                // off a diverged copy would reach every replica that loads it.
                let sharer = replica.shares_snapshots();
                let vouched = sharer && replica.vouched_through(covered, VOUCH_WAIT).await;
                if sharer && !vouched {
                    tracing::warn!(
                        covered,
                        "no barrier of this replica read as sent at or past the snapshot's seq within \
                         {VOUCH_WAIT:?}: the snapshot stays local this time"
                    );
                }
                let applied_everywhere = || replica.applied_everywhere(purge_horizon);
                let share = vouched.then(|| Sharing {
                    stream: replica.stream(),
                    namespaces: namespaces.clone(),
                    applied_everywhere: &applied_everywhere,
                });
                replicated
                    .snapshots
                    .take(covered, point, images, gate.hash_check(), share)
                    .await
            }
            Err(error) => Err(error),
        };
        if let Err(error) = taken {
            tracing::error!(%error, "snapshot failed; the stream still holds everything");
        }
    }
}
/// Keeps health in step with the replica: ready the first time it is neither behind nor without a lease,
/// then lagging whenever it is either.
async fn follow_health(replica: Arc<Replica>, gate: Arc<Gate>, lifecycle: Arc<Lifecycle>) {
    let mut ticks = tokio::time::interval(HEALTH_INTERVAL);
    let shutdown = lifecycle.shutdown().clone();
    loop {
        tokio::select! {
            () = shutdown.wait() => return,
            _ = ticks.tick() => {}
        }
        let lagging = replica.lagging().map(|lagging| lagging.to_string());
        let caught_up = lagging.is_none();
        lifecycle.set_lagging(lagging).await;
        if caught_up && !gate.is_ready() {
            tracing::info!(applied = replica.applied_seq(), "caught up with the stream");
            lifecycle.ready_replica(&gate, None).await;
        }
    }
}
