//! Durability figures: durable `Add` throughput per sync mode, recovery time and peak memory, snapshot time
//! and its effect on concurrent lookup latency.
//!
//! `cargo bench --bench durability` prints one table. Everything runs in-process against the core and the
//! real write-ahead log on the local disk (gRPC costs are measured by the load harness), so the figures say
//! what the log and the filter cost. Recovery is measured in a fresh child process (this binary re-run with
//! `recover DIR KEYS`) so its peak RSS is recovery's alone.
//!
//! `EXISTENCE_BENCH_BIG=1` adds the 100M-key recovery case (a ~125 MB filter; about a minute to build).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use existence_gate::core::clock::SystemClock;
use existence_gate::core::config::GateConfig;
use existence_gate::core::gate::Gate;
use existence_gate::core::hashing::KeyHasher;
use existence_gate::storage::{self, DataDir, Snapshotter, SyncMode};

const BATCH: usize = 1_000;
const WRITERS: usize = 4;
const THROUGHPUT_SECONDS: u64 = 3;

fn config(expected_keys: u64) -> GateConfig {
    GateConfig::from_toml(&format!(
        "[namespaces.default]\nexpected_keys = {expected_keys}"
    ))
    .unwrap()
}

/// A gate on `dir` with its log opened.
fn open(
    dir: &Path,
    expected_keys: u64,
    mode: SyncMode,
) -> (Arc<Gate>, Arc<storage::Wal>, Arc<DataDir>) {
    let data_dir = Arc::new(DataDir::open(dir).unwrap());
    let gate = Arc::new(Gate::new(
        &config(expected_keys),
        KeyHasher::from_seed(data_dir.seed()),
        Arc::new(SystemClock),
    ));
    let (wal, _) = storage::recover(&data_dir, &gate, mode).unwrap();
    let wal = Arc::new(wal);
    gate.open(wal.clone());
    (gate, wal, data_dir)
}

fn batch(writer: usize, n: u64) -> Vec<Bytes> {
    (0..BATCH as u64)
        .map(|i| {
            let mut key = [0u8; 16];
            key[..8].copy_from_slice(&(n * BATCH as u64 + i).to_le_bytes());
            key[8..].copy_from_slice(&(writer as u64).to_le_bytes());
            Bytes::copy_from_slice(&key)
        })
        .collect()
}

/// Keys per second added by `WRITERS` threads in batches of 1,000 under `mode`.
fn add_throughput(mode: SyncMode) -> f64 {
    let temp = tempfile::tempdir().unwrap();
    let (gate, _, _) = open(temp.path(), 100_000_000, mode);
    let stop = Arc::new(AtomicBool::new(false));
    let added = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (gate, stop, added) = (gate.clone(), stop.clone(), added.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    gate.add("default", batch(w, n)).unwrap();
                    added.fetch_add(BATCH as u64, Ordering::Relaxed);
                    n += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(THROUGHPUT_SECONDS));
    stop.store(true, Ordering::Relaxed);
    threads.into_iter().for_each(|t| t.join().unwrap());
    added.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// Fills a data directory with `keys` keys and a snapshot of them (plus a short log tail).
fn prepare(dir: &Path, keys: u64) {
    let (gate, wal, data_dir) = open(dir, keys, SyncMode::Never);
    let threads: Vec<_> = (0..2)
        .map(|w| {
            let gate = gate.clone();
            std::thread::spawn(move || {
                for n in 0..keys / BATCH as u64 / 2 {
                    gate.add("default", batch(w, n)).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    Snapshotter::new(data_dir, wal.clone()).take(&gate).unwrap();
    for n in 0..100 {
        gate.add("default", batch(9, n)).unwrap();
    }
    wal.sync_now().unwrap();
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Child mode: recover `dir` and print `seconds peak_rss_mb`.
fn recover_child(dir: &Path, keys: u64) {
    let data_dir = DataDir::open(dir).unwrap();
    let gate = Gate::new(
        &config(keys),
        KeyHasher::from_seed(data_dir.seed()),
        Arc::new(SystemClock),
    );
    let started = Instant::now();
    let (_, recovered) = storage::recover(&data_dir, &gate, SyncMode::Never).unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    assert!(recovered.snapshot.is_some());
    println!("{elapsed} {}", peak_rss_mb());
}

/// (seconds, peak RSS MB, snapshot MB) of recovering `keys` keys in a fresh process.
fn recovery(keys: u64) -> (f64, f64, f64) {
    let temp = tempfile::tempdir().unwrap();
    prepare(temp.path(), keys);
    let snapshot_bytes: u64 = std::fs::read_dir(temp.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("snapshot-"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "recover",
            &temp.path().display().to_string(),
            &keys.to_string(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let mut fields = text.split_whitespace().map(|f| f.parse::<f64>().unwrap());
    (
        fields.next().expect("recovery seconds"),
        fields.next().expect("peak rss"),
        snapshot_bytes as f64 / 1e6,
    )
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize] as f64 / 1_000.0
}

/// MayExist latency percentiles (µs) on one thread without and during back-to-back snapshots, and the
/// snapshot time.
fn snapshot_effect(keys: u64) -> ([f64; 2], [f64; 2], f64) {
    let temp = tempfile::tempdir().unwrap();
    prepare(temp.path(), keys);
    let (gate, wal, data_dir) = open(temp.path(), keys, SyncMode::Never);
    let snapshots = Arc::new(Snapshotter::new(data_dir, wal));
    let measure = |gate: &Gate, for_how_long: Duration| {
        let mut latencies = Vec::new();
        let started = Instant::now();
        let mut i = 0u64;
        while started.elapsed() < for_how_long {
            let key = (i * 7_919).to_le_bytes();
            let t = Instant::now();
            let _ = gate.may_exist("default", &key).unwrap();
            latencies.push(t.elapsed().as_nanos() as u64);
            i += 1;
        }
        latencies.sort_unstable();
        [percentile(&latencies, 0.5), percentile(&latencies, 0.99)]
    };
    let quiet = measure(&gate, Duration::from_secs(2));
    let busy = Arc::new(AtomicBool::new(true));
    let snapshot_times = Arc::new(std::sync::Mutex::new(Vec::new()));
    let snapshotter = {
        let (gate, snapshots, busy, times) = (
            gate.clone(),
            snapshots.clone(),
            busy.clone(),
            snapshot_times.clone(),
        );
        std::thread::spawn(move || {
            while busy.load(Ordering::Relaxed) {
                let taken = snapshots.take(&gate).unwrap();
                times.lock().unwrap().push(taken.elapsed.as_secs_f64());
            }
        })
    };
    let during = measure(&gate, Duration::from_secs(2));
    busy.store(false, Ordering::Relaxed);
    snapshotter.join().unwrap();
    let mut times = snapshot_times.lock().unwrap().clone();
    times.sort_by(f64::total_cmp);
    (quiet, during, times[times.len() / 2])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("recover") {
        return recover_child(Path::new(&args[2]), args[3].parse().unwrap());
    }
    if args.iter().any(|a| a == "--test" || a == "--list") {
        return; // `cargo test --benches` smoke: nothing to verify here.
    }
    println!("durable Add, {WRITERS} writer threads, batches of {BATCH} 16-byte keys, {THROUGHPUT_SECONDS} s each:");
    for (name, mode) in [
        ("always", SyncMode::Always),
        (
            "interval 100ms",
            SyncMode::Interval(Duration::from_millis(100)),
        ),
        ("never", SyncMode::Never),
    ] {
        println!("  --sync {name:<15} {:>12.0} keys/s", add_throughput(mode));
    }
    let mut sizes = vec![10_000_000u64];
    if std::env::var("EXISTENCE_BENCH_BIG").is_ok() {
        sizes.push(100_000_000);
    }
    println!("recovery (newest snapshot + 100-batch log tail), fresh process:");
    for keys in sizes {
        let (seconds, rss, snapshot_mb) = recovery(keys);
        println!(
            "  {keys:>11} keys: {seconds:.3} s, peak RSS {rss:.0} MB, snapshot {snapshot_mb:.1} MB"
        );
    }
    let (quiet, during, snapshot_seconds) = snapshot_effect(10_000_000);
    println!("snapshot of 10M keys: {snapshot_seconds:.3} s (median)");
    println!(
        "MayExist on one thread: p50 {:.2} µs / p99 {:.2} µs quiet; p50 {:.2} µs / p99 {:.2} µs during back-to-back snapshots (p99 ratio {:.2}x)",
        quiet[0],
        quiet[1],
        during[0],
        during[1],
        during[1] / quiet[1]
    );
}
