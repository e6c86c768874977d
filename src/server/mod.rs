//! Wiring: binds the ports, opens the data directory, serves gRPC (the contract, admin, health, reflection)
//! and HTTP while the state loads, then opens the gate for writes; runs maintenance, log syncing and
//! snapshots; shuts down gracefully.
//!
//! Startup: ports bound and served at once — health `NOT_SERVING`, `/readyz` 503, lookups `MAY_EXIST` +
//! `WARMING`, writes waiting for the state (up to 10 s) — while the newest snapshot loads and the log
//! replays; then `SERVING`.
//!
//! Shutdown: health turns `NOT_SERVING` and `/readyz` 503 (load balancers stop sending), handlers refuse new
//! calls with `UNAVAILABLE`, subscription streams end with `UNAVAILABLE` (clients resubscribe elsewhere with
//! their last seq), the listeners stop accepting and send GOAWAY, in-flight calls get until the drain
//! deadline to finish, and a last snapshot is taken so the next start replays nothing.

mod background;
mod grpc_port;
mod loading;
mod mode;
mod replicated;
mod resp_port;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use replicated::ReplicationOptions;
pub use tls::TlsOptions;

pub use crate::service::resp::RespOptions;

use crate::core::clock::{Clock, SystemMonotonicClock};
use crate::core::config::GateConfig;
use crate::core::gate::Gate;
use crate::core::hashing::KeyHasher;
use crate::core::lease::ReadLease;
use crate::service::lifecycle::{Lifecycle, Phase};
use crate::service::listener::Acceptor;
use crate::service::resp::Port;
use crate::service::shutdown::Shutdown;
use crate::storage::segment_file::{RealFiles, SegmentFiles};
use crate::storage::{self, DataDir, PersistenceError, SyncMode};
use background::{final_snapshot, maintenance, Background};
use grpc_port::GrpcTask;
use loading::Load;
use mode::Mode;

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
    /// Refuse to start a single server on a data directory that holds no state yet.
    pub require_existing: bool,
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
            require_existing: false,
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
    /// `Some`: a replica of a shared NATS JetStream stream, which is then the log (no local one).
    pub replication: Option<ReplicationOptions>,
    /// `Some`: the RESP port (RedisBloom's commands for Redis clients). `existence-gate serve` opens it on
    /// `127.0.0.1:6380` unless told `--resp-listen off`; an embedding program asks for it.
    pub resp: Option<RespOptions>,
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
            replication: None,
            resp: None,
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
    /// The replicated stream cannot be joined (the message names NATS, the stream and what to check).
    Replication(String),
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bind { address, source } => write!(f, "cannot listen on {address}: {source}"),
            Self::Transport(error) => write!(f, "gRPC server failed: {error}"),
            Self::Reflection(error) => write!(f, "cannot build the reflection service: {error}"),
            Self::Persistence(error) => write!(f, "{error}"),
            Self::Loading(reason) => write!(f, "cannot load state: {reason}"),
            Self::Config(problem) | Self::Replication(problem) => write!(f, "{problem}"),
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
    /// Where the RESP port is served, if it is.
    pub resp_addr: Option<SocketAddr>,
    /// The gate it serves.
    pub gate: Arc<Gate>,
    lifecycle: Arc<Lifecycle>,
    drain_timeout: Duration,
    grpc: GrpcTask,
    http: JoinHandle<()>,
    resp: Option<JoinHandle<()>>,
    /// Maintenance, snapshots, log sync and watch, health reporting: each ends at shutdown.
    background: Background,
}

async fn bind(address: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let bind_error = |source| ServerError::Bind { address, source };
    let listener = TcpListener::bind(address).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
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
/// Each step fails with what to fix before anything is served.
pub async fn start(
    options: ServeOptions,
    clock: Arc<dyn Clock>,
) -> Result<RunningServer, ServerError> {
    options
        .config
        .check_fits(memory_available())
        .map_err(|e| ServerError::Config(e.to_string()))?;
    let prometheus = crate::service::metrics::install_recorder();
    let (grpc_listener, grpc_addr) = bind(options.listen).await?;
    let (http_listener, http_addr) = bind(options.http_listen).await?;
    let resp_listener = match &options.resp {
        Some(resp) => Some(bind(resp.listen).await?),
        None => None,
    };
    let resp_addr = resp_listener.as_ref().map(|(_, address)| *address);
    let joined = match &options.replication {
        Some(replication) => Some(replicated::join(replication, &options.config).await?),
        None => None,
    };
    let seed = joined.as_ref().map(|(stream, _)| stream.seed());
    let data_dir = open_data_dir(options.durability.as_ref(), seed)?;
    let hasher = match (seed, &data_dir) {
        (Some(seed), _) => KeyHasher::from_seed(seed),
        (None, Some(dir)) => KeyHasher::from_seed(dir.seed()),
        (None, None) => KeyHasher::random(),
    };
    let lease = Arc::new(ReadLease::new(Arc::new(SystemMonotonicClock::new())));
    let mut gate = Gate::new(&options.config, hasher, clock);
    if joined.is_some() {
        gate = gate.with_read_lease(Arc::clone(&lease)).with_stream_time();
    }
    let gate = Arc::new(gate);
    let mode = Mode::new(&options, joined, data_dir, (&gate, lease), grpc_addr);
    let (health, health_service) = tonic_health::server::health_reporter();
    let lifecycle = Lifecycle::new(Shutdown::default(), mode.has_own_log(), health).await;
    let access = grpc_port::access(&options, &lifecycle)?;
    let mirrors = mode.mirrors(&options.config.mirrors);
    let writes = mode.writes(&gate, mirrors.as_ref().ok());
    let grpc = grpc_port::serve(
        &options,
        &gate,
        (&access, &writes),
        (mode.replicas(), mirrors),
        &lifecycle,
        health_service,
        grpc_listener,
    )?;
    let resp = match (resp_listener, &options.resp) {
        (Some((listener, _)), Some(resp)) => Some(resp_port::serve(
            &options,
            resp,
            Port::new(Arc::clone(&gate), writes, access, resp.clone()),
            listener,
        )?),
        _ => None,
    };
    let http = tokio::spawn(crate::service::http::serve(
        Acceptor::new(http_listener, "http"),
        crate::service::http::router(
            Arc::clone(&gate),
            prometheus.clone(),
            Arc::clone(&lifecycle),
        ),
        options.config.limits.handshake_timeout,
        lifecycle.shutdown().clone(),
    ));
    let background = Background::default();
    background.spawn(maintenance(
        Arc::clone(&gate),
        prometheus,
        lifecycle.shutdown().clone(),
    ));
    let load = Load {
        gate: Arc::clone(&gate),
        lifecycle: Arc::clone(&lifecycle),
        background: background.clone(),
    };
    mode.run(load, options.durability).await;
    match resp_addr {
        Some(resp_addr) => tracing::info!(%grpc_addr, %http_addr, %resp_addr, "serving"),
        None => tracing::info!(%grpc_addr, %http_addr, "serving"),
    }
    Ok(RunningServer {
        grpc_addr,
        http_addr,
        resp_addr,
        gate,
        lifecycle,
        drain_timeout: options.drain_timeout,
        grpc,
        http,
        resp,
        background,
    })
}

/// The data directory, opened and locked, when state is durable; a replica's must hold the stream's `seed`. A
/// single server's that holds no state yet is refused under `require_existing`, and logged otherwise.
fn open_data_dir(
    durability: Option<&DurabilityOptions>,
    seed: Option<[u8; 32]>,
) -> Result<Option<DataDir>, ServerError> {
    let Some(durability) = durability else {
        return Ok(None);
    };
    let path = &durability.data_dir;
    let Some(seed) = seed else {
        let new = !DataDir::holds_state(path);
        if new && durability.require_existing {
            return Err(ServerError::Config(format!(
                "the data directory {} holds no state (missing, or never started on), and \
                 --require-existing-data was given: if this server held state before, it is gone — restore \
                 the directory (or mount its volume) and start again; to start a new, empty server, start \
                 once without the flag",
                path.display()
            )));
        }
        let dir = DataDir::open(path).map_err(ServerError::Persistence)?;
        if new {
            tracing::warn!(
                data_dir = %path.display(),
                "a new data directory: starting with no state. If this server held state before, its data \
                 directory is gone and every key added before answers ABSENT: stop, restore it, and start \
                 again (--require-existing-data refuses to start on an empty directory)"
            );
        }
        return Ok(Some(dir));
    };
    DataDir::open_for_replica(path, seed)
        .map(Some)
        .map_err(ServerError::Persistence)
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
    pub async fn snapshot(&self) -> Result<storage::SnapshotTaken, ServerError> {
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
    /// serving tasks are aborted, not left running), background loops end, and a last snapshot is taken
    /// (given the same deadline: past it, the process exits without one).
    /// Returns an error if loading failed.
    pub async fn run_until_shutdown(self) -> Result<(), ServerError> {
        let Self {
            gate,
            lifecycle,
            drain_timeout,
            mut grpc,
            mut http,
            resp,
            background,
            ..
        } = self;
        lifecycle.shutdown().wait().await;
        lifecycle.drain().await;
        tracing::info!(?drain_timeout, "shutting down");
        // The RESP port stops accepting at shutdown, and each of its connections closes after the replies
        // it is writing (a request begun gets `TRYAGAIN`): waited for as the gRPC port's calls are.
        let mut resp = resp;
        let drained = tokio::time::timeout(drain_timeout, async {
            let served = (&mut grpc).await;
            let _ = (&mut http).await;
            if let Some(resp) = &mut resp {
                let _ = resp.await;
            }
            served
        })
        .await;
        if let Some(resp) = resp {
            resp.abort();
        }
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
            // Bounded like the drain: a disk that stalls (an fsync that never returns) must not keep the
            // process from exiting, and the log already holds every acknowledged write.
            if tokio::time::timeout(drain_timeout, final_snapshot(&gate, persistence))
                .await
                .is_err()
            {
                tracing::error!(
                    ?drain_timeout,
                    "the final snapshot did not finish in time (a stalled disk?); exiting without it: the \
                     log holds every acknowledged write, and the next start replays it"
                );
            }
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
