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

/// A free loopback port below the kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`), for
/// a process that is restarted on the same port: while it is down, an outgoing connection of any process on
/// the host may take a port of that range as its own, and the restart then fails "Address already in use"
/// (seen once in the rolling-restart balancer test with [`free_port`]).
pub fn stable_port() -> u16 {
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let low = 10_000.min(first_ephemeral / 2);
    for _ in 0..1_000 {
        let port = rand::random_range(low..first_ephemeral);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {low}..{first_ephemeral}");
}
