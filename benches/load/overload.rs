//! Overload: the gate driven at five times its measured capacity, with and without the in-flight limit.
//!
//! A fleet of crawlers sends packed `BatchMayExist` calls of 50,000 two-byte keys. The gate runs pinned to
//! one core (`taskset`) and this process to the other, so that it can offer five times what the gate can
//! serve: on two shared cores a gRPC client costs about what the server does per small call, and only
//! calls whose bytes are cheap to send and dear to answer (many short keys, each hashed and probed) tilt
//! that ratio far enough. The run:
//!
//! 1. **capacity**: closed loop with as many calls in flight as the limit admits: calls/s served;
//! 2. **5x, limited**: open loop at five times that rate over `OVERLOAD_CONNECTIONS` connections for
//!    `OVERLOAD_FOR`, against `max_in_flight = LIMIT`: how many calls are served and with what latency, how
//!    many are shed and how fast, whether the health check (on its own connection, every 50 ms) answers,
//!    and the server's peak RSS;
//! 3. **5x, unlimited**: the same offered load against a fresh gate whose limit is out of reach, for a
//!    shorter time (its backlog grows without bound, in both processes): what the limit saves.
//!
//! Run with `cargo bench --bench load -- overload`; writes `benches/results/overload.md`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use existence_gate::proto::BatchMayExistRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::drive::{self, Sample};
use crate::procs::{self, Server};

/// Keys per call: large enough that the server's work per call dwarfs the client's.
const OVERLOAD_BATCH: usize = 50_000;
/// The in-flight limit of the limited run: a few calls per core for work this heavy (each call is ~1.4 ms
/// of CPU), so the request thread keeps a fair share of the core for reading, shedding and health checks.
const LIMIT: usize = 4;
/// How many times the measured capacity is offered.
const FACTOR: f64 = 5.0;
/// Connections the offered load is spread over.
const OVERLOAD_CONNECTIONS: usize = 32;
/// Length of the limited run.
const OVERLOAD_FOR: Duration = Duration::from_secs(8);
/// Length of the unlimited run.
const UNLIMITED_FOR: Duration = Duration::from_secs(2);
/// The core the gate is pinned to.
const GATE_CPU: &str = "0";
/// The core this process (the load generator) is pinned to.
const CLIENT_CPU: &str = "1";

fn config(max_in_flight: usize) -> String {
    format!(
        "[limits]\nmax_batch_keys = {OVERLOAD_BATCH}\nmax_key_bytes = 16\nmax_in_flight = {max_in_flight}\n\
         max_concurrent_streams = 1024\n\n[namespaces.default]\nexpected_keys = 1000000\n"
    )
}

/// What a run against one gate measured.
struct Run {
    offered_per_second: f64,
    sample: Sample,
    health: Health,
    peak_rss: u64,
    rss_before: u64,
}

/// Health checks made during a run.
#[derive(Default)]
struct Health {
    latencies: Vec<u64>,
    failures: u64,
}

/// Checks health every 50 ms on its own connection until `stop`.
fn check_health(server: &Server, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Health> {
    let addr = format!("http://{}", server.addr);
    tokio::spawn(async move {
        let channel = tonic::transport::Endpoint::from_shared(addr)
            .expect("a valid address")
            .connect()
            .await
            .expect("a health connection");
        let mut client = HealthClient::new(channel);
        let mut health = Health::default();
        while !stop.load(Ordering::Relaxed) {
            let sent = Instant::now();
            let request = HealthCheckRequest {
                service: String::new(),
            };
            match tokio::time::timeout(Duration::from_secs(1), client.check(request)).await {
                Ok(Ok(reply)) if reply.get_ref().status == 1 => {
                    health.latencies.push(sent.elapsed().as_nanos() as u64)
                }
                _ => health.failures += 1,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        health.latencies.sort_unstable();
        health
    })
}

/// Samples the server's RSS every 50 ms until `stop`; returns the peak.
fn watch_rss(pid: u32, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut peak = 0;
        while !stop.load(Ordering::Relaxed) {
            peak = peak.max(procs::rss_bytes(pid));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        peak
    })
}

/// Packed batches of two-byte keys, none of them added (the added keys are 16 bytes long).
fn short_key_requests() -> Arc<Vec<BatchMayExistRequest>> {
    Arc::new(
        (0..16u32)
            .map(|b| {
                let keys: Vec<Bytes> = (0..OVERLOAD_BATCH as u32)
                    .map(|i| Bytes::copy_from_slice(&((b * 7_919 + i) as u16).to_le_bytes()))
                    .collect();
                BatchMayExistRequest {
                    namespace: "default".to_string(),
                    keys: Vec::new(),
                    packed_keys: crate::keys::pack(&keys),
                    ..Default::default()
                }
            })
            .collect(),
    )
}

/// A gate limited to `max_in_flight`, pinned to one core, with its connections.
async fn start(max_in_flight: usize) -> (Server, crate::Clients, tempfile::NamedTempFile) {
    let file = tempfile::NamedTempFile::new().expect("a temporary file");
    std::fs::write(file.path(), config(max_in_flight)).expect("writing the configuration");
    let server = procs::start_gate(&procs::gate_binary(), file.path(), Some(GATE_CPU));
    let clients = crate::connect_n(&server, OVERLOAD_CONNECTIONS).await;
    crate::fill(&clients, &server, "default", crate::ABSENT / 2, 1_000_000).await;
    (server, clients, file)
}

/// Offers `rate` calls/s of `op` to `server` for `duration`, checking health and RSS meanwhile.
async fn offer(server: &Server, op: &drive::Op, rate: f64, duration: Duration) -> Run {
    let stop = Arc::new(AtomicBool::new(false));
    let health = check_health(server, Arc::clone(&stop));
    let rss = watch_rss(server.pid(), Arc::clone(&stop));
    let rss_before = server.rss_bytes();
    let issued = Arc::new(AtomicU64::new(0));
    let counting = {
        let (op, issued) = (Arc::clone(op), Arc::clone(&issued));
        drive::op(move |c, n| {
            issued.fetch_add(1, Ordering::Relaxed);
            op(c, n)
        })
    };
    let (sample, _) = drive::open_loop(
        rate,
        OVERLOAD_CONNECTIONS,
        duration,
        server.pid(),
        &counting,
    )
    .await;
    let offered_per_second = issued.load(Ordering::Relaxed) as f64 / duration.as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    Run {
        offered_per_second,
        sample,
        health: health.await.expect("the health task panicked"),
        peak_rss: rss.await.expect("the RSS task panicked"),
        rss_before,
    }
}

/// Pins every thread of this process to `CLIENT_CPU`, away from the gate's core.
fn pin_this_process() {
    let pid = std::process::id().to_string();
    let pinned = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", CLIENT_CPU, &pid])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        pinned,
        "taskset could not pin the load generator to cpu {CLIENT_CPU}"
    );
}

/// Runs the overload measurement and writes `benches/results/overload.md`.
pub async fn run() {
    let started = Instant::now();
    pin_this_process();
    println!("overload: gate pinned to cpu {GATE_CPU}, max_in_flight = {LIMIT}, {OVERLOAD_BATCH}-key packed batches");
    let (gate, clients, _config) = start(LIMIT).await;
    let requests = short_key_requests();
    let op = crate::batch_may_exist(&clients, Arc::clone(&requests), OVERLOAD_BATCH);
    // As many calls in flight as the limit admits, one per connection: served, never shed.
    let mut capacity = drive::closed_loop(LIMIT, 1, Duration::from_secs(4), gate.pid(), &op).await;
    capacity.sort();
    let rate = capacity.calls_per_second() * FACTOR;
    println!(
        "  capacity {:.0} calls/s ({} shed); offering {rate:.0}/s for {:?}...",
        capacity.calls_per_second(),
        capacity.errors,
        OVERLOAD_FOR
    );
    let mut limited = offer(&gate, &op, rate, OVERLOAD_FOR).await;
    limited.sample.sort();
    let mut after = drive::closed_loop(LIMIT, 1, Duration::from_secs(2), gate.pid(), &op).await;
    after.sort();
    drop(gate);

    println!("  same offered load without the limit, for {UNLIMITED_FOR:?}...");
    let (gate, clients, _config) = start(1 << 30).await;
    let op = crate::batch_may_exist(&clients, requests, OVERLOAD_BATCH);
    let mut unlimited = offer(&gate, &op, rate, UNLIMITED_FOR).await;
    unlimited.sample.sort();
    drop(gate);

    let markdown = markdown(&capacity, &limited, &after, &unlimited, started.elapsed());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results/overload.md");
    std::fs::write(&path, &markdown).expect("writing overload.md");
    println!("\n{markdown}\nwritten: {}", path.display());
}

fn ms(ns: f64) -> String {
    if ns.is_nan() {
        "–".to_string()
    } else {
        format!("{:.1} ms", ns / 1e6)
    }
}

fn percentile_ns(sorted: &[u64], p: f64) -> f64 {
    drive::percentile_us(sorted, p) * 1_000.0
}

fn run_row(w: &mut String, what: &str, run: &Run) {
    let s = &run.sample;
    let _ = writeln!(
        w,
        "| {what} | {:.0} | {:.0} ({:.0}%) | {} / {} / {} | {:.0} | {} / {} | {} | {} / {} ({} failed) | {:.0} → {:.0} MB | {:.2} / {:.2} |",
        run.offered_per_second,
        s.calls_per_second(),
        s.calls as f64 * 100.0 / (s.calls + s.refusals.len() as u64 + s.errors).max(1) as f64,
        ms(percentile_ns(&s.latencies, 0.5)),
        ms(percentile_ns(&s.latencies, 0.99)),
        ms(percentile_ns(&s.latencies, 0.999)),
        s.refusals.len() as f64 / s.wall,
        ms(percentile_ns(&s.refusals, 0.5)),
        ms(percentile_ns(&s.refusals, 0.99)),
        s.errors,
        ms(percentile_ns(&run.health.latencies, 0.99)),
        ms(run.health.latencies.last().map_or(f64::NAN, |&l| l as f64)),
        run.health.failures,
        run.rss_before as f64 / 1e6,
        run.peak_rss as f64 / 1e6,
        s.server_cores(),
        s.client_cpu / s.wall,
    );
}

fn markdown(
    capacity: &Sample,
    limited: &Run,
    after: &Sample,
    unlimited: &Run,
    took: Duration,
) -> String {
    let mut w = String::new();
    let _ = writeln!(w, "# Overload results\n");
    let _ = writeln!(
        w,
        "`cargo bench --bench load -- overload`, {} — the gate's release binary pinned to cpu {GATE_CPU} \
         (`taskset`), the load generator in the harness process pinned to cpu {CLIENT_CPU}; `BatchMayExist` \
         calls of {OVERLOAD_BATCH} two-byte keys with `packed_keys` over {OVERLOAD_CONNECTIONS} connections, open loop at {FACTOR}x the capacity \
         measured first; the run took {:.0} s.\n",
        crate::text::today(),
        took.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "Capacity (closed loop, {LIMIT} connections × 1 call in flight, the limit): **{:.0} calls/s** = {:.2}M keys/s \
         on one core, p50 {} / p99 {}, {} errors.\n",
        capacity.calls_per_second(),
        capacity.keys_per_second() / 1e6,
        ms(percentile_ns(&capacity.latencies, 0.5)),
        ms(percentile_ns(&capacity.latencies, 0.99)),
        capacity.errors
    );
    let _ = writeln!(
        w,
        "| run | offered calls/s | served calls/s (share) | served p50 / p99 / p99.9 | shed/s | shed p50 / p99 | other errors | health p99 / max | server RSS | cores busy: server / client |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    run_row(
        &mut w,
        &format!(
            "{FACTOR}x, `max_in_flight = {LIMIT}`, {} s",
            OVERLOAD_FOR.as_secs()
        ),
        limited,
    );
    run_row(
        &mut w,
        &format!("{FACTOR}x, no limit, {} s", UNLIMITED_FOR.as_secs()),
        unlimited,
    );
    let _ = writeln!(
        w,
        "\nAfter the limited run the same gate served {:.0} calls/s closed loop again (p99 {}, {} errors).",
        after.calls_per_second(),
        ms(percentile_ns(&after.latencies, 0.99)),
        after.errors
    );
    w
}
