//! The replicated mode: replicas that share one NATS JetStream stream as their log, each applying it in
//! stream order into its own gate, so that any replica answers any lookup.
//!
//! ```text
//!  protocol/            the rules, pure: membership, read lease, acknowledgement (simulated in tests)
//!  stream/              the JetStream stream: publish, follow, the stream's own records, reports
//!  replica/             the applier, lease keeper, peers, writes and health, driving the protocol with
//!                       real time and NATS
//!  replica_snapshots.rs where a replica's state starts from, and the snapshots it shares
//!  snapshot_store.rs    the shared snapshots' object-store bucket
//!  replicated_rebuild.rs Admin.Rebuild through the stream
//! ```
//!
//! The safety rule — once an `Add` is acknowledged, no replica answers `ABSENT` for its keys — is argued
//! in [`protocol`] and checked there by a deterministic simulation under the fault model it states.

/// The layers beneath, under the names the rest of the tree uses for them.
use existence_gate_core as core;
use existence_gate_storage as storage;

pub mod protocol;
pub mod replica;
pub mod replica_snapshots;
pub mod replicated_rebuild;
pub mod snapshot_store;
pub mod stream;
