//! The results: one Markdown report (`benches/results/load.md`) and the throughput-by-batch-size plot
//! (`benches/results/throughput-vs-batch.svg`).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use existence_gate::core::filter::{FilterSpec, Retention};
use existence_gate::proto::NamespaceStats;
use plotters::prelude::*;

use crate::drive::{percentile_us, Sample, Timed};
use crate::text::{latency, load_average, machine, si, today};

/// One line of the main table, its figures computed when it is made.
pub struct Row {
    workload: String,
    server: String,
    calls_per_second: f64,
    keys_per_second: f64,
    server_us_per_call: f64,
    server_us_per_key: f64,
    server_cores: f64,
    client_us_per_call: f64,
    other_cores: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    errors: u64,
    rss: u64,
    versus: String,
}

impl Row {
    /// A row for `sample` (latencies sorted) of `server` at resident size `rss`.
    pub fn new(workload: &str, server: &str, sample: &Sample, rss: u64) -> Self {
        Self {
            workload: workload.to_string(),
            server: server.to_string(),
            calls_per_second: sample.calls_per_second(),
            keys_per_second: sample.keys_per_second(),
            server_us_per_call: sample.server_us_per_call(),
            server_us_per_key: sample.server_us_per_key(),
            server_cores: sample.server_cores(),
            client_us_per_call: sample.client_us_per_call(),
            other_cores: sample.other_cores(),
            p50: sample.latency_us(0.5),
            p99: sample.latency_us(0.99),
            p999: sample.latency_us(0.999),
            errors: sample.errors,
            rss,
            versus: String::new(),
        }
    }

    /// Notes this row's server CPU per call as a multiple of `other`'s.
    pub fn per_call_vs(mut self, other: &Sample, name: &str) -> Self {
        self.versus = format!(
            "{:.2}x {name} (CPU/call)",
            self.server_us_per_call / other.server_us_per_call()
        );
        self
    }

    /// Notes this row's server CPU per key as a multiple of `other`'s.
    pub fn per_key_vs(mut self, other: &Sample, name: &str) -> Self {
        self.versus = format!(
            "{:.2}x {name} (CPU/key)",
            self.server_us_per_key / other.server_us_per_key()
        );
        self
    }

    /// Notes how much more `other` (named `name`) does: keys/s end to end and per server core.
    pub fn throughput_vs(mut self, other: &Sample, name: &str) -> Self {
        let per_core = self.keys_per_second / self.server_cores.max(1e-9);
        self.versus = format!(
            "{name}: {:.1}x keys/s, {:.1}x per server core",
            other.keys_per_second() / self.keys_per_second,
            other.keys_per_server_core_second() / per_core
        );
        self
    }
}

/// A target of the tracker issue and whether this run met it.
pub struct Target {
    id: String,
    what: String,
    value: f64,
    limit: f64,
    at_most: bool,
    figure: String,
    /// Why the run cannot tell (the verdict is then "inconclusive").
    inconclusive: Option<String>,
}

impl Target {
    /// Met when `value ≤ limit`.
    pub fn at_most(id: &str, what: &str, value: f64, limit: f64, figure: String) -> Self {
        Self {
            id: id.to_string(),
            what: what.to_string(),
            value,
            limit,
            at_most: true,
            figure,
            inconclusive: None,
        }
    }

    /// Met when `value ≥ limit`.
    pub fn at_least(id: &str, what: &str, value: f64, limit: f64, figure: String) -> Self {
        Self {
            at_most: false,
            ..Self::at_most(id, what, value, limit, figure)
        }
    }

    fn met(&self) -> bool {
        if self.at_most {
            self.value <= self.limit
        } else {
            self.value >= self.limit
        }
    }

    fn verdict(&self) -> String {
        match &self.inconclusive {
            Some(why) => format!("**inconclusive**: {why}"),
            None if self.met() => "**met**".to_string(),
            None => "**not met**".to_string(),
        }
    }
}

/// Memory of the tombstone store filled to its bound, and of as many Redis null markers.
pub struct TombstoneMemory {
    /// The store's bound (`max_tombstones`).
    pub capacity: u64,
    /// `RecordAbsent` calls answered `RECORDED` (more than the bound once the store evicts).
    pub recorded: u64,
    /// Tombstones held at the end (up to the bound).
    pub stored: u64,
    /// Bytes of the store's tables, as `Stats` reports them.
    pub table_bytes: u64,
    /// Growth of the server's RSS from before the first `RecordAbsent` to the full store.
    pub rss_delta: u64,
    /// Null markers set in Redis.
    pub redis_markers: u64,
    /// Growth of Redis' `used_memory` over them.
    pub redis_delta: u64,
}

/// The tail-latency run.
pub struct Tail {
    /// Lookups per second offered, and the closed-loop capacity it is half of.
    pub rate: f64,
    pub capacity: f64,
    /// Seconds into the run at which the window boundary passed.
    pub rotation_at: f64,
    /// Lookups (latencies sorted) and each lookup's start time.
    pub sample: Sample,
    pub timed: Vec<Timed>,
    /// Latencies of the concurrent Adds (sorted), their size and period.
    pub adds: Vec<u64>,
    pub add_keys: u64,
    pub add_every: Duration,
    /// The trivial tonic server at the same rate (latencies sorted).
    pub trivial: Sample,
    /// Live windows of the rotating namespace after the run.
    pub windows: u32,
}

/// Everything one run measured.
pub struct Report {
    connections: usize,
    in_flight: usize,
    rounds: usize,
    stretch: Duration,
    load_at_start: String,
    /// The gate's configuration file.
    pub config: String,
    /// `redis-server --version`, if Redis ran.
    pub redis_version: Option<String>,
    /// The table.
    pub rows: Vec<Row>,
    /// False-positive rate of never-added keys measured through the server.
    pub measured_fp: f64,
    /// The Redisson-style bitmap: bits, probes per key, Redis `used_memory` growth.
    pub redis_bloom: Option<(u64, u32, u64)>,
    fill: Option<(Sample, u64, u64, u64)>,
    /// (batch size, gate packed, Redis GETBIT) for the plot.
    pub sweep: Vec<(usize, Sample, Option<Sample>)>,
    /// Tombstone memory.
    pub tombstones: Option<TombstoneMemory>,
    /// The tail-latency run.
    pub tail: Option<Tail>,
    /// Tombstoned keys the tombstone lookups cycle through.
    pub tombstone_lookup_keys: usize,
    /// The gate's RSS growth over the unary workload, before anything scraped `/metrics`, and its calls.
    pub unbuffered_growth: Option<(u64, u64)>,
    /// Server CPU seconds of one `/metrics` scrape, and the filter bytes the gate held then.
    pub scrape_cpu: Option<(f64, u64)>,
    /// Targets with verdicts.
    pub targets: Vec<Target>,
    /// How long the run took.
    pub elapsed: Duration,
}

impl Report {
    /// An empty report of a run with these load settings.
    pub fn new(connections: usize, in_flight: usize, rounds: usize, stretch: Duration) -> Self {
        Self {
            connections,
            in_flight,
            rounds,
            stretch,
            load_at_start: load_average(),
            config: String::new(),
            redis_version: None,
            rows: Vec::new(),
            measured_fp: f64::NAN,
            redis_bloom: None,
            fill: None,
            sweep: Vec::new(),
            tombstones: None,
            tail: None,
            tombstone_lookup_keys: 0,
            unbuffered_growth: None,
            scrape_cpu: None,
            targets: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    /// Records the fill of `default`: the Adds, the server's RSS before and after, its filter size.
    pub fn add_fill(
        &mut self,
        adds: &Sample,
        rss_before: u64,
        rss_after: u64,
        stats: &NamespaceStats,
    ) {
        self.fill = Some((adds.clone(), rss_before, rss_after, stats.filter_bytes));
    }

    /// The whole report as Markdown. The tail-latency target is judged here and joins `targets`.
    pub fn markdown(&mut self) -> String {
        let mut out = String::new();
        let w = &mut out;
        self.write_method(w);
        self.write_targets(w);
        self.write_table(w);
        self.write_memory(w);
        if let Some(tail) = &self.tail {
            write_tail(w, tail);
        }
        self.write_sweep(w);
        write_filter_sizing(w);
        let _ = writeln!(
            w,
            "\n## Configuration of the gate\n\n```toml\n{}```",
            self.config
        );
        out
    }

    /// The title, when and where the run was made, and how it measures: servers, clients, stretches and
    /// what "server CPU" means, so the figures below can be read without the harness's source.
    fn write_method(&self, w: &mut String) {
        let _ = writeln!(w, "# Load harness results\n");
        let _ = writeln!(
            w,
            "`cargo bench --bench load`, {} — {}; load average {} at the start, {} at the end; the run took {:.0} s.\n",
            today(),
            machine(),
            self.load_at_start,
            load_average(),
            self.elapsed.as_secs_f64()
        );
        let _ = writeln!(
            w,
            "Servers, each its own process on loopback: the gate's release binary (`serve --in-memory`), a trivial \
             tonic server of the same contract whose handlers look nothing up (the ceiling of any tonic service), \
             and {}. Clients: {} connections per server × {} calls in flight each (closed loop) in the harness \
             process, which shares the {} cores with the server under test. Each side of a comparison is measured \
             in {} alternating stretches of {:.1} s. **Server CPU** is user + system time of the server process \
             from `/proc/<pid>/stat`, per call or per key; **client CPU** is the harness's. Throughput is end to end \
             and shares the machine with the client; latency is per call, from send to answer, in µs.\n",
            self.redis_version
                .as_deref()
                .map_or("no Redis (not installed)".to_string(), |v| format!("Redis ({v}, `--save \"\" --appendonly no`)")),
            self.connections,
            self.in_flight,
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            self.rounds,
            self.stretch.as_secs_f64()
        );
    }

    /// The targets of the tracker issue with this run's figure and verdict, the tail-latency one judged now
    /// from the tail run.
    fn write_targets(&mut self, w: &mut String) {
        if let Some(tail) = &self.tail {
            self.targets.push(tail_target(tail));
        }
        let _ = writeln!(w, "## Targets\n");
        let _ = writeln!(w, "| # | target | this run | met |");
        let _ = writeln!(w, "|---|---|---|---|");
        for t in &self.targets {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} |",
                t.id,
                t.what,
                t.figure,
                t.verdict()
            );
        }
    }

    /// The main table: one row per workload and server.
    fn write_table(&self, w: &mut String) {
        let _ = writeln!(w, "\n## Throughput, CPU and latency\n");
        let _ = writeln!(
            w,
            "| workload | server | calls/s | keys/s | server CPU µs/call | server CPU µs/key | server cores busy | client CPU µs/call | other load (cores) | p50 | p99 | p99.9 | RSS MB | errors | versus |"
        );
        let _ = writeln!(
            w,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        );
        for r in &self.rows {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {:.3} | {:.4} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {:.0} | {} | {} |",
                r.workload,
                r.server,
                si(r.calls_per_second),
                si(r.keys_per_second),
                r.server_us_per_call,
                r.server_us_per_key,
                r.server_cores,
                r.client_us_per_call,
                r.other_cores,
                latency(r.p50),
                latency(r.p99),
                latency(r.p999),
                r.rss as f64 / 1e6,
                r.errors,
                r.versus
            );
        }
    }

    /// Memory: the filter and its Redis counterpart, tombstones and null markers, and what the metrics
    /// exporter holds and costs.
    fn write_memory(&self, w: &mut String) {
        let _ = writeln!(w, "\n## Memory\n");
        self.write_filter_memory(w);
        self.write_tombstone_memory(w);
        self.write_metrics_memory(w);
    }

    /// The fill of `default` (throughput, filter bytes per key, RSS) and the Redis bitmap of the same keys.
    fn write_filter_memory(&self, w: &mut String) {
        if let Some((adds, before, after, filter_bytes)) = &self.fill {
            let _ = writeln!(
                w,
                "- Filling `default` with {} keys in Adds of 10,000: {:.1} s, {} keys/s, {:.3} µs server CPU per key. \
                 Filter {:.1} MB = {:.2} bytes per key (measured false-positive rate of never-added keys through the \
                 server: {:.2}%). Server RSS {:.0} MB empty → {:.0} MB filled (the filter's pages are touched when it is \
                 created; the growth is mostly the 16 MiB invalidation replay buffer).",
                si(adds.keys as f64),
                adds.wall,
                si(adds.keys_per_second()),
                adds.server_us_per_key(),
                *filter_bytes as f64 / 1e6,
                *filter_bytes as f64 / adds.keys as f64,
                self.measured_fp * 100.0,
                *before as f64 / 1e6,
                *after as f64 / 1e6
            );
        }
        if let Some((bits, probes, bytes)) = self.redis_bloom {
            let _ = writeln!(
                w,
                "- Redis Bloom bitmap sized the way Redisson sizes it for 10M keys at 1%: {} bits, k = {probes}; \
                 `used_memory` +{:.1} MB = {:.2} bytes per key.",
                si(bits as f64),
                bytes as f64 / 1e6,
                bytes as f64 / 1e7
            );
        }
    }

    /// Bytes per tombstone of the second gate's store against bytes per Redis null marker.
    fn write_tombstone_memory(&self, w: &mut String) {
        if let Some(t) = &self.tombstones {
            let _ = writeln!(
                w,
                "- Tombstones, measured in a second, fresh gate process whose one namespace holds at most {} \
                 tombstones (16-byte keys), scraped every 100 ms so request-latency samples do not pile up: {} \
                 `RecordAbsent` calls of distinct keys (twice the bound; a key may live only in its 16-slot \
                 bucket, so one pass leaves the buckets that drew few keys short of full) left it holding {}, \
                 and its RSS grew \
                 {:.1} MB = **{:.1} bytes per tombstone**; the tables themselves \
                 {:.1} MB = {:.1} bytes per tombstone. Redis: {} null markers (`SET key \"\" NX EX 60`, 16-byte keys), \
                 `used_memory` +{:.1} MB = **{:.1} bytes per marker**. The tombstoned-key lookups in the table cycle through \
                 {} keys holding a live tombstone (and the same keys' markers in Redis).",
                t.capacity,
                t.recorded,
                t.stored,
                t.rss_delta as f64 / 1e6,
                t.rss_delta as f64 / t.stored.max(1) as f64,
                t.table_bytes as f64 / 1e6,
                t.table_bytes as f64 / t.stored.max(1) as f64,
                t.redis_markers,
                t.redis_delta as f64 / 1e6,
                t.redis_delta as f64 / t.redis_markers.max(1) as f64,
                self.tombstone_lookup_keys
            );
        }
    }

    /// What the metrics exporter buffers while nothing scrapes it, and what one scrape costs.
    fn write_metrics_memory(&self, w: &mut String) {
        if let Some((bytes, calls)) = self.unbuffered_growth {
            let _ = writeln!(
                w,
                "- Before anything scraped `/metrics`, the server's RSS grew {:.1} MB over {} unary calls \
                 ({:.1} bytes per call): the Prometheus exporter buffers request-latency samples until its \
                 upkeep, which the server runs every 5 s, so this stays bounded. From then on the harness \
                 scraped `/metrics` every second.",
                bytes as f64 / 1e6,
                calls,
                bytes as f64 / calls.max(1) as f64
            );
        }
        if let Some((seconds, filter_bytes)) = self.scrape_cpu {
            let _ = writeln!(
                w,
                "- One `/metrics` scrape costs the gate {:.2} ms of CPU (average of 20, nothing else running; \
                 {:.1} MB of filters here): the gauges come from counters, and the fill ratio, which counts \
                 every filter bit, is computed only for Admin `Stats`.",
                seconds * 1e3,
                filter_bytes as f64 / 1e6
            );
        }
    }

    /// Keys/s and server CPU per key by batch size, gate against Redis (the plot's figures).
    fn write_sweep(&self, w: &mut String) {
        let _ = writeln!(w, "\n## Throughput by batch size\n");
        let _ = writeln!(
            w,
            "BatchMayExist with `packed_keys` against Redis GETBIT pipelines (k GETBITs per key, one pipeline per \
             call), same connections and calls in flight. Plot: [throughput-vs-batch.svg](throughput-vs-batch.svg).\n"
        );
        let _ = writeln!(
            w,
            "| keys per call | gate keys/s | gate server µs/key | redis keys/s | redis server µs/key | gate / redis (keys/s) | gate / redis (per server core) |"
        );
        let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|---:|");
        for (size, gate, redis) in &self.sweep {
            let (rk, ru, ratio, core_ratio) = match redis {
                Some(r) => (
                    si(r.keys_per_second()),
                    format!("{:.4}", r.server_us_per_key()),
                    format!("{:.1}x", gate.keys_per_second() / r.keys_per_second()),
                    format!("{:.1}x", r.server_us_per_key() / gate.server_us_per_key()),
                ),
                None => ("–".into(), "–".into(), "–".into(), "–".into()),
            };
            let _ = writeln!(
                w,
                "| {size} | {} | {:.4} | {rk} | {ru} | {ratio} | {core_ratio} |",
                si(gate.keys_per_second()),
                gate.server_us_per_key()
            );
        }
    }
}

/// Filter bytes by expected keys, false-positive rate and windows, from the sizing code (not measured): what
/// a deployment's configuration will cost in memory.
fn write_filter_sizing(w: &mut String) {
    let _ = writeln!(w, "\n## Filter memory by sizing\n");
    let _ = writeln!(
        w,
        "Bytes of filter for `expected_keys` N at `false_positive_rate` p: with W windows (a finite retention) \
         each window is sized for N/(W-1) keys at p/W; `forever` is one window. Figures from the sizing code \
         (`FilterSpec::initial_bytes`).\n"
    );
    let windows = [1u32, 2, 4, 8, 24];
    let _ = writeln!(
        w,
        "| N | p | forever | 2 windows | 4 windows | 8 windows | 24 windows |"
    );
    let _ = writeln!(w, "|---:|---:|---:|---:|---:|---:|---:|");
    for keys in [1_000_000u64, 10_000_000, 100_000_000] {
        for p in [0.01, 0.001] {
            let cells: Vec<String> = windows
                .iter()
                .map(|&windows| {
                    let spec = FilterSpec {
                        expected_keys: keys,
                        false_positive_rate: p,
                        retention: if windows == 1 {
                            Retention::Forever
                        } else {
                            Retention::Millis(86_400_000)
                        },
                        windows: windows.max(2),
                        max_bytes: 0,
                    };
                    format!("{:.1} MB", spec.initial_bytes() as f64 / 1e6)
                })
                .collect();
            let _ = writeln!(
                w,
                "| {} | {}% | {} |",
                si(keys as f64),
                p * 100.0,
                cells.join(" | ")
            );
        }
    }
}

/// Latencies (ns, in start order) of calls that started within `[from, to)` seconds, sorted.
fn latencies_between(timed: &[Timed], from: f64, to: f64) -> Vec<u64> {
    let mut latencies: Vec<u64> = timed
        .iter()
        .filter(|t| t.at >= from && t.at < to)
        .map(|t| t.latency)
        .collect();
    latencies.sort_unstable();
    latencies
}

/// The stretch around the rotation: from half a second before the boundary to a second after.
fn rotation_window(tail: &Tail) -> (f64, f64) {
    (tail.rotation_at - 0.5, tail.rotation_at + 1.0)
}

fn outside_rotation(tail: &Tail) -> Vec<u64> {
    let (from, to) = rotation_window(tail);
    let mut latencies: Vec<u64> = tail
        .timed
        .iter()
        .filter(|t| t.at < from || t.at >= to)
        .map(|t| t.latency)
        .collect();
    latencies.sort_unstable();
    latencies
}

/// The p99 of each stretch of the run as long as the rotation window, leaving out those that overlap it.
fn stretch_p99s(tail: &Tail) -> Vec<f64> {
    let (from, to) = rotation_window(tail);
    let length = to - from;
    let mut p99s = Vec::new();
    let mut start = 0.0;
    while start + length <= tail.sample.wall {
        let end = start + length;
        if end <= from || start >= to {
            let latencies = latencies_between(&tail.timed, start, end);
            if latencies.len() >= 100 {
                p99s.push(percentile_us(&latencies, 0.99));
            }
        }
        start = end;
    }
    p99s.sort_by(f64::total_cmp);
    p99s
}

fn tail_target(tail: &Tail) -> Target {
    let (from, to) = rotation_window(tail);
    let during = latencies_between(&tail.timed, from, to);
    let outside = outside_rotation(tail);
    let p99_during = percentile_us(&during, 0.99);
    // The typical stretch of the same run, so that one disturbance elsewhere (other work on a shared
    // machine) neither hides a stall at the rotation nor stands in for one.
    let stretches = stretch_p99s(tail);
    let typical = stretches
        .get(stretches.len() / 2)
        .copied()
        .unwrap_or(f64::NAN);
    let mut target = Target::at_most(
        "5",
        "Tail latency of unary MayExist at 50% of capacity with Adds and a window rotation: the rotation must not \
         stall readers (p99 from 0.5 s before to 1 s after it at most 2x the median p99 of the run's other \
         1.5 s stretches)",
        p99_during / typical,
        2.0,
        format!(
            "p50 {} / p99 {} / p99.9 {} at {}/s (trivial tonic at the same rate, run after: p50 {} / p99 {} / \
             p99.9 {}); around the rotation p99 {}, max {}; other stretches: median p99 {}; rest of the run pooled: \
             p99 {}, max {}",
            latency(tail.sample.latency_us(0.5)),
            latency(tail.sample.latency_us(0.99)),
            latency(tail.sample.latency_us(0.999)),
            si(tail.rate),
            latency(tail.trivial.latency_us(0.5)),
            latency(tail.trivial.latency_us(0.99)),
            latency(tail.trivial.latency_us(0.999)),
            latency(p99_during),
            latency(percentile_us(&during, 1.0)),
            latency(typical),
            latency(percentile_us(&outside, 0.99)),
            latency(percentile_us(&outside, 1.0)),
        ),
    );
    // At half of the capacity measured just before, answers should not queue; if they did (p50 over 10 ms),
    // other work took the machine meanwhile and the run says nothing about the rotation.
    if tail.sample.latency_us(0.5) > 10_000.0 {
        target.inconclusive = Some(format!(
            "the server fell behind the offered rate (other load on the machine: {:.2} cores busy outside the \
             harness and its servers)",
            tail.sample.other_cores()
        ));
    }
    target
}

fn write_tail(w: &mut String, tail: &Tail) {
    let (from, to) = rotation_window(tail);
    let during = latencies_between(&tail.timed, from, to);
    let outside = outside_rotation(tail);
    let _ = writeln!(w, "\n## Tail latency with Adds and a window rotation\n");
    let _ = writeln!(
        w,
        "Unary MayExist in namespace `rot` (retention 10 s over 2 windows, so the filter rotates every 10 s on \
         the clock) offered open loop at {}/s — half the closed-loop capacity of {}/s measured just before — for \
         {:.1} s, while one Add of {} keys every {} ms runs on the same server; the window boundary passed {:.1} s \
         into the run (the first Add after it builds the new window; {} windows were live at the end). Calls start \
         in bursts each millisecond (the timer's resolution). The trivial tonic server at the same rate gives the \
         floor of the stack on this machine.\n",
        si(tail.rate),
        si(tail.capacity),
        tail.sample.wall,
        tail.add_keys,
        tail.add_every.as_millis(),
        tail.rotation_at,
        tail.windows
    );
    let _ = writeln!(w, "| calls | count | p50 | p99 | p99.9 | max | errors |");
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|");
    let mut line = |name: &str, sorted: &[u64], errors: u64| {
        let _ = writeln!(
            w,
            "| {name} | {} | {} | {} | {} | {} | {errors} |",
            sorted.len(),
            latency(percentile_us(sorted, 0.5)),
            latency(percentile_us(sorted, 0.99)),
            latency(percentile_us(sorted, 0.999)),
            latency(percentile_us(sorted, 1.0))
        );
    };
    line(
        "gate MayExist, whole run",
        &tail.sample.latencies,
        tail.sample.errors,
    );
    line(
        "gate MayExist, from 0.5 s before to 1 s after the rotation",
        &during,
        0,
    );
    line("gate MayExist, the rest of the run", &outside, 0);
    line("gate Add (100 keys), whole run", &tail.adds, 0);
    line(
        "trivial tonic MayExist, same rate",
        &tail.trivial.latencies,
        tail.trivial.errors,
    );
    let _ = writeln!(
        w,
        "\nServer CPU during the run: {:.2} cores busy ({:.2} µs per lookup, Adds included); other work on the \
         machine: {:.2} cores.",
        tail.sample.server_cores(),
        tail.sample.server_us_per_call(),
        tail.sample.other_cores()
    );
    // Where the slowest calls were, to tell a stall at the rotation from one elsewhere.
    let mut worst: Vec<(u64, u64)> = Vec::new();
    for call in &tail.timed {
        let bucket = (call.at * 10.0) as u64;
        match worst.last_mut() {
            Some((b, max)) if *b == bucket => *max = (*max).max(call.latency),
            _ => worst.push((bucket, call.latency)),
        }
    }
    worst.sort_by_key(|w| std::cmp::Reverse(w.1));
    let slowest: Vec<String> = worst
        .iter()
        .take(5)
        .map(|(bucket, max)| {
            format!(
                "+{:.1} s ({})",
                *bucket as f64 / 10.0,
                latency(*max as f64 / 1e3)
            )
        })
        .collect();
    let _ = writeln!(
        w,
        "The five slowest 100 ms stretches by their slowest call (start time into the run): {}; the rotation \
         was at +{:.1} s.",
        slowest.join(", "),
        tail.rotation_at
    );
}

/// Draws keys/s against batch size for the gate and Redis, end to end and per server core.
pub fn plot(
    sweep: &[(usize, Sample, Option<Sample>)],
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let gate: Vec<(f64, f64)> = sweep
        .iter()
        .map(|(s, g, _)| (*s as f64, g.keys_per_second()))
        .collect();
    let gate_core: Vec<(f64, f64)> = sweep
        .iter()
        .map(|(s, g, _)| (*s as f64, g.keys_per_server_core_second()))
        .collect();
    let redis: Vec<(f64, f64)> = sweep
        .iter()
        .filter_map(|(s, _, r)| r.as_ref().map(|r| (*s as f64, r.keys_per_second())))
        .collect();
    let redis_core: Vec<(f64, f64)> = sweep
        .iter()
        .filter_map(|(s, _, r)| {
            r.as_ref()
                .map(|r| (*s as f64, r.keys_per_server_core_second()))
        })
        .collect();
    let all = gate
        .iter()
        .chain(&gate_core)
        .chain(&redis)
        .chain(&redis_core)
        .map(|p| p.1);
    let (low, high) = all.fold((f64::MAX, 0.0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let (low, high) = (
        10f64.powf(low.max(1.0).log10().floor()),
        10f64.powf(high.max(10.0).log10().ceil()),
    );
    let (min_x, max_x) = (
        sweep.first().map_or(1.0, |s| s.0 as f64),
        sweep.last().map_or(10_000.0, |s| s.0 as f64),
    );

    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "BatchMayExist (packed_keys) vs Redis GETBIT pipeline: keys/s by batch size",
            ("sans-serif", 20),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d((min_x..max_x).log_scale(), (low..high).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("keys per call")
        .y_desc("keys per second")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| si(*y))
        .draw()?;
    let blue = RGBColor(31, 119, 180);
    let red = RGBColor(214, 39, 40);
    chart
        .draw_series(LineSeries::new(gate.clone(), blue.stroke_width(3)).point_size(4))?
        .label("gate, end to end")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], blue.stroke_width(3)));
    chart
        .draw_series(LineSeries::new(redis.clone(), red.stroke_width(3)).point_size(4))?
        .label("Redis GETBIT pipeline, end to end")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], red.stroke_width(3)));
    chart
        .draw_series(DashedLineSeries::new(gate_core, 8, 5, blue.stroke_width(2)))?
        .label("gate, per server CPU-second (dashed)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], blue.stroke_width(1)));
    chart
        .draw_series(DashedLineSeries::new(redis_core, 8, 5, red.stroke_width(2)))?
        .label("Redis, per server CPU-second (dashed)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], red.stroke_width(1)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
