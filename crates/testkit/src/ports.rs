//! Loopback ports for the processes tests and benches start. [`EPHEMERAL_PORTS`] puts every port of
//! `existence-gate serve` on a free loopback port (each logged on the `serving grpc_addr=... http_addr=...
//! resp_addr=...` line): the tests' launcher ([`crate::binary::serve`]) and the benches'
//! ([`crate::procs::start_gate`], `benches/replicated/deployment.rs`) both use it, so that a new port is
//! added in one place.

/// `--listen`, `--http-listen` and `--resp-listen`, each on `127.0.0.1:0`.
pub const EPHEMERAL_PORTS: [&str; 6] = [
    "--listen",
    "127.0.0.1:0",
    "--http-listen",
    "127.0.0.1:0",
    "--resp-listen",
    "127.0.0.1:0",
];

/// A free loopback port (free when asked; the server that needs it binds it right after), for a process
/// that must be told its port rather than report one it bound (nats-server, PostgreSQL, redis-server).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}
