//! Mirrors: what a lookup costs when a mirror answers it in-process, what attaching costs, and what mirrors
//! cost the gate's `Add`s.
//!
//! The gate is the bench-profile binary with mirrors on and `default` filled with 10M keys at 1%, as in the
//! main run. Measured in one run:
//! - **attach**: from `GateClient::mirror` until the mirror holds a sub-lease, and this process's resident
//!   memory before and after (three attachments, one at a time);
//! - **lookups**: `Mirror::absent_locally` for keys never added (answered `ABSENT` locally) and for added
//!   keys (the copy says "may exist"), one thread, the sub-lease check included, and `absent_locally_many`
//!   in batches; the same library's RPC path
//!   (64 callers, coalesced) for keys never added, with the gate's CPU per lookup; `BF.EXISTS` pipelined 16
//!   deep against RedisBloom when its module is at hand (`EXISTENCE_GATE_REDISBLOOM_MODULE`);
//! - **`Add`s** with 0, 10 and 100 mirrors attached to a namespace: one writer's single-key `Add`s, their
//!   p50 and p99 as the writer sees them, and the gate's CPU per `Add` (what each mirror adds to it).
//!
//! Run with `cargo bench --bench load -- mirror`; writes `benches/results/mirror.md`.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use existence_gate_client::{ClientOptions, GateClient, Mirror, MirrorOptions};

use crate::procs::{self, Server};
use crate::{keys, text, ABSENT, FALSE_POSITIVE_RATE, FILLED_KEYS, PRESENT};

/// Lookups per measured pass of the mirror.
const LOOKUPS: usize = 1 << 20;
/// Passes, each over the same keys; the median is reported.
const PASSES: usize = 7;
/// Keys per `absent_locally_many`.
const BATCH: usize = 64;
/// Callers of the RPC path.
const CALLERS: usize = 64;
/// How long the RPC path is driven per round.
const RPC_STRETCH: Duration = Duration::from_secs(3);
/// `Add`s per mirror count.
const ADDS: usize = 2_000;
/// The namespace the `Add` rows write to (small, so that 100 copies fit in this process easily).
const ACKS_KEYS: u64 = 1_000_000;
/// Mirror counts of the `Add` rows.
const MIRROR_COUNTS: [usize; 3] = [0, 10, 100];

fn config() -> String {
    format!(
        r#"[mirrors]
max_per_namespace = 128
sublease = "1s"

[namespaces.default]
expected_keys = {FILLED_KEYS}
false_positive_rate = {FALSE_POSITIVE_RATE}

[namespaces.acks]
expected_keys = {ACKS_KEYS}
"#
    )
}

fn client(server: &Server, namespace: &str, deadline: Duration) -> GateClient {
    let options = ClientOptions {
        deadline,
        ..ClientOptions::namespace(namespace)
    };
    GateClient::new([server.addr.to_string()], options).expect("a client")
}

fn own_rss() -> u64 {
    procs::status_bytes(std::process::id(), "VmRSS")
}

async fn until_held(mirror: &Mirror) {
    while !mirror.holds_sublease() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Nanoseconds per call of `lookup` over `keys`: the median of [`PASSES`], with how many answered true.
fn per_lookup_ns(keys: &[Bytes], lookup: impl Fn(&[u8]) -> bool) -> (f64, usize) {
    let mut passes = Vec::new();
    let mut hits = 0;
    for _ in 0..PASSES {
        let started = Instant::now();
        hits = keys.iter().filter(|k| lookup(k)).count();
        passes.push(started.elapsed().as_nanos() as f64 / keys.len() as f64);
    }
    passes.sort_by(f64::total_cmp);
    (passes[PASSES / 2], hits)
}

/// Nanoseconds per key of `Mirror::absent_locally_many` over `keys` in batches of [`BATCH`]: the median of
/// [`PASSES`], with how many answered `ABSENT`.
fn per_key_in_batches_ns(keys: &[Bytes], mirror: &Mirror) -> (f64, usize) {
    let mut passes = Vec::new();
    let mut hits = 0;
    for _ in 0..PASSES {
        let started = Instant::now();
        hits = keys
            .chunks(BATCH)
            .map(|batch| {
                mirror
                    .absent_locally_many(batch)
                    .iter()
                    .filter(|a| **a)
                    .count()
            })
            .sum();
        passes.push(started.elapsed().as_nanos() as f64 / keys.len() as f64);
    }
    passes.sort_by(f64::total_cmp);
    (passes[PASSES / 2], hits)
}

/// The RPC path: `CALLERS` callers looking up `pool`'s keys through `client` for `RPC_STRETCH`: lookups,
/// seconds, this process's CPU and the gate's.
async fn rpc_lookups(
    client: &GateClient,
    gate: &Server,
    pool: &Arc<Vec<Bytes>>,
) -> (u64, f64, f64, f64) {
    let done = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let (own, server) = (procs::own_cpu_seconds(), gate.cpu_seconds());
    let started = Instant::now();
    let callers: Vec<_> = (0..CALLERS)
        .map(|c| {
            let (client, pool, done, count) = (
                client.clone(),
                Arc::clone(pool),
                Arc::clone(&done),
                Arc::clone(&count),
            );
            tokio::spawn(async move {
                let mut i = c;
                while !done.load(Ordering::Relaxed) {
                    client
                        .may_exist(pool[i % pool.len()].clone())
                        .await
                        .expect("a lookup");
                    count.fetch_add(1, Ordering::Relaxed);
                    i += CALLERS;
                }
            })
        })
        .collect();
    tokio::time::sleep(RPC_STRETCH).await;
    done.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await.expect("a caller");
    }
    (
        count.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64(),
        procs::own_cpu_seconds() - own,
        gate.cpu_seconds() - server,
    )
}

/// One writer's `count` single-key `Add`s to `acks`: sorted latencies in µs, and the gate's CPU seconds.
async fn adds(writer: &GateClient, gate: &Server, round: usize) -> (Vec<f64>, f64) {
    let server = gate.cpu_seconds();
    let mut latencies = Vec::with_capacity(ADDS);
    for i in 0..ADDS {
        let key = Bytes::from(format!("ack-{round}-{i}"));
        let started = Instant::now();
        writer.add([key]).await.expect("an Add");
        latencies.push(started.elapsed().as_secs_f64() * 1e6);
    }
    latencies.sort_by(f64::total_cmp);
    (latencies, gate.cpu_seconds() - server)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub async fn run() {
    let started = Instant::now();
    let load_at_start = text::load_average();
    let gate = crate::filled_gate(&config()).await;
    let mut out = String::new();

    println!("attaching mirrors of 10M keys...");
    let lookups = client(&gate, "default", Duration::from_millis(500));
    let mut attach = Vec::new();
    let mut mirror: Option<Mirror> = None;
    for _ in 0..3 {
        drop(mirror.take());
        let rss = own_rss();
        let begun = Instant::now();
        let attached = lookups.mirror(MirrorOptions::default()).expect("a mirror");
        until_held(&attached).await;
        attach.push((
            begun.elapsed().as_secs_f64() * 1e3,
            own_rss().saturating_sub(rss),
        ));
        mirror = Some(attached);
    }
    let mirror = mirror.expect("attached");

    println!("lookups: the mirror, the RPC path...");
    let absent = keys((0..LOOKUPS as u64).map(|i| ABSENT + i));
    let present = keys((0..LOOKUPS as u64).map(|i| PRESENT + i * 7 % FILLED_KEYS));
    let (absent_ns, absent_hits) = per_lookup_ns(&absent, |k| mirror.absent_locally(k));
    let (present_ns, present_hits) = per_lookup_ns(&present, |k| mirror.absent_locally(k));
    let (batch_ns, batch_hits) = per_key_in_batches_ns(&absent, &mirror);
    let pool = Arc::new(absent[..1 << 16].to_vec());
    let (rpc_count, rpc_seconds, rpc_own, rpc_server) = rpc_lookups(&lookups, &gate, &pool).await;
    let redisbloom = crate::resp::exists_pipelined_16().await;

    println!("Adds with 0, 10 and 100 mirrors attached...");
    let writer = client(&gate, "acks", Duration::from_secs(10));
    let mut add_rows = Vec::new();
    for (round, mirrors) in MIRROR_COUNTS.into_iter().enumerate() {
        let attached: Vec<Mirror> = (0..mirrors)
            .map(|_| writer.mirror(MirrorOptions::default()).expect("a mirror"))
            .collect();
        for mirror in &attached {
            until_held(mirror).await;
        }
        let (latencies, cpu) = adds(&writer, &gate, round).await;
        add_rows.push((mirrors, latencies, cpu));
    }

    let stats = crate::stats(&gate, "default").await;
    writeln!(
        out,
        "# Mirrors\n\n`cargo bench --bench load -- mirror`, {} on {}; load average {load_at_start} at the \
         start; {:.0} s in all. The gate's bench-profile binary (`--in-memory`, `[mirrors]` on, sub-leases of \
         1 s) with `default` holding {FILLED_KEYS} keys at 1% ({} filter bytes); the mirrors and callers in \
         this process, on the same 2-core machine.\n",
        text::today(),
        text::machine(),
        started.elapsed().as_secs_f64(),
        stats.filter_bytes,
    )
    .unwrap();
    writeln!(out, "## Attaching a mirror of 10M keys\n\n| attachment | until it holds a sub-lease | this process's resident memory grew by |\n|---|---:|---:|").unwrap();
    for (i, (ms, rss)) in attach.iter().enumerate() {
        writeln!(
            out,
            "| {} | {ms:.0} ms | {:.1} MB |",
            i + 1,
            *rss as f64 / 1e6
        )
        .unwrap();
    }
    writeln!(
        out,
        "\n(Each attachment drops the one before; the copy is the filter's bytes, {:.1} MB.)\n",
        stats.filter_bytes as f64 / 1e6
    )
    .unwrap();
    let rpc_per_lookup = |seconds: f64| seconds * 1e9 / rpc_count as f64;
    writeln!(out, "## Lookups\n\n| how | per lookup | lookups per second per core | answered ABSENT |\n|---|---:|---:|---:|").unwrap();
    writeln!(
        out,
        "| mirror, key never added (`absent_locally`, sub-lease check included) | **{absent_ns:.1} ns** | {:.1}M | {:.1}% |",
        1e3 / absent_ns,
        100.0 * absent_hits as f64 / LOOKUPS as f64
    )
    .unwrap();
    writeln!(
        out,
        "| mirror, keys never added, {BATCH} at a time (`absent_locally_many`) | {batch_ns:.1} ns per key | {:.1}M | {:.1}% |",
        1e3 / batch_ns,
        100.0 * batch_hits as f64 / LOOKUPS as f64
    )
    .unwrap();
    writeln!(
        out,
        "| mirror, key added (the copy says \"may exist\": the caller asks the gate) | {present_ns:.1} ns | {:.1}M | {:.1}% |",
        1e3 / present_ns,
        100.0 * present_hits as f64 / LOOKUPS as f64
    )
    .unwrap();
    writeln!(
        out,
        "| the same library's RPC path, {CALLERS} callers coalesced, key never added | {:.0} ns of this process's CPU + {:.0} ns of the gate's ({:.0} ns wall per lookup across callers) | {:.2}M (both sides' CPU) | |",
        rpc_per_lookup(rpc_own),
        rpc_per_lookup(rpc_server),
        rpc_per_lookup(rpc_seconds),
        rpc_count as f64 / (rpc_own + rpc_server) / 1e6,
    )
    .unwrap();
    match redisbloom {
        Some((server_us, keys_per_second)) => writeln!(
            out,
            "| `BF.EXISTS` pipelined 16 deep, 8 connections, RedisBloom (server CPU only) | {:.0} ns of RedisBloom's CPU | {:.2}M (server CPU) | |",
            server_us * 1e3,
            keys_per_second / 1e6,
        )
        .unwrap(),
        None => writeln!(out, "| `BF.EXISTS` pipelined, RedisBloom | not measured: `EXISTENCE_GATE_REDISBLOOM_MODULE` names no module | | |").unwrap(),
    }
    writeln!(out, "\n## `Add`s with mirrors attached\n\nOne writer, {ADDS} single-key `Add`s one after another to `acks` ({ACKS_KEYS} keys), each mirror in this process acknowledging them.\n\n| mirrors | p50 | p99 | gate CPU per `Add` | per mirror |\n|---:|---:|---:|---:|---:|").unwrap();
    let base_cpu = add_rows[0].2 / ADDS as f64;
    for (mirrors, latencies, cpu) in &add_rows {
        let per_add = cpu / ADDS as f64;
        let per_mirror = match mirrors {
            0 => "".to_string(),
            m => format!("{:.1} µs", (per_add - base_cpu) * 1e6 / *m as f64),
        };
        writeln!(
            out,
            "| {mirrors} | {:.0} µs | {:.0} µs | {:.1} µs | {per_mirror} |",
            percentile(latencies, 0.5),
            percentile(latencies, 0.99),
            per_add * 1e6,
        )
        .unwrap();
    }
    println!("\n{out}");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results/mirror.md");
    std::fs::write(&path, out).expect("writing the results");
    println!("written: {}", path.display());
}
