//! The `Admin` gRPC service: per-namespace figures, snapshots on demand, and rebuilding a namespace's filter
//! from keys streamed by the source of truth.

use std::sync::Arc;

use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::access::{self, Access};
use crate::auth::{Role, Scope};
use crate::core::gate::{Gate, GateError};
use crate::core::namespace::{Rebuilt, WriteError};
use crate::core::replicas::Replicas;
use crate::grpc::{self, status};
use crate::lifecycle::{Lifecycle, NotDurable};
use crate::memory::Memory;
use crate::proto;
use crate::proto::admin_server::Admin;
use crate::storage::Persistence;

/// The `Admin` service.
#[derive(Debug, Clone)]
pub struct AdminService {
    gate: Arc<Gate>,
    access: Arc<Access>,
    /// Where the durable side is found, once loaded.
    lifecycle: Arc<Lifecycle>,
    /// For a replica of a shared stream: its members, and where rebuilds are published.
    replica: Option<Arc<dyn Replicas>>,
}

impl AdminService {
    /// Administers `gate` behind `access`, snapshotting once `lifecycle` has the data directory loaded.
    pub fn new(gate: Arc<Gate>, access: Arc<Access>, lifecycle: Arc<Lifecycle>) -> Self {
        Self {
            gate,
            access,
            lifecycle,
            replica: None,
        }
    }

    /// The same service for a replica: rebuilds go through its stream to every replica.
    pub fn with_replica(mut self, replica: Option<Arc<dyn Replicas>>) -> Self {
        self.replica = replica;
        self
    }

    /// Rebuilds here: keys fill a filter beside the live one, swapped in at the end; a snapshot then makes
    /// it durable (until then a crash restores the old filter, which is still safe: it holds every key ever
    /// added through the gate).
    async fn rebuild_here(
        &self,
        mut first: proto::RebuildRequest,
        mut stream: Streaming<proto::RebuildRequest>,
    ) -> Result<Rebuilt, Status> {
        let mut next = Streamed::first(&mut first)?;
        let mut rebuild = self.gate.begin_rebuild(&first.namespace).map_err(status)?;
        // An error, or a stream that ends without its commit, drops `rebuild`: abandoned, the live filter
        // untouched.
        loop {
            self.gate
                .feed_rebuild(&mut rebuild, &next.keys)
                .map_err(status)?;
            if next.commit {
                break;
            }
            next = next_keys(&mut stream, &first.namespace, next).await?;
        }
        let rebuilt = rebuild
            .finish()
            .map_err(|stopped| status(GateError::from(WriteError::from(stopped))))?;
        if !matches!(self.lifecycle.persistence(), Err(NotDurable::InMemory)) {
            AdminService::snapshot(self).await?;
        }
        Ok(rebuilt)
    }

    fn persistence(&self) -> Result<&Persistence, Status> {
        if self.replica.is_some() {
            return Err(Status::failed_precondition(
                "a replica snapshots on its own, every --snapshot-interval (and one replica shares its \
                 snapshots through the object store); Admin.Snapshot is for a single server",
            ));
        }
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
            .map_err(|e| match e {
                crate::storage::PersistenceError::NoRoom { .. } => {
                    Status::resource_exhausted(e.to_string())
                }
                e => Status::internal(format!("snapshot failed: {e}")),
            })
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
        let administers = |name: &str| {
            self.access
                .authorizer()
                .allows(authorization, Role::Admin, name)
        };
        // Summed over every namespace, so only for a caller who may see them all.
        let memory = (wanted.is_empty() && stats.iter().all(|s| administers(&s.name)))
            .then(|| memory_stats(&Memory::measure(&stats)));
        let namespaces = stats
            .into_iter()
            .filter(|s| wanted.is_empty() || *s.name == **wanted)
            .filter(|s| administers(&s.name))
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
                    replay_buffer_bytes: s.replay_buffer_bytes as u64,
                    recent_adds_bytes: s.recent_adds_bytes as u64,
                }
            })
            .collect();
        Ok(Response::new(proto::StatsResponse { namespaces, memory }))
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
        let namespace = first.namespace.clone();
        let rebuilt = match &self.replica {
            Some(replica) => rebuild_replicated(Arc::clone(replica), first, stream).await?,
            None => self.rebuild_here(first, stream).await?,
        };
        tracing::info!(%namespace, keys = rebuilt.keys, bytes = rebuilt.filter_bytes, seq = rebuilt.seq, "filter rebuilt");
        Ok(Response::new(proto::RebuildResponse {
            keys: rebuilt.keys,
            filter_bytes: rebuilt.filter_bytes,
            seq: rebuilt.seq,
        }))
    }

    async fn list_replicas(
        &self,
        request: Request<proto::ListReplicasRequest>,
    ) -> Result<Response<proto::ListReplicasResponse>, Status> {
        self.access.admit(&request, Role::Admin, Scope::All)?;
        let replica = self.replica()?;
        let replicas = replica
            .members()
            .into_iter()
            .map(|m| proto::ReplicaMember {
                id: m.id,
                nonce: m.nonce,
                joined_seq: m.joined,
                origin: m.origin,
                reported_seq: m.reported,
                this_replica: m.this_replica,
            })
            .collect();
        Ok(Response::new(proto::ListReplicasResponse {
            replicas,
            applied_seq: replica.applied_seq(),
        }))
    }

    async fn remove_replica(
        &self,
        request: Request<proto::RemoveReplicaRequest>,
    ) -> Result<Response<proto::RemoveReplicaResponse>, Status> {
        self.access.admit(&request, Role::Admin, Scope::All)?;
        let replica = self.replica()?;
        let id = &request.get_ref().id;
        let members = replica.members();
        if !members.iter().any(|m| m.id == *id) {
            let ids: Vec<&str> = members.iter().map(|m| m.id.as_str()).collect();
            return Err(Status::not_found(format!(
                "replica {id:?} is not a member (members: {})",
                if ids.is_empty() {
                    "none".to_string()
                } else {
                    ids.join(", ")
                }
            )));
        }
        let seq = replica.remove_member(id).await.map_err(status)?;
        Ok(Response::new(proto::RemoveReplicaResponse { seq }))
    }
}

impl AdminService {
    /// The replica this gate is, or `FAILED_PRECONDITION` for a gate that is not one.
    fn replica(&self) -> Result<&Arc<dyn Replicas>, Status> {
        self.replica.as_ref().ok_or_else(|| {
            Status::failed_precondition(
                "this gate is not a replica (started without --nats): it has no membership",
            )
        })
    }
}

/// Rebuilds on every replica through the stream ([`LoggedRebuild`](crate::core::replicas::LoggedRebuild));
/// an error or cancellation drops the rebuild, which publishes its abort.
async fn rebuild_replicated(
    replica: Arc<dyn Replicas>,
    mut first: proto::RebuildRequest,
    mut stream: Streaming<proto::RebuildRequest>,
) -> Result<Rebuilt, Status> {
    let mut next = Streamed::first(&mut first)?;
    let mut rebuild = replica
        .begin_rebuild(first.namespace.clone())
        .await
        .map_err(status)?;
    loop {
        rebuild
            .feed(std::mem::take(&mut next.keys))
            .await
            .map_err(status)?;
        if next.commit {
            return rebuild.commit().await.map_err(status);
        }
        next = next_keys(&mut stream, &first.namespace, next).await?;
    }
}

/// A Rebuild stream read so far: the keys of its latest message and whether that one commits, with the
/// count of keys streamed through it and whether any message allowed an empty rebuild.
struct Streamed {
    keys: Vec<bytes::Bytes>,
    commit: bool,
    keys_streamed: u64,
    allow_empty: bool,
}

impl Streamed {
    /// The first message (its keys taken), refused if it commits no keys without `allow_empty`.
    fn first(message: &mut proto::RebuildRequest) -> Result<Self, Status> {
        let keys = std::mem::take(&mut message.keys);
        Self {
            keys_streamed: keys.len() as u64,
            keys,
            commit: message.commit,
            allow_empty: message.allow_empty,
        }
        .refuse_empty_commit(&message.namespace)
    }

    /// `FAILED_PRECONDITION` for a commit after no keys at all without `allow_empty`: the rebuilt filter
    /// would answer ABSENT for every key the namespace holds (see `RebuildRequest.allow_empty`).
    fn refuse_empty_commit(self, namespace: &str) -> Result<Self, Status> {
        if self.commit && !self.allow_empty && self.keys_streamed == 0 {
            return Err(Status::failed_precondition(format!(
                "the Rebuild of namespace {namespace:?} streamed no keys: swapping in an empty filter would \
                 answer ABSENT for every key it holds, so the rebuild was abandoned and the live filter is \
                 unchanged (set allow_empty, or `existence-gate rebuild --allow-empty`, if the namespace \
                 really holds no keys)"
            )));
        }
        Ok(self)
    }
}

/// The keys of the next message of a rebuild of `namespace`, and whether it commits; `INVALID_ARGUMENT` if
/// the stream ends first (see `RebuildRequest.commit`).
async fn next_keys(
    stream: &mut Streaming<proto::RebuildRequest>,
    namespace: &str,
    previous: Streamed,
) -> Result<Streamed, Status> {
    let Some(message) = stream.next().await.transpose()? else {
        return Err(Status::invalid_argument(format!(
            "the Rebuild stream of namespace {namespace:?} ended without a message with commit = true: the \
             rebuild was abandoned and the live filter is unchanged (set commit on the last message)"
        )));
    };
    if !message.namespace.is_empty() && message.namespace != namespace {
        return Err(Status::invalid_argument(format!(
            "Rebuild streams one namespace: {:?} after {namespace:?}",
            message.namespace
        )));
    }
    Streamed {
        keys_streamed: previous.keys_streamed + message.keys.len() as u64,
        allow_empty: previous.allow_empty || message.allow_empty,
        keys: message.keys,
        commit: message.commit,
    }
    .refuse_empty_commit(namespace)
}

fn memory_stats(memory: &Memory) -> proto::MemoryStats {
    proto::MemoryStats {
        resident_bytes: memory.resident,
        filter_bytes: memory.filters,
        tombstone_bytes: memory.tombstones,
        recent_adds_bytes: memory.recent_adds,
        replay_buffer_bytes: memory.replay_buffers,
        other_heap_bytes: memory.other_heap,
        allocator_free_bytes: memory.allocator_free,
        program_bytes: memory.program,
        heap_measured: memory.heap_measured,
    }
}
