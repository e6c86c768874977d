//! `existence-gate feed` as a process: started against a database and a gate, its HTTP port found in its
//! log, killed when dropped.

use std::net::SocketAddr;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::{wait_until, PATIENCE};

/// A running `existence-gate feed` process.
pub struct Feed {
    child: tokio::process::Child,
    /// Its HTTP port.
    pub http: SocketAddr,
}

/// The feed's command line against the database `dsn` and the gate at `addr`, following
/// `public.users:id=users`.
pub fn feed_command(dsn: &str, addr: &str, extra: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(crate::binary::path());
    command
        .args(["feed", "--addr", addr, "--postgres", dsn])
        .args(["--table", "public.users:id=users", "--slot", "feed_slot"])
        .args([
            "--publication",
            "feed_publication",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .args(extra)
        .env_remove("EXISTENCE_GATE_TOKEN")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

impl Feed {
    /// Starts the feed against the database `dsn` and the gate at `addr`; returns once its HTTP port is up.
    pub async fn start(dsn: &str, addr: &str, extra: &[&str]) -> Self {
        let mut child = feed_command(dsn, addr, extra)
            .spawn()
            .expect("the binary starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let http = tokio::time::timeout(PATIENCE, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(at) = line.find("http_addr=") {
                    let rest = &line[at + "http_addr=".len()..];
                    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                    return rest[..end].parse().expect("an address");
                }
            }
            panic!("the feed exited before serving HTTP");
        })
        .await
        .expect("the feed serves HTTP");
        let show = std::env::var_os("EXISTENCE_GATE_TEST_LOGS").is_some();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if show {
                    eprintln!("[feed] {line}");
                }
            }
        });
        Self { child, http }
    }

    /// Waits until `/readyz` answers 200 (following the slot).
    pub async fn ready(&self) {
        wait_until(PATIENCE, "the feed to follow its slot", async || {
            let (status, _) = try_http_get_at(self.http, "/readyz").await?;
            (status == 200).then_some(())
        })
        .await;
    }

    /// One sample of the metric `series` (the first line starting with it), 0 if absent.
    pub async fn metric(&self, series: &str) -> f64 {
        let (_, body) = try_http_get_at(self.http, "/metrics")
            .await
            .unwrap_or_default();
        body.lines()
            .find(|line| line.starts_with(series))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse().ok())
            .unwrap_or(0.0)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Sends `signal` (e.g. "STOP", "CONT") to the process.
    pub fn signal(&self, signal: &str) {
        crate::send_signal(self.pid(), signal);
    }

    /// SIGKILL.
    pub async fn kill(mut self) {
        self.child.kill().await.expect("kill the feed");
    }
}

async fn try_http_get_at(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    crate::try_http_get(addr, path).await.ok()
}
