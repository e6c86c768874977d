//! The gRPC surface: decodes requests, calls the [`Gate`], encodes answers, maps errors to statuses, and
//! records per-RPC metrics. No decisions are made here.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::access::Access;
use crate::auth::{Role, Scope};
use crate::core::answer::{Answer, Basis, Lookup};
use crate::core::config::DEFAULT_NAMESPACE;
use crate::core::gate::{Gate, GateError};
use crate::core::invalidations::Delivery;
use crate::core::namespace::{self, AbsenceReport, NewKeys};
use crate::core::tombstones::AbsenceKind;
use crate::core::writes::Writes;
use crate::metrics::{Rpc, RpcMetrics};
use crate::proto;
use crate::proto::existence_gate_server::ExistenceGate;
use crate::request_keys::{packed_instead, AddKeys, BLOCKING_BATCH_BYTES};
use crate::writes::LocalWrites;

/// The `ExistenceGate` service.
#[derive(Debug, Clone)]
pub struct GateService {
    gate: Arc<Gate>,
    access: Arc<Access>,
    metrics: Arc<RpcMetrics>,
    /// Where writes go: the local gate through its log, or a replica's stream.
    writes: Arc<dyn Writes>,
}

/// How long a subscription that resumes from a seq this replica has not applied yet (the client saw it on
/// a replica further ahead) waits for this one to reach it, before it is answered with a `RESYNC`.
pub const RESUME_WAIT: Duration = Duration::from_secs(5);

impl GateService {
    /// Serves `gate` behind `access`.
    pub fn new(gate: Arc<Gate>, access: Arc<Access>) -> Self {
        Self {
            writes: Arc::new(LocalWrites::new(Arc::clone(&gate))),
            gate,
            access,
            metrics: Arc::new(RpcMetrics::default()),
        }
    }

    /// The same service with its writes sent to `writes` (a replica's stream) instead of the local gate.
    pub fn with_writes(mut self, writes: Arc<dyn Writes>) -> Self {
        self.writes = writes;
        self
    }

    /// `Add`, from the request's keys as [`AddKeys`] reads them.
    pub async fn add_keys(
        &self,
        request: Request<AddKeys>,
    ) -> Result<Response<proto::AddResponse>, Status> {
        let max_keys = self.gate.limits().max_batch_keys;
        self.admitted_write(
            Rpc::Add,
            request,
            |r| &mut r.namespace,
            |writes, request| async move {
                let (namespace, keys) = request.into_parts(max_keys)?;
                add_response(writes.add(&namespace, keys, NewKeys::Skip).await)
            },
        )
        .await
    }

    /// Admits a write needing the `write` role on the request's namespace, runs it through [`Writes`], and
    /// records its metrics.
    async fn admitted_write<Q, T, R>(
        &self,
        rpc: Rpc,
        request: Request<Q>,
        namespace: impl Fn(&mut Q) -> &mut String,
        write: impl FnOnce(Arc<dyn Writes>, Q) -> R,
    ) -> Result<Response<T>, Status>
    where
        R: std::future::Future<Output = Result<T, Status>>,
    {
        let started = Instant::now();
        let mut request = resolved(request, &namespace);
        let name = namespace(request.get_mut()).clone();
        let scope = Scope::Namespace(&name);
        let result = match self.access.admit(&request, Role::Write, scope) {
            Ok(()) => write(Arc::clone(&self.writes), request.into_inner()).await,
            Err(refused) => Err(refused),
        };
        self.finish(rpc, started, result)
    }

    /// `namespace`'s seq for `CurrentSeq` (a feed's fence): once what this gate applied is known to be
    /// the log's ([`Writes::vouch`]) — a replica's answers otherwise claim the seq of its newest barrier,
    /// and a fence that old would make a delete of a key added since `SUPERSEDED`. If that takes longer than
    /// [`VOUCH_WAIT`], the older seq: it only loses such a tombstone.
    async fn vouched_current_seq(
        &self,
        namespace: &str,
    ) -> Result<proto::CurrentSeqResponse, Status> {
        // An unknown namespace is refused before any wait.
        self.gate.current_seq(namespace).map_err(status)?;
        self.writes.vouch(VOUCH_WAIT).await;
        let seq = self.gate.current_seq(namespace).map_err(status)?;
        Ok(proto::CurrentSeqResponse { seq })
    }

    /// Records the call's metrics and wraps its reply.
    fn finish<T>(
        &self,
        rpc: Rpc,
        started: Instant,
        result: Result<T, Status>,
    ) -> Result<Response<T>, Status> {
        let code = result.as_ref().map_or_else(|s| s.code() as usize, |_| 0);
        self.metrics.record(rpc, code, started);
        result.map(Response::new)
    }
}

/// Resolves a request's namespace: `""` is `default`. The one place this is done, before authorization
/// and the gate see the name, so both agree on which namespace a call is about.
pub fn resolve_namespace(namespace: &mut String) {
    if namespace.is_empty() {
        *namespace = DEFAULT_NAMESPACE.to_string();
    }
}

/// `request` with its namespace resolved ([`resolve_namespace`]).
fn resolved<Q>(
    mut request: Request<Q>,
    namespace: impl FnOnce(&mut Q) -> &mut String,
) -> Request<Q> {
    resolve_namespace(namespace(request.get_mut()));
    request
}

/// How long `CurrentSeq` waits for a replica's barrier to vouch for what it applied: a few barriers' round
/// trips.
const VOUCH_WAIT: Duration = Duration::from_secs(2);

/// Runs `work` on the blocking pool, keeping a request thread free while it runs.
async fn on_blocking_pool<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(Status::internal(format!("the call's task failed: {e}"))))
}

/// Answers a `BatchMayExist` request: `keys` as a list of enum values, `packed_keys` as a bitmap.
fn answer_batch(
    gate: &Gate,
    request: &proto::BatchMayExistRequest,
) -> Result<proto::BatchMayExistResponse, Status> {
    let max_keys = gate.limits().max_batch_keys;
    let (mut response, lookups) =
        match packed_instead(!request.keys.is_empty(), &request.packed_keys, max_keys)? {
            None => batch_answers(gate, &request.namespace, &request.keys),
            Some(keys) => batch_bitmap(gate, &request.namespace, &keys),
        }?;
    if request.with_bases {
        response.bases = lookups.iter().map(|l| basis(l.basis) as i32).collect();
    }
    Ok(response)
}

/// The bytes of a batch's keys: the measure of its work.
fn batch_bytes(request: &proto::BatchMayExistRequest) -> usize {
    request.packed_keys.len() + request.keys.iter().map(|k| k.len() + 2).sum::<usize>()
}

/// Answers `keys` as a list of enum values.
fn batch_answers(
    gate: &Gate,
    namespace: &str,
    keys: &[bytes::Bytes],
) -> Result<(proto::BatchMayExistResponse, Vec<Lookup>), Status> {
    let mut lookups = Vec::with_capacity(keys.len());
    let observed_seq = gate
        .batch_may_exist(namespace, keys, &mut lookups)
        .map_err(status)?;
    let response = proto::BatchMayExistResponse {
        answers: lookups.iter().map(|l| answer(l.answer) as i32).collect(),
        observed_seq,
        warming: warming(&lookups),
        ..Default::default()
    };
    Ok((response, lookups))
}

/// Answers unpacked `keys` as a bitmap, one bit per key.
fn batch_bitmap(
    gate: &Gate,
    namespace: &str,
    keys: &[&[u8]],
) -> Result<(proto::BatchMayExistResponse, Vec<Lookup>), Status> {
    let mut lookups = Vec::with_capacity(keys.len());
    let observed_seq = gate
        .batch_may_exist(namespace, keys, &mut lookups)
        .map_err(status)?;
    let mut bitmap = vec![0u8; lookups.len().div_ceil(8)];
    for (i, lookup) in lookups.iter().enumerate() {
        if lookup.answer == Answer::MayExist {
            bitmap[i / 8] |= 1 << (i % 8);
        }
    }
    let response = proto::BatchMayExistResponse {
        observed_seq,
        may_exist_bitmap: bitmap.into(),
        warming: warming(&lookups),
        ..Default::default()
    };
    Ok((response, lookups))
}

/// Whether a batch was answered from a namespace still loading its state (every lookup then rests on
/// `Basis::Warming`).
fn warming(lookups: &[Lookup]) -> bool {
    lookups.iter().any(|lookup| lookup.basis == Basis::Warming)
}

/// The status for a refused request.
pub fn status(error: GateError) -> Status {
    match &error {
        GateError::UnknownNamespace(_) => Status::not_found(error.to_string()),
        GateError::InvalidArgument(_) => Status::invalid_argument(error.to_string()),
        GateError::Unavailable(_) => Status::unavailable(error.to_string()),
        GateError::Conflict(_) => Status::failed_precondition(error.to_string()),
        GateError::Exhausted(_) => Status::resource_exhausted(error.to_string()),
    }
}

fn answer(answer: Answer) -> proto::Answer {
    match answer {
        Answer::Absent => proto::Answer::Absent,
        Answer::MayExist => proto::Answer::MayExist,
    }
}

fn basis(basis: Basis) -> proto::Basis {
    match basis {
        Basis::Filter => proto::Basis::Filter,
        Basis::Tombstone => proto::Basis::Tombstone,
        Basis::Warming => proto::Basis::Warming,
    }
}

fn absence_kind(value: i32) -> Result<AbsenceKind, Status> {
    match proto::AbsenceKind::try_from(value) {
        Ok(proto::AbsenceKind::Unspecified | proto::AbsenceKind::Missing) => Ok(AbsenceKind::Missing),
        Ok(proto::AbsenceKind::Deleted) => Ok(AbsenceKind::Deleted),
        Err(_) => Err(Status::invalid_argument(format!(
            "kind {value} is not a known AbsenceKind; use ABSENCE_KIND_MISSING (1) or ABSENCE_KIND_DELETED (2)"
        ))),
    }
}

fn add_response(added: Result<namespace::Added, GateError>) -> Result<proto::AddResponse, Status> {
    let added = added.map_err(status)?;
    Ok(proto::AddResponse {
        seq: added.seq,
        tombstones_cleared: added.tombstones_cleared,
    })
}

fn absence_report(request: &proto::RecordAbsentRequest) -> Result<AbsenceReport, Status> {
    Ok(AbsenceReport {
        kind: absence_kind(request.kind)?,
        key: request.key.clone(),
        observed_seq: request.observed_seq,
        ttl_seconds: request.ttl_seconds,
    })
}

fn record_absent_response(
    recorded: Result<namespace::Recorded, GateError>,
) -> Result<proto::RecordAbsentResponse, Status> {
    let recorded = recorded.map_err(status)?;
    Ok(proto::RecordAbsentResponse {
        outcome: record_outcome(recorded.outcome) as i32,
        seq: recorded.seq,
        expires_in_ms: recorded.expires_in_ms,
    })
}

fn record_outcome(outcome: namespace::RecordOutcome) -> proto::RecordOutcome {
    match outcome {
        namespace::RecordOutcome::Recorded => proto::RecordOutcome::Recorded,
        namespace::RecordOutcome::Redundant => proto::RecordOutcome::Redundant,
        namespace::RecordOutcome::Superseded => proto::RecordOutcome::Superseded,
        namespace::RecordOutcome::Throttled => proto::RecordOutcome::Throttled,
    }
}

fn invalidation(namespace: &str, delivery: Delivery) -> proto::Invalidation {
    match delivery {
        Delivery::Added(event) => proto::Invalidation {
            namespace: namespace.to_string(),
            keys: event.keys.iter().collect(),
            seq: event.seq,
            cause: proto::InvalidationCause::Added as i32,
        },
        Delivery::Resync { seq } => proto::Invalidation {
            namespace: namespace.to_string(),
            keys: Vec::new(),
            seq,
            cause: proto::InvalidationCause::Resync as i32,
        },
    }
}

type InvalidationStream = Pin<Box<dyn Stream<Item = Result<proto::Invalidation, Status>> + Send>>;

#[tonic::async_trait]
impl ExistenceGate for GateService {
    async fn may_exist(
        &self,
        request: Request<proto::MayExistRequest>,
    ) -> Result<Response<proto::MayExistResponse>, Status> {
        let started = Instant::now();
        let request = resolved(request, |r| &mut r.namespace);
        let result = self
            .access
            .admit(
                &request,
                Role::Read,
                Scope::Namespace(&request.get_ref().namespace),
            )
            .and_then(|()| {
                let request = request.get_ref();
                let (lookup, observed_seq) = self
                    .gate
                    .may_exist(&request.namespace, &request.key)
                    .map_err(status)?;
                Ok(proto::MayExistResponse {
                    answer: answer(lookup.answer) as i32,
                    basis: basis(lookup.basis) as i32,
                    observed_seq,
                })
            });
        self.finish(Rpc::MayExist, started, result)
    }

    async fn batch_may_exist(
        &self,
        request: Request<proto::BatchMayExistRequest>,
    ) -> Result<Response<proto::BatchMayExistResponse>, Status> {
        let started = Instant::now();
        let request = resolved(request, |r| &mut r.namespace);
        let scope = Scope::Namespace(&request.get_ref().namespace);
        let result = match self.access.admit(&request, Role::Read, scope) {
            Ok(()) if batch_bytes(request.get_ref()) >= BLOCKING_BATCH_BYTES => {
                let gate = Arc::clone(&self.gate);
                let request = request.into_inner();
                on_blocking_pool(move || answer_batch(&gate, &request)).await
            }
            Ok(()) => answer_batch(&self.gate, request.get_ref()),
            Err(refused) => Err(refused),
        };
        self.finish(Rpc::BatchMayExist, started, result)
    }

    /// Served by [`AddRoute`](crate::add_request::AddRoute) from the request's wire form; this is the
    /// same `Add` for a caller holding the generated type.
    async fn add(
        &self,
        request: Request<proto::AddRequest>,
    ) -> Result<Response<proto::AddResponse>, Status> {
        self.add_keys(request.map(AddKeys::from)).await
    }

    async fn record_absent(
        &self,
        request: Request<proto::RecordAbsentRequest>,
    ) -> Result<Response<proto::RecordAbsentResponse>, Status> {
        self.admitted_write(
            Rpc::RecordAbsent,
            request,
            |r| &mut r.namespace,
            |writes, request| async move {
                let report = absence_report(&request)?;
                record_absent_response(writes.record_absent(&request.namespace, report).await)
            },
        )
        .await
    }

    async fn current_seq(
        &self,
        request: Request<proto::CurrentSeqRequest>,
    ) -> Result<Response<proto::CurrentSeqResponse>, Status> {
        let started = Instant::now();
        let request = resolved(request, |r| &mut r.namespace);
        let namespace = &request.get_ref().namespace;
        let scope = || Scope::Namespace(namespace);
        // A feed's token may hold the write role only: either role may read a seq.
        let result = self
            .access
            .admit(&request, Role::Write, scope())
            .or_else(|refused| {
                self.access
                    .admit(&request, Role::Read, scope())
                    .map_err(|_| refused)
            });
        let result = match result {
            Ok(()) => self.vouched_current_seq(namespace).await,
            Err(refused) => Err(refused),
        };
        self.finish(Rpc::CurrentSeq, started, result)
    }

    type SubscribeInvalidationsStream = InvalidationStream;

    async fn subscribe_invalidations(
        &self,
        request: Request<proto::SubscribeInvalidationsRequest>,
    ) -> Result<Response<Self::SubscribeInvalidationsStream>, Status> {
        let started = Instant::now();
        let request = resolved(request, |r| &mut r.namespace);
        let admitted = self.access.admit(
            &request,
            Role::Read,
            Scope::Namespace(&request.get_ref().namespace),
        );
        if admitted.is_ok() {
            // A resume from a seq seen on a replica ahead of this one: wait to reach it, so the stream
            // continues exactly (no gap, no duplicate) instead of with a RESYNC.
            self.writes
                .reach(request.get_ref().after_seq, RESUME_WAIT)
                .await;
        }
        let result = admitted.and_then(|()| {
                let held = self
                    .access
                    .hold_subscription(crate::access::authorization(&request))
                    .map_err(Status::resource_exhausted)?;
                let request = request.get_ref();
                let (namespace, mut subscription) =
                    self.gate.subscribe(&request.namespace, request.after_seq).map_err(status)?;
                let shutdown = self.access.shutdown().clone();
                let stream: InvalidationStream = Box::pin(async_stream::stream! {
                    let _held = held; // counted against its token while the stream lives
                    loop {
                        tokio::select! {
                            biased;
                            () = shutdown.wait() => {
                                yield Err(Status::unavailable(format!(
                                    "the server is shutting down; resubscribe with after_seq = {}",
                                    subscription.cursor()
                                )));
                                break;
                            }
                            delivery = subscription.next() => yield Ok(invalidation(&namespace, delivery)),
                        }
                    }
                });
                Ok(stream)
            });
        self.finish(Rpc::SubscribeInvalidations, started, result)
    }
}
