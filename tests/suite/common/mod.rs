//! Helpers shared by the integration tests: a real server on ephemeral loopback ports, real clients.

#![allow(dead_code)]

pub mod binary;
pub mod faketime;
pub mod feed;
pub mod nats;
pub mod polyglot;
pub mod ports;
pub mod postgres;
pub mod proxy;
pub mod replicas;

use std::sync::Arc;
use std::time::{Duration, Instant};

use existence_gate::core::clock::{Clock, ManualClock, SystemClock};
use existence_gate::core::config::GateConfig;
use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use existence_gate::server::{self, RunningServer, ServeOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

/// A unix time far from window boundaries, for manual clocks.
pub const START_MS: u64 = 1_800_000_000_000;

/// How long a test waits for something that must happen before it fails: far beyond what a loaded 2-core
/// machine needs, so that only a real failure (never a slow machine) reaches it. Waits end as soon as the
/// condition holds, so a passing run never spends it.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The pause between two looks at a condition.
const POLL_PAUSE: Duration = Duration::from_millis(10);

/// Waits until `condition` yields `Some` and returns it, looking again after a short pause; fails the test,
/// naming `what` it waited for, once `deadline` has passed. Tests wait on the condition they need rather than
/// sleeping for a time that a loaded machine may exceed.
pub async fn wait_until<T>(
    deadline: Duration,
    what: &str,
    mut condition: impl AsyncFnMut() -> Option<T>,
) -> T {
    let give_up = Instant::now() + deadline;
    loop {
        if let Some(value) = condition().await {
            return value;
        }
        assert!(
            Instant::now() < give_up,
            "gave up after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(POLL_PAUSE).await;
    }
}

/// Sends `signal` (e.g. "STOP", "CONT", "KILL") to process `pid`, as an operator's `kill` would.
pub fn send_signal(pid: u32, signal: &str) {
    let sent = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{signal} {pid}");
}

/// A free loopback port (free when asked; the server that needs it binds it right after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Options for a server on ephemeral loopback ports with `config` (TOML), in memory, plaintext.
pub fn options(config: &str, max_message_bytes: usize) -> ServeOptions {
    ServeOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        http_listen: "127.0.0.1:0".parse().unwrap(),
        config: GateConfig::from_toml(config).expect("test config is valid"),
        max_message_bytes,
        drain_timeout: Duration::from_secs(5),
        durability: None,
        tls: None,
        replication: None,
        resp: None,
    }
}

/// A server started with `options` and `clock`, once its state is loaded.
pub async fn start_options(options: ServeOptions, clock: Arc<dyn Clock>) -> RunningServer {
    let server = server::start(options, clock).await.expect("server starts");
    server.loaded().await.expect("state loads");
    server
}

/// A server started on ephemeral ports with `config` (TOML) and `clock`.
pub async fn start_with(
    config: &str,
    clock: Arc<dyn Clock>,
    max_message_bytes: usize,
) -> RunningServer {
    start_options(options(config, max_message_bytes), clock).await
}

/// A server with `config` on the system clock.
pub async fn start(config: &str) -> RunningServer {
    start_with(config, Arc::new(SystemClock), 16 << 20).await
}

/// A server with `config` on a manual clock (returned too).
pub async fn start_manual(config: &str) -> (RunningServer, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(START_MS));
    (start_with(config, clock.clone(), 16 << 20).await, clock)
}

/// A channel to the server's gRPC port.
pub async fn channel(server: &RunningServer) -> Channel {
    Channel::from_shared(format!("http://{}", server.grpc_addr))
        .unwrap()
        .connect()
        .await
        .expect("connects")
}

/// A gate client with large message limits.
pub async fn client(server: &RunningServer) -> ExistenceGateClient<Channel> {
    ExistenceGateClient::new(channel(server).await)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

/// `GET path` on the HTTP port: (status code, body).
pub async fn http_get(server: &RunningServer, path: &str) -> (u16, String) {
    try_http_get(server.http_addr, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// `GET path` on the HTTP port at `addr`: (status code, body), or why no response came (the port is closed,
/// or the connection closed before a status line).
pub async fn try_http_get(
    addr: std::net::SocketAddr,
    path: &str,
) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("no status line in {response:?}"),
            )
        })?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Keys as `packed_keys` wants them: each preceded by its length as a varint.
pub fn pack(keys: &[bytes::Bytes]) -> bytes::Bytes {
    let mut packed = Vec::new();
    for key in keys {
        prost::encoding::encode_varint(key.len() as u64, &mut packed);
        packed.extend_from_slice(key);
    }
    packed.into()
}

/// A CA, a server certificate for `localhost` and a client certificate it signed, all PEM.
pub struct Pki {
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
}

/// A fresh [`Pki`].
pub fn new_pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::from_params(&ca_params, &ca_key);
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf("localhost");
    let (client_cert, client_key) = leaf("client");
    Pki {
        ca: ca.pem(),
        server_cert,
        server_key,
        client_cert,
        client_key,
    }
}

/// A runtime for a server under a stalled disk, apart from the test's own: two workers, as on this
/// machine, so a blocked worker shows; dropped only once nothing is stuck in it.
pub fn runtime_of_its_own() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Lets stalled fsyncs proceed when dropped: a failed assertion must not leave a server's threads blocked
/// (dropping its runtime would then wait for them forever).
pub struct ReleaseSyncs(pub Arc<existence_gate::storage::faulty_files::FaultyFiles>);

impl Drop for ReleaseSyncs {
    fn drop(&mut self) {
        self.0.release_syncs();
    }
}
