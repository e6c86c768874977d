//! Bootstrap of a wiped replica: how long a replica with an empty data directory takes from its start to
//! `SERVING` when the stream holds 10,000,000 keys — downloading the shared snapshot, loading it, applying
//! the stream after it, then taking a read lease. Written to `benches/results/replicated-bootstrap.md`.
//!
//! The deployment: one nats-server (an R1 stream) and replicas `r0`, `r1` with data directories and a
//! snapshot every `SNAPSHOT_INTERVAL`. They are filled with `KEYS` keys in 1,000-key Adds; once a snapshot
//! covering the stream's last seq is shared, a few more Adds make a tail for the new replica to apply, and
//! replica `r2` is started with an empty data directory and timed.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use existence_gate::proto::AddRequest;

use crate::deployment::{self, Deployment, NatsSync, Replica, REPLICA_IDS};
use crate::keys::keys;
use crate::text::{load_average, machine, si, today};

/// Keys in the stream when the wiped replica starts.
pub const KEYS: u64 = 10_000_000;
/// Keys per `Add`.
const BATCH: u64 = 1_000;
/// Adds in flight while filling, over the two replicas.
const IN_FLIGHT: usize = 6;
/// 1,000-key Adds written after the shared snapshot: the tail the new replica applies from the stream.
const TAIL_BATCHES: u64 = 200;
const SNAPSHOT_INTERVAL: &str = "5s";
/// Sized for every key at 1%.
const CONFIG: &str = r#"[namespaces.default]
expected_keys = 12000000
false_positive_rate = 0.01
"#;

/// What the run measured.
pub struct Bootstrap {
    fill: Duration,
    snapshot_seq: u64,
    snapshot_bytes: u64,
    stream_seq: u64,
    started_from: u64,
    serving_after: Duration,
    commands: Vec<String>,
    elapsed: Duration,
    load_at_start: String,
}

/// Runs the measurement.
pub async fn run(binary: &std::path::Path) -> Bootstrap {
    let started = Instant::now();
    let load_at_start = load_average();
    println!("bootstrap: starting r0, r1 with data directories...");
    let mut deployment = Deployment::start_with(
        "bootstrap",
        1,
        binary,
        CONFIG,
        &REPLICA_IDS[..2],
        Some(SNAPSHOT_INTERVAL),
        NatsSync::Always,
    )
    .await;
    println!("bootstrap: adding {} keys...", si(KEYS as f64));
    let filling = Instant::now();
    fill(&deployment.replicas, 0, KEYS / BATCH).await;
    let filled_in = filling.elapsed();
    let filled = deployment.last_seq().await;
    println!("bootstrap: waiting for a shared snapshot covering seq {filled}...");
    let snapshot_seq = deployment::wait_until("a shared snapshot of every key", async || {
        let mut shared = 0.0f64;
        for replica in &deployment.replicas {
            shared = shared.max(
                replica
                    .metric("existence_replica_snapshot_shared_seq")
                    .await,
            );
        }
        (shared as u64 >= filled).then_some(shared as u64)
    })
    .await;
    let snapshot_bytes = deployment.snapshot_bytes("r0").unwrap_or(0);
    fill(&deployment.replicas, KEYS, TAIL_BATCHES).await;
    let stream_seq = deployment.last_seq().await;

    println!("bootstrap: starting r2 with an empty data directory...");
    let starting = Instant::now();
    let wiped = deployment.add_replica(REPLICA_IDS[2]);
    wiped.serving().await;
    let serving_after = starting.elapsed();
    let started_from = wiped.metric("existence_replica_start_seq").await as u64;
    Bootstrap {
        fill: filled_in,
        snapshot_seq,
        snapshot_bytes,
        stream_seq,
        started_from,
        serving_after,
        commands: deployment.commands.clone(),
        elapsed: started.elapsed(),
        load_at_start,
    }
}

/// `calls` Adds of `BATCH` keys numbered from `first`, `IN_FLIGHT` at a time over `replicas`.
async fn fill(replicas: &[Replica], first: u64, calls: u64) {
    let next = Arc::new(AtomicU64::new(0));
    let mut writers = tokio::task::JoinSet::new();
    for i in 0..IN_FLIGHT {
        let mut client = replicas[i % replicas.len()].client().await;
        let next = Arc::clone(&next);
        writers.spawn(async move {
            loop {
                let call = next.fetch_add(1, Ordering::Relaxed);
                if call >= calls {
                    return;
                }
                let from = first + call * BATCH;
                let request = AddRequest {
                    namespace: String::new(),
                    keys: keys(from..from + BATCH),
                    ..Default::default()
                };
                client.add(request).await.expect("an Add while filling");
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.expect("a filling task");
    }
}

impl Bootstrap {
    /// The results as markdown.
    pub fn markdown(&self) -> String {
        let mut w = String::new();
        let _ = writeln!(w, "# Bootstrap of a wiped replica\n");
        let _ = writeln!(
            w,
            "Measured {} on {} (load average at start: {}), `cargo bench --bench replicated -- bootstrap` \
             ({:.0} s in all). One nats-server (R1 stream), replicas `r0` and `r1` with data directories and \
             a snapshot every {SNAPSHOT_INTERVAL}; {} keys added in 1,000-key Adds ({IN_FLIGHT} in flight), \
             then a snapshot shared, then {TAIL_BATCHES} more Adds; then `r2` started with an empty data \
             directory. Everything shares the machine's cores.\n",
            today(),
            machine(),
            self.load_at_start,
            self.elapsed.as_secs_f64(),
            si(KEYS as f64),
        );
        let _ = writeln!(w, "| figure | value |\n|---|---|");
        let keys_per_s = KEYS as f64 / self.fill.as_secs_f64();
        let rows = [
            (
                "fill: keys added through r0 and r1".to_string(),
                format!(
                    "{} keys in {:.1} s ({} keys/s)",
                    si(KEYS as f64),
                    self.fill.as_secs_f64(),
                    si(keys_per_s)
                ),
            ),
            (
                "shared snapshot".to_string(),
                format!(
                    "covers seq {}, {:.1} MB",
                    self.snapshot_seq,
                    self.snapshot_bytes as f64 / 1e6
                ),
            ),
            (
                "stream when r2 starts".to_string(),
                format!("last seq {}", self.stream_seq),
            ),
            (
                "r2 started from the snapshot at".to_string(),
                format!(
                    "seq {} (then applied {} stream messages)",
                    self.started_from,
                    self.stream_seq.saturating_sub(self.started_from)
                ),
            ),
            (
                "**r2: start to SERVING**".to_string(),
                format!("**{:.2} s**", self.serving_after.as_secs_f64()),
            ),
        ];
        for (figure, value) in rows {
            let _ = writeln!(w, "| {figure} | {value} |");
        }
        let _ = writeln!(
            w,
            "\nCommands (`$DIR` is the run's temporary directory):\n\n```sh"
        );
        for command in &self.commands {
            let _ = writeln!(w, "{command}");
        }
        let _ = writeln!(w, "```");
        w
    }
}
