//! Every integration test, as one test binary.
//!
//! Why one: each file under `tests/` is a crate of its own that links tokio, tonic and the whole library.
//! Nineteen of them made a fresh clone's first `cargo test` spend most of its time compiling and linking
//! the same dependencies nineteen times over; one binary links them once (figures in docs/development.md,
//! "Build time").
//! A module here is what a file under `tests/` used to be, so `cargo test --test suite replicas::` runs
//! the replica tests alone, and `cargo test --test suite -- --list` names them all.
//!
//! Fifteen of them are the **system tier**, `#[ignore = "system test: ..."]`: whole deployments that run for
//! half a minute or more each (behind HAProxy, the nemesis, failover through faulty proxies, the client
//! libraries and interop). A plain `cargo test` leaves them out so that it stays quick;
//! `cargo test -- --include-ignored`, README's test command and CI's, runs them (docs/development.md, "Testing").
//!
//! The modules, from the core outwards:

/// Helpers every module shares, from the test kit (`crates/testkit`): servers on free loopback ports, real
/// clients, NATS, PostgreSQL, a faulty TCP proxy, the polyglot runners.
mod common;

// The core and its state: properties against an exact model (and against clocks that step), replay,
// durability, concurrency.
mod balancer;
mod clock;
mod clock_steps;
mod concurrency;
mod deploy_units;
mod durability;
mod faults;
mod fuzz_harnesses;
mod model;
mod monitoring;
mod replay;

// The tree itself: which layer may use which, documentation whose links resolve, and a configuration
// reference that names every flag and key the code has, and no other.
mod config_reference;
mod docs_links;
mod layering;

// The service over real gRPC: the contract, admin, security, hostile traffic, each port's door,
// what operators see.
mod abuse;
mod admin;
mod connections;
mod grpc;
mod operations;
mod security;

// The RESP port with Redis clients: RedisBloom's commands on the gate's rules, and its replies byte for
// byte beside RedisBloom's.
mod resp;
mod resp_compat;

// The replicated mode against real nats-servers: the stream, replicas, failover under partitions, a
// nemesis run mixing every fault.
mod failover;
mod nemesis;
mod replica_mirrors;
mod replicas;
mod stream;
mod three_replicas_script;

// The binary's commands, the PostgreSQL change feed, and the clients in other languages.
mod cli;
mod clients;
mod feed;
mod interop;
