//! `scripts/three-replicas.sh`, the way docs/deployment.md ("Three replicas") tells a newcomer to try
//! replicated mode: it starts three nats-servers and three replicas that all turn `SERVING`, and a SIGTERM
//! stops every one of them. (The replicas once shared the default data directory, so the second one refused
//! to start.)

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::PATIENCE;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// What the script says once every replica serves.
const ALL_SERVING: &str = "all three replicas are SERVING";

/// The script on ports from `base` (clients `base+0..2`, routes `+100..102`, monitoring `+200..202`).
fn start(dir: &std::path::Path, nats: &std::path::Path, base: u16) -> Child {
    Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/three-replicas.sh"
        ))
        .arg(dir)
        .env("EXISTENCE_GATE_BIN", env!("CARGO_BIN_EXE_existence-gate"))
        .env("NATS_SERVER", nats)
        .env("PORT_BASE", base.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("bash runs the script")
}

/// Offsets from the port base of the nine ports the script's servers listen on.
const PORT_OFFSETS: [u16; 9] = [0, 1, 2, 100, 101, 102, 200, 201, 202];

/// A port base whose nine ports are free now, taken below the ephemeral range, where the other tests'
/// servers and connections take theirs (a base from `free_port` itself lands in it, and one of its nine
/// ports was in use now and then when the whole suite ran).
fn free_base() -> u16 {
    loop {
        let base = 20_000 + common::free_port() % 10_000;
        let free = PORT_OFFSETS
            .iter()
            .all(|offset| std::net::TcpListener::bind(("127.0.0.1", base + offset)).is_ok());
        if free {
            return base;
        }
    }
}

/// The last lines of every log the script left in `dir`: why a server or replica exited.
fn log_tails(dir: &std::path::Path) -> String {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return String::new();
    };
    let mut tails = String::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|ext| ext == "log") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(5)..].join("\n");
            tails.push_str(&format!("\n--- {}:\n{tail}", path.display()));
        }
    }
    tails
}

/// The script's stdout, line by line.
type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

/// The script's output until it says every replica serves (`Ok`, with the rest of its output to read on:
/// a script whose stdout is closed dies of SIGPIPE at its next word), or exits first (`Err`, with all it
/// said).
async fn until_serving(script: &mut Child) -> Result<(Vec<String>, Lines), String> {
    let mut lines = BufReader::new(script.stdout.take().expect("stdout")).lines();
    let mut said = Vec::new();
    while let Some(line) = tokio::time::timeout(PATIENCE * 2, lines.next_line())
        .await
        .map_err(|_| format!("no word for {:?}: {said:?}", PATIENCE * 2))?
        .expect("the script's stdout")
    {
        let done = line.contains(ALL_SERVING);
        said.push(line);
        if done {
            return Ok((said, lines));
        }
    }
    let mut error = String::new();
    if let Some(mut stderr) = script.stderr.take() {
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut error).await;
    }
    Err(format!("exited before {ALL_SERVING:?}: {said:?} {error}"))
}

/// The gRPC address of replica `r` as the script printed it.
fn grpc_address(said: &[String], replica: usize) -> String {
    let prefix = format!("replica r{replica}: gRPC ");
    let line = said
        .iter()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no address of r{replica} in {said:?}"));
    line.split_whitespace()
        .next()
        .expect("an address")
        .to_string()
}

#[tokio::test]
async fn the_three_replicas_script_starts_replicas_that_all_serve_and_stops_them() {
    let Some(nats) = common::nats::binary() else {
        return;
    };
    let temp = tempfile::tempdir().unwrap();
    // Nine ports from a base: a base whose ports another process took meanwhile makes a server exit, which
    // the script reports; another base is then tried, in a directory of its own (a cluster's stores are
    // not reused on other ports).
    let mut attempts = Vec::new();
    let (dir, base, mut script, said, mut rest) = loop {
        let dir = temp.path().join(format!("attempt-{}", attempts.len()));
        std::fs::create_dir(&dir).unwrap();
        let base = free_base();
        let mut script = start(&dir, &nats, base);
        match until_serving(&mut script).await {
            Ok((said, rest)) => break (dir, base, script, said, rest),
            Err(why) => attempts.push(format!("{why}{}", log_tails(&dir))),
        }
        assert!(attempts.len() < 3, "three attempts failed: {attempts:#?}");
    };
    let addresses: Vec<String> = (0..3).map(|r| grpc_address(&said, r)).collect();
    for replica in 0..3 {
        assert!(
            dir.join(format!("r{replica}")).join("LOCK").exists(),
            "r{replica}'s data directory"
        );
    }
    // Its NATS servers run the shipped settings (deploy/nats/nats-server.conf): each syncs before it
    // acknowledges.
    for server in 0..3 {
        let monitor = std::net::SocketAddr::from(([127, 0, 0, 1], base + 200 + server));
        let (_, varz) = common::try_http_get(monitor, "/varz").await.unwrap();
        let varz: serde_json::Value = serde_json::from_str(&varz).unwrap();
        assert_eq!(
            varz["jetstream"]["config"]["sync_always"],
            serde_json::Value::Bool(true),
            "n{server}: {}",
            varz["jetstream"]
        );
    }
    common::send_signal(script.id().expect("running"), "TERM");
    let mut after = Vec::new();
    while let Some(line) = tokio::time::timeout(PATIENCE, rest.next_line())
        .await
        .expect("the script stops within the patience")
        .expect("the script's stdout")
    {
        after.push(line);
    }
    assert_eq!(
        after.first().map(String::as_str),
        Some("stopping..."),
        "{after:?}"
    );
    let status = tokio::time::timeout(PATIENCE, script.wait())
        .await
        .expect("the script stops within the patience")
        .unwrap();
    assert_eq!(status.code(), Some(143), "SIGTERM's exit status");
    for address in addresses {
        let refused = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::TcpStream::connect(&address),
        )
        .await;
        assert!(
            matches!(refused, Ok(Err(_))),
            "replica at {address} still listens after the script stopped"
        );
    }
}
