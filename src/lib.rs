//! existence-gate: a shared service that answers "can this key exist?" so that lookups of ids that do not
//! exist stop reaching databases.
//!
//! The crate is three layers and the wiring that joins them; each layer may use the ones above it in this
//! list and never one below (`tests/suite/layering.rs` checks it):
//!
//! - [`core`]: the deterministic state machine — filters, tombstones, namespaces, the gate — fed by an
//!   ordered log it knows only as a trait. A crate of its own (`crates/core`), so that it cannot reach
//!   upward is a compile error. No files, no network, no tonic, no clock but the ones it is
//!   given (`core::clock`): it can be driven from a test, a replay or a fuzzer alike.
//! - [`storage`]: the data directory — write-ahead log, snapshots, recovery — which implements the core's
//!   `Log` and encodes its state.
//! - [`replication`]: the replicated mode — replicas that share one NATS JetStream stream as their log. Its
//!   [`protocol`](replication::protocol) (membership, read lease, acknowledgement rule) is pure: no NATS, no
//!   tokio, time passed in, so a deterministic simulation drives it; the stream adapter, the applier, the
//!   shared snapshots and the replicated rebuild sit around it.
//! - [`service`]: gRPC, admin, auth, shedding, HTTP, listeners, metrics and the lifecycle health reads.
//! - [`server`]: the wiring — configuration in, layers started in order, background tasks, graceful
//!   shutdown. The binary (`src/bin/existence-gate/`) only parses flags and calls it.
//!
//! Beside them, [`cli`]: the operator commands (`load`, `rebuild`, `stats`, `check`, `add`, `absent`,
//! `watch`, `snapshot`), clients of a running gate that use only the generated [`proto`] contract, the
//! core's pure helpers (duration parsing, limits) and the spec's status names; nothing of the server
//! depends on them. And [`feed`]: `existence-gate feed`, a process of its own that follows PostgreSQL
//! tables through logical replication into the gate and serves its own metrics and health with the
//! service's HTTP serving. What the two share as clients (the connection, failures, PostgreSQL reading)
//! is [`client`], so neither reaches into the other.

pub mod cli;
pub mod client;
/// The core, a crate of its own (`crates/core`, `existence-gate-core`): the compiler keeps it below every
/// layer here, since it depends on none of them.
pub use existence_gate_core as core;
pub mod feed;
/// The replicated mode, a crate of its own (`crates/replication`, `existence-gate-replication`), depending
/// on the core and storage alone.
pub use existence_gate_replication as replication;
pub mod server;
/// The service, a crate of its own (`crates/service`, `existence-gate-service`), depending on the layers
/// beneath and the contract.
pub use existence_gate_service as service;
/// Storage, a crate of its own (`crates/storage`, `existence-gate-storage`), depending on the core alone.
pub use existence_gate_storage as storage;

/// Types generated from `proto/existence/v1/existence.proto`, a crate of its own (`crates/proto`).
pub use existence_gate_proto as proto;
