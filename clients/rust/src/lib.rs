//! The existence-gate client: the gate's calls with single-key lookups **coalesced** into packed batches,
//! and the **gated read path** in front of a source (a local absence cache kept true by the invalidation
//! stream, single flight on source reads, `RecordAbsent`, fail-open).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use existence_gate_client::{ClientOptions, GateClient, GatedReader, ReaderOptions, SourceRead};
//!
//! let gate = GateClient::new(["127.0.0.1:50051"], ClientOptions::namespace("users"))?;
//! let reader = GatedReader::new(gate, ReaderOptions::default(), |key: bytes::Bytes| async move {
//!     // The database read: Found(row), Missing or Deleted.
//!     Ok::<_, std::io::Error>(if key.as_ref() == b"user-1" { SourceRead::Found("Ada") } else { SourceRead::Missing })
//! });
//! assert_eq!(reader.get("user-1").await?, Some("Ada"));
//! assert_eq!(reader.get("user-2").await?, None);
//! # Ok(()) }
//! ```
//!
//! The map:
//! - [`client`]: [`GateClient`], the calls, with lookups coalesced by [`coalesce`] and sent to one of
//!   several addresses by [`endpoints`], over channels whose requests end with their last DATA frame
//!   ([`whole_request`]);
//! - [`mirror`]: [`Mirror`], an in-process copy of the namespace's filter that answers `ABSENT` with no
//!   call while it holds a sub-lease from the gate;
//! - [`reader`]: [`GatedReader`], the read path, over [`cache`] (the local absences) kept true by
//!   [`subscription`];
//! - [`options`] and [`stats`]: what a caller sets and what it can count.
//!
//! The contract every language's client keeps is `clients/README.md`.

pub mod cache;
pub mod client;
pub mod coalesce;
pub mod endpoints;
pub mod mirror;
pub mod options;
pub mod reader;
pub mod stats;
pub mod subscription;
pub mod whole_request;

/// The gate's contract, generated from `proto/` at build time.
pub mod proto {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("existence.v1");
}

pub use client::{BatchLookup, GateClient, InvalidAddress, Lookup, Recorded};
pub use coalesce::MAX_BATCH_KEYS;
pub use mirror::{Mirror, MirrorOptions};
pub use options::{AddressPolicy, ClientOptions, ClientTls, ReaderOptions};
pub use proto::{AbsenceKind, RecordOutcome};
pub use reader::{GatedReader, ReadError, SourceRead};
pub use stats::Stats;
