//! `cargo bench --bench replicated -- mirrors`: what mirrors cost a replica. An R1 deployment (one
//! nats-server, three replicas, the default 100 ms read lease) with `[mirrors]` on; 0, 10 and 100 Rust mirrors
//! of `acks` attached to r0, in this process. For each count:
//! - **at rest**: r0's CPU over a few seconds with no `Add`s — the mirrors' sub-lease renewals (a replica's
//!   sub-leases last at most what its read lease has left, so each mirror asks every 20–25 ms);
//! - **`Add`s**: single-key `Add`s one after another, alternating between a writer on r0 (whose own `Add`s
//!   wait for its mirrors before they are acknowledged) and a writer on r1 (whose `Add`s wait for r0's
//!   report, which r0 holds back until its mirrors applied them): p50 and p99 of each, and r0's CPU per
//!   `Add` on top of what it spends at rest.
//!
//! Writes `benches/results/replicated-mirrors.md`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use existence_gate_client::{ClientOptions, GateClient, Mirror, MirrorOptions};

use crate::deployment::{Deployment, Replica};
use crate::text::{load_average, machine, today};

/// Mirror counts measured.
const MIRROR_COUNTS: [usize; 3] = [0, 10, 100];
/// `Add`s per writer per count.
const ADDS: usize = 1_000;
/// How long r0's CPU is read at rest.
const AT_REST: Duration = Duration::from_secs(3);

const CONFIG: &str = r#"[mirrors]
max_per_namespace = 128
sublease = "1s"

[namespaces.acks]
expected_keys = 1000000
"#;

/// One mirror count's figures.
struct Row {
    mirrors: usize,
    /// r0's CPU share at rest (CPU seconds per second).
    at_rest: f64,
    /// Sorted latencies in µs, through r0 and through r1.
    through: [Vec<f64>; 2],
    /// r0's CPU seconds per `Add` (both writers), less its CPU at rest over the same time.
    cpu_per_add: f64,
}

fn client(replica: &Replica) -> GateClient {
    let options = ClientOptions {
        deadline: Duration::from_secs(10),
        ..ClientOptions::namespace("acks")
    };
    GateClient::new([replica.server.addr.to_string()], options).expect("a client")
}

async fn held(mirror: &Mirror) {
    while !mirror.holds_sublease() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Measures every mirror count on a deployment of `binary`; returns the report.
pub async fn run(binary: &Path) -> String {
    let started = Instant::now();
    let load_at_start = load_average();
    let deployment = Deployment::start("R1", 1, binary, CONFIG).await;
    let (r0, r1) = (&deployment.replicas[0], &deployment.replicas[1]);
    let writers = [client(r0), client(r1)];
    let attaching = client(r0);
    let mut rows = Vec::new();
    for (round, mirrors) in MIRROR_COUNTS.into_iter().enumerate() {
        println!("{mirrors} mirrors of r0...");
        let attached: Vec<Mirror> = (0..mirrors)
            .map(|_| {
                attaching
                    .mirror(MirrorOptions::default())
                    .expect("a mirror")
            })
            .collect();
        for mirror in &attached {
            held(mirror).await;
        }
        let rest_cpu = r0.server.cpu_seconds();
        tokio::time::sleep(AT_REST).await;
        let at_rest = (r0.server.cpu_seconds() - rest_cpu) / AT_REST.as_secs_f64();
        let (cpu, begun) = (r0.server.cpu_seconds(), Instant::now());
        let mut through = [Vec::with_capacity(ADDS), Vec::with_capacity(ADDS)];
        for i in 0..ADDS {
            for (w, writer) in writers.iter().enumerate() {
                let key = Bytes::from(format!("ack-{round}-{w}-{i}"));
                let sent = Instant::now();
                writer.add([key]).await.expect("an Add");
                through[w].push(sent.elapsed().as_secs_f64() * 1e6);
            }
        }
        let busy = r0.server.cpu_seconds() - cpu - at_rest * begun.elapsed().as_secs_f64();
        through.iter_mut().for_each(|l| l.sort_by(f64::total_cmp));
        rows.push(Row {
            mirrors,
            at_rest,
            through,
            cpu_per_add: busy / (2 * ADDS) as f64,
        });
    }
    markdown(&rows, &load_at_start, started.elapsed())
}

fn markdown(rows: &[Row], load_at_start: &str, elapsed: Duration) -> String {
    let mut w = String::new();
    let _ = writeln!(
        w,
        "# Mirrors of a replica\n\n`cargo bench --bench replicated -- mirrors`, {} on {}; load average \
         {load_at_start} at the start; {:.0} s in all. One nats-server (R1 stream, `sync_interval: always`), \
         three replicas with the default 100 ms read lease and `[mirrors]` on (`sublease = \"1s\"`, capped by \
         the lease); 0, 10 and 100 Rust mirrors of `acks` attached to r0, in the harness's process; {ADDS} \
         single-key `Add`s through r0 and as many through r1, alternating, one at a time. Everything shares \
         the machine's 2 cores.\n",
        today(),
        machine(),
        elapsed.as_secs_f64(),
    );
    let _ = writeln!(
        w,
        "| mirrors of r0 | r0's CPU at rest | `Add` through r0: p50 / p99 | through r1: p50 / p99 | r0's CPU \
         per `Add` | per `Add` per mirror |\n|---:|---:|---:|---:|---:|---:|"
    );
    let base = rows.first().map_or(0.0, |r| r.cpu_per_add);
    for row in rows {
        let [r0, r1] = &row.through;
        let per_mirror = match row.mirrors {
            0 => "—".to_string(),
            n => format!("{:.1} µs", (row.cpu_per_add - base) * 1e6 / n as f64),
        };
        let _ = writeln!(
            w,
            "| {} | {:.1} % | {:.0} / {:.0} µs | {:.0} / {:.0} µs | {:.1} µs | {per_mirror} |",
            row.mirrors,
            row.at_rest * 100.0,
            percentile(r0, 0.5),
            percentile(r0, 0.99),
            percentile(r1, 0.5),
            percentile(r1, 0.99),
            row.cpu_per_add * 1e6,
        );
    }
    w
}
