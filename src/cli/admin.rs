//! `stats` and `snapshot`: the `Admin` service's figures and on-demand snapshots.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use indicatif::{HumanBytes, HumanCount, HumanDuration};
use serde_json::json;

use crate::cli::output;
use crate::client::connection::{ConnectArgs, Gate};
use crate::client::failure;
use crate::proto::{MemoryStats, NamespaceStats, SnapshotRequest, StatsRequest};

/// `stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// One namespace; default: every namespace the token administers.
    #[arg(long, short)]
    pub namespace: Option<String>,
    /// Print the figures as JSON (`{"namespaces": [...]}`, exact numbers) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Prints `Admin.Stats` as a table, one row per namespace, or as JSON.
pub async fn stats(args: StatsArgs) -> Result<(), String> {
    let gate = Gate::connect(&args.connect).await?;
    let reply = gate
        .admin()
        .stats(StatsRequest {
            namespace: args.namespace.clone().unwrap_or_default(),
        })
        .await
        .map_err(|status| failure::refused("Stats", &status))?
        .into_inner();
    if args.json {
        let namespaces: Vec<_> = reply.namespaces.iter().map(stats_json).collect();
        let mut document = json!({ "namespaces": namespaces });
        if let Some(memory) = &reply.memory {
            document["memory"] = memory_json(memory);
        }
        return output::line(&document.to_string());
    }
    let header = [
        "NAMESPACE",
        "KEYS ADDED",
        "EST. KEYS",
        "WINDOWS",
        "LAYERS",
        "FILTER",
        "FILL",
        "EST. FP RATE",
        "TOMBSTONES",
        "TOMBSTONE MEMORY",
        "REPLAY BUFFER",
        "SEQ",
        "LAST SNAPSHOT",
        "DIGEST@SEQ",
    ];
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let rows: Vec<Vec<String>> = reply
        .namespaces
        .iter()
        .map(|s| {
            vec![
                s.namespace.clone(),
                HumanCount(s.keys_added).to_string(),
                HumanCount(s.estimated_keys).to_string(),
                s.windows.to_string(),
                s.layers.to_string(),
                HumanBytes(s.filter_bytes).to_string(),
                format!("{:.2}%", s.fill_ratio * 100.0),
                rate(s.estimated_false_positive_rate),
                HumanCount(s.tombstones).to_string(),
                HumanBytes(s.tombstone_bytes).to_string(),
                HumanBytes(s.replay_buffer_bytes).to_string(),
                s.seq.to_string(),
                match s.last_snapshot_unix_ms {
                    0 => "never".to_string(),
                    at => format!(
                        "{} ago",
                        HumanDuration(Duration::from_millis(now_ms.saturating_sub(at)))
                    ),
                },
                format!("{:016x}@{}", s.state_digest, s.state_digest_seq),
            ]
        })
        .collect();
    output::line(table(&header, &rows).trim_end())?;
    match &reply.memory {
        Some(memory) => output::line(&memory_line(memory)),
        None => Ok(()),
    }
}

/// The process's memory in one line: resident, then the parts that make it up.
fn memory_line(m: &MemoryStats) -> String {
    let parts = [
        ("filters", m.filter_bytes),
        ("tombstones", m.tombstone_bytes),
        ("recent adds", m.recent_adds_bytes),
        ("replay buffers", m.replay_buffer_bytes),
        ("other heap", m.other_heap_bytes),
        ("allocator free", m.allocator_free_bytes),
        ("program", m.program_bytes),
    ]
    .iter()
    .filter(|(name, _)| m.heap_measured || !matches!(*name, "other heap" | "allocator free"))
    .map(|(name, bytes)| format!("{name} {}", HumanBytes(*bytes)))
    .collect::<Vec<_>>()
    .join(" + ");
    format!(
        "memory: {} resident ~ {parts}",
        HumanBytes(m.resident_bytes)
    )
}

/// The process's memory, as the contract names it.
fn memory_json(m: &MemoryStats) -> serde_json::Value {
    json!({
        "resident_bytes": m.resident_bytes,
        "filter_bytes": m.filter_bytes,
        "tombstone_bytes": m.tombstone_bytes,
        "recent_adds_bytes": m.recent_adds_bytes,
        "replay_buffer_bytes": m.replay_buffer_bytes,
        "other_heap_bytes": m.other_heap_bytes,
        "allocator_free_bytes": m.allocator_free_bytes,
        "program_bytes": m.program_bytes,
        "heap_measured": m.heap_measured,
    })
}

/// A false-positive rate as a percentage, or in scientific notation when too small to read as one.
fn rate(rate: f64) -> String {
    if rate == 0.0 || rate >= 1e-5 {
        format!("{:.3}%", rate * 100.0)
    } else {
        format!("{rate:.1e}")
    }
}

/// Every figure of a namespace, as the contract names it.
fn stats_json(s: &NamespaceStats) -> serde_json::Value {
    json!({
        "namespace": s.namespace,
        "keys_added": s.keys_added,
        "windows": s.windows,
        "layers": s.layers,
        "filter_bytes": s.filter_bytes,
        "fill_ratio": s.fill_ratio,
        "estimated_false_positive_rate": s.estimated_false_positive_rate,
        "estimated_keys": s.estimated_keys,
        "tombstones": s.tombstones,
        "tombstone_bytes": s.tombstone_bytes,
        "replay_buffer_bytes": s.replay_buffer_bytes,
        "recent_adds_bytes": s.recent_adds_bytes,
        "seq": s.seq,
        "last_snapshot_unix_ms": s.last_snapshot_unix_ms,
        "state_digest": s.state_digest,
        "state_digest_seq": s.state_digest_seq,
    })
}

/// `rows` under `header` in columns two spaces apart: the first column left-aligned (names), the others
/// right-aligned (figures), so digits line up.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(column, (cell, &width))| {
                if column == 0 {
                    format!("{cell:<width$}")
                } else {
                    format!("{cell:>width$}")
                }
            })
            .collect();
        text.push_str(cells.join("  ").trim_end());
        text.push('\n');
    }
    text
}

/// Takes a snapshot and prints where it went, its size and how long it took.
pub async fn snapshot(args: SnapshotArgs) -> Result<(), String> {
    let gate = Gate::connect(&args.connect).await?;
    let reply = gate
        .admin()
        .snapshot(SnapshotRequest {})
        .await
        .map_err(|status| failure::refused("Snapshot", &status))?
        .into_inner();
    if args.json {
        return output::line(
            &json!({
                "path": reply.path,
                "bytes": reply.bytes,
                "elapsed_ms": reply.elapsed_ms,
                "log_segments_removed": reply.log_segments_removed,
            })
            .to_string(),
        );
    }
    output::line(&format!(
        "snapshot {} ({}) taken in {} ms; {} log segments removed",
        reply.path,
        HumanBytes(reply.bytes),
        reply.elapsed_ms,
        reply.log_segments_removed
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_names_left_and_figures_right() {
        let rows = vec![
            vec!["users".to_string(), "1,000".to_string()],
            vec!["default".to_string(), "7".to_string()],
        ];
        assert_eq!(
            table(&["NAMESPACE", "KEYS"], &rows),
            "NAMESPACE   KEYS\nusers      1,000\ndefault        7\n"
        );
    }

    #[test]
    fn rates_stay_readable() {
        assert_eq!(rate(0.01), "1.000%");
        assert_eq!(rate(1.5e-9), "1.5e-9");
        assert_eq!(rate(0.0), "0.000%");
    }
}
