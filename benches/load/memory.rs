//! The gate's memory after 10M keys, part by part, beside RedisBloom's holding the same keys.
//!
//! Both servers get the same 10M keys at 1% (`default` in the gate, `BF.RESERVE default 0.01 10000000` in
//! Redis with the RedisBloom module `EXISTENCE_GATE_REDISBLOOM_MODULE` names loaded; without it RedisBloom's
//! column is left out), through `BF.MADD`s of 1,000 keys on each one's RESP port. Two gates: one with the
//! default replay buffer (half the filter) and one with `replay_buffer_bytes = 16777216`, the fixed default
//! before it. After the fill settles (1 s), each process's `VmRSS`, `RssAnon` and `RssFile` are read from
//! `/proc/<pid>/status`, the gate's breakdown from `Admin.Stats`, RedisBloom's filter from `BF.INFO`.
//!
//! Run with `cargo bench --bench load -- memory`; writes `benches/results/memory.md`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use existence_gate::proto::admin_client::AdminClient;
use existence_gate::proto::{MemoryStats, StatsRequest};

use crate::procs;
use crate::resp;

/// The keys in each filter.
const FILLED: u64 = resp::FILLED;

/// The resident figures of a process, in bytes.
#[derive(Clone, Copy)]
struct Resident {
    total: u64,
    anon: u64,
    file: u64,
}

fn resident(pid: u32) -> Resident {
    Resident {
        total: procs::status_bytes(pid, "VmRSS"),
        anon: procs::status_bytes(pid, "RssAnon"),
        file: procs::status_bytes(pid, "RssFile"),
    }
}

/// A gate filled with the keys, its resident figures and its own breakdown.
async fn gate(name: &str, extra_config: &str) -> (Resident, MemoryStats) {
    let config = tempfile::NamedTempFile::new().expect("a temporary file");
    std::fs::write(
        config.path(),
        format!(
            "{extra_config}\n[namespaces.default]\nexpected_keys = {FILLED}\nfalse_positive_rate = 0.01\n"
        ),
    )
    .expect("writing the configuration");
    let gate = procs::start_gate(&procs::gate_binary(), config.path(), None);
    println!("filling the gate ({name})...");
    resp::fill(&gate, FILLED).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let memory = AdminClient::connect(format!("http://{}", gate.addr))
        .await
        .expect("the admin service")
        .stats(StatsRequest::default())
        .await
        .expect("Stats")
        .into_inner()
        .memory
        .expect("the memory breakdown");
    (resident(gate.pid()), memory)
}

/// RedisBloom filled with the keys: its resident figures and `BF.INFO`'s size of the filter.
async fn redisbloom() -> Option<(Resident, u64)> {
    let module = procs::redisbloom_module()
        .map_err(|why| eprintln!("{why}"))
        .ok()?;
    let module_path = module.to_string_lossy().to_string();
    let server = procs::start_redis_with(&["--loadmodule", &module_path])?;
    let mut connection = resp::connect(&server).await;
    let () = redis::cmd("BF.RESERVE")
        .arg(&["default", "0.01", &FILLED.to_string()])
        .query_async(&mut connection)
        .await
        .expect("BF.RESERVE");
    println!("filling RedisBloom...");
    resp::fill(&server, FILLED).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // RedisBloom 2.6.9 answers `BF.INFO key SIZE` with a one-element array.
    let size: Vec<u64> = redis::cmd("BF.INFO")
        .arg(&["default", "SIZE"])
        .query_async(&mut connection)
        .await
        .expect("BF.INFO SIZE");
    Some((resident(server.pid()), size[0]))
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

pub async fn run() {
    let load_at_start = crate::text::load_average();
    let (default_rss, default_memory) = gate("default replay buffer", "").await;
    let (fixed_rss, fixed_memory) = gate(
        "16 MiB replay buffer",
        "[limits]\nreplay_buffer_bytes = 16777216",
    )
    .await;
    let redisbloom = redisbloom().await;

    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Memory after 10M keys\n\nMeasured {} on {} (load average at start: {load_at_start}), `cargo bench \
         --bench load -- memory`. Each server holds the same {FILLED} keys at 1% (12-digit keys, as \
         `redis-benchmark` spells them), filled through `BF.MADD`s of 1,000 keys on its RESP port; figures \
         read 1 s after the fill from `/proc/<pid>/status` and, for the gate, `Admin.Stats` (its memory \
         breakdown). \"Program\" is `RssFile`: the executable's and libraries' pages, file-backed (shared \
         with the page cache and reclaimable); \"private\" is `RssAnon`.\n",
        crate::text::today(),
        crate::text::machine(),
    );
    let _ = writeln!(
        out,
        "| | gate (default replay buffer) | gate (`replay_buffer_bytes = 16777216`) | RedisBloom 2.6.9 |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|");
    let rb = |f: &dyn Fn(&(Resident, u64)) -> String| redisbloom.as_ref().map_or("—".into(), f);
    let rows: [(&str, String, String, String); 12] = [
        (
            "**RSS**",
            mb(default_rss.total),
            mb(fixed_rss.total),
            rb(&|(r, _)| mb(r.total)),
        ),
        (
            "private (RssAnon)",
            mb(default_rss.anon),
            mb(fixed_rss.anon),
            rb(&|(r, _)| mb(r.anon)),
        ),
        (
            "program (RssFile)",
            mb(default_rss.file),
            mb(fixed_rss.file),
            rb(&|(r, _)| mb(r.file)),
        ),
        (
            "filter",
            mb(default_memory.filter_bytes),
            mb(fixed_memory.filter_bytes),
            rb(&|(_, size)| mb(*size)),
        ),
        (
            "replay buffer",
            mb(default_memory.replay_buffer_bytes),
            mb(fixed_memory.replay_buffer_bytes),
            "—".into(),
        ),
        (
            "recent adds",
            mb(default_memory.recent_adds_bytes),
            mb(fixed_memory.recent_adds_bytes),
            "—".into(),
        ),
        (
            "tombstones",
            mb(default_memory.tombstone_bytes),
            mb(fixed_memory.tombstone_bytes),
            "—".into(),
        ),
        (
            "other heap",
            mb(default_memory.other_heap_bytes),
            mb(fixed_memory.other_heap_bytes),
            "—".into(),
        ),
        (
            "allocator free",
            mb(default_memory.allocator_free_bytes),
            mb(fixed_memory.allocator_free_bytes),
            "—".into(),
        ),
        (
            "parts summed (vs RSS)",
            sum_vs_rss(&default_memory),
            sum_vs_rss(&fixed_memory),
            "—".into(),
        ),
        (
            "RSS / (filter + replay buffer)",
            ratio(default_rss.total, &default_memory),
            ratio(fixed_rss.total, &fixed_memory),
            rb(&|(r, size)| format!("{:.2}×", r.total as f64 / *size as f64)),
        ),
        (
            "private / (filter + replay buffer)",
            ratio(default_rss.anon, &default_memory),
            ratio(fixed_rss.anon, &fixed_memory),
            rb(&|(r, size)| format!("{:.2}×", r.anon as f64 / *size as f64)),
        ),
    ];
    for (name, a, b, c) in rows {
        let _ = writeln!(out, "| {name} | {a} | {b} | {c} |");
    }
    println!("\n{out}");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results/memory.md");
    std::fs::write(&path, out).expect("writing the results");
    println!("written: {}", path.display());
}

/// The breakdown's parts summed, and how far from RSS.
fn sum_vs_rss(m: &MemoryStats) -> String {
    let parts = m.filter_bytes
        + m.tombstone_bytes
        + m.recent_adds_bytes
        + m.replay_buffer_bytes
        + m.other_heap_bytes
        + m.allocator_free_bytes
        + m.program_bytes;
    format!(
        "{} ({:+.1}%)",
        mb(parts),
        (parts as f64 / m.resident_bytes as f64 - 1.0) * 100.0
    )
}

fn ratio(resident: u64, m: &MemoryStats) -> String {
    format!(
        "{:.2}×",
        resident as f64 / (m.filter_bytes + m.replay_buffer_bytes) as f64
    )
}
