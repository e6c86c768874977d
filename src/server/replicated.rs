//! Replicated mode's wiring: join the stream before the gate exists (its hash seed and every namespace's
//! sizing come from the stream), then run the replica's loops — apply, keep the lease, hear the others —
//! and move the lifecycle to ready once caught up, and to lagging and back as the replica falls behind.

use std::sync::Arc;
use std::time::Duration;

use super::background::Background;
use super::ServerError;
use crate::core::config::GateConfig;
use crate::core::gate::Gate;
use crate::service::lifecycle::Lifecycle;
use crate::storage::replica::{Replica, ReplicaOptions};
use crate::storage::stream::{MutationStream, StreamOptions};

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

/// Opens the stream (creating it if this is the first replica) and checks that every configured namespace
/// is sized as the stream records; fails with what to fix.
pub(super) async fn join(
    options: &ReplicationOptions,
    config: &GateConfig,
) -> Result<MutationStream, ServerError> {
    let stream = MutationStream::open(&options.stream)
        .await
        .map_err(|e| ServerError::Replication(e.to_string()))?;
    for (name, settings) in &config.namespaces {
        stream
            .agree_sizing(name, &settings.filter_spec())
            .await
            .map_err(|e| ServerError::Replication(e.to_string()))?;
    }
    tracing::info!(
        stream = stream.name(),
        servers = options.stream.servers.join(","),
        replica = options.replica.id,
        "joined the replicated stream"
    );
    Ok(stream)
}

/// Starts the replica's loops; the lifecycle turns ready once it has caught up and holds a lease.
pub(super) fn run(
    replica: &Arc<Replica>,
    gate: &Arc<Gate>,
    lifecycle: &Arc<Lifecycle>,
    background: &Background,
) {
    let stop = || {
        let shutdown = lifecycle.shutdown().clone();
        async move { shutdown.wait().await }
    };
    background.spawn(Arc::clone(replica).apply(stop()));
    background.spawn(Arc::clone(replica).keep_lease(stop()));
    background.spawn(Arc::clone(replica).hear_peers(stop()));
    background.spawn(follow_health(
        Arc::clone(replica),
        Arc::clone(gate),
        Arc::clone(lifecycle),
    ));
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
