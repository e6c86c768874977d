//! The `existence-gate` binary as a single server on a data directory, optionally with fault points set
//! through `FAILPOINTS` (docs/development.md, "Fault points"): the process is the unit of isolation, so a
//! fault set for one test never reaches another running in this test binary.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::{wait_until, PATIENCE};

/// The `existence-gate` binary that cargo built with the running test or bench, panicking if there is none.
pub fn path() -> PathBuf {
    built().unwrap_or_else(|| {
        panic!("the existence-gate binary is not built: run the tests with `cargo test`, which builds it")
    })
}

/// The `existence-gate` binary that cargo built with the running test or bench, if it exists. Cargo names it
/// to the root package's integration tests and benches (`CARGO_BIN_EXE_existence-gate`), at compile time and,
/// when it runs them, in their environment; a library like this one sees only the latter. Run directly, a
/// test or bench executable sits in `target/<profile>/deps/`, and cargo puts the binary it built with them
/// in `target/<profile>/`: the same file either way.
pub fn built() -> Option<PathBuf> {
    let named = std::env::var_os("CARGO_BIN_EXE_existence-gate").map(PathBuf::from);
    let beside = || {
        let exe = std::env::current_exe().ok()?;
        let deps = exe.parent().filter(|dir| dir.ends_with("deps"))?;
        Some(deps.parent()?.join("existence-gate"))
    };
    named.or_else(beside).filter(|path| path.is_file())
}

/// `existence-gate serve` on free loopback ports (each logged on its `grpc_addr=`/`http_addr=` line), logging
/// at `EXISTENCE_GATE_TEST_RUST_LOG` (default `info`) without colours, killed when dropped.
pub fn serve() -> tokio::process::Command {
    serve_on(&crate::ports::EPHEMERAL_PORTS)
}

/// [`serve`] with the port flags `ports` (`--listen`, `--http-listen`, `--resp-listen` and their
/// addresses) instead of free ones: for a process restarted on the ports a load balancer knows.
pub fn serve_on(ports: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(path());
    command
        .arg("serve")
        .args(ports)
        .env(
            "RUST_LOG",
            std::env::var("EXISTENCE_GATE_TEST_RUST_LOG").unwrap_or_else(|_| "info".to_string()),
        )
        .env("NO_COLOR", "1")
        // Stopped at once on SIGTERM unless a test asks for a drain delay (`--drain-delay` wins over this).
        .env("EXISTENCE_GATE_DRAIN_DELAY", "0s")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// [`serve`] on `dir` (`--sync always`) with `FAILPOINTS=faults`.
fn command(dir: &Path, faults: &str) -> tokio::process::Command {
    let mut command = serve();
    command
        .args(["--sync", "always", "--data-dir"])
        .arg(dir)
        .env("FAILPOINTS", faults);
    command
}

/// Starts the binary on `dir` with `FAILPOINTS=faults` ("" for none) and waits until it has loaded and
/// serves; returns the process and its gRPC address.
pub async fn spawn(dir: &Path, faults: &str) -> (tokio::process::Child, String) {
    let served = start(command(dir, faults)).await;
    (served.child, served.grpc_addr)
}

/// A started binary.
pub struct Served {
    /// The process (killed when dropped).
    pub child: tokio::process::Child,
    /// Its gRPC address, `IP:PORT`.
    pub grpc_addr: String,
    /// Its HTTP address (`/metrics`, `/readyz`), `IP:PORT`.
    pub http_addr: String,
    /// Its RESP address, `IP:PORT`, unless the port is off.
    pub resp_addr: Option<String>,
}

/// Starts `command` (a [`serve`] with its flags) and waits until it has loaded and serves.
pub async fn start(mut command: tokio::process::Command) -> Served {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let field = |line: &str, name: &str| {
        let rest = line.split(name).nth(1)?;
        Some(rest.split_whitespace().next()?.to_string())
    };
    let (grpc_addr, http_addr, resp_addr) = tokio::time::timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let (Some(grpc), Some(http)) =
                (field(&line, "grpc_addr="), field(&line, "http_addr="))
            {
                return (grpc, http, field(&line, "resp_addr="));
            }
        }
        panic!("the binary exited before logging its address");
    })
    .await
    .expect("binds within the deadline");
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    // Loaded once health says SERVING: the gate opens just before (its "state loaded" log line comes earlier,
    // while writes are still refused).
    let channel = tonic::transport::Channel::from_shared(format!("http://{grpc_addr}"))
        .unwrap()
        .connect_lazy();
    let mut health = HealthClient::new(channel);
    wait_until(PATIENCE, "the binary to load and serve", async || {
        let request = HealthCheckRequest {
            service: String::new(),
        };
        let reply = health.check(request).await.ok()?.into_inner();
        (reply.status() == ServingStatus::Serving).then_some(())
    })
    .await;
    Served {
        child,
        grpc_addr,
        http_addr,
        resp_addr,
    }
}

/// Runs the binary on `dir` with `FAILPOINTS=faults`, expecting it to refuse to start: everything it wrote
/// (its log lines and its one-line error).
pub async fn refused(dir: &Path, faults: &str) -> String {
    let output = tokio::time::timeout(PATIENCE, command(dir, faults).output())
        .await
        .expect("the binary exits")
        .expect("the binary runs");
    assert!(
        !output.status.success(),
        "the binary was expected to refuse to start"
    );
    String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
}
