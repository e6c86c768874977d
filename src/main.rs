//! The `existence-gate` command: `serve` (the default) runs the service; the client subcommands of
//! `existence_gate::cli` operate a running one.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};

use existence_gate::cli;
use existence_gate::core::clock::SystemClock;
use existence_gate::core::config::{parse_duration, GateConfig};
use existence_gate::replication::replica::ReplicaOptions;
use existence_gate::replication::stream::StreamOptions;
use existence_gate::server::{
    self, DurabilityOptions, ReplicationOptions, ServeOptions, TlsOptions,
};
use existence_gate::storage::SyncMode;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::EnvFilter;

/// With `--features mimalloc`: a unary call allocates and frees a few dozen small buffers (HTTP/2 frames,
/// headers, the request and response), and glibc's allocator takes 6-7% of its server CPU; mimalloc saves
/// most of that but holds more memory (see the feature's note in Cargo.toml).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long blocking work still running when `main` returns may take before the process exits without it.
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Answers "can this key exist?" for the services in front of your databases.
#[derive(Debug, Parser)]
#[command(name = "existence-gate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the gRPC contract and the HTTP metrics/health port (the default).
    Serve(Box<ServeArgs>),
    /// Check a server's gRPC health: exits 0 only when the service is SERVING (for container HEALTHCHECKs).
    Probe(ProbeArgs),
    /// Print the SHA-256 of a token for the `sha256` field of a `[[tokens]]` entry (reads the token from
    /// standard input when not given, so it stays out of shell history).
    HashToken {
        /// The token.
        token: Option<String>,
    },
    #[command(flatten)]
    Client(cli::Command),
    /// Follow tables of a PostgreSQL database (logical replication) into the gate: inserts become Adds,
    /// deletes RecordAbsent(DELETED). Runs until interrupted; serves /metrics, /healthz and /readyz.
    Feed(Box<existence_gate::feed::FeedArgs>),
}

#[derive(Debug, Args)]
struct ProbeArgs {
    /// The server's gRPC address, e.g. 127.0.0.1:50051.
    #[arg(long, default_value = "127.0.0.1:50051")]
    addr: String,
    /// The health service name to check ("" = the whole server).
    #[arg(long, default_value = "")]
    service: String,
    /// How long to wait for an answer (e.g. 2s).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    timeout: std::time::Duration,
}

/// Prints the hash of `token` (or of the first line of standard input).
fn hash_token(token: Option<String>) -> Result<(), String> {
    let token = match token {
        Some(token) => token,
        None => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .map_err(|e| format!("cannot read the token from standard input: {e}"))?;
            line.trim_end_matches(['\r', '\n']).to_string()
        }
    };
    if token.is_empty() {
        return Err("the token is empty".to_string());
    }
    println!("{}", existence_gate::service::auth::hash_token(&token));
    Ok(())
}

/// Asks the server's health service; Ok(()) only for SERVING.
async fn probe(args: ProbeArgs) -> Result<(), String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let uri = if args.addr.contains("://") {
        args.addr.clone()
    } else {
        format!("http://{}", args.addr)
    };
    let check = async {
        let channel = tonic::transport::Endpoint::from_shared(uri)
            .map_err(|e| format!("invalid --addr {}: {e}", args.addr))?
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", args.addr))?;
        let reply = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: args.service.clone(),
            })
            .await
            .map_err(|status| {
                format!(
                    "health check of {:?} failed: {}",
                    args.service,
                    status.message()
                )
            })?;
        match reply.into_inner().status() {
            ServingStatus::Serving => Ok(()),
            other => Err(format!(
                "service {:?} is {}",
                args.service,
                other.as_str_name()
            )),
        }
    };
    tokio::time::timeout(args.timeout, check)
        .await
        .map_err(|_| format!("no answer from {} within {:?}", args.addr, args.timeout))?
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// gRPC listen address.
    #[arg(long, env = "EXISTENCE_GATE_LISTEN", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// HTTP listen address for /metrics, /healthz and /readyz.
    #[arg(
        long,
        env = "EXISTENCE_GATE_HTTP_LISTEN",
        default_value = "127.0.0.1:9464"
    )]
    http_listen: SocketAddr,
    /// TOML file with [limits] and [namespaces.NAME] tables; defaults apply without it.
    #[arg(long, env = "EXISTENCE_GATE_CONFIG")]
    config: Option<PathBuf>,
    /// Largest gRPC message accepted, in bytes (a full batch of maximal keys must fit).
    #[arg(long, env = "EXISTENCE_GATE_MAX_MESSAGE_BYTES", default_value_t = 16 << 20)]
    max_message_bytes: usize,
    /// How long in-flight calls may take to finish after SIGTERM (e.g. 10s).
    #[arg(long, env = "EXISTENCE_GATE_DRAIN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    drain_timeout: std::time::Duration,
    /// How long a new connection may take to send the HTTP/2 preface (TLS handshake included) on the gRPC
    /// port, or a request head on the HTTP port, before it is closed (e.g. 30s). Overrides
    /// `handshake_timeout` in the [limits] of --config; default 30s.
    #[arg(long, env = "EXISTENCE_GATE_HANDSHAKE_TIMEOUT", value_parser = parse_duration)]
    handshake_timeout: Option<std::time::Duration>,
    /// Directory for the write-ahead log, snapshots and the deployment's hash seed.
    #[arg(
        long,
        env = "EXISTENCE_GATE_DATA_DIR",
        default_value = "./existence-data"
    )]
    data_dir: PathBuf,
    /// Keep state in memory only (no data directory; everything is lost on restart).
    #[arg(long, env = "EXISTENCE_GATE_IN_MEMORY", conflicts_with = "data_dir")]
    in_memory: bool,
    /// When writes are acknowledged: after fsync (always), after write with an fsync every
    /// --sync-interval (interval), or after write (never).
    #[arg(long, env = "EXISTENCE_GATE_SYNC", value_enum, default_value_t = Sync::Always)]
    sync: Sync,
    /// How often `--sync interval` fsyncs the log (the most a machine crash can lose).
    #[arg(long, env = "EXISTENCE_GATE_SYNC_INTERVAL", default_value = "100ms", value_parser = parse_duration)]
    sync_interval: std::time::Duration,
    /// How often a snapshot is taken.
    #[arg(long, env = "EXISTENCE_GATE_SNAPSHOT_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    snapshot_interval: std::time::Duration,
    /// A snapshot is also taken once this many log bytes were written since the last one.
    #[arg(long, env = "EXISTENCE_GATE_SNAPSHOT_LOG_BYTES", default_value_t = 256 << 20)]
    snapshot_log_bytes: u64,
    /// PEM certificate chain: serve gRPC over TLS (with --tls-key).
    #[arg(long, env = "EXISTENCE_GATE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "EXISTENCE_GATE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA bundle: require client certificates it signed (mutual TLS).
    #[arg(long, env = "EXISTENCE_GATE_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    #[command(flatten)]
    replication: ReplicationArgs,
}

/// Replicated mode: every flag but `--nats` only matters with it.
#[derive(Debug, Args)]
struct ReplicationArgs {
    /// NATS servers (comma-separated URLs, e.g. nats://127.0.0.1:4222): run as one replica of a deployment
    /// sharing a JetStream stream, which is then the log (no local write-ahead log).
    #[arg(long, env = "EXISTENCE_GATE_NATS", value_delimiter = ',')]
    nats: Vec<String>,
    /// A token for a NATS that requires one.
    #[arg(long, env = "EXISTENCE_GATE_NATS_TOKEN", requires = "nats")]
    nats_token: Option<String>,
    /// A NATS .creds file (JWT and NKey seed).
    #[arg(long, env = "EXISTENCE_GATE_NATS_CREDS", requires = "nats")]
    nats_creds: Option<PathBuf>,
    /// A PEM CA bundle the NATS servers' certificates chain to (TLS is then required).
    #[arg(long, env = "EXISTENCE_GATE_NATS_TLS_CA", requires = "nats")]
    nats_tls_ca: Option<PathBuf>,
    /// The JetStream stream (subjects NAME.<namespace>); the first replica creates it.
    #[arg(long, env = "EXISTENCE_GATE_NATS_STREAM", default_value = "existence")]
    nats_stream: String,
    /// Replicas of the stream when this replica creates it (3 in production).
    #[arg(long, env = "EXISTENCE_GATE_NATS_REPLICAS", default_value_t = 1)]
    nats_replicas: usize,
    /// How this replica names itself in metrics, logs and applied-seq reports (default: host name and gRPC
    /// port).
    #[arg(long, env = "EXISTENCE_GATE_REPLICA_ID")]
    replica_id: Option<String>,
    /// How long a replica may answer ABSENT after confirming it has applied the stream's end (e.g. 100ms);
    /// an Add is acknowledged at most this long after the stream stored it.
    #[arg(long, env = "EXISTENCE_GATE_READ_LEASE", default_value = "100ms", value_parser = parse_duration)]
    read_lease: std::time::Duration,
    /// Seqs behind the stream past which a replica reports NOT_SERVING (lagging).
    #[arg(long, env = "EXISTENCE_GATE_MAX_LAG", default_value_t = 10_000)]
    max_lag: u64,
    /// How much faster one replica's monotonic clock may run than another's (e.g. 1%, 0.5%, 100ppm): writers
    /// that acknowledge by the fallback wait the read lease stretched by this much.
    #[arg(long, env = "EXISTENCE_GATE_MAX_CLOCK_DRIFT", default_value = "1%", value_parser = parse_drift)]
    max_clock_drift: u64,
}

/// A clock drift in parts per million, from `1%` or `100ppm`.
fn parse_drift(text: &str) -> Result<u64, String> {
    let bad = || {
        format!("{text:?} is not a clock drift: write it as a percentage (1%) or in ppm (100ppm)")
    };
    let ppm = if let Some(percent) = text.strip_suffix('%') {
        let percent: f64 = percent.trim().parse().map_err(|_| bad())?;
        (percent * 10_000.0).round()
    } else if let Some(ppm) = text.strip_suffix("ppm") {
        ppm.trim().parse::<f64>().map_err(|_| bad())?
    } else {
        return Err(bad());
    };
    if !(0.0..=100_000.0).contains(&ppm) {
        return Err(format!(
            "{text:?} is out of range: a clock drift is 0 to 10%"
        ));
    }
    Ok(ppm as u64)
}

impl ReplicationArgs {
    fn options(&self, listen: SocketAddr) -> Result<Option<ReplicationOptions>, String> {
        if self.nats.is_empty() {
            return Ok(None);
        }
        if self.read_lease < std::time::Duration::from_millis(4) {
            return Err(format!(
                "--read-lease {:?} is too short: replicas renew it four times per lease over the network; \
                 use at least 4ms (100ms is the default)",
                self.read_lease
            ));
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_string())
            .unwrap_or_else(|_| "replica".to_string());
        let id = self
            .replica_id
            .clone()
            .unwrap_or_else(|| format!("{host}:{}", listen.port()));
        Ok(Some(ReplicationOptions {
            stream: StreamOptions {
                token: self.nats_token.clone(),
                credentials: self.nats_creds.clone(),
                tls_ca: self.nats_tls_ca.clone(),
                replicas: self.nats_replicas,
                ..StreamOptions::new(self.nats.clone(), &self.nats_stream)
            },
            replica: ReplicaOptions {
                id,
                read_lease: self.read_lease,
                max_lag: self.max_lag,
                max_clock_drift_ppm: self.max_clock_drift,
                origin: format!("{host} pid {}", std::process::id()),
            },
        }))
    }
}

/// `--sync` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Sync {
    Always,
    Interval,
    Never,
}

impl ServeArgs {
    fn durability(&self) -> Option<DurabilityOptions> {
        // A replica keeps only snapshots in its data directory: its log is the stream.
        (!self.in_memory).then(|| DurabilityOptions {
            sync: match self.sync {
                Sync::Always => SyncMode::Always,
                Sync::Interval => SyncMode::Interval(self.sync_interval),
                Sync::Never => SyncMode::Never,
            },
            snapshot_interval: self.snapshot_interval,
            snapshot_log_bytes: self.snapshot_log_bytes,
            ..DurabilityOptions::new(self.data_dir.clone())
        })
    }

    /// The serve arguments given only by environment variables and defaults (for a bare `existence-gate`).
    fn from_env() -> Result<Self, clap::Error> {
        #[derive(Parser)]
        struct Bare {
            #[command(flatten)]
            serve: ServeArgs,
        }
        Bare::try_parse_from(["existence-gate"]).map(|bare| bare.serve)
    }

    fn options(self) -> Result<ServeOptions, String> {
        let mut config = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
                GateConfig::from_toml(&text).map_err(|e| e.to_string())?
            }
            None => GateConfig::default(),
        };
        if let Some(timeout) = self.handshake_timeout {
            config.limits.handshake_timeout = timeout;
            config.validate().map_err(|e| {
                e.to_string()
                    .replace("limits.handshake_timeout", "--handshake-timeout")
            })?;
        }
        let replication = self.replication.options(self.listen)?;
        Ok(ServeOptions {
            replication,
            listen: self.listen,
            http_listen: self.http_listen,
            config,
            max_message_bytes: self.max_message_bytes,
            drain_timeout: self.drain_timeout,
            durability: self.durability(),
            tls: self
                .tls_cert
                .clone()
                .zip(self.tls_key.clone())
                .map(|(cert, key)| TlsOptions {
                    cert,
                    key,
                    client_ca: self.tls_client_ca.clone(),
                }),
        })
    }
}

fn log_settings(options: &ServeOptions) {
    tracing::info!(listen = %options.listen, http_listen = %options.http_listen, "listen addresses");
    tracing::info!(
        max_message_bytes = options.max_message_bytes,
        drain_timeout = ?options.drain_timeout,
        max_batch_keys = options.config.limits.max_batch_keys,
        max_key_bytes = options.config.limits.max_key_bytes,
        replay_buffer_bytes = options.config.limits.replay_buffer_bytes,
        "limits"
    );
    tracing::info!(
        tls = options.tls.is_some(),
        mutual_tls = options.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        tokens = options.config.tokens.len(),
        max_in_flight = options.config.limits.max_in_flight,
        max_concurrent_streams = options.config.limits.max_concurrent_streams,
        max_subscribers_per_namespace = options.config.limits.max_subscribers_per_namespace,
        handshake_timeout = ?options.config.limits.handshake_timeout,
        "access"
    );
    match &options.durability {
        Some(d) => tracing::info!(
            data_dir = %d.data_dir.display(),
            sync = ?d.sync,
            snapshot_interval = ?d.snapshot_interval,
            snapshot_log_bytes = d.snapshot_log_bytes,
            "durability"
        ),
        None if options.replication.is_some() => {}
        None => tracing::warn!("--in-memory: state is kept in memory only and is lost on restart"),
    }
    if let Some(replication) = &options.replication {
        tracing::info!(
            nats = replication.stream.servers.join(","),
            stream = replication.stream.stream,
            stream_replicas = replication.stream.replicas,
            replica_id = replication.replica.id,
            read_lease = ?replication.replica.read_lease,
            max_lag = replication.replica.max_lag,
            "replicated: the JetStream stream is the log"
        );
    }
    for (name, ns) in &options.config.namespaces {
        let spec = ns.filter_spec();
        tracing::info!(
            namespace = %name,
            expected_keys = ns.expected_keys,
            false_positive_rate = ns.false_positive_rate,
            retention = ?ns.retention,
            max_windows = ns.windows,
            filter_bytes = spec.initial_bytes(),
            max_filter_bytes = spec.max_bytes,
            missing_ttl = ?ns.missing_ttl,
            deleted_ttl = ?ns.deleted_ttl,
            max_ttl = ?ns.max_ttl,
            max_tombstones = ns.max_tombstones,
            max_tombstone_rate = ns.max_tombstone_rate,
            "namespace"
        );
    }
}

/// Starts listening for SIGTERM and SIGINT now — from here on neither kills the process — and returns what
/// completes on the first of them. Called before serving: a SIGTERM that arrives as soon as the ports answer
/// must drain, not kill.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let listen = |kind, name: &'static str| {
        let mut signal = signal(kind)
            .map_err(|error| tracing::error!(%error, "cannot listen for {name}"))
            .ok();
        async move {
            match &mut signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
            name
        }
    };
    let terminate = listen(SignalKind::terminate(), "SIGTERM");
    let interrupt = listen(SignalKind::interrupt(), "SIGINT");
    async move {
        let name = tokio::select! {
            name = terminate => name,
            name = interrupt => name,
        };
        tracing::info!("{name} received");
    }
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    let options = args.options()?;
    log_settings(&options);
    let signal = shutdown_signal();
    let running = server::start(options, Arc::new(SystemClock))
        .await
        .map_err(|e| e.to_string())?;
    let shutdown = running.shutdown_handle();
    tokio::spawn(async move {
        signal.await;
        shutdown.trigger();
    });
    running
        .run_until_shutdown()
        .await
        .map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The server logs to stdout; every other command keeps stdout for its output (data a script may read)
    // and logs, if asked to with RUST_LOG, to stderr. `probe` prints only its verdict on stderr.
    let serving = matches!(
        cli.command,
        None | Some(Command::Serve(_)) | Some(Command::Feed(_))
    );
    let (writer, ansi) = if serving {
        (
            BoxMakeWriter::new(std::io::stdout),
            std::io::IsTerminal::is_terminal(&std::io::stdout()),
        )
    } else {
        (
            BoxMakeWriter::new(std::io::stderr),
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
        )
    };
    let default_level = if serving { "info" } else { "warn" };
    tracing_subscriber::fmt()
        .with_writer(writer)
        .with_ansi(ansi)
        // A closed stdout (a log collector that died) must not turn every log line into a panic: by
        // default the subscriber reports its own write failures with eprintln!, which panics when stderr
        // is gone too, killing the task that logged (the signal handler, the accept loop).
        .log_internal_errors(false)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)),
        )
        .init();
    let command = match cli.command {
        Some(command) => command,
        None => Command::Serve(Box::new(
            ServeArgs::from_env().unwrap_or_else(|error| error.exit()),
        )),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("existence-gate: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = match command {
        Command::Serve(args) => runtime.block_on(serve(*args)),
        Command::Probe(args) => runtime.block_on(probe(args)),
        Command::HashToken { token } => hash_token(token),
        Command::Client(command) => runtime.block_on(cli::run(command)),
        // The signal handler needs the runtime: made inside it.
        Command::Feed(args) => {
            runtime.block_on(async { existence_gate::feed::run(*args, shutdown_signal()).await })
        }
    };
    // Dropping a runtime waits for its blocking threads; one stuck on a stalled disk (a write or snapshot
    // the shutdown gave up on) would then hold the process forever. Everything acknowledged is in the log.
    runtime.shutdown_timeout(EXIT_GRACE);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("existence-gate: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_drift;

    #[test]
    fn clock_drift_takes_percent_or_ppm_and_refuses_the_rest() {
        assert_eq!(parse_drift("1%"), Ok(10_000));
        assert_eq!(parse_drift("0.5%"), Ok(5_000));
        assert_eq!(parse_drift("100ppm"), Ok(100));
        assert_eq!(parse_drift("0%"), Ok(0));
        assert!(parse_drift("1")
            .unwrap_err()
            .contains("percentage (1%) or in ppm"));
        assert!(parse_drift("11%").unwrap_err().contains("out of range"));
        assert!(parse_drift("-1%").is_err());
    }
}
