//! Behind a real load balancer: HAProxy (HTTP/2 to the replicas, health from `/readyz` on their HTTP ports)
//! before three replicas on NATS, a steady load of `Add`s and lookups through it, and each replica restarted
//! in turn with SIGTERM, as a rolling upgrade does. No call may fail — the replica leaving keeps serving for
//! `--drain-delay` while HAProxy's checks see `/readyz` 503 and stop sending to it, and the restarted one is
//! sent calls only once `/readyz` says it is ready — and no acknowledged key may be answered `ABSENT`.
//!
//! HAProxy is Debian's `haproxy` (2.6); the test is skipped with a note where it is not installed, and
//! required where `EXISTENCE_GATE_REQUIRE_HAPROXY` is set (CI).

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use common::nats::Nats;
use common::ports::free_port;
use common::replicas::{config_file, Launch, Replica};
use common::{wait_until, PATIENCE};
use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use existence_gate::proto::{AddRequest, Answer, MayExistRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

const CONFIG: &str = "[namespaces.users]\nexpected_keys = 100000\n";

/// How long a leaving replica serves on: the default, well past HAProxy's detection (2 failed checks 250 ms
/// apart), with a margin for a loaded machine.
const DRAIN_DELAY: &str = "5s";

/// The `haproxy` binary, or `None` (with a note) where it is not installed and not required.
fn haproxy() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .chain([PathBuf::from("/usr/sbin")])
            .map(|dir| dir.join("haproxy"))
            .find(|path| path.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("EXISTENCE_GATE_REQUIRE_HAPROXY").is_none(),
            "haproxy is required (EXISTENCE_GATE_REQUIRE_HAPROXY) but not installed: apt-get install haproxy"
        );
        eprintln!("note: haproxy is not installed (apt-get install haproxy); the load-balancer test is skipped");
    }
    found
}

/// The shipped configuration (`deploy/haproxy.cfg`) with this test's addresses: gRPC in on `front`, the
/// runtime API on `socket`, server `gate-N` at the replica's gRPC address and checked on its HTTP port.
fn haproxy_config(front: u16, socket: &Path, replicas: &[[SocketAddr; 3]]) -> String {
    let shipped =
        std::fs::read_to_string(common::workspace_root().join("deploy/haproxy.cfg")).unwrap();
    let mut config = shipped
        .replace("bind :50051", &format!("bind 127.0.0.1:{front}"))
        .replace("/run/haproxy/admin.sock", &socket.display().to_string());
    for (i, [grpc, http, _]) in replicas.iter().enumerate() {
        let server = format!(
            "server gate-{n} gate-{n}:50051 proto h2 check port 9464",
            n = i + 1
        );
        assert!(
            config.contains(&server),
            "deploy/haproxy.cfg has no line `{server}`"
        );
        let here = format!(
            "server gate-{} {grpc} proto h2 check port {}",
            i + 1,
            http.port()
        );
        config = config.replace(&server, &here);
    }
    config
}

/// What HAProxy's runtime API says of server `server` of the backend: `UP`, `DOWN`, ...
async fn server_status(socket: &Path, server: &str) -> Option<String> {
    let mut stream = tokio::net::UnixStream::connect(socket).await.ok()?;
    stream.write_all(b"show stat\n").await.ok()?;
    let mut csv = String::new();
    stream.read_to_string(&mut csv).await.ok()?;
    csv.lines()
        .map(|line| line.split(',').collect::<Vec<_>>())
        .find(|fields| fields.first() == Some(&"replicas") && fields.get(1) == Some(&server))
        .and_then(|fields| fields.get(17).map(|status| status.to_string()))
}

async fn until_status(socket: &Path, server: &str, wanted: &str) {
    wait_until(
        PATIENCE,
        &format!("HAProxy to see {server} {wanted}"),
        async || (server_status(socket, server).await.as_deref() == Some(wanted)).then_some(()),
    )
    .await;
}

/// What the load saw.
#[derive(Debug, Default)]
struct Seen {
    adds: AtomicU64,
    lookups: AtomicU64,
    failed: Mutex<Vec<String>>,
    false_absent: Mutex<Vec<String>>,
}

/// One caller through HAProxy until `stop`: an `Add` of a new key, then a lookup of it (it must not be
/// `ABSENT`), then a lookup of a key nobody adds.
async fn caller(
    mut gate: ExistenceGateClient<Channel>,
    name: usize,
    seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
) {
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let key = Bytes::from(format!("c{name}-{i}"));
        let added = gate
            .add(AddRequest {
                namespace: "users".into(),
                keys: vec![key.clone()],
                ..Default::default()
            })
            .await;
        if let Err(status) = added {
            seen.failed.lock().unwrap().push(format!("Add: {status:?}"));
            continue;
        }
        seen.adds.fetch_add(1, Ordering::Relaxed);
        for (key, acknowledged) in [
            (key, true),
            (Bytes::from(format!("none-{name}-{i}")), false),
        ] {
            let looked = gate
                .may_exist(MayExistRequest {
                    namespace: "users".into(),
                    key: key.clone(),
                })
                .await;
            match looked {
                Err(status) => seen
                    .failed
                    .lock()
                    .unwrap()
                    .push(format!("MayExist: {status:?}")),
                Ok(reply) if acknowledged && reply.get_ref().answer() == Answer::Absent => {
                    seen.false_absent.lock().unwrap().push(format!("{key:?}"))
                }
                Ok(_) => {
                    seen.lookups.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// A rolling restart (SIGTERM, restart on the same ports and data, back in HAProxy) of each of three
/// replicas under a steady load through HAProxy: no call fails, no acknowledged key answers `ABSENT`.
#[tokio::test]
async fn a_rolling_restart_behind_haproxy_fails_no_call() {
    let Some(haproxy) = haproxy() else {
        return;
    };
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), CONFIG);
    let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let launches: Vec<Launch> = (0..3)
        .map(|i| {
            let mut launch = Launch::new(&nats.url, &config, &format!("r{i}"));
            launch.args = vec!["--drain-delay".into(), DRAIN_DELAY.into()];
            launch.addresses = Some([free_port(), free_port(), free_port()].map(loopback));
            launch
        })
        .collect();
    let mut replicas: Vec<Replica> = Vec::new();
    for launch in &launches {
        replicas.push(launch.start().await);
    }
    for replica in &replicas {
        replica.serving().await;
    }
    let (front, socket) = (free_port(), dir.path().join("haproxy.sock"));
    let addresses: Vec<[SocketAddr; 3]> = launches.iter().map(|l| l.addresses.unwrap()).collect();
    let haproxy_cfg = dir.path().join("haproxy.cfg");
    std::fs::write(&haproxy_cfg, haproxy_config(front, &socket, &addresses)).unwrap();
    let _balancer = tokio::process::Command::new(haproxy)
        .arg("-db")
        .arg("-f")
        .arg(&haproxy_cfg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("haproxy starts");
    for i in 1..=3 {
        until_status(&socket, &format!("gate-{i}"), "UP").await;
    }
    let channel = Channel::from_shared(format!("http://127.0.0.1:{front}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (seen, stop) = (Arc::new(Seen::default()), Arc::new(AtomicBool::new(false)));
    let callers: Vec<_> = (0..4)
        .map(|name| {
            let gate = ExistenceGateClient::new(channel.clone());
            tokio::spawn(caller(gate, name, Arc::clone(&seen), Arc::clone(&stop)))
        })
        .collect();
    wait_until(PATIENCE, "the load to run", async || {
        (seen.adds.load(Ordering::Relaxed) > 20).then_some(())
    })
    .await;
    for (i, launch) in launches.iter().enumerate() {
        let server = format!("gate-{}", i + 1);
        let (adds_before, started) = (seen.adds.load(Ordering::Relaxed), Instant::now());
        // As a service manager restarts it: SIGTERM, and a new process as soon as the old one exits, without
        // waiting for the balancer — which must not send the new one calls before it is ready either.
        let leaving = replicas.remove(i);
        leaving.signal("TERM");
        assert!(leaving.exited().await.success(), "{server} exits 0");
        let exited = started.elapsed();
        replicas.insert(i, launch.start().await);
        replicas[i].serving().await;
        until_status(&socket, &server, "UP").await;
        eprintln!(
            "rolling restart of {server}: exited {exited:?} after SIGTERM, back UP in HAProxy after {:?}; {} \
             Adds acknowledged meanwhile",
            started.elapsed(),
            seen.adds.load(Ordering::Relaxed) - adds_before
        );
    }
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await.unwrap();
    }
    let (adds, lookups) = (
        seen.adds.load(Ordering::Relaxed),
        seen.lookups.load(Ordering::Relaxed),
    );
    let failed = seen.failed.lock().unwrap();
    let false_absent = seen.false_absent.lock().unwrap();
    eprintln!(
        "through HAProxy: {adds} Adds and {lookups} lookups, {} failed, {} false ABSENT",
        failed.len(),
        false_absent.len()
    );
    assert!(failed.is_empty(), "failed calls: {failed:#?}");
    assert!(
        false_absent.is_empty(),
        "acknowledged keys answered ABSENT: {false_absent:?}"
    );
}
