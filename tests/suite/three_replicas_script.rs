//! `scripts/three-replicas.sh`, the way README "Scaling out" tells a newcomer to try replicated mode: it
//! starts three nats-servers and three replicas that all turn `SERVING`, and a SIGTERM stops every one of
//! them. (The replicas once shared the default data directory, so the second one refused to start.)

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
    let dir = tempfile::tempdir().unwrap();
    // Nine ports from a base: a base whose ports another process holds makes a server exit, which the
    // script reports; another base is then tried.
    let mut attempts = Vec::new();
    let (mut script, said, mut rest) = loop {
        let base = common::free_port().clamp(1_024, 65_000);
        let mut script = start(dir.path(), &nats, base);
        match until_serving(&mut script).await {
            Ok((said, rest)) => break (script, said, rest),
            Err(why) if attempts.len() < 2 => attempts.push(why),
            Err(why) => panic!("three attempts failed: {attempts:?} {why}"),
        }
    };
    let addresses: Vec<String> = (0..3).map(|r| grpc_address(&said, r)).collect();
    for replica in 0..3 {
        assert!(
            dir.path().join(format!("r{replica}")).join("LOCK").exists(),
            "r{replica}'s data directory"
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
