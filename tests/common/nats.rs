//! A real `nats-server` with JetStream, on a free loopback port with its store in a temporary directory,
//! stopped when dropped. `.ci/run` installs Debian's nats-server and sets `EXISTENCE_GATE_REQUIRE_NATS=1`,
//! so in CI a missing binary fails the tests; elsewhere the tests that need it say so and skip.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use async_nats::jetstream::context::GetStreamErrorKind;

use super::{free_port, wait_until, PATIENCE};

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
    /// Their client URLs, comma-separated (as `--nats` takes them).
    pub urls: String,
    _store: tempfile::TempDir,
}

/// The nats-server binary, or `None` (with a note on stderr) when it is not installed and not required.
fn binary() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
            .map(|dir| dir.join("nats-server"))
            .find(|path| path.is_file())
    });
    let required = std::env::var("EXISTENCE_GATE_REQUIRE_NATS").is_ok_and(|v| v == "1");
    match found {
        Some(path) => Some(path),
        None if required => panic!("nats-server is not installed (apt-get install -y nats-server)"),
        None => {
            eprintln!("nats-server is not installed (apt-get install -y nats-server): skipping");
            None
        }
    }
}

impl Nats {
    /// Starts a JetStream server and waits until it takes JetStream requests; `None` if nats-server is not
    /// installed (and not required).
    pub async fn start() -> Option<Self> {
        let binary = binary()?;
        let store = tempfile::tempdir().expect("a temporary directory");
        let port = free_port();
        let nats = Self {
            child: spawn(&binary, port, store.path()),
            binary,
            port,
            url: format!("nats://127.0.0.1:{port}"),
            store,
        };
        nats.ready().await;
        Some(nats)
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
        self.ready().await;
    }

    /// Waits until the server takes JetStream requests.
    async fn ready(&self) {
        let url = self.url.clone();
        wait_until(
            PATIENCE,
            "nats-server to take JetStream requests",
            async || {
                let client = async_nats::connect(url.as_str()).await.ok()?;
                // JetStream answers (here: "no such stream") once it is up; a request error means not yet.
                let probe = async_nats::jetstream::new(client)
                    .get_stream("readiness-probe")
                    .await;
                match probe.map_err(|e| e.kind()) {
                    Ok(_) | Err(GetStreamErrorKind::JetStream(_)) => Some(()),
                    Err(_) => None,
                }
            },
        )
        .await;
    }
}

/// Starts a JetStream server on `port` with its store in `store`.
fn spawn(binary: &std::path::Path, port: u16, store: &std::path::Path) -> Child {
    Command::new(binary)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting nats-server")
}

impl Cluster {
    /// Starts three clustered JetStream servers and waits until they take JetStream requests (a meta
    /// leader is elected); `None` if nats-server is not installed (and not required).
    pub async fn start() -> Option<Self> {
        let binary = binary()?;
        let store = tempfile::tempdir().expect("a temporary directory");
        let (clients, routes): (Vec<u16>, Vec<u16>) =
            (0..3).map(|_| (free_port(), free_port())).unzip();
        let route_urls: Vec<String> = routes
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect();
        let servers = (0..3)
            .map(|i| {
                let name = format!("n{i}");
                let child = Command::new(&binary)
                    .args([
                        "-a",
                        "127.0.0.1",
                        "-p",
                        &clients[i].to_string(),
                        "-js",
                        "-sd",
                    ])
                    .arg(store.path().join(&name))
                    .args(["--server_name", &name, "--cluster_name", "existence-test"])
                    .args([
                        "--cluster",
                        &route_urls[i],
                        "--routes",
                        &route_urls.join(","),
                    ])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("starting nats-server");
                (name, child)
            })
            .collect();
        let urls: Vec<String> = clients
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect();
        let cluster = Self {
            servers,
            urls: urls.join(","),
            _store: store,
        };
        wait_until(
            PATIENCE,
            "the cluster to elect a JetStream leader",
            async || {
                let client = async_nats::connect(urls[0].as_str()).await.ok()?;
                let probe = async_nats::jetstream::new(client)
                    .get_stream("readiness-probe")
                    .await;
                match probe.map_err(|e| e.kind()) {
                    Err(GetStreamErrorKind::JetStream(e))
                        if e.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND =>
                    {
                        Some(())
                    }
                    _ => None,
                }
            },
        )
        .await;
        Some(cluster)
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
