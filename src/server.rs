//! Wiring: binds the ports, opens the data directory, serves gRPC (the contract, admin, health, reflection)
//! and HTTP while the state loads, then opens the gate for writes; runs maintenance, log syncing and
//! snapshots; shuts down gracefully.
//!
//! Startup: ports bound and served at once — health `NOT_SERVING`, `/readyz` 503, lookups `MAY_EXIST` +
//! `WARMING`, writes `UNAVAILABLE` — while the newest snapshot loads and the log replays; then `SERVING`.
//!
//! Shutdown: health turns `NOT_SERVING` and `/readyz` 503 (load balancers stop sending), handlers refuse new
//! calls with `UNAVAILABLE`, subscription streams end with `UNAVAILABLE` (clients resubscribe elsewhere with
//! their last seq), the listeners stop accepting and send GOAWAY, in-flight calls get until the drain
//! deadline to finish, and a last snapshot is taken so the next start replays nothing.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::access::{Access, GrpcResponse, InFlightLimitLayer};
use crate::admin::AdminService;
use crate::auth::Authorizer;
use crate::clock::Clock;
use crate::config::GateConfig;
use crate::gate::Gate;
use crate::grpc::GateService;
use crate::hashing::KeyHasher;
use crate::lifecycle::{Lifecycle, Phase};
use crate::listener::{Acceptor, Incoming, Plaintext};
use crate::log::VolatileLog;
use crate::persistence::segment_file::{RealFiles, SegmentFiles};
use crate::persistence::{
    self, DataDir, Persistence, PersistenceError, Snapshotter, SyncMode, Wal,
};
use crate::proto::admin_server::AdminServer;
use crate::proto::existence_gate_server::ExistenceGateServer;
use crate::shutdown::Shutdown;

/// How often dead windows and expired tombstones are freed.
const MAINTENANCE_INTERVAL: Duration = Duration::from_secs(5);
/// How often the log size is checked against the snapshot threshold.
const SNAPSHOT_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How often the log's files and write health are checked.
const LOG_WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Where and how state is kept across restarts.
#[derive(Debug, Clone)]
pub struct DurabilityOptions {
    /// The data directory (log, snapshots, identity).
    pub data_dir: PathBuf,
    /// When writes are acknowledged relative to fsync.
    pub sync: SyncMode,
    /// A snapshot is taken this often...
    pub snapshot_interval: Duration,
    /// ...and whenever this many log bytes were written since the last one.
    pub snapshot_log_bytes: u64,
    /// How log segments are created: the file system, or a test's faulty files.
    pub segment_files: Arc<dyn SegmentFiles>,
}

impl DurabilityOptions {
    /// State in `data_dir` with the defaults of `existence-gate serve`: fsync before acknowledging, a
    /// snapshot every 5 minutes or 256 MiB of log, real files.
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            sync: SyncMode::Always,
            snapshot_interval: Duration::from_secs(300),
            snapshot_log_bytes: 256 << 20,
            segment_files: Arc::new(RealFiles),
        }
    }
}

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
    /// `None` keeps state in memory only (lost on restart).
    pub durability: Option<DurabilityOptions>,
    /// `None` serves plaintext gRPC.
    pub tls: Option<TlsOptions>,
}

/// TLS for the gRPC port.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    /// PEM certificate chain of the server.
    pub cert: PathBuf,
    /// PEM private key of the server.
    pub key: PathBuf,
    /// PEM CA bundle: when set, clients must present a certificate it signed (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

impl TlsOptions {
    /// The acceptor for the gRPC port: rustls with the `ring` provider, HTTP/2 offered by ALPN, and client
    /// certificates required and checked against `client_ca` when it is set — as tonic's own TLS does, but
    /// terminated by [`crate::listener`], so the handshake timeout covers the TLS handshake too.
    fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, ServerError> {
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        use tokio_rustls::rustls::server::WebPkiClientVerifier;
        use tokio_rustls::rustls::{RootCertStore, ServerConfig};
        let read = |path: &PathBuf, what: &str| {
            std::fs::read(path).map_err(|e| {
                ServerError::Config(format!(
                    "cannot read the TLS {what} {}: {e}",
                    path.display()
                ))
            })
        };
        let invalid = |what: &str, path: &PathBuf, e: &dyn std::fmt::Display| {
            ServerError::Config(format!("invalid TLS {what} {}: {e}", path.display()))
        };
        let certificates = |path: &PathBuf, what: &str| {
            let pem = read(path, what)?;
            let certificates = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(what, path, &e))?;
            if certificates.is_empty() {
                return Err(invalid(what, path, &"no PEM certificate in it"));
            }
            Ok(certificates)
        };
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| ServerError::Config(format!("invalid TLS configuration: {e}")))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for certificate in certificates(ca, "client CA")? {
                    roots
                        .add(certificate)
                        .map_err(|e| invalid("client CA", ca, &e))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| invalid("client CA", ca, &e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let key = PrivateKeyDer::from_pem_slice(&read(&self.key, "key")?)
            .map_err(|e| invalid("key", &self.key, &e))?;
        let mut config = builder
            .with_single_cert(certificates(&self.cert, "certificate")?, key)
            .map_err(|e| invalid("certificate", &self.cert, &e))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            listen: ([127, 0, 0, 1], 50051).into(),
            http_listen: ([127, 0, 0, 1], 9464).into(),
            config: GateConfig::default(),
            max_message_bytes: 16 << 20,
            drain_timeout: Duration::from_secs(10),
            durability: None,
            tls: None,
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
    /// The data directory could not be opened, loaded or written.
    Persistence(PersistenceError),
    /// Loading the state failed (the reason says how to recover).
    Loading(String),
    /// The configuration or the TLS files cannot be used.
    Config(String),
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bind { address, source } => write!(f, "cannot listen on {address}: {source}"),
            Self::Transport(error) => write!(f, "gRPC server failed: {error}"),
            Self::Reflection(error) => write!(f, "cannot build the reflection service: {error}"),
            Self::Persistence(error) => write!(f, "{error}"),
            Self::Loading(reason) => write!(f, "cannot load state: {reason}"),
            Self::Config(problem) => write!(f, "{problem}"),
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
    lifecycle: Arc<Lifecycle>,
    drain_timeout: Duration,
    grpc: JoinHandle<Result<(), tonic::transport::Error>>,
    http: JoinHandle<()>,
    /// Maintenance, snapshots, log sync and watch, health reporting: each ends at shutdown.
    background: Background,
}

/// The server's background loops, which shutdown waits for (and aborts past a bound) before the final
/// snapshot, so that none of them still writes when it is taken.
#[derive(Debug, Clone, Default)]
struct Background(Arc<std::sync::Mutex<tokio::task::JoinSet<()>>>);

impl Background {
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).spawn(task);
    }

    /// Waits for every loop to end (they end at shutdown), aborting those still running after `bound`.
    async fn stop(&self, bound: Duration) {
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

async fn bind(address: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let bind_error = |source| ServerError::Bind { address, source };
    let listener = TcpListener::bind(address).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
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

/// The memory this process may use: the machine's (`MemTotal`), or its cgroup's limit if lower; unlimited if
/// neither can be read.
fn memory_available() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib.saturating_mul(1024))
        })
        .unwrap_or(u64::MAX);
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|limit| limit.trim().parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    total.min(cgroup)
}

/// Binds both ports and starts serving; the state loads in the background (see [`RunningServer::loaded`]).
pub async fn start(
    options: ServeOptions,
    clock: Arc<dyn Clock>,
) -> Result<RunningServer, ServerError> {
    options
        .config
        .check_fits(memory_available())
        .map_err(|e| ServerError::Config(e.to_string()))?;
    let prometheus = crate::metrics::install_recorder();
    let (grpc_listener, grpc_addr) = bind(options.listen).await?;
    let (http_listener, http_addr) = bind(options.http_listen).await?;
    let data_dir = match &options.durability {
        Some(durability) => {
            Some(DataDir::open(&durability.data_dir).map_err(ServerError::Persistence)?)
        }
        None => None,
    };
    let hasher = data_dir
        .as_ref()
        .map_or_else(KeyHasher::random, |dir| KeyHasher::from_seed(dir.seed()));
    let gate = Arc::new(Gate::new(&options.config, hasher, clock));
    let shutdown = Shutdown::default();
    let (health, health_service) = tonic_health::server::health_reporter();
    let lifecycle = Lifecycle::new(shutdown.clone(), options.durability.is_some(), health).await;
    let background = Background::default();

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
    let authorizer = Authorizer::new(&options.config.tokens).map_err(ServerError::Config)?;
    if !authorizer.is_enabled() && !options.listen.ip().is_loopback() {
        tracing::warn!(
            listen = %options.listen,
            "no [[tokens]] configured and listening beyond loopback: anyone who can reach the port can read \
             and write every namespace"
        );
    }
    let access = Access::new(authorizer, shutdown.clone());
    let gate_service =
        ExistenceGateServer::new(GateService::new(Arc::clone(&gate), Arc::clone(&access)))
            .max_decoding_message_size(options.max_message_bytes)
            .max_encoding_message_size(options.max_message_bytes);

    let admin_service = AdminServer::new(AdminService::new(
        Arc::clone(&gate),
        access,
        Arc::clone(&lifecycle),
    ))
    .max_decoding_message_size(options.max_message_bytes);

    let limits = &options.config.limits;
    let tls = options.tls.as_ref().map(TlsOptions::acceptor).transpose()?;
    let router = tonic::transport::Server::builder()
        .max_concurrent_streams(limits.max_concurrent_streams)
        .timeout(limits.request_timeout)
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .layer(
            tower::ServiceBuilder::new()
                .layer(tower::util::MapResponseLayer::new(
                    client_errors_as_client_errors as fn(GrpcResponse) -> GrpcResponse,
                ))
                .layer(InFlightLimitLayer::new(limits.max_in_flight)),
        )
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(gate_service)
        .add_service(admin_service);
    let grpc_shutdown = shutdown.clone();
    let stopped = async move { grpc_shutdown.wait().await };
    // Two types of connection, so two instances of the serving future.
    let grpc = match tls {
        None => tokio::spawn(router.serve_with_incoming_shutdown(
            Incoming::new(grpc_listener, Plaintext, limits.handshake_timeout),
            stopped,
        )),
        Some(tls) => tokio::spawn(router.serve_with_incoming_shutdown(
            Incoming::new(grpc_listener, tls, limits.handshake_timeout),
            stopped,
        )),
    };
    let http = tokio::spawn(crate::http::serve(
        Acceptor::new(http_listener, "http"),
        crate::http::router(
            Arc::clone(&gate),
            prometheus.clone(),
            Arc::clone(&lifecycle),
        ),
        limits.handshake_timeout,
        shutdown.clone(),
    ));
    background.spawn(maintenance(Arc::clone(&gate), prometheus, shutdown.clone()));

    let load = Load {
        gate: Arc::clone(&gate),
        lifecycle: Arc::clone(&lifecycle),
        background: background.clone(),
    };
    match (data_dir, options.durability) {
        (Some(dir), Some(durability)) => background.spawn(load.recover(dir, durability)),
        _ => lifecycle.ready(&gate, Arc::new(VolatileLog), None).await,
    }
    tracing::info!(%grpc_addr, %http_addr, "serving");
    Ok(RunningServer {
        grpc_addr,
        http_addr,
        gate,
        lifecycle,
        drain_timeout: options.drain_timeout,
        grpc,
        http,
        background,
    })
}

/// The background work of loading state and then opening the gate.
struct Load {
    gate: Arc<Gate>,
    lifecycle: Arc<Lifecycle>,
    background: Background,
}

impl Load {
    async fn recover(self, dir: DataDir, durability: DurabilityOptions) {
        let gate = Arc::clone(&self.gate);
        let (sync, files) = (durability.sync, Arc::clone(&durability.segment_files));
        let recovered = tokio::task::spawn_blocking(move || {
            persistence::recover_with_files(&dir, &gate, sync, files)
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

/// Every `MAINTENANCE_INTERVAL`: frees dead windows and expired tombstones, and folds the latency samples
/// recorded since into the Prometheus histograms (which otherwise keep every sample until a scrape, so a
/// server nobody scrapes would grow by ~17 bytes per call).
async fn maintenance(gate: Arc<Gate>, prometheus: PrometheusHandle, shutdown: Shutdown) {
    every_tick(MAINTENANCE_INTERVAL, shutdown, move || {
        gate.maintain();
        prometheus.run_upkeep();
    })
    .await;
}

/// Takes a snapshot every `snapshot_interval`, or sooner once `snapshot_log_bytes` were logged.
async fn take_snapshots(
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
async fn watch_log(wal: Arc<Wal>, gate: Arc<Gate>, shutdown: Shutdown) {
    every_tick(LOG_WATCH_INTERVAL, shutdown, move || {
        wal.check_segment_linked();
        wal.retry_writes();
        crate::metrics::writes_refused(gate.write_failure().is_some());
    })
    .await;
}

/// Fsyncs the log every `every` (`--sync interval`).
async fn sync_periodically(wal: Arc<Wal>, every: Duration, shutdown: Shutdown) {
    every_tick(every, shutdown, move || {
        if let Err(error) = wal.sync_now() {
            tracing::error!(%error, "periodic log sync failed");
        }
    })
    .await;
}

impl RunningServer {
    /// The shutdown handle (trigger it to stop the server).
    pub fn shutdown_handle(&self) -> Shutdown {
        self.lifecycle.shutdown().clone()
    }

    /// The server's lifecycle.
    pub fn lifecycle(&self) -> Arc<Lifecycle> {
        Arc::clone(&self.lifecycle)
    }

    /// Waits until the state is loaded (or loading failed).
    pub async fn loaded(&self) -> Result<(), String> {
        self.lifecycle.loaded().await
    }

    /// Takes a snapshot now.
    pub async fn snapshot(&self) -> Result<persistence::SnapshotTaken, ServerError> {
        let snapshots = self
            .lifecycle
            .persistence()
            .map_err(|not| ServerError::Config(format!("no snapshot: {not}")))?
            .snapshots
            .clone();
        let gate = Arc::clone(&self.gate);
        tokio::task::spawn_blocking(move || snapshots.take(&gate))
            .await
            .map_err(|panic| ServerError::Loading(format!("the snapshot task failed: {panic}")))?
            .map_err(ServerError::Persistence)
    }

    /// Waits for shutdown to be triggered, then drains: in-flight calls get the drain deadline (past it the
    /// serving tasks are aborted, not left running), background loops end, and a last snapshot is taken.
    /// Returns an error if loading failed.
    pub async fn run_until_shutdown(self) -> Result<(), ServerError> {
        let Self {
            gate,
            lifecycle,
            drain_timeout,
            mut grpc,
            mut http,
            background,
            ..
        } = self;
        lifecycle.shutdown().wait().await;
        lifecycle.drain().await;
        tracing::info!(?drain_timeout, "shutting down");
        let drained = tokio::time::timeout(drain_timeout, async {
            let served = (&mut grpc).await;
            let _ = (&mut http).await;
            served
        })
        .await;
        match drained {
            Ok(Ok(Ok(()))) => tracing::info!("drained"),
            Ok(Ok(Err(error))) => return Err(ServerError::Transport(error)),
            Ok(Err(join_error)) => tracing::error!(%join_error, "gRPC server task failed"),
            Err(_) => {
                tracing::warn!("drain deadline passed with calls still in flight; aborting them");
                grpc.abort();
                http.abort();
                let _ = grpc.await;
                let _ = http.await;
            }
        }
        background.stop(drain_timeout).await;
        if let Phase::Failed(reason) = lifecycle.phase() {
            return Err(ServerError::Loading(reason));
        }
        if let Ok(persistence) = lifecycle.persistence() {
            final_snapshot(&gate, persistence).await;
        }
        tracing::info!("bye");
        Ok(())
    }

    /// Triggers shutdown and drains.
    pub async fn stop(self) -> Result<(), ServerError> {
        self.lifecycle.drain().await;
        self.lifecycle.shutdown().trigger();
        self.run_until_shutdown().await
    }
}

/// Syncs the log and takes the snapshot that lets the next start replay nothing; a failure is logged with
/// what it means for the next start.
async fn final_snapshot(gate: &Arc<Gate>, persistence: &Persistence) {
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
