//! The `existence-gate` command: `serve` (the default) runs the service; the client subcommands of
//! `existence_gate::cli` operate a running one; `feed` follows PostgreSQL into a gate. This binary only
//! parses flags and dispatches; the service is the library's [`existence_gate::server`].
//!
//! - [`serve`]: `serve`'s flags, checked and turned into the server's options; the settings logged.
//! - [`replication_flags`]: the flags of replicated mode (`--nats` and what only matters with it).
//! - [`probe`]: `probe`, the server's gRPC health as an exit code.
//! - [`hash_token`]: `hash-token`, a token's SHA-256 for the configuration.
//! - [`logging`]: a server logs to stdout, every other command to stderr.
//! - [`signals`]: SIGTERM and SIGINT as the future a server drains on.

mod hash_token;
mod logging;
mod probe;
mod replication_flags;
mod serve;
mod signals;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use existence_gate::cli;

use crate::probe::ProbeArgs;
use crate::serve::ServeArgs;
use crate::signals::shutdown_signal;

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

fn main() -> ExitCode {
    // Tests start the binary with FAILPOINTS=NAME=ACTION;... (docs/development.md, "Fault points"); not in a
    // release build.
    #[cfg(feature = "fault-points")]
    let _faults = fail::FailScenario::setup();
    let cli = Cli::parse();
    // The server logs to stdout; every other command keeps stdout for its output (data a script may read)
    // and logs, if asked to with RUST_LOG, to stderr. `probe` prints only its verdict on stderr.
    let serving = matches!(
        cli.command,
        None | Some(Command::Serve(_)) | Some(Command::Feed(_))
    );
    logging::init(serving);
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
        Command::Serve(args) => runtime.block_on(serve::serve(*args)),
        Command::Probe(args) => runtime.block_on(probe::probe(args)),
        Command::HashToken { token } => hash_token::hash_token(token),
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
