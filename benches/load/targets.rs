//! The targets the run is judged against, and where its figures are written.

use super::*;

/// Judges the tracker issue's targets, in its numbering, on what the steps measured.
pub(crate) fn judge_targets(report: &mut Report, unary: &[Sample], batch: &BatchLookups) {
    report.targets.push(batch.packed_ceiling_target());
    report.targets.push(unary_target(unary));
    report.targets.push(batch.keys_per_core_target());
    report.targets.extend(batch.redis_target());
    let tombstone_target = report.tombstones.as_ref().map(tombstone_memory_target);
    report.targets.extend(tombstone_target);
}

impl BatchLookups {
    /// Target 2: the gate's server CPU per key within 2x of the trivial server's with packed keys.
    pub(crate) fn packed_ceiling_target(&self) -> Target {
        let (gate_keyed, gate_packed) = (&self.gate_keyed, &self.gate_packed);
        let ceiling = &self.trivial_packed;
        Target::at_most(
            "2",
            "BatchMayExist (1,000 keys, `packed_keys`): server CPU per key within 2x of the trivial tonic handler's packed-bytes ceiling",
            gate_packed.server_us_per_key() / ceiling.server_us_per_key(),
            2.0,
            format!(
                "{:.4} µs vs {:.4} µs per key; with `keys` (repeated bytes): {:.4} µs, {:.2}x the packed ceiling ({:.2}x the trivial handler with `keys`)",
                gate_packed.server_us_per_key(),
                ceiling.server_us_per_key(),
                gate_keyed.server_us_per_key(),
                gate_keyed.server_us_per_key() / ceiling.server_us_per_key(),
                gate_keyed.server_us_per_key() / self.trivial_keyed.server_us_per_key(),
            ),
        )
    }

    /// Target 4a: 20M keys/s per server core with packed keys.
    pub(crate) fn keys_per_core_target(&self) -> Target {
        let (gate_keyed, gate_packed) = (&self.gate_keyed, &self.gate_packed);
        Target::at_most(
            "4a",
            "Batches: ≥ 20M keys/s per server core (≤ 0.045 µs server CPU per key), `packed_keys`, 1,000 keys",
            gate_packed.server_us_per_key(),
            0.045,
            format!(
                "{:.4} µs per key = {:.1}M keys/s per server core (`keys`: {:.4} µs = {:.1}M)",
                gate_packed.server_us_per_key(),
                gate_packed.keys_per_server_core_second() / 1e6,
                gate_keyed.server_us_per_key(),
                gate_keyed.keys_per_server_core_second() / 1e6
            ),
        )
    }

    /// Target 4b, if Redis ran: 5x the keys/s of Redis `GETBIT` pipelines.
    pub(crate) fn redis_target(&self) -> Option<Target> {
        let (gate_packed, getbit) = (&self.gate_packed, self.getbit.as_ref()?);
        Some(Target::at_least(
            "4b",
            "Batches: ≥ 5x the keys/s of a Redis GETBIT pipeline (Redisson RBloomFilter probes), same run",
            gate_packed.keys_per_second() / getbit.keys_per_second(),
            5.0,
            format!(
                "end to end {:.2}M vs {:.2}M keys/s; per server core {:.1}M vs {:.2}M keys/s ({:.0}x)",
                gate_packed.keys_per_second() / 1e6,
                getbit.keys_per_second() / 1e6,
                gate_packed.keys_per_server_core_second() / 1e6,
                getbit.keys_per_server_core_second() / 1e6,
                gate_packed.keys_per_server_core_second() / getbit.keys_per_server_core_second()
            ),
        ))
    }
}

/// Target 3: unary server CPU per call within 1.2x of the trivial server's (`unary` is gate, trivial).
pub(crate) fn unary_target(unary: &[Sample]) -> Target {
    Target::at_most(
        "3",
        "Unary MayExist: server CPU per call within 1.2x of the trivial tonic handler's",
        unary[0].server_us_per_call() / unary[1].server_us_per_call(),
        1.2,
        format!(
            "{:.2} µs vs {:.2} µs per call",
            unary[0].server_us_per_call(),
            unary[1].server_us_per_call()
        ),
    )
}

/// Target 4c: at most 40 bytes of RSS per tombstone.
pub(crate) fn tombstone_memory_target(memory: &report::TombstoneMemory) -> Target {
    let per_tombstone = memory.rss_delta as f64 / memory.stored.max(1) as f64;
    Target::at_most(
        "4c",
        "≤ 40 bytes per tombstone (RSS growth of a fresh server while its store fills to its bound)",
        per_tombstone,
        40.0,
        format!(
            "{per_tombstone:.1} B per tombstone by RSS, {:.1} B by table size; Redis null marker {:.1} B (used_memory)",
            memory.table_bytes as f64 / memory.stored.max(1) as f64,
            memory.redis_delta as f64 / memory.redis_markers.max(1) as f64
        ),
    )
}

/// Writes `benches/results/load.md` and the plot, and prints the report.
pub(crate) fn write_results(report: &mut Report, started: Instant) {
    report.elapsed = started.elapsed();
    let results = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results");
    std::fs::create_dir_all(&results).expect("benches/results");
    let markdown = report.markdown();
    std::fs::write(results.join("load.md"), &markdown).expect("writing load.md");
    report::plot(&report.sweep, &results.join("throughput-vs-batch.svg"))
        .expect("writing the plot");
    println!("\n{markdown}");
    println!(
        "written: {} and {} ({:.0} s)",
        results.join("load.md").display(),
        results.join("throughput-vs-batch.svg").display(),
        started.elapsed().as_secs_f64()
    );
}
