//! The `Admin` gRPC service: per-namespace figures, snapshots on demand, and rebuilding a namespace's filter
//! from keys streamed by the source of truth.

use std::sync::Arc;

use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::core::gate::{Gate, GateError};
use crate::core::namespace::WriteError;
use crate::proto;
use crate::proto::admin_server::Admin;
use crate::service::access::{self, Access};
use crate::service::auth::{Role, Scope};
use crate::service::grpc::{self, status};
use crate::service::lifecycle::{Lifecycle, NotDurable};
use crate::storage::Persistence;

/// The `Admin` service.
#[derive(Debug, Clone)]
pub struct AdminService {
    gate: Arc<Gate>,
    access: Arc<Access>,
    /// Where the durable side is found, once loaded.
    lifecycle: Arc<Lifecycle>,
}

impl AdminService {
    /// Administers `gate` behind `access`, snapshotting once `lifecycle` has the data directory loaded.
    pub fn new(gate: Arc<Gate>, access: Arc<Access>, lifecycle: Arc<Lifecycle>) -> Self {
        Self {
            gate,
            access,
            lifecycle,
        }
    }

    fn persistence(&self) -> Result<&Persistence, Status> {
        self.lifecycle.persistence().map_err(|not| match not {
            NotDurable::NotLoaded => Status::unavailable(not.to_string()),
            NotDurable::InMemory => Status::failed_precondition(format!("{not} to snapshot")),
        })
    }

    /// Takes a snapshot on the blocking pool.
    async fn snapshot(&self) -> Result<crate::storage::SnapshotTaken, Status> {
        let snapshots = Arc::clone(&self.persistence()?.snapshots);
        let gate = Arc::clone(&self.gate);
        tokio::task::spawn_blocking(move || snapshots.take(&gate))
            .await
            .map_err(|e| Status::internal(format!("snapshot task failed: {e}")))?
            .map_err(|e| Status::internal(format!("snapshot failed: {e}")))
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn stats(
        &self,
        request: Request<proto::StatsRequest>,
    ) -> Result<Response<proto::StatsResponse>, Status> {
        let wanted = &request.get_ref().namespace;
        // "" lists the namespaces this token administers; a named one needs admin on it.
        let scope = if wanted.is_empty() {
            Scope::Any
        } else {
            Scope::Namespace(wanted)
        };
        self.access.admit(&request, Role::Admin, scope)?;
        let authorization = access::authorization(&request);
        if !wanted.is_empty() {
            self.gate.namespace(wanted).map_err(status)?;
        }
        let last_snapshot_unix_ms = self
            .lifecycle
            .persistence()
            .ok()
            .and_then(|p| p.snapshots.last())
            .map_or(0, |taken| taken.at_ms);
        // The scan reads every filter word (milliseconds per 16 MB): off the request threads.
        let gate = Arc::clone(&self.gate);
        let (stats, scans) = tokio::task::spawn_blocking(move || (gate.stats(), gate.scan()))
            .await
            .map_err(|e| Status::internal(format!("computing stats failed: {e}")))?;
        let namespaces = stats
            .into_iter()
            .filter(|s| wanted.is_empty() || *s.name == **wanted)
            .filter(|s| {
                self.access
                    .authorizer()
                    .allows(authorization, Role::Admin, &s.name)
            })
            .map(|s| {
                let scan = scans.get(&s.name);
                let digest = scan.and_then(|scan| scan.digest);
                proto::NamespaceStats {
                    namespace: s.name.to_string(),
                    keys_added: s.keys_added,
                    windows: s.filter.windows as u32,
                    layers: s.filter.layers as u32,
                    filter_bytes: s.filter.bytes,
                    fill_ratio: scan.map_or(0.0, |scan| scan.fill_ratio),
                    estimated_false_positive_rate: s.filter.estimated_false_positive_rate,
                    estimated_keys: s.filter.keys,
                    tombstones: s.tombstones,
                    tombstone_bytes: s.tombstone_bytes,
                    seq: s.seq,
                    last_snapshot_unix_ms,
                    state_digest: digest.map_or(0, |d| d.digest),
                    state_digest_seq: digest.map_or(0, |d| d.seq),
                }
            })
            .collect();
        Ok(Response::new(proto::StatsResponse { namespaces }))
    }

    async fn snapshot(
        &self,
        request: Request<proto::SnapshotRequest>,
    ) -> Result<Response<proto::SnapshotResponse>, Status> {
        self.access.admit(&request, Role::Admin, Scope::All)?;
        let taken = AdminService::snapshot(self).await?;
        Ok(Response::new(proto::SnapshotResponse {
            path: taken.path.display().to_string(),
            bytes: taken.bytes,
            elapsed_ms: taken.elapsed.as_millis() as u64,
            log_segments_removed: taken.segments_removed as u32,
        }))
    }

    async fn rebuild(
        &self,
        request: Request<Streaming<proto::RebuildRequest>>,
    ) -> Result<Response<proto::RebuildResponse>, Status> {
        let authorization = access::authorization(&request).map(str::to_owned);
        let mut stream = request.into_inner();
        let mut first = stream.next().await.ok_or_else(|| {
            Status::invalid_argument("Rebuild needs at least one message naming the namespace")
        })??;
        grpc::resolve_namespace(&mut first.namespace);
        self.access.admit_with(
            authorization.as_deref(),
            Role::Admin,
            Scope::Namespace(&first.namespace),
        )?;
        let mut rebuild = self.gate.begin_rebuild(&first.namespace).map_err(status)?;
        self.gate
            .feed_rebuild(&mut rebuild, &first.keys)
            .map_err(status)?;
        while let Some(message) = stream.next().await {
            // An error or cancellation drops `rebuild`, abandoning it; the live filter is untouched.
            let message = message?;
            if !message.namespace.is_empty() && message.namespace != first.namespace {
                return Err(Status::invalid_argument(format!(
                    "Rebuild streams one namespace: {:?} after {:?}",
                    message.namespace, first.namespace
                )));
            }
            self.gate
                .feed_rebuild(&mut rebuild, &message.keys)
                .map_err(status)?;
        }
        let rebuilt = rebuild
            .finish()
            .map_err(|stopped| status(GateError::from(WriteError::from(stopped))))?;
        tracing::info!(namespace = %first.namespace, keys = rebuilt.keys, bytes = rebuilt.filter_bytes, "filter rebuilt");
        if !matches!(self.lifecycle.persistence(), Err(NotDurable::InMemory)) {
            // The rebuilt filter exists only in memory until a snapshot holds it; a crash before that restores
            // the old filter, which is still safe (it holds every key ever added through the gate).
            AdminService::snapshot(self).await?;
        }
        Ok(Response::new(proto::RebuildResponse {
            keys: rebuilt.keys,
            filter_bytes: rebuilt.filter_bytes,
            seq: rebuilt.seq,
        }))
    }
}
