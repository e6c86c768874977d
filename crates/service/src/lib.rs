//! The service: everything between a network peer and the [`gate`](crate::core::gate::Gate).
//!
//! - [`grpc`]: the thin layer that maps the contract onto the gate; the one place `""` becomes `default`.
//!   [`request_keys`]: a request's keys as sent (repeated, packed, or an `Add` read straight into one
//!   buffer); [`add_request`]: the `Add` method served from that, in front of the generated server.
//! - [`admin`]: stats, snapshots, rebuild.
//! - [`access`] and [`auth`]: shutdown refusal, load shedding and bearer tokens in front of both;
//!   [`deadline`]: a call past its deadline ends `DEADLINE_EXCEEDED`, not tonic's `CANCELLED`.
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`.
//! - [`listener`]: accepting connections — backoff at the descriptor limit, a deadline for the handshake.
//! - [`lifecycle`]: the one state (loading, ready, failed, draining) that health, `/readyz` and admin read.
//! - [`memory`]: where the process's memory goes, part by part (`Admin.Stats`, `/metrics`).
//! - [`metrics`]: the Prometheus recorder and the service's own series.
//! - [`mirror`]: `Mirror.Attach` — client libraries' copies of filters and their sub-leases.
//! - [`resp`]: the RESP port — RedisBloom's commands for Redis clients, on the same gate and rules.
//! - [`shutdown`]: the signal every part watches.
//! - [`subscriptions`]: how many invalidation streams one token holds, on both ports.
//! - [`writes`]: the single server's writes, to the local gate through its log (a replica's go to its stream).

/// The layers beneath and the contract, under the names the rest of the tree uses for them.
use existence_gate_core as core;
use existence_gate_proto as proto;
use existence_gate_storage as storage;

pub mod access;
pub mod add_request;
pub mod admin;
pub mod auth;
pub mod deadline;
pub mod grpc;
pub mod http;
pub mod lifecycle;
pub mod listener;
pub mod memory;
pub mod metrics;
pub mod mirror;
pub mod request_keys;
pub mod resp;
pub mod shutdown;
pub mod subscriptions;
pub mod writes;
