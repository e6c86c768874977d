//! Wiring: binds the ports, builds the gate, serves gRPC (the contract, health, reflection) and HTTP,
//! runs periodic maintenance, and shuts down gracefully.
//!
//! Shutdown order: health turns `NOT_SERVING` and `/readyz` 503 (load balancers stop sending), handlers refuse
//! new calls with `UNAVAILABLE`, subscription streams end with `UNAVAILABLE` (clients resubscribe elsewhere
//! with their last seq), the listeners stop accepting and send GOAWAY, and in-flight calls get until the drain
//! deadline to finish.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::clock::Clock;
use crate::config::GateConfig;
use crate::gate::Gate;
use crate::grpc::GateService;
use crate::hashing::KeyHasher;
use crate::log::VolatileLog;
use crate::proto::existence_gate_server::ExistenceGateServer;
use crate::shutdown::Shutdown;

/// How often dead windows and expired tombstones are freed.
const MAINTENANCE_INTERVAL: Duration = Duration::from_secs(5);

/// How to run the server.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// gRPC address (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// HTTP address for `/metrics`, `/healthz`, `/readyz`.
    pub http_listen: SocketAddr,
    /// Namespaces and limits.
    pub config: GateConfig,
    /// Largest gRPC message accepted or sent.
    pub max_message_bytes: usize,
    /// How long in-flight calls may take to finish after shutdown begins.
    pub drain_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            listen: ([127, 0, 0, 1], 50051).into(),
            http_listen: ([127, 0, 0, 1], 9464).into(),
            config: GateConfig::default(),
            max_message_bytes: 16 << 20,
            drain_timeout: Duration::from_secs(10),
        }
    }
}

/// Why the server could not start or stopped badly.
#[derive(Debug)]
pub enum ServerError {
    /// A port could not be bound.
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
    /// The gRPC server failed.
    Transport(tonic::transport::Error),
    /// Reflection could not be built from the descriptors.
    Reflection(String),
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bind { address, source } => write!(f, "cannot listen on {address}: {source}"),
            Self::Transport(error) => write!(f, "gRPC server failed: {error}"),
            Self::Reflection(error) => write!(f, "cannot build the reflection service: {error}"),
        }
    }
}

impl std::error::Error for ServerError {}

/// A started server.
#[derive(Debug)]
pub struct RunningServer {
    /// Where gRPC is served.
    pub grpc_addr: SocketAddr,
    /// Where HTTP is served.
    pub http_addr: SocketAddr,
    /// The gate it serves.
    pub gate: Arc<Gate>,
    shutdown: Shutdown,
    drain_timeout: Duration,
    grpc: JoinHandle<Result<(), tonic::transport::Error>>,
    http: JoinHandle<std::io::Result<()>>,
    health: HealthReporter,
}

async fn bind(address: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(address)
        .await
        .map_err(|source| ServerError::Bind { address, source })
}

/// Health service names this server reports: overall ("") and the contract's.
fn health_names() -> [&'static str; 2] {
    ["", crate::proto::existence_gate_server::SERVICE_NAME]
}

async fn set_health(health: &HealthReporter, status: ServingStatus) {
    for name in health_names() {
        health.set_service_status(name, status).await;
    }
}

/// Binds both ports, builds the gate and starts serving; returns once the gate is ready.
pub async fn start(
    options: ServeOptions,
    clock: Arc<dyn Clock>,
) -> Result<RunningServer, ServerError> {
    let prometheus = crate::metrics::install_recorder();
    let grpc_listener = bind(options.listen).await?;
    let http_listener = bind(options.http_listen).await?;
    let grpc_addr = grpc_listener
        .local_addr()
        .map_err(|source| ServerError::Bind {
            address: options.listen,
            source,
        })?;
    let http_addr = http_listener
        .local_addr()
        .map_err(|source| ServerError::Bind {
            address: options.http_listen,
            source,
        })?;

    let gate = Arc::new(Gate::new(
        &options.config,
        KeyHasher::random(),
        Arc::new(VolatileLog),
        clock,
    ));
    let shutdown = Shutdown::default();
    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(&health, ServingStatus::NotServing).await;

    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .map_err(|e| ServerError::Reflection(e.to_string()))?;
    // grpcurl 1.8 and Python's grpcio-reflection speak only v1alpha.
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .map_err(|e| ServerError::Reflection(e.to_string()))?;
    let gate_service =
        ExistenceGateServer::new(GateService::new(Arc::clone(&gate), shutdown.clone()))
            .max_decoding_message_size(options.max_message_bytes)
            .max_encoding_message_size(options.max_message_bytes);

    let grpc_shutdown = shutdown.clone();
    let grpc = tokio::spawn(
        tonic::transport::Server::builder()
            .layer(tower::util::MapResponseLayer::new(
                oversized_is_resource_exhausted as fn(GrpcResponse) -> GrpcResponse,
            ))
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(gate_service)
            .serve_with_incoming_shutdown(TcpListenerStream::new(grpc_listener), async move {
                grpc_shutdown.wait().await
            }),
    );
    let http_shutdown = shutdown.clone();
    let router = crate::http::router(Arc::clone(&gate), prometheus, shutdown.clone());
    let http = tokio::spawn(async move {
        axum::serve(http_listener, router)
            .with_graceful_shutdown(async move { http_shutdown.wait().await })
            .await
    });
    spawn_maintenance(Arc::clone(&gate), shutdown.clone());

    // State lives in memory only, so there is nothing to load: ready at once.
    gate.set_ready(true);
    set_health(&health, ServingStatus::Serving).await;
    tracing::info!(%grpc_addr, %http_addr, "serving");
    Ok(RunningServer {
        grpc_addr,
        http_addr,
        gate,
        shutdown,
        drain_timeout: options.drain_timeout,
        grpc,
        http,
        health,
    })
}

type GrpcResponse = tonic::codegen::http::Response<tonic::body::Body>;

/// tonic refuses a message over the size limit with `OUT_OF_RANGE`; the gRPC spec (and every other gRPC
/// implementation, so every client's retry logic) says `RESOURCE_EXHAUSTED`. Rewrites that one status.
fn oversized_is_resource_exhausted(mut response: GrpcResponse) -> GrpcResponse {
    let headers = response.headers_mut();
    let oversized = headers.get("grpc-status").is_some_and(|s| s == "11")
        && headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .is_some_and(|m| {
                m.contains("message%20length%20too%20large")
                    || m.contains("message length too large")
            });
    if oversized {
        headers.insert(
            "grpc-status",
            tonic::codegen::http::HeaderValue::from_static("8"),
        );
    }
    response
}

fn spawn_maintenance(gate: Arc<Gate>, shutdown: Shutdown) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(MAINTENANCE_INTERVAL);
        loop {
            tokio::select! {
                () = shutdown.wait() => break,
                _ = ticks.tick() => {
                    let gate = Arc::clone(&gate);
                    // Purging scans tables: keep it off the request threads' budget.
                    let _ = tokio::task::spawn_blocking(move || gate.maintain()).await;
                }
            }
        }
    });
}

impl RunningServer {
    /// The shutdown handle (trigger it to stop the server).
    pub fn shutdown_handle(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// Waits for shutdown to be triggered, then drains: returns once in-flight calls finished or the drain
    /// deadline passed.
    pub async fn run_until_shutdown(self) -> Result<(), ServerError> {
        self.shutdown.wait().await;
        tracing::info!(drain_timeout = ?self.drain_timeout, "shutting down");
        set_health(&self.health, ServingStatus::NotServing).await;
        let drained = tokio::time::timeout(self.drain_timeout, async {
            let grpc = self.grpc.await;
            let _ = self.http.await;
            grpc
        })
        .await;
        match drained {
            Ok(Ok(Ok(()))) => {
                tracing::info!("drained; bye");
                Ok(())
            }
            Ok(Ok(Err(error))) => Err(ServerError::Transport(error)),
            Ok(Err(join_error)) => {
                tracing::error!(%join_error, "gRPC server task failed");
                Ok(())
            }
            Err(_) => {
                tracing::warn!("drain deadline passed with calls still in flight; stopping anyway");
                Ok(())
            }
        }
    }

    /// Triggers shutdown and drains.
    pub async fn stop(self) -> Result<(), ServerError> {
        set_health(&self.health, ServingStatus::NotServing).await;
        self.shutdown.trigger();
        self.run_until_shutdown().await
    }
}
