//! The gRPC port: the contract, mirror, admin, health and reflection services behind one tower stack (status
//! rewriting, the in-flight limit), served on a listener with a handshake deadline, plaintext or TLS.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic_health::pb::health_server::{Health, HealthServer};

use super::tls::TlsOptions;
use super::{ServeOptions, ServerError};
use crate::core::gate::Gate;
use crate::core::replicas::Replicas;
use crate::core::writes::Writes;
use crate::proto::admin_server::AdminServer;
use crate::proto::mirror_server::MirrorServer;
use crate::service::access::{Access, GrpcResponse, InFlightLimitLayer};
use crate::service::add_request::AddRoute;
use crate::service::admin::AdminService;
use crate::service::auth::Authorizer;
use crate::service::deadline::DeadlineLayer;
use crate::service::grpc::GateService;
use crate::service::lifecycle::Lifecycle;
use crate::service::listener::{Incoming, Plaintext};
use crate::service::mirror::{MirrorService, Mirroring};

/// How many streams a client may reset before the server has accepted them, on one connection, before h2
/// ends the connection with GOAWAY `ENHANCE_YOUR_CALM` (its default is 20, a defence against HTTP/2 rapid
/// reset). A server that resumes after a pause (a starved VM, SIGSTOP) reads at once every call its clients
/// gave up on meanwhile, each a request and its reset: the client libraries try a silent replica again once
/// a second per caller, so 20 went in seconds, and the GOAWAY failed the calls still in flight on the
/// connection (the balancer test's Java library lost five after a 10 s pause). 1,024 holds minutes of that
/// and is h2's own bound on the streams a server resets: a rapid-reset attacker still queues no more than
/// that many streams per connection (`tests/suite/connections.rs` sends 100 resets during a pause).
const PENDING_ACCEPT_RESETS: usize = 1024;
/// The gRPC serving task; it ends when shutdown is triggered and in-flight calls finished.
pub(super) type GrpcTask = JoinHandle<Result<(), tonic::transport::Error>>;

/// Serves every service of the gRPC port, with their limits, behind the tower stack, on `listener` until
/// shutdown: plaintext, or TLS when configured.
pub(super) fn serve(
    options: &ServeOptions,
    gate: &Arc<Gate>,
    (access, writes): (&Arc<Access>, &Arc<dyn Writes>),
    (replicas, mirrors): (Option<Arc<dyn Replicas>>, Mirroring),
    lifecycle: &Arc<Lifecycle>,
    health_service: HealthServer<impl Health>,
    listener: TcpListener,
) -> Result<GrpcTask, ServerError> {
    let tls = options.tls.as_ref().map(TlsOptions::acceptor).transpose()?;
    let access = Arc::clone(access);
    let contract =
        GateService::new(Arc::clone(gate), Arc::clone(&access)).with_writes(Arc::clone(writes));
    let gate_service = AddRoute::new(contract, options.max_message_bytes);
    let mirror_service = MirrorServer::new(MirrorService::new(
        Arc::clone(gate),
        Arc::clone(&access),
        mirrors,
    ));
    let admin_service = AdminServer::new(
        AdminService::new(Arc::clone(gate), access, Arc::clone(lifecycle)).with_replica(replicas),
    )
    .max_decoding_message_size(options.max_message_bytes);
    let reflection_failed =
        |e: tonic_reflection::server::Error| ServerError::Reflection(e.to_string());
    let limits = &options.config.limits;
    let router = tonic::transport::Server::builder()
        .max_concurrent_streams(limits.max_concurrent_streams)
        .http2_max_pending_accept_reset_streams(Some(PENDING_ACCEPT_RESETS))
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .layer(
            tower::ServiceBuilder::new()
                .layer(tower::util::MapResponseLayer::new(
                    client_errors_as_client_errors as fn(GrpcResponse) -> GrpcResponse,
                ))
                .layer(DeadlineLayer::new(limits.request_timeout))
                .layer(InFlightLimitLayer::new(limits.max_in_flight)),
        )
        .add_service(health_service)
        .add_service(reflection().build_v1().map_err(reflection_failed)?)
        // grpcurl 1.8 and Python's grpcio-reflection speak only v1alpha.
        .add_service(reflection().build_v1alpha().map_err(reflection_failed)?)
        .add_service(gate_service)
        .add_service(mirror_service)
        .add_service(admin_service);
    let shutdown = lifecycle.shutdown().clone();
    let stopped = async move { shutdown.wait().await };
    let deadline = limits.handshake_timeout;
    // Two types of connection, so two instances of the serving future.
    Ok(match tls {
        None => {
            tokio::spawn(router.serve_with_incoming_shutdown(
                Incoming::new(listener, Plaintext, deadline),
                stopped,
            ))
        }
        Some(tls) => tokio::spawn(
            router.serve_with_incoming_shutdown(Incoming::new(listener, tls, deadline), stopped),
        ),
    })
}

/// Admission for every port: the configuration's tokens and the shutdown signal.
pub(super) fn access(
    options: &ServeOptions,
    lifecycle: &Lifecycle,
) -> Result<Arc<Access>, ServerError> {
    Ok(Access::new(
        authorizer(options)?,
        lifecycle.shutdown().clone(),
        options.config.limits.max_subscriptions_per_token,
    ))
}

/// The bearer-token check from the configuration, with a warning when a port is open to anyone.
fn authorizer(options: &ServeOptions) -> Result<Authorizer, ServerError> {
    let authorizer = Authorizer::new(&options.config.tokens).map_err(ServerError::Config)?;
    let resp = options.resp.as_ref().map(|resp| resp.listen);
    let beyond_loopback = std::iter::once(options.listen)
        .chain(resp)
        .find(|address| !address.ip().is_loopback());
    if let (false, Some(listen)) = (authorizer.is_enabled(), beyond_loopback) {
        tracing::warn!(
            %listen,
            "no [[tokens]] configured and listening beyond loopback: anyone who can reach the port can read \
             and write every namespace"
        );
    }
    Ok(authorizer)
}

/// Server reflection of the contract and of health, to be built in each version clients speak.
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

/// Rewrites the two statuses tonic gives to bad requests before a handler sees them into the ones callers
/// can act on: a message over the size limit is `OUT_OF_RANGE` in tonic, `RESOURCE_EXHAUSTED` in the gRPC
/// spec (and so in every other implementation's retry logic); a body that does not decode (truncated
/// protobuf, a namespace that is not UTF-8) is `INTERNAL` in tonic, which reads as the server's fault and
/// invites retries of a request that will never succeed: it is `INVALID_ARGUMENT`.
fn client_errors_as_client_errors(mut response: GrpcResponse) -> GrpcResponse {
    let headers = response.headers_mut();
    // Every response passes here: the message is read only for the two codes that may be rewritten.
    let message = || {
        headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .unwrap_or_default()
            .replace("%20", " ")
    };
    let rewritten = match headers.get("grpc-status").map(|s| s.as_bytes()) {
        Some(b"11") if message().contains("message length too large") => "8",
        Some(b"13") if message().starts_with("failed to decode Protobuf message") => "3",
        _ => return response,
    };
    headers.insert(
        "grpc-status",
        tonic::codegen::http::HeaderValue::from_static(rewritten),
    );
    response
}
