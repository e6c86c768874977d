//! The core: a deterministic state machine fed by an ordered log. Given the same configuration, hash seed and
//! mutations in the same order, every instance answers the same — which is what lets a snapshot, a replayed
//! log or another replica stand in for it. It knows nothing of files, networks or gRPC: storage implements
//! its [`log::Log`] seam and encodes its [`namespace::NamespaceImage`]s; the service calls the [`gate::Gate`].
//!
//! From the leaves up:
//!
//! - [`hashing`]: the keyed 128-bit hash every other part works on.
//! - [`prefetch`]: the cache hint batch lookups use; [`clock`]: time as the core sees it (manual in tests).
//! - [`keys`]: an `Add`'s keys packed in one allocation, as every layer passes them on.
//! - [`filter`]: the Bloom filter of keys that exist — cache-line blocks, time windows, growth.
//! - [`tombstones`]: the bounded store of recent "the source said not found" entries.
//! - [`writes`]: what the service sends writes to (the local gate through its log, or a replica's stream).
//! - [`replicas`]: what the service asks of the replicated mode besides (members, removal, rebuilds).
//! - [`recent_adds`] and [`rate_limit`]: the guards on recording absences (stale races, floods).
//! - [`invalidations`]: the bounded replay buffer that tells subscribers when cached absences became wrong.
//! - [`lease`]: the read lease under which a replica of a shared log may answer `ABSENT`.
//! - [`sublease`]: the rules under which a client's mirror of a filter may answer `ABSENT` without a call.
//! - [`log`]: the ordered mutations the core applies, and the `Log` seam a durable log plugs into.
//! - [`answer`]: what a look-up answers (`Lookup`, `Answer`, `Basis`) and what a namespace reports.
//! - [`config`]: the configuration file's schema, defaults and limits.
//! - [`metrics`]: the per-namespace series, through the `metrics` facade (the service renders them).
//! - [`namespace`]: one key space — the state machine plus the decisions that feed it.
//! - [`gate`]: all namespaces, request validation and warming; the core's public surface.

pub mod answer;
pub mod clock;
pub mod config;
pub mod filter;
pub mod gate;
pub mod hashing;
pub mod invalidations;
pub mod keys;
pub mod lease;
pub mod log;
pub mod metrics;
pub mod namespace;
pub mod prefetch;
pub mod rate_limit;
pub mod recent_adds;
pub mod replicas;
pub mod sublease;
pub mod tombstones;
pub mod writes;
