//! The flags that put every port of `existence-gate serve` on a free loopback port (each logged on the
//! `serving grpc_addr=... http_addr=... resp_addr=...` line): shared by the tests' launcher
//! ([`super::binary::serve`]) and the benches' (`benches/load/procs.rs`, `benches/replicated/deployment.rs`,
//! which include this file), so that a new port is added in one place.

/// `--listen`, `--http-listen` and `--resp-listen`, each on `127.0.0.1:0`.
pub const EPHEMERAL_PORTS: [&str; 6] = [
    "--listen",
    "127.0.0.1:0",
    "--http-listen",
    "127.0.0.1:0",
    "--resp-listen",
    "127.0.0.1:0",
];
