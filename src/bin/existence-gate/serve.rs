//! `existence-gate serve` (and a bare `existence-gate`): its flags, checked and turned into the server's
//! [`ServeOptions`], the settings logged once at startup, and the server run until a signal drains it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Parser};

use existence_gate::core::clock::SteadyClock;
use existence_gate::core::config::{parse_duration, GateConfig};
use existence_gate::server::{self, DurabilityOptions, RespOptions, ServeOptions, TlsOptions};
use existence_gate::storage::SyncMode;

use crate::replication_flags::ReplicationArgs;
use crate::signals::shutdown_signal;

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
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
    /// RESP listen address for Redis clients (RedisBloom's BF.* commands), or `off`.
    #[arg(
        long,
        env = "EXISTENCE_GATE_RESP_LISTEN",
        default_value = "127.0.0.1:6380",
        value_parser = parse_resp_listen
    )]
    resp_listen: RespListen,
    /// RESP connections open at once; more are told `max number of clients reached` and closed.
    #[arg(
        long,
        env = "EXISTENCE_GATE_RESP_MAX_CONNECTIONS",
        default_value_t = 1_024
    )]
    resp_max_connections: usize,
    /// A RESP connection that sends nothing, or does not read its replies, for this long is closed.
    #[arg(long, env = "EXISTENCE_GATE_RESP_IDLE_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    resp_idle_timeout: std::time::Duration,
    /// MiB of unfinished RESP requests held across connections beyond 64 KiB each; a connection whose request
    /// would exceed it is told so and closed (one request may be ~10 MB with the default limits).
    #[arg(
        long,
        env = "EXISTENCE_GATE_RESP_REQUEST_MEMORY_MIB",
        default_value_t = 256
    )]
    resp_request_memory_mib: usize,
    /// Threads RESP connections are served on, each an event loop of its own; 0 = one per core.
    #[arg(long, env = "EXISTENCE_GATE_RESP_THREADS", default_value_t = 0)]
    resp_threads: usize,
    /// TOML file with [limits] and [namespaces.NAME] tables; defaults apply without it.
    #[arg(long, env = "EXISTENCE_GATE_CONFIG")]
    config: Option<PathBuf>,
    /// Largest gRPC message accepted, in bytes (a full batch of maximal keys must fit).
    #[arg(long, env = "EXISTENCE_GATE_MAX_MESSAGE_BYTES", default_value_t = 16 << 20)]
    max_message_bytes: usize,
    /// After SIGTERM (or SIGINT), how long the server keeps serving with health NOT_SERVING and /readyz 503
    /// before it stops taking calls: long enough for load balancers to see it leave (their check interval
    /// times their fall count). A second signal ends the wait. 0s: stop taking calls at once.
    #[arg(long, env = "EXISTENCE_GATE_DRAIN_DELAY", default_value = "5s", value_parser = parse_duration)]
    drain_delay: std::time::Duration,
    /// How long in-flight calls may take to finish once the server stops taking calls (e.g. 10s).
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
    /// Refuse to start on a data directory that holds no state yet (missing, or never started on): for a
    /// deployed single server, where that means the state was lost (a deleted directory, a volume not
    /// mounted), and starting empty would answer ABSENT for every key added before. Start once without it
    /// to create the directory. A replica (--nats) does not need it: an empty directory starts from the
    /// stream and its shared snapshots.
    #[arg(
        long,
        env = "EXISTENCE_GATE_REQUIRE_EXISTING_DATA",
        conflicts_with = "in_memory"
    )]
    require_existing_data: bool,
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

/// `--resp-listen`: an address, or `off`.
#[derive(Debug, Clone, Copy)]
struct RespListen(Option<SocketAddr>);

fn parse_resp_listen(value: &str) -> Result<RespListen, String> {
    if value.eq_ignore_ascii_case("off") {
        return Ok(RespListen(None));
    }
    value
        .parse()
        .map(|address| RespListen(Some(address)))
        .map_err(|e| format!("{e}: give an address such as 127.0.0.1:6380, or off"))
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
            require_existing: self.require_existing_data,
            ..DurabilityOptions::new(self.data_dir.clone())
        })
    }

    /// The serve arguments given only by environment variables and defaults (for a bare `existence-gate`).
    pub(crate) fn from_env() -> Result<Self, clap::Error> {
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
        let resp = self.resp_listen.0.map(|listen| RespOptions {
            max_connections: self.resp_max_connections,
            idle_timeout: self.resp_idle_timeout,
            request_memory: self.resp_request_memory_mib << 20,
            threads: self.resp_threads,
            ..RespOptions::new(listen)
        });
        Ok(ServeOptions {
            replication,
            resp,
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

/// Logs every setting the server runs with, once, so a log shows what an incident ran under.
fn log_settings(options: &ServeOptions) {
    tracing::info!(
        listen = %options.listen,
        http_listen = %options.http_listen,
        resp_listen = ?options.resp.as_ref().map(|r| r.listen),
        "listen addresses"
    );
    tracing::info!(
        max_message_bytes = options.max_message_bytes,
        drain_timeout = ?options.drain_timeout,
        max_batch_keys = options.config.limits.max_batch_keys,
        max_key_bytes = options.config.limits.max_key_bytes,
        replay_buffer_bytes = ?options.config.limits.replay_buffer_bytes,
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

/// Runs the server until SIGTERM or SIGINT has drained it.
pub(crate) async fn serve(args: ServeArgs) -> Result<(), String> {
    let drain_delay = args.drain_delay;
    let options = args.options()?;
    log_settings(&options);
    let signal = shutdown_signal();
    let running = server::start(options, Arc::new(SteadyClock::system()))
        .await
        .map_err(|e| e.to_string())?;
    let (shutdown, lifecycle) = (running.shutdown_handle(), running.lifecycle());
    tokio::spawn(async move {
        signal.await;
        if !drain_delay.is_zero() {
            // Readiness down first, the ports serving on: a balancer moves calls away on its next checks
            // instead of having them refused.
            lifecycle.drain().await;
            tracing::info!(
                ?drain_delay,
                "readiness down; serving on while load balancers move away (a second signal ends the wait)"
            );
            tokio::select! {
                () = tokio::time::sleep(drain_delay) => {}
                () = shutdown_signal() => {}
            }
        }
        shutdown.trigger();
    });
    running
        .run_until_shutdown()
        .await
        .map_err(|e| e.to_string())
}
