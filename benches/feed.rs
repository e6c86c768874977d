//! The feed bench: what `existence-gate feed` delivers on this machine, with real processes — a throwaway
//! PostgreSQL 15 cluster, the gate (in memory) and the feed, all optimised builds on loopback.
//!
//! `cargo bench --bench feed` measures, in about a minute:
//!
//! 1. **steady load**: 100-row insert transactions every 10 ms (10,000 rows/s) for `STEADY`; each row's lag
//!    from its commit (as the inserting client saw it return) to its key reaching the gate (as a
//!    subscriber of the gate's invalidations sees it), and the feed's CPU meanwhile;
//! 2. **throughput**: one transaction of `BULK` rows; rows/s from its commit to its last key in the gate.
//!
//! and writes `benches/results/feed.md`. Everything shares the machine's cores. Under `cargo test --benches`
//! (no `--bench` argument) it does nothing.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use existence_gate::proto::SubscribeInvalidationsRequest;
use existence_gate_testkit::feed::Feed;
use existence_gate_testkit::postgres::Postgres;
use existence_gate_testkit::{procs, text};
use tokio_stream::StreamExt;

/// Rows per transaction and transactions per second of the steady load.
const ROWS_PER_TRANSACTION: i64 = 100;
const TRANSACTION_EVERY: Duration = Duration::from_millis(10);
const STEADY: Duration = Duration::from_secs(20);
/// Rows of the throughput transaction.
const BULK: i64 = 1_000_000;
const CONFIG: &str = "[namespaces.users]\nexpected_keys = 2000000\n";

/// When each key (an id) reached the gate.
type Arrivals = Arc<Mutex<Vec<(i64, Instant)>>>;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("feed bench: run it with `cargo bench --bench feed`");
        return;
    }
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    runtime.block_on(run());
}

async fn run() {
    let started = Instant::now();
    let load_at_start = text::load_average();
    let postgres = Postgres::start().await.expect("PostgreSQL 15 is installed");
    let db = postgres.client().await;
    // The test cluster turns synchronous_commit off for speed; then the WAL writer flushes (and the
    // walsender can send) only every wal_writer_delay, 200 ms, which would be most of the lag measured. A
    // production primary commits synchronously: so do these inserts.
    db.batch_execute(
        "SET synchronous_commit = on; CREATE TABLE users (id bigint PRIMARY KEY, email text)",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let gate = procs::start_gate(&procs::gate_binary(), &config, None);
    let addr = format!("http://{}", gate.addr);
    let arrivals = subscribe(&addr).await;
    let feed = Feed::start(&postgres.dsn(), &addr, &[]).await;
    feed.ready().await;
    let feed_pid = feed.pid();

    println!(
        "steady load: {ROWS_PER_TRANSACTION} rows every {TRANSACTION_EVERY:?} for {STEADY:?}..."
    );
    let cpu_before = procs::cpu_seconds(feed_pid);
    let gate_cpu_before = gate.cpu_seconds();
    let steady_started = Instant::now();
    let mut commits = Vec::new();
    let mut ticks = tokio::time::interval(TRANSACTION_EVERY);
    let mut next = 0;
    while steady_started.elapsed() < STEADY {
        ticks.tick().await;
        insert(&db, next, next + ROWS_PER_TRANSACTION).await;
        commits.push((next, Instant::now()));
        next += ROWS_PER_TRANSACTION;
    }
    let steady_wall = steady_started.elapsed();
    wait_for(&arrivals, next as usize).await;
    let feed_cpu = procs::cpu_seconds(feed_pid) - cpu_before;
    let gate_cpu = gate.cpu_seconds() - gate_cpu_before;
    let mut lags: Vec<Duration> = {
        let arrivals = arrivals.lock().unwrap();
        arrivals
            .iter()
            .map(|(id, at)| {
                let (_, committed) = commits[(*id / ROWS_PER_TRANSACTION) as usize];
                at.saturating_duration_since(committed)
            })
            .collect()
    };
    lags.sort();

    println!("throughput: one transaction of {BULK} rows...");
    arrivals.lock().unwrap().clear();
    let bulk_cpu_before = procs::cpu_seconds(feed_pid);
    insert(&db, 10_000_000, 10_000_000 + BULK).await;
    let committed = Instant::now();
    wait_for(&arrivals, BULK as usize).await;
    let bulk_wall = committed.elapsed();
    let bulk_cpu = procs::cpu_seconds(feed_pid) - bulk_cpu_before;
    feed.kill().await;

    let steady_rows = next as f64;
    let quantile = |q: f64| lags[((lags.len() - 1) as f64 * q) as usize];
    let mut w = String::new();
    let _ = writeln!(w, "# Feed results\n");
    let _ = writeln!(
        w,
        "Measured {} on {} (load average at start: {load_at_start}), `cargo bench --bench feed` ({:.0} s in \
         all). PostgreSQL 15 (a throwaway cluster, `wal_level = logical`, `fsync = off`; the inserts commit with `synchronous_commit = on`), the gate \
         (`--in-memory`) and `existence-gate feed` (defaults: `--batch 1000`, `--linger 5ms`) share the \
         machine's cores, with the load generator. Lag: from the insert's commit returning to the client, \
         to its key's invalidation reaching a subscriber of the gate.\n",
        text::today(),
        text::machine(),
        started.elapsed().as_secs_f64()
    );
    let _ = writeln!(w, "| figure | value |\n|---|---|");
    let rows = [
        (
            "steady load offered".to_string(),
            format!(
                "{} rows in {:.1} s ({:.0} rows/s, {ROWS_PER_TRANSACTION}-row transactions)",
                next,
                steady_wall.as_secs_f64(),
                steady_rows / steady_wall.as_secs_f64()
            ),
        ),
        (
            "**lag p50 / p99 / max**".to_string(),
            format!(
                "**{:.1} ms / {:.1} ms** / {:.1} ms",
                ms(quantile(0.5)),
                ms(quantile(0.99)),
                ms(*lags.last().unwrap())
            ),
        ),
        (
            "feed CPU at that load".to_string(),
            format!(
                "{:.1}% of a core ({:.1} µs per row); the gate: {:.1}% ({:.1} µs per row)",
                feed_cpu / steady_wall.as_secs_f64() * 100.0,
                feed_cpu / steady_rows * 1e6,
                gate_cpu / steady_wall.as_secs_f64() * 100.0,
                gate_cpu / steady_rows * 1e6
            ),
        ),
        (
            "**throughput**: one transaction of rows".to_string(),
            format!(
                "**{} rows/s** ({BULK} rows in {:.2} s after the commit; feed CPU {:.2} µs per row)",
                text::si(BULK as f64 / bulk_wall.as_secs_f64()),
                bulk_wall.as_secs_f64(),
                bulk_cpu / BULK as f64 * 1e6
            ),
        ),
    ];
    for (figure, value) in rows {
        let _ = writeln!(w, "| {figure} | {value} |");
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results/feed.md");
    std::fs::write(&path, &w).expect("writing feed.md");
    println!("\n{w}\nwritten: {}", path.display());
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

async fn insert(db: &tokio_postgres::Client, from: i64, to: i64) {
    db.execute(
        "INSERT INTO users (id) SELECT generate_series($1::bigint, $2::bigint - 1)",
        &[&from, &to],
    )
    .await
    .unwrap();
}

/// Subscribes to `users`'s invalidations: every added key with when it arrived.
async fn subscribe(addr: &str) -> Arrivals {
    let mut client = ExistenceGateClient::connect(addr.to_string())
        .await
        .unwrap();
    let mut stream = client
        .subscribe_invalidations(SubscribeInvalidationsRequest {
            namespace: "users".into(),
            after_seq: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let arrivals: Arrivals = Arc::default();
    let seen = Arc::clone(&arrivals);
    tokio::spawn(async move {
        while let Some(Ok(invalidation)) = stream.next().await {
            let at = Instant::now();
            let mut seen = seen.lock().unwrap();
            for key in &invalidation.keys {
                if let Some(id) = std::str::from_utf8(key).ok().and_then(|k| k.parse().ok()) {
                    seen.push((id, at));
                }
            }
        }
    });
    arrivals
}

/// Waits until `count` keys have arrived.
async fn wait_for(arrivals: &Arrivals, count: usize) {
    existence_gate_testkit::wait_until(
        Duration::from_secs(300),
        &format!("{count} keys to reach the gate"),
        async || (arrivals.lock().unwrap().len() >= count).then_some(()),
    )
    .await;
}
