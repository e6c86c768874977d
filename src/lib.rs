//! existence-gate: a shared service that answers "can this key exist?" so that lookups of ids that do not
//! exist stop reaching databases.
//!
//! A map of the crate, from the core outwards:
//!
//! - [`hashing`]: the keyed 128-bit hash every other part works on.
//! - [`filter`]: the Bloom filter of keys that exist — cache-line blocks, time windows, growth.
//! - [`tombstones`]: the bounded store of recent "the source said not found" entries.
//! - [`recent_adds`] and [`rate_limit`]: the guards on recording absences (stale races, floods).
//! - [`invalidations`]: the bounded replay buffer that tells subscribers when cached absences became wrong.
//! - [`log`]: the ordered mutations the core applies, and the `Log` seam persistence plugs into.
//! - [`persistence`]: the data directory — write-ahead log, snapshots, recovery.
//! - [`answer`]: what a look-up answers (`Lookup`, `Answer`, `Basis`) and what a namespace reports.
//! - [`namespace`]: one key space — the deterministic state machine plus the decisions that feed it.
//! - [`gate`]: all namespaces, request validation and warming; the core's public surface.
//! - [`clock`]: time as the core sees it (a manual clock in tests); [`prefetch`]: the cache hint batches use.
//! - [`config`]: TOML configuration and its defaults.
//! - [`metrics`]: Prometheus metrics with pre-resolved handles.
//! - [`grpc`]: the thin gRPC layer that maps the contract onto the gate; [`admin`]: stats, snapshots, rebuild;
//!   [`access`] and [`auth`]: shutdown refusal, load shedding and bearer tokens in front of both.
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`.
//! - [`listener`]: accepting connections — backoff at the descriptor limit, a deadline for the handshake.
//! - [`server`]: wiring, startup and graceful shutdown; [`shutdown`]: the signal every part watches;
//!   [`lifecycle`]: the one state (loading, ready, failed, draining) health, `/readyz` and admin read.
//!
//! The core (everything above `grpc`) knows nothing of tonic.

pub mod access;
pub mod admin;
pub mod answer;
pub mod auth;
pub mod clock;
pub mod config;
pub mod filter;
pub mod gate;
pub mod grpc;
pub mod hashing;
pub mod http;
pub mod invalidations;
pub mod lifecycle;
pub mod listener;
pub mod log;
pub mod metrics;
pub mod namespace;
pub mod persistence;
pub mod prefetch;
pub mod rate_limit;
pub mod recent_adds;
pub mod server;
pub mod shutdown;
pub mod tombstones;

/// Types generated from `proto/existence/v1/existence.proto`.
pub mod proto {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("existence.v1");

    /// The encoded descriptor set of the contract, served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("existence_descriptor");
}
