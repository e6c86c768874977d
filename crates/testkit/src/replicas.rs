//! Replicas as real `existence-gate` processes sharing one JetStream stream: started with `--nats` on free
//! loopback ports, stopped (SIGSTOP), continued, killed (-9) and restarted the way an operator would.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use existence_gate::proto::admin_client::AdminClient;
use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use existence_gate::proto::{
    self, Answer, Basis, BatchMayExistRequest, MayExistRequest, StatsRequest,
};
use existence_gate::replication::stream::{Framing, Record};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::{try_http_get, wait_until, PATIENCE};

/// A replica process.
pub struct Replica {
    child: Child,
    /// Its `--replica-id`.
    pub id: String,
    /// Where it serves gRPC.
    pub grpc_addr: SocketAddr,
    /// Where it serves HTTP.
    pub http_addr: SocketAddr,
    /// Where it serves RESP.
    pub resp_addr: SocketAddr,
    channel: Channel,
    /// Its last [`KEPT_LINES`] lines of log, for a failure's message.
    recent: Arc<Mutex<VecDeque<String>>>,
}

/// Log lines a [`Replica`] keeps for a failure's message.
const KEPT_LINES: usize = 40;

/// How to start a replica.
#[derive(Debug, Clone)]
pub struct Launch {
    /// `--nats`.
    pub nats: String,
    /// The configuration file.
    pub config: PathBuf,
    /// `--replica-id`.
    pub id: String,
    /// `--data-dir`: `data-<id>` beside the configuration file.
    pub data_dir: PathBuf,
    /// More flags.
    pub args: Vec<String>,
    /// `FAILPOINTS` (docs/development.md, "Fault points"); empty for none.
    pub faults: String,
    /// A wall clock the test steps, if not the host's.
    pub clock: Option<std::sync::Arc<crate::faketime::SteppedClock>>,
    /// Its gRPC, HTTP and RESP addresses, if fixed (a restart keeps them); free ones otherwise.
    pub addresses: Option<[SocketAddr; 3]>,
}

impl Launch {
    /// A replica `id` of the stream on `nats` with the configuration in `config`.
    pub fn new(nats: &str, config: &Path, id: &str) -> Self {
        Self {
            nats: nats.to_string(),
            config: config.to_path_buf(),
            id: id.to_string(),
            data_dir: config.with_file_name(format!("data-{id}")),
            args: Vec::new(),
            faults: String::new(),
            clock: None,
            addresses: None,
        }
    }

    fn command(&self) -> Command {
        let mut command = match self.addresses {
            None => crate::binary::serve(),
            Some([grpc, http, resp]) => crate::binary::serve_on(&[
                "--listen",
                &grpc.to_string(),
                "--http-listen",
                &http.to_string(),
                "--resp-listen",
                &resp.to_string(),
            ]),
        };
        command
            .args(["--nats", &self.nats, "--replica-id", &self.id])
            .arg("--config")
            .arg(&self.config)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.args)
            .env("FAILPOINTS", &self.faults)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(clock) = &self.clock {
            clock.apply(&mut command);
        }
        command
    }

    /// Starts the process and waits until it serves its ports (not until it is caught up).
    pub async fn start(&self) -> Replica {
        let mut child = self.command().spawn().expect("the binary starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut stderr = child.stderr.take().unwrap();
        let addresses = tokio::time::timeout(PATIENCE, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let (Some(grpc), Some(http), Some(resp)) = (
                    field(&line, "grpc_addr="),
                    field(&line, "http_addr="),
                    field(&line, "resp_addr="),
                ) {
                    return (grpc, http, resp);
                }
            }
            let mut why = String::new();
            let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut why).await;
            panic!("replica {} exited before serving: {why}", self.id);
        })
        .await
        .expect("the replica serves its ports");
        // Keep draining its output so that logging never blocks it; shown when EXISTENCE_GATE_TEST_LOGS=1.
        let (id, show) = (
            self.id.clone(),
            std::env::var_os("EXISTENCE_GATE_TEST_LOGS").is_some(),
        );
        let recent = Arc::new(Mutex::new(VecDeque::with_capacity(KEPT_LINES)));
        let kept = Arc::clone(&recent);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if show {
                    eprintln!("[{id}] {line}");
                }
                let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
                if kept.len() == KEPT_LINES {
                    kept.pop_front();
                }
                kept.push_back(line);
            }
        });
        let channel = Channel::from_shared(format!("http://{}", addresses.0))
            .unwrap()
            .connect_lazy();
        Replica {
            child,
            id: self.id.clone(),
            grpc_addr: addresses.0,
            http_addr: addresses.1,
            resp_addr: addresses.2,
            channel,
            recent,
        }
    }

    /// Runs the process to its exit, expecting it to fail: its standard error.
    pub async fn refused(&self) -> String {
        let output = tokio::time::timeout(PATIENCE, self.command().output())
            .await
            .expect("the replica exits")
            .unwrap();
        assert!(!output.status.success(), "replica {} started", self.id);
        String::from_utf8_lossy(&output.stderr).into_owned()
    }
}

fn field(line: &str, name: &str) -> Option<SocketAddr> {
    line.split(name)
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl Replica {
    /// A contract client.
    pub fn client(&self) -> ExistenceGateClient<Channel> {
        ExistenceGateClient::new(self.channel.clone())
    }

    /// An admin client.
    pub fn admin(&self) -> AdminClient<Channel> {
        AdminClient::new(self.channel.clone())
    }

    /// Its gRPC health.
    pub async fn health(&self) -> Option<ServingStatus> {
        let reply = HealthClient::new(self.channel.clone())
            .check(HealthCheckRequest::default())
            .await
            .ok()?;
        Some(reply.into_inner().status())
    }

    /// Waits until it reports `SERVING` (caught up, with a read lease); past [`PATIENCE`], fails with its
    /// `/readyz` and its last lines of log.
    pub async fn serving(&self) {
        self.serving_within(PATIENCE).await
    }

    /// [`Replica::serving`] with a patience of one's own (a run that just undid many faults may need more).
    pub async fn serving_within(&self, patience: Duration) {
        let served = tokio::time::timeout(patience, async {
            while self.health().await != Some(ServingStatus::Serving) {
                tokio::time::sleep(crate::POLL_PAUSE).await;
            }
        })
        .await;
        if served.is_err() {
            let readiness = try_http_get(self.http_addr, "/readyz").await;
            let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            panic!(
                "gave up after {patience:?} waiting for replica {} to serve; /readyz: {readiness:?}; its last \
                 lines of log:\n{}",
                self.id,
                recent.iter().cloned().collect::<Vec<_>>().join("\n")
            );
        }
    }

    /// `/readyz`: status and body.
    pub async fn readiness(&self) -> (u16, String) {
        try_http_get(self.http_addr, "/readyz").await.unwrap()
    }

    /// One `/metrics` sample: the value of the series starting with `series`.
    pub async fn metric(&self, series: &str) -> f64 {
        let (_, body) = try_http_get(self.http_addr, "/metrics").await.unwrap();
        body.lines()
            .find(|line| line.starts_with(series))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse().ok())
            .unwrap_or(0.0)
    }

    /// `MayExist` in `namespace`: answer, basis and observed seq.
    pub async fn lookup(&self, namespace: &str, key: &[u8]) -> (Answer, Basis, u64) {
        let reply = self
            .client()
            .may_exist(MayExistRequest {
                namespace: namespace.to_string(),
                key: key.to_vec().into(),
            })
            .await
            .unwrap()
            .into_inner();
        (reply.answer(), reply.basis(), reply.observed_seq)
    }

    /// [`lookup`](Self::lookup) answered under this replica's read lease: retried while the answer is
    /// `WARMING` — the lease lapsed, as it can when a loaded machine delays a renewal, and the replica fails
    /// open (`MAY_EXIST`, never `ABSENT`) — for an assertion about what the replica's state says.
    pub async fn leased_lookup(&self, namespace: &str, key: &[u8]) -> (Answer, Basis, u64) {
        let what = format!("replica {} to answer under its read lease", self.id);
        wait_until(PATIENCE, &what, async || {
            let reply = self.lookup(namespace, key).await;
            (reply.1 != Basis::Warming).then_some(reply)
        })
        .await
    }

    /// [`leased_lookup`](Self::leased_lookup) once its answer claims to have observed `seq`: a replica's
    /// `observed_seq` is no later than its newest barrier read where the stream stored it, and it renews
    /// its lease (a new barrier) while lookups ask, so this waits about a quarter lease past applying `seq`.
    pub async fn lookup_observing(&self, namespace: &str, key: &[u8], seq: u64) -> (Answer, Basis) {
        let what = format!("replica {} to answer having observed seq {seq}", self.id);
        wait_until(PATIENCE, &what, async || {
            let (answer, basis, observed) = self.lookup(namespace, key).await;
            (basis != Basis::Warming && observed >= seq).then_some((answer, basis))
        })
        .await
    }

    /// How many of `keys` answer `MAY_EXIST` in `namespace` (one `BatchMayExist`), and whether the replica
    /// said so failing open (`warming`).
    pub async fn passing(&self, namespace: &str, keys: &[String]) -> (usize, bool) {
        let reply = self
            .client()
            .batch_may_exist(BatchMayExistRequest {
                namespace: namespace.to_string(),
                keys: keys.iter().map(|k| k.as_bytes().to_vec().into()).collect(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let passing = reply.answers().filter(|a| *a == Answer::MayExist).count();
        (passing, reply.warming)
    }

    /// [`passing`](Self::passing) under this replica's read lease: retried while it fails open (see
    /// [`leased_lookup`](Self::leased_lookup)), for a count of keys that must answer `ABSENT`.
    pub async fn passing_under_lease(&self, namespace: &str, keys: &[String]) -> usize {
        let what = format!("replica {} to answer under its read lease", self.id);
        wait_until(PATIENCE, &what, async || {
            let (passing, warming) = self.passing(namespace, keys).await;
            (!warming).then_some(passing)
        })
        .await
    }

    /// Each namespace's (name, digest seq, digest) from `Admin.Stats`.
    pub async fn digests(&self) -> Vec<(String, u64, u64)> {
        let stats = self
            .admin()
            .stats(StatsRequest::default())
            .await
            .unwrap()
            .into_inner();
        stats
            .namespaces
            .into_iter()
            .map(|n: proto::NamespaceStats| (n.namespace, n.state_digest_seq, n.state_digest))
            .collect()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Sends `signal` (e.g. "STOP", "CONT", "KILL") to the process.
    pub fn signal(&self, signal: &str) {
        crate::send_signal(self.pid(), signal);
    }

    /// Waits, at most [`PATIENCE`], for it to exit on its own (after a SIGTERM): its exit status.
    pub async fn exited(mut self) -> std::process::ExitStatus {
        tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("replica {} did not exit within {PATIENCE:?}", self.id))
            .unwrap()
    }

    /// Kills it with SIGKILL and waits for it to die.
    pub async fn kill(mut self) {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
    }
}

/// Writes `toml` to `config.toml` in `dir`.
pub fn config_file(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// `n` replicas "r0".."r{n-1}" of the stream on `nats` with more flags `args`, started together and
/// serving.
pub async fn start_serving(nats: &str, config: &Path, n: usize, args: &[&str]) -> Vec<Replica> {
    let started = futures_util::future::join_all((0..n).map(|i| async move {
        let mut launch = Launch::new(nats, config, &format!("r{i}"));
        launch.args = args.iter().map(|a| a.to_string()).collect();
        launch.start().await
    }))
    .await;
    for replica in &started {
        replica.serving().await;
    }
    started
}

/// Starts `launches` one after another (the first creates what the others find), then waits until each
/// serves.
pub async fn start_in_turn(launches: &[Launch]) -> Vec<Replica> {
    let mut started = Vec::with_capacity(launches.len());
    for launch in launches {
        started.push(launch.start().await);
    }
    for replica in &started {
        replica.serving().await;
    }
    started
}

/// The digests of every replica once they all cover the same seqs, which must be equal.
pub async fn agreed_digests(replicas: &[Replica]) -> Vec<(String, u64, u64)> {
    wait_until(
        PATIENCE,
        "the replicas to reach the same seqs",
        async || {
            let mut all = Vec::new();
            for replica in replicas {
                all.push(replica.digests().await);
            }
            let seqs = |d: &Vec<(String, u64, u64)>| {
                d.iter()
                    .map(|(n, s, _)| (n.clone(), *s))
                    .collect::<Vec<_>>()
            };
            all.iter().all(|d| seqs(d) == seqs(&all[0])).then_some(all)
        },
    )
    .await
    .into_iter()
    .reduce(|first, other| {
        assert_eq!(
            first, other,
            "replicas at the same seqs hold the same state"
        );
        first
    })
    .unwrap()
}

/// The stream seqs the shared snapshots cover, oldest first, as the stream's index record names them.
pub async fn shared_snapshots(nats: &str) -> Vec<u64> {
    let client = async_nats::connect(nats).await.unwrap();
    let stream = async_nats::jetstream::new(client)
        .get_stream("existence")
        .await
        .unwrap();
    match stream
        .get_last_raw_message_by_subject("existence.$snapshots")
        .await
    {
        Ok(index) => Framing::Sealed
            .body(Record::SnapshotIndex, &index.payload)
            .expect("the index is a sealed record")
            .chunks_exact(8)
            .map(|seq| u64::from_le_bytes(seq.try_into().unwrap()))
            .collect(),
        Err(_) => Vec::new(),
    }
}
