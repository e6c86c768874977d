//! A gate in this process: a real server (`existence_gate::server`) on ephemeral loopback ports, in memory
//! and plaintext unless the options say otherwise, and clients of it. Tests that need the binary itself (its
//! flags, signals, fault points, a crash) use [`binary`](crate::binary) instead.

use std::sync::Arc;
use std::time::Duration;

use existence_gate::core::clock::{Clock, ManualClock, SystemClock};
use existence_gate::core::config::GateConfig;
use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use existence_gate::server::{self, RunningServer, ServeOptions};
use tonic::transport::Channel;

/// A unix time far from window boundaries, for manual clocks.
pub const START_MS: u64 = 1_800_000_000_000;

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
#[cfg(feature = "fault-points")]
pub struct ReleaseSyncs(pub Arc<existence_gate::storage::faulty_files::FaultyFiles>);

#[cfg(feature = "fault-points")]
impl Drop for ReleaseSyncs {
    fn drop(&mut self) {
        self.0.release_syncs();
    }
}
