//! Behind a real load balancer: HAProxy (HTTP/2 to the replicas, health from `/readyz` on their HTTP ports)
//! before three replicas on NATS, a steady load of `Add`s and lookups through it, and each replica restarted
//! in turn with SIGTERM, as a rolling upgrade does. No call may fail — the replica leaving keeps serving for
//! `--drain-delay` while HAProxy's checks see `/readyz` 503 and stop sending to it, and the restarted one is
//! sent calls only once `/readyz` says it is ready — and no acknowledged key may be answered `ABSENT`.
//!
//! Beside the test's own callers, each client library (Go, Python, Java: `clients/LANG/load.sh`) runs its
//! load through HAProxy with its default settings, and is held to the same rules; a Redis client and
//! `redis-benchmark` run `BF.ADD`s through HAProxy's RESP front.
//!
//! HAProxy is Debian's `haproxy` (2.6); the test is skipped with a note where it is not installed, and
//! required where `EXISTENCE_GATE_REQUIRE_HAPROXY` is set (CI).

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::load_drivers::{unix_ms, DriverReport, LoadDriver, LANGUAGES};
use common::nats::Nats;
use common::ports::{free_port, stable_port};
use common::proxy::{Mode, Proxy};
use common::replicas::{config_file, start_in_turn, Launch, Replica};
use common::{wait_until, PATIENCE};
use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use existence_gate::proto::{AddRequest, Answer, MayExistRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

const CONFIG: &str = "[namespaces.users]\nexpected_keys = 100000\n";
/// The load's callers.
const CALLERS: usize = 4;
/// Callers in each client library's load driver (`clients/LANG/load.sh`).
const LIBRARY_CALLERS: usize = 4;
/// Each call's deadline, as a client sets one: what a call held by a paused replica costs.
const CALL_DEADLINE: Duration = Duration::from_secs(2);

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

/// The shipped configuration (`deploy/haproxy.cfg`) with this test's addresses: gRPC in on `fronts.0` and
/// RESP on `fronts.1`, the runtime API on `socket`, server `gate-N` at the replica's gRPC and RESP addresses
/// and checked on its HTTP port.
fn haproxy_config(fronts: (u16, u16), socket: &Path, replicas: &[[SocketAddr; 3]]) -> String {
    let shipped =
        std::fs::read_to_string(common::workspace_root().join("deploy/haproxy.cfg")).unwrap();
    let mut config = shipped
        .replace("bind :50051", &format!("bind 127.0.0.1:{}", fronts.0))
        .replace("bind :6380", &format!("bind 127.0.0.1:{}", fronts.1))
        .replace("/run/haproxy/admin.sock", &socket.display().to_string());
    for (i, [grpc, http, resp]) in replicas.iter().enumerate() {
        let n = i + 1;
        for (shipped, here) in [
            (
                format!("server gate-{n} gate-{n}:50051 proto h2 check port 9464"),
                format!("server gate-{n} {grpc} proto h2 check port {}", http.port()),
            ),
            (
                format!("server gate-{n} gate-{n}:6380 check port 9464"),
                format!("server gate-{n} {resp} check port {}", http.port()),
            ),
        ] {
            assert!(
                config.contains(&shipped),
                "deploy/haproxy.cfg has no line `{shipped}`"
            );
            config = config.replace(&shipped, &here);
        }
    }
    config
}

/// What HAProxy's runtime API says of server `server` of both backends (gRPC and RESP: each checks the same
/// `/readyz`): `UP`, `DOWN`, ..., or the two statuses joined by `/` while they differ.
async fn server_status(socket: &Path, server: &str) -> Option<String> {
    let mut stream = tokio::net::UnixStream::connect(socket).await.ok()?;
    stream.write_all(b"show stat\n").await.ok()?;
    let mut csv = String::new();
    stream.read_to_string(&mut csv).await.ok()?;
    let statuses: Vec<String> = ["replicas", "resp_replicas"]
        .iter()
        .filter_map(|backend| {
            csv.lines()
                .map(|line| line.split(',').collect::<Vec<_>>())
                .find(|fields| fields.first() == Some(backend) && fields.get(1) == Some(&server))
                .and_then(|fields| fields.get(17).map(|status| status.to_string()))
        })
        .collect();
    match statuses.as_slice() {
        [grpc, resp] if grpc == resp => Some(grpc.clone()),
        [grpc, resp] => Some(format!("{grpc}/{resp}")),
        _ => None,
    }
}

async fn until_status(socket: &Path, server: &str, wanted: &str) {
    wait_until(
        PATIENCE,
        &format!("HAProxy to see {server} {wanted}"),
        async || (server_status(socket, server).await.as_deref() == Some(wanted)).then_some(()),
    )
    .await;
}

/// One call the load made: when it started, how long it took, and why it failed, if it did.
#[derive(Debug, Clone)]
struct Call {
    add: bool,
    at: Instant,
    took: Duration,
    failed: Option<String>,
}

/// What the load saw.
#[derive(Debug, Default)]
struct Seen {
    adds: AtomicU64,
    calls: Mutex<Vec<Call>>,
    false_absent: Mutex<Vec<String>>,
}

impl Seen {
    fn record(&self, add: bool, at: Instant, failed: Option<String>) {
        let took = at.elapsed();
        let call = Call {
            add,
            at,
            took,
            failed,
        };
        self.calls.lock().unwrap().push(call);
    }

    /// The 99th percentile latency of the `Add`s (or, `!adds`, the lookups) that started in `window`.
    fn p99(&self, window: std::ops::Range<Instant>, adds: bool) -> Duration {
        let mut took: Vec<Duration> = self
            .during(window)
            .iter()
            .filter(|c| c.add == adds)
            .map(|c| c.took)
            .collect();
        took.sort();
        took.get(took.len() * 99 / 100).copied().unwrap_or_default()
    }

    /// The calls that started in `window`.
    fn during(&self, window: std::ops::Range<Instant>) -> Vec<Call> {
        let calls = self.calls.lock().unwrap();
        calls
            .iter()
            .filter(|c| window.contains(&c.at))
            .cloned()
            .collect()
    }

    fn failed(&self) -> Vec<String> {
        let calls = self.calls.lock().unwrap();
        calls.iter().filter_map(|c| c.failed.clone()).collect()
    }
}

/// One caller through HAProxy until `stop`, each call with `CALL_DEADLINE` (as a client sets one): an `Add`
/// of a new key, then a lookup of it (it must not be `ABSENT`), then a lookup of a key nobody adds.
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
        let mut request = tonic::Request::new(AddRequest {
            namespace: "users".into(),
            keys: vec![key.clone()],
            ..Default::default()
        });
        request.set_timeout(CALL_DEADLINE);
        let at = Instant::now();
        if let Err(status) = gate.add(request).await {
            seen.record(true, at, Some(format!("Add: {status:?}")));
            continue;
        }
        seen.record(true, at, None);
        seen.adds.fetch_add(1, Ordering::Relaxed);
        for (key, acknowledged) in [
            (key, true),
            (Bytes::from(format!("none-{name}-{i}")), false),
        ] {
            let mut request = tonic::Request::new(MayExistRequest {
                namespace: "users".into(),
                key: key.clone(),
            });
            request.set_timeout(CALL_DEADLINE);
            let at = Instant::now();
            match gate.may_exist(request).await {
                Err(status) => seen.record(false, at, Some(format!("MayExist: {status:?}"))),
                Ok(reply) => {
                    seen.record(false, at, None);
                    if acknowledged && reply.get_ref().answer() == Answer::Absent {
                        seen.false_absent.lock().unwrap().push(format!("{key:?}"));
                    }
                }
            }
        }
    }
}

/// What the RESP caller saw.
#[derive(Debug, Default)]
struct RespSeen {
    /// Keys added and then found.
    checked: AtomicU64,
    /// Commands sent again on a new connection (the old one closed, or the server said `TRYAGAIN`).
    retried: AtomicU64,
    /// Commands that failed even so, or a key not found after its `BF.ADD`.
    failed: Mutex<Vec<String>>,
}

/// A Redis client through HAProxy's RESP front until `stop`: `BF.ADD` of a new key, then `BF.EXISTS` of it
/// (it must be 1). A command that fails in a way redis-rs says may be retried (its connection closed, or
/// `TRYAGAIN`) is sent again on a new connection, twice at most — what redis-py and go-redis do by default.
async fn resp_caller(front: SocketAddr, seen: Arc<RespSeen>, stop: Arc<AtomicBool>) {
    let client = redis::Client::open(format!("redis://{front}/")).unwrap();
    let mut connection = None;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let key = format!("resp-{i}");
        for command in ["BF.ADD", "BF.EXISTS"] {
            let mut attempts = 0;
            let answer = loop {
                attempts += 1;
                if connection.is_none() {
                    connection = client.get_multiplexed_async_connection().await.ok();
                }
                let Some(open) = &mut connection else {
                    continue;
                };
                let sent = redis::cmd(command)
                    .arg("users")
                    .arg(&key)
                    .query_async::<i64>(open)
                    .await;
                match sent {
                    Err(error)
                        if attempts <= 2
                            && !matches!(error.retry_method(), redis::RetryMethod::NoRetry) =>
                    {
                        seen.retried.fetch_add(1, Ordering::Relaxed);
                        connection = None;
                    }
                    answered => break answered,
                }
            };
            match (command, answer) {
                (_, Err(error)) => seen
                    .failed
                    .lock()
                    .unwrap()
                    .push(format!("{command} {key}: {error}")),
                ("BF.EXISTS", Ok(found)) if found != 1 => seen
                    .failed
                    .lock()
                    .unwrap()
                    .push(format!("{key} answered {found} after its BF.ADD")),
                ("BF.EXISTS", Ok(_)) => {
                    seen.checked.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
    }
}

/// What `redis-benchmark` runs through HAProxy came to: runs that sent every command, and how the others
/// ended (the last line of their output).
#[derive(Debug, Default)]
struct BenchmarkRuns {
    completed: u64,
    ended: Vec<String>,
}

/// `redis-benchmark` through HAProxy's RESP front, one short run after another until `stop`: two connections
/// of unpipelined `BF.ADD`s of random keys. It does not reconnect: a run whose connection a draining replica
/// closes ends there (with `TRYAGAIN` for a command that met the close, or "Server closed the connection"),
/// and the next run connects through HAProxy to a replica that serves. `None` where it is not installed.
async fn redis_benchmark_runs(front: SocketAddr, stop: Arc<AtomicBool>) -> Option<BenchmarkRuns> {
    let mut runs = BenchmarkRuns::default();
    while !stop.load(Ordering::Relaxed) {
        let (host, port) = (front.ip().to_string(), front.port().to_string());
        let ran = tokio::process::Command::new("redis-benchmark")
            .args([
                "-h",
                &host,
                "-p",
                &port,
                "-c",
                "2",
                "-n",
                "200",
                "-r",
                "100000000",
                "-q",
            ])
            .args(["BF.ADD", "users", "bench:__rand_int__"])
            .stdin(std::process::Stdio::null())
            .output()
            .await;
        let Ok(output) = ran else {
            eprintln!("note: redis-benchmark is not installed (apt-get install redis-tools)");
            return None;
        };
        if output.status.success() {
            runs.completed += 1;
        } else {
            // Its error is on stderr; stdout holds progress lines.
            let text = String::from_utf8_lossy(&output.stderr);
            let error = text.lines().rev().find(|l| !l.trim().is_empty());
            runs.ended
                .push(error.unwrap_or("(nothing on stderr)").trim().to_string());
        }
    }
    Some(runs)
}

/// Three replicas on NATS, each reaching it through a proxy of its own (so that one can be cut off), on
/// fixed ports a restart keeps, behind HAProxy running `deploy/haproxy.cfg`; every server `UP`.
struct Balanced {
    _nats: Nats,
    _haproxy: tokio::process::Child,
    _dir: tempfile::TempDir,
    launches: Vec<Launch>,
    replicas: Vec<Replica>,
    /// Each replica's link to NATS.
    links: Vec<Proxy>,
    /// HAProxy's runtime API.
    socket: PathBuf,
    /// HAProxy's gRPC front, and a channel to it.
    front: SocketAddr,
    channel: Channel,
    /// HAProxy's RESP front.
    resp_front: SocketAddr,
    /// Its turn ([`TAKING_TURNS`]), held until everything above has stopped.
    _turn: tokio::sync::SemaphorePermit<'static>,
}

/// The balancer runs take turns. Each counts the calls its events cost against bounds worked out from
/// deadlines; three at once — nine replicas, three NATS servers, three HAProxies and nine language drivers —
/// beside the rest of the suite on a 2-core machine once made a run lose more calls than its deadlines
/// explain.
static TAKING_TURNS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

impl Balanced {
    async fn start() -> Option<Self> {
        let haproxy = haproxy()?;
        let turn = TAKING_TURNS.acquire().await.expect("never closed");
        let nats = Nats::start().await?;
        let dir = tempfile::tempdir().unwrap();
        let config = config_file(dir.path(), CONFIG);
        let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        let nats_addr: SocketAddr = nats.url.trim_start_matches("nats://").parse().unwrap();
        let mut links = Vec::new();
        let mut launches = Vec::new();
        for i in 0..3 {
            let link = Proxy::start(nats_addr).await;
            let mut launch = Launch::new(&link.url(), &config, &format!("r{i}"));
            launch.args = vec!["--drain-delay".into(), DRAIN_DELAY.into()];
            launch.addresses = Some([stable_port(), stable_port(), stable_port()].map(loopback));
            links.push(link);
            launches.push(launch);
        }
        let replicas = start_in_turn(&launches).await;
        let (front, resp_front) = (free_port(), free_port());
        let socket = dir.path().join("haproxy.sock");
        let addresses: Vec<[SocketAddr; 3]> =
            launches.iter().map(|l| l.addresses.unwrap()).collect();
        let haproxy_cfg = dir.path().join("haproxy.cfg");
        std::fs::write(
            &haproxy_cfg,
            haproxy_config((front, resp_front), &socket, &addresses),
        )
        .unwrap();
        let balancer = tokio::process::Command::new(haproxy)
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
        Some(Self {
            _nats: nats,
            _haproxy: balancer,
            _dir: dir,
            launches,
            replicas,
            links,
            socket,
            front: loopback(front),
            channel,
            resp_front: loopback(resp_front),
            _turn: turn,
        })
    }

    /// Starts `CALLERS` callers through HAProxy, and waits until they have Adds acknowledged.
    async fn load(&self) -> Load {
        let (seen, stop) = (Arc::new(Seen::default()), Arc::new(AtomicBool::new(false)));
        let callers = (0..CALLERS)
            .map(|name| {
                let gate = ExistenceGateClient::new(self.channel.clone());
                tokio::spawn(caller(gate, name, Arc::clone(&seen), Arc::clone(&stop)))
            })
            .collect();
        wait_until(PATIENCE, "the load to run", async || {
            (seen.adds.load(Ordering::Relaxed) > 20).then_some(())
        })
        .await;
        Load {
            seen,
            stop,
            callers,
        }
    }

    /// Starts replica `i` again on its ports and data, and waits until HAProxy sends it calls.
    async fn restart(&mut self, i: usize) {
        self.replicas.insert(i, self.launches[i].start().await);
        self.replicas[i].serving().await;
        until_status(&self.socket, &format!("gate-{}", i + 1), "UP").await;
    }

    /// How long after `since` HAProxy took server `i` out (polled from `since`).
    async fn taken_out(&self, i: usize, since: Instant) -> Duration {
        let server = format!("gate-{}", i + 1);
        wait_until(
            PATIENCE,
            &format!("HAProxy to take {server} out"),
            async || {
                let status = server_status(&self.socket, &server).await?;
                status.starts_with("DOWN").then(|| since.elapsed())
            },
        )
        .await
    }
}

/// Each client library's load driver against `addresses` (joined by commas), started one after another
/// (each builds its library, and the machine has two cores): those whose toolchain is installed.
async fn drivers(addresses: &str) -> Vec<LoadDriver> {
    let mut started = Vec::new();
    for lang in LANGUAGES {
        started.extend(LoadDriver::start(lang, addresses).await);
    }
    started
}

/// Prints what each library lost to `event` (the failures stamped between `from` and `to`), and fails
/// unless each lost at most `bound` calls (`why` that bound).
fn assert_lost_at_most(
    libraries: &[DriverReport],
    event: &str,
    (from, to): (u64, u64),
    bound: usize,
    why: &str,
) {
    for library in libraries {
        let lost = library.between(from, to);
        eprintln!(
            "{event} ({from}..{to}): the {} library lost {} calls",
            library.lang,
            lost.len()
        );
        assert!(
            lost.len() <= bound,
            "{event}: the {} library lost {} calls, more than {bound} ({why}): {lost:#?}",
            library.lang,
            lost.len()
        );
    }
}

/// Stops the drivers; what each saw, printed.
async fn finish_drivers(drivers: Vec<LoadDriver>) -> Vec<DriverReport> {
    let mut reports = Vec::new();
    for driver in drivers {
        let report = driver.finish().await;
        eprintln!(
            "{} library: {} calls, {} failed, {} false ABSENT",
            report.lang, report.calls, report.failed, report.false_absent
        );
        for (at, what) in &report.events {
            eprintln!("  {} at {at}: {what}", report.lang);
        }
        reports.push(report);
    }
    reports
}

/// The load's callers, running until [`finish`](Load::finish).
struct Load {
    seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
    callers: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Stops the callers; what they saw.
    async fn finish(self) -> Arc<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        for caller in self.callers {
            caller.await.unwrap();
        }
        self.seen
    }
}

/// A rolling restart (SIGTERM, restart on the same ports and data, back in HAProxy) of each of three
/// replicas under a steady load through HAProxy, gRPC and RESP: no gRPC call fails, no Redis command fails
/// once retried as Redis clients retry, no acknowledged key answers `ABSENT`.
#[tokio::test]
#[ignore = "system test: `cargo test -- --include-ignored` runs it, as README and CI do"]
async fn a_rolling_restart_behind_haproxy_fails_no_call() {
    let Some(mut balanced) = Balanced::start().await else {
        return;
    };
    let load = balanced.load().await;
    let libraries = drivers(&balanced.front.to_string()).await;
    let resp_seen = Arc::new(RespSeen::default());
    let resp = tokio::spawn(resp_caller(
        balanced.resp_front,
        Arc::clone(&resp_seen),
        Arc::clone(&load.stop),
    ));
    let benchmark = tokio::spawn(redis_benchmark_runs(
        balanced.resp_front,
        Arc::clone(&load.stop),
    ));
    // Steady state first, 200 Adds of it: what each restart's Add latency is compared with.
    let (steady_from, adds_then) = (Instant::now(), load.seen.adds.load(Ordering::Relaxed));
    wait_until(PATIENCE, "a steady stretch of load", async || {
        (load.seen.adds.load(Ordering::Relaxed) >= adds_then + 200).then_some(())
    })
    .await;
    let steady = load.seen.p99(steady_from..Instant::now(), true);
    let restarts_from = unix_ms();
    for i in 0..3 {
        let server = format!("gate-{}", i + 1);
        let (adds_before, started) = (load.seen.adds.load(Ordering::Relaxed), Instant::now());
        // As a service manager restarts it: SIGTERM, and a new process as soon as the old one exits, without
        // waiting for the balancer — which must not send the new one calls before it is ready either.
        let leaving = balanced.replicas.remove(i);
        leaving.signal("TERM");
        assert!(leaving.exited().await.success(), "{server} exits 0");
        let exited = started.elapsed();
        balanced.restart(i).await;
        eprintln!(
            "rolling restart of {server}: exited {exited:?} after SIGTERM, back UP in HAProxy after {:?}; {} \
             Adds acknowledged meanwhile, Add p99 {:?} (steady: {steady:?})",
            started.elapsed(),
            load.seen.adds.load(Ordering::Relaxed) - adds_before,
            load.seen.p99(started..Instant::now(), true)
        );
    }
    let restarts_to = unix_ms();
    let seen = load.finish().await;
    resp.await.unwrap();
    let benchmark = benchmark.await.unwrap();
    let reports = finish_drivers(libraries).await;
    let failed = seen.failed();
    let false_absent = seen.false_absent.lock().unwrap();
    eprintln!(
        "through HAProxy: {} calls, {} failed, {} false ABSENT; RESP: {} keys added and found, {} commands \
         sent again on a new connection, {} failed",
        seen.calls.lock().unwrap().len(),
        failed.len(),
        false_absent.len(),
        resp_seen.checked.load(Ordering::Relaxed),
        resp_seen.retried.load(Ordering::Relaxed),
        resp_seen.failed.lock().unwrap().len()
    );
    let resp_failed = resp_seen.failed.lock().unwrap();
    assert!(resp_failed.is_empty(), "RESP: {resp_failed:#?}");
    if let Some(runs) = benchmark {
        eprintln!(
            "redis-benchmark through HAProxy: {} runs of 200 BF.ADDs completed, {} ended by a restart: {:?}",
            runs.completed,
            runs.ended.len(),
            runs.ended
        );
        assert!(runs.completed > 0, "no redis-benchmark run completed");
        for end in &runs.ended {
            assert!(
                end.contains("TRYAGAIN the server is shutting down")
                    || end.contains("Server closed the connection"),
                "a redis-benchmark run ended otherwise than by its replica draining: {end:?}"
            );
        }
    }
    assert!(
        resp_seen.checked.load(Ordering::Relaxed) > 100,
        "the RESP caller checked too little"
    );
    assert!(failed.is_empty(), "failed calls: {failed:#?}");
    assert!(
        false_absent.is_empty(),
        "acknowledged keys answered ABSENT: {false_absent:?}"
    );
    // From the first restart on: a library's first calls, before its load was steady, may miss the default
    // 500 ms deadline on a loaded machine while the channel connects (a cold JVM's did).
    for report in reports {
        let during = report.between(restarts_from, restarts_to);
        assert!(
            during.is_empty() && report.false_absent == 0,
            "the {} library, with its default settings, during the restarts: {during:#?} ({} false ABSENT)",
            report.lang,
            report.false_absent
        );
    }
}

/// A replica lost without warning, under a steady load through HAProxy: (b) killed (kill -9) and
/// restarted, (c) paused (SIGSTOP) for 10 s, (d) cut off from NATS for 6 s. Each costs at most the calls in
/// flight on it when it went, and those HAProxy sent it before its checks took it out (one per caller per
/// deadline): at most two per caller, where a balancer that kept sending to it would fail every caller's
/// calls for the whole event. No acknowledged key answers `ABSENT`. Per event: failed calls, p99 latency,
/// and how long HAProxy took to take the replica out.
#[tokio::test]
#[ignore = "system test: `cargo test -- --include-ignored` runs it, as README and CI do"]
async fn losing_a_replica_behind_haproxy_fails_only_the_calls_it_held() {
    let Some(mut balanced) = Balanced::start().await else {
        return;
    };
    let load = balanced.load().await;
    let libraries = drivers(&balanced.front.to_string()).await;
    let mut report = Vec::new();
    for event in [
        "kill -9 and restart",
        "SIGSTOP for 10 s",
        "cut off from NATS for 6 s",
    ] {
        let i = report.len();
        let (started, started_ms) = (Instant::now(), unix_ms());
        match i {
            0 => balanced.replicas.remove(i).kill().await,
            1 => balanced.replicas[i].signal("STOP"),
            _ => balanced.links[i].set(Mode::Silent),
        }
        let out_after = balanced.taken_out(i, started).await;
        match i {
            0 => balanced.restart(i).await,
            1 => {
                tokio::time::sleep(Duration::from_secs(10).saturating_sub(started.elapsed())).await;
                balanced.replicas[i].signal("CONT");
            }
            _ => {
                tokio::time::sleep(Duration::from_secs(6).saturating_sub(started.elapsed())).await;
                balanced.links[i].set(Mode::Pass);
            }
        }
        until_status(&balanced.socket, &format!("gate-{}", i + 1), "UP").await;
        let calls = load.seen.during(started..Instant::now());
        let failed: Vec<String> = calls.iter().filter_map(|c| c.failed.clone()).collect();
        let mut took: Vec<Duration> = calls.iter().map(|c| c.took).collect();
        took.sort();
        let p99 = took.get(took.len() * 99 / 100).copied().unwrap_or_default();
        eprintln!(
            "{event} (gate-{}): {} calls, {} failed, p99 {p99:?}, out of HAProxy after {out_after:?}",
            i + 1,
            calls.len(),
            failed.len()
        );
        report.push((event, failed, (started_ms, unix_ms()), out_after));
    }
    let seen = load.finish().await;
    let libraries = finish_drivers(libraries).await;
    let false_absent = seen.false_absent.lock().unwrap();
    assert!(
        false_absent.is_empty(),
        "acknowledged keys answered ABSENT: {false_absent:?}"
    );
    for (event, failed, (from, to), out_after) in report {
        assert!(
            failed.len() <= 2 * CALLERS,
            "{event}: {} calls failed, more than the {CALLERS} callers' calls in flight and sent before \
             HAProxy took the replica out: {failed:#?}",
            failed.len()
        );
        // A library's four callers, each with the default 500 ms deadline, lose at most the calls they
        // had in flight on the replica and those HAProxy sent it until it took it out: a call a deadline.
        let bound = LIBRARY_CALLERS * (out_after.as_millis() as usize / 500 + 2);
        let why = format!("its callers' in flight and sent until HAProxy took the replica out after {out_after:?}");
        assert_lost_at_most(&libraries, event, (from, to), bound, &why);
    }
    for library in &libraries {
        assert_eq!(library.false_absent, 0, "{library:#?}");
    }
}

/// No balancer: each client library given the three replicas' addresses balances over them itself, under
/// the same events — a rolling restart (SIGTERM, restart, serving again), a replica paused (SIGSTOP) for
/// 10 s, one killed (kill -9) and restarted. The libraries do not watch health: a draining replica serves
/// on, then refuses, which they retry elsewhere; a restarted one holds an `Add` until it is ready, and a
/// paused one answers nothing — each costs a call half its deadline, then the call moves on; a killed one
/// breaks its connections, which they retry. A call fails only when its second attempt misses the half
/// deadline left too (a loaded machine): about the calls in flight on the replica per restart or kill, a
/// few in a 10 s pause. No acknowledged key answers `ABSENT`.
#[tokio::test]
#[ignore = "system test: `cargo test -- --include-ignored` runs it, as README and CI do"]
async fn the_libraries_balancing_by_themselves_ride_out_restarts_pauses_and_kills() {
    let Some(mut balanced) = Balanced::start().await else {
        return;
    };
    let addresses: Vec<String> = balanced
        .launches
        .iter()
        .map(|launch| launch.addresses.unwrap()[0].to_string())
        .collect();
    let libraries = drivers(&addresses.join(",")).await;
    let mut events = Vec::new();
    for i in 0..3 {
        let from = unix_ms();
        let leaving = balanced.replicas.remove(i);
        leaving.signal("TERM");
        assert!(leaving.exited().await.success(), "r{i} exits 0");
        balanced
            .replicas
            .insert(i, balanced.launches[i].start().await);
        balanced.replicas[i].serving().await;
        events.push((
            format!("rolling restart of r{i}"),
            from,
            unix_ms(),
            LIBRARY_CALLERS,
        ));
    }
    let from = unix_ms();
    balanced.replicas[1].signal("STOP");
    tokio::time::sleep(Duration::from_secs(10)).await;
    balanced.replicas[1].signal("CONT");
    balanced.replicas[1].serving().await;
    // Each caller tries the paused replica again once a second (it is marked down for 1 s at a time), and
    // the call's second attempt has half its deadline left, which a loaded machine's replicas at times miss
    // (1–4 calls per library in 10 s here).
    events.push((
        "SIGSTOP of r1 for 10 s".into(),
        from,
        unix_ms(),
        3 * LIBRARY_CALLERS,
    ));
    let from = unix_ms();
    balanced.replicas.remove(2).kill().await;
    balanced
        .replicas
        .insert(2, balanced.launches[2].start().await);
    balanced.replicas[2].serving().await;
    events.push((
        "kill -9 of r2, restarted".into(),
        from,
        unix_ms(),
        LIBRARY_CALLERS,
    ));
    let libraries = finish_drivers(libraries).await;
    for (event, from, to, bound) in events {
        let why = format!("balancing over {addresses:?} itself");
        assert_lost_at_most(&libraries, &event, (from, to), bound, &why);
    }
    for library in &libraries {
        assert_eq!(library.false_absent, 0, "{library:#?}");
    }
}
