//! The one decision between a single server and a replica, made once at start: [`Mode`] says where writes
//! go, what the Admin service can ask of the replicated mode, and what loads the state and keeps it.

use std::sync::Arc;
use std::time::Duration;

use super::loading::Load;
use super::replicated::{self, Replicated};
use super::{DurabilityOptions, ServeOptions};
use crate::core::config::Mirrors as MirrorsConfig;
use crate::core::gate::Gate;
use crate::core::lease::ReadLease;
use crate::core::log::VolatileLog;
use crate::core::replicas::Replicas;
use crate::core::writes::Writes;
use crate::replication::replica::Replica;
use crate::replication::replica_snapshots::ReplicaSnapshots;
use crate::replication::snapshot_store::SnapshotStore;
use crate::replication::stream::MutationStream;
use crate::service::mirror::{MirrorRegistry, Mirroring, OwnLease};
use crate::service::writes::LocalWrites;
use crate::storage::DataDir;

/// How this server keeps its state and takes writes.
pub(super) enum Mode {
    /// A single server: its own log and snapshots in a data directory (`None`: in memory only).
    Single(Option<DataDir>),
    /// A replica of a shared JetStream stream (its data directory, if any, holds snapshots only).
    Replicated(Box<Replicated>),
}

impl Mode {
    /// The mode `options` ask for: a replica of `joined` (the stream and its snapshot bucket, joined before
    /// the gate existed) applying into `gate` under `lease`, or a single server on `data_dir`.
    pub(super) fn new(
        options: &ServeOptions,
        joined: Option<(MutationStream, SnapshotStore)>,
        data_dir: Option<DataDir>,
        (gate, lease): (&Arc<Gate>, Arc<ReadLease>),
        grpc_addr: std::net::SocketAddr,
    ) -> Self {
        let (Some((stream, store)), Some(replication)) = (joined, &options.replication) else {
            return Self::Single(data_dir);
        };
        let snapshots = ReplicaSnapshots::new(data_dir.map(Arc::new), store, stream.seed());
        let mut replica_options = replication.replica.clone();
        replica_options.origin = format!("{}, gRPC {grpc_addr}", replica_options.origin);
        let replica = Replica::new(
            stream,
            Arc::clone(gate),
            Arc::clone(&lease),
            replica_options,
        );
        let snapshot_interval = options
            .durability
            .as_ref()
            .map_or(Duration::MAX, |d| d.snapshot_interval);
        Self::Replicated(Box::new(replicated::Replicated {
            replica,
            lease,
            snapshots,
            snapshot_interval,
        }))
    }

    /// Whether this server keeps a log of its own (what the lifecycle's snapshots and admin need).
    pub(super) fn has_own_log(&self) -> bool {
        matches!(self, Self::Single(Some(_)))
    }

    /// Where mirrors' sub-leases are kept, or why this gate takes no mirrors (said to each that tries).
    /// Made once, at start: a single server's rule-5 quiet period runs from here, and a replica's `Add`s
    /// and reports wait on them from here on.
    pub(super) fn mirrors(&self, config: &MirrorsConfig) -> Mirroring {
        if !config.enabled() {
            return Err(
                "mirrors are off on this gate: set [mirrors] max_per_namespace \
                        (docs/mirrors.md)"
                    .to_string(),
            );
        }
        let (terms, max) = (config.terms(), config.max_per_namespace);
        Ok(match self {
            Self::Single(_) => MirrorRegistry::new(terms, max, OwnLease::Always),
            Self::Replicated(replicated) => {
                let own = OwnLease::Replica(Arc::clone(&replicated.lease));
                let registry = MirrorRegistry::new(terms, max, own);
                replicated
                    .replica
                    .wait_for_mirrors(Arc::clone(&registry) as _);
                registry
            }
        })
    }

    /// Where the service sends writes; a single server's `Add`s wait on `mirrors`' sub-leases.
    pub(super) fn writes(
        &self,
        gate: &Arc<Gate>,
        mirrors: Option<&Arc<MirrorRegistry>>,
    ) -> Arc<dyn Writes> {
        match self {
            Self::Single(_) => {
                let writes = LocalWrites::new(Arc::clone(gate));
                Arc::new(match mirrors {
                    Some(mirrors) => writes.with_mirrors(Arc::clone(mirrors)),
                    None => writes,
                })
            }
            Self::Replicated(replicated) => Arc::clone(&replicated.replica) as Arc<dyn Writes>,
        }
    }

    /// What the Admin service asks of the replicated mode (`None` for a single server).
    pub(super) fn replicas(&self) -> Option<Arc<dyn Replicas>> {
        match self {
            Self::Single(_) => None,
            Self::Replicated(replicated) => {
                Some(Arc::clone(&replicated.replica) as Arc<dyn Replicas>)
            }
        }
    }

    /// Loads the state in the background — a replica's snapshot and the stream after it, a single server's
    /// snapshot and log — or, in memory, opens the gate at once.
    pub(super) async fn run(self, load: Load, durability: Option<DurabilityOptions>) {
        let background = load.background.clone();
        match (self, durability) {
            (Self::Replicated(replicated), _) => {
                background.spawn(replicated.run(load.gate, load.lifecycle, load.background))
            }
            (Self::Single(Some(dir)), Some(durability)) => {
                background.spawn(load.recover(dir, durability))
            }
            (Self::Single(_), _) => {
                load.lifecycle
                    .ready(&load.gate, Arc::new(VolatileLog), None)
                    .await
            }
        }
    }
}
