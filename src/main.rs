//! The `existence-gate` command: `serve` (the default) runs the service.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use existence_gate::clock::SystemClock;
use existence_gate::config::{parse_duration, GateConfig};
use existence_gate::server::{self, ServeOptions};
use tracing_subscriber::EnvFilter;

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
    Serve(ServeArgs),
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
}

impl ServeArgs {
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
        let config = match &self.config {
            Some(path) => GateConfig::from_file(path).map_err(|e| e.to_string())?,
            None => GateConfig::default(),
        };
        Ok(ServeOptions {
            listen: self.listen,
            http_listen: self.http_listen,
            config,
            max_message_bytes: self.max_message_bytes,
            drain_timeout: self.drain_timeout,
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
    tracing::warn!("no --data-dir yet: state is kept in memory only and is lost on restart");
    for (name, ns) in &options.config.namespaces {
        let spec = ns.filter_spec();
        tracing::info!(
            namespace = %name,
            expected_keys = ns.expected_keys,
            false_positive_rate = ns.false_positive_rate,
            retention = ?ns.retention,
            windows = ns.windows,
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

async fn wait_for_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        () = terminate => tracing::info!("SIGTERM received"),
    }
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    let options = args.options()?;
    log_settings(&options);
    let running = server::start(options, Arc::new(SystemClock))
        .await
        .map_err(|e| e.to_string())?;
    let shutdown = running.shutdown_handle();
    tokio::spawn(async move {
        wait_for_signal().await;
        shutdown.trigger();
    });
    running
        .run_until_shutdown()
        .await
        .map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Serve(args)) => Ok(args),
        None => ServeArgs::from_env(),
    };
    let args = match args {
        Ok(args) => args,
        Err(error) => error.exit(),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error}");
            eprintln!("existence-gate: {error}");
            ExitCode::FAILURE
        }
    }
}
