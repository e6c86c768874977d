//! The operator commands: clients of a running gate that speak only its gRPC contract, so they work against
//! a single server or any replica alike. Each exits 0 on success and otherwise prints one line on stderr
//! that says what failed and what to change. The connection, failures and PostgreSQL reading they share with
//! the feed are in [`crate::client`].
//!
//! - [`reader`]: the key formats (`lines`, `raw`, `hex`) read from a file or standard input, in batches.
//! - [`source`]: where `load` and `rebuild` take their keys from (a file, standard input or a query).
//! - [`progress`]: the progress bar on a terminal, and the one summary line in any case.
//! - [`output`]: how keys, answers and outcomes are printed, as text or JSON.
//! - [`bulk`]: `load` (batches of `Add`, several in flight) and `rebuild` (one `Admin.Rebuild` stream).
//! - [`point`]: `check`, `add` and `absent`, a few keys at a time.
//! - [`watch`]: `watch`, invalidations as JSON lines.
//! - [`admin`]: `stats` and `snapshot`.
//! - [`replicas`]: `replicas list` and `replicas remove`, the replicated mode's membership.

pub mod admin;
pub mod bulk;
pub mod output;
pub mod point;
pub mod progress;
pub mod reader;
pub mod replicas;
pub mod source;
pub mod watch;

use clap::Subcommand;

/// The client subcommands of `existence-gate`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Add every key of a file, standard input or a PostgreSQL query, in batches of `Add`.
    ///
    /// Safe to run again after an interruption: `Add` is idempotent (adding a key twice leaves the filter as
    /// adding it once), so re-running the whole load loses nothing and costs only the time.
    Load(bulk::LoadArgs),
    /// Replace a namespace's filter with exactly the keys of a file, standard input or a PostgreSQL query
    /// (`Admin.Rebuild`).
    ///
    /// The new filter is built beside the live one and swapped in atomically at the end; `Add`s that arrive
    /// meanwhile are kept. An interrupted rebuild (Ctrl-C, a failed read, a lost connection) leaves the live
    /// filter as it was: the stream is only ended once every key has been sent, and otherwise the gate is
    /// made to abandon it.
    Rebuild(bulk::RebuildArgs),
    /// Print each namespace's figures (`Admin.Stats`) as a table, or as JSON with --json.
    Stats(admin::StatsArgs),
    /// Ask whether keys may exist: one line per key with the answer and what it rests on. Reads keys from
    /// standard input when none are given.
    Check(point::CheckArgs),
    /// Declare that keys exist (one `Add`).
    Add(point::AddArgs),
    /// Record that the source said a key does not exist (`RecordAbsent`) and print the outcome.
    Absent(point::AbsentArgs),
    /// Print a namespace's invalidations as JSON lines until interrupted (Ctrl-C ends it with exit 0).
    Watch(watch::WatchArgs),
    /// Take a snapshot now (`Admin.Snapshot`) and print where it went, its size and how long it took.
    Snapshot(admin::SnapshotArgs),
    /// The replicas' membership (replicated mode): `list` the members, `remove` one that is gone for good.
    Replicas(replicas::ReplicasArgs),
}

/// Runs `command` against the gate it names.
pub async fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Load(args) => bulk::load(args).await,
        Command::Rebuild(args) => bulk::rebuild(args).await,
        Command::Stats(args) => admin::stats(args).await,
        Command::Check(args) => point::check(args).await,
        Command::Add(args) => point::add(args).await,
        Command::Absent(args) => point::absent(args).await,
        Command::Watch(args) => watch::watch(args).await,
        Command::Snapshot(args) => admin::snapshot(args).await,
        Command::Replicas(args) => replicas::replicas(args).await,
    }
}
