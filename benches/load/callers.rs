//! Single-key callers: 64 concurrent callers, each looking up one key at a time through the Rust client
//! (`clients/rust`), with coalescing on and off, beside Redis probed the way Redisson's `RBloomFilter` does
//! from 64 connections — the traffic of services that check one key per request.
//!
//! The gate is the bench-profile binary with `default` filled with 10M keys at 1%, as in the main run. Every
//! row is measured in `ROUNDS` alternating stretches; the server's CPU comes from `/proc`. A sweep of the
//! coalescing window shows what each microsecond of waiting buys, and is plotted.
//!
//! RedisBloom is not installable from the registries these machines reach, so its figures are constants,
//! measured on this machine (`BF.EXISTS` 9.6 µs of server CPU per call, `BF.MEXISTS` of 100 keys 0.36 µs
//! per key), and the targets are half of them.
//!
//! Run with `cargo bench --bench load -- callers`; writes `benches/results/callers.md` and
//! `benches/results/callers-window.svg`.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use existence_gate_client::{ClientOptions, GateClient};
use plotters::prelude::*;

use crate::drive::{self, Op, Sample, Until};
use crate::procs::{self, Server};
use crate::{
    connect_redis_n, fill_redis_bitmap, gate_config, getbit, keys, lookup_index, FILLED_KEYS,
    ROUNDS, STRETCH, WARM_UP,
};

/// Concurrent callers, each with one lookup in flight.
const CALLERS: usize = 64;
/// Keys per call in the batch rows.
const BATCH: usize = 100;
/// Distinct keys the callers cycle through (half added, half never added).
const POOL: u64 = 1 << 16;
/// The coalescing windows of the sweep, in microseconds (0 = off).
const WINDOWS_US: [u64; 6] = [0, 50, 100, 200, 500, 1_000];
/// RedisBloom's server CPU per `BF.EXISTS` on this machine, in microseconds.
const REDISBLOOM_EXISTS_US: f64 = 9.6;
/// RedisBloom's server CPU per key in a 100-key `BF.MEXISTS` on this machine, in microseconds.
const REDISBLOOM_MEXISTS_US: f64 = 0.36;

/// One measured way of asking.
struct Row {
    what: String,
    sample: Sample,
    /// Lookup RPCs the client sent (its counters), where a client of ours asked.
    rpcs: Option<u64>,
}

pub async fn run() {
    let started = Instant::now();
    let gate = crate::filled_gate(&gate_config()).await;
    let redis = procs::start_redis();
    let redis_connections = match &redis {
        Some(redis) => {
            let connections = connect_redis_n(redis, CALLERS).await;
            fill_redis_bitmap(&mut connections[0].clone()).await;
            Some(connections)
        }
        None => {
            eprintln!("redis-server is not installed (apt-get install -y redis-server): Redis rows are skipped");
            None
        }
    };
    let pool = Arc::new(keys((0..POOL).map(lookup_index)));

    println!("64 single-key callers: coalescing on and off, Redis...");
    let coalescing = client(&gate, Duration::from_micros(200), 1_024);
    let unary = client(&gate, Duration::ZERO, 1_024);
    let narrow = client(&gate, Duration::from_micros(200), 256);
    let mut sides = vec![
        Side::single(
            "gate, Rust client, coalescing (200 µs window)",
            &gate,
            &coalescing,
            &pool,
        ),
        Side::single(
            "gate, Rust client, unary (coalescing off)",
            &gate,
            &unary,
            &pool,
        ),
        Side::batches(
            "coalescing (at most 1,024 keys a call)",
            &gate,
            &coalescing,
            &pool,
        ),
        Side::batches("coalescing, at most 256 keys a call", &gate, &narrow, &pool),
        Side::batches("coalescing off", &gate, &unary, &pool),
    ];
    if let (Some(redis), Some(connections)) = (&redis, &redis_connections) {
        sides.push(Side {
            what: "Redis, Redisson-style GETBIT ×7, 1 key per pipeline".to_string(),
            server: redis,
            op: getbit(connections, 1),
            client: None,
        });
        sides.push(Side {
            what: format!("Redis, Redisson-style GETBIT ×7, {BATCH} keys per pipeline"),
            server: redis,
            op: getbit(connections, BATCH),
            client: None,
        });
    }
    let rows = measure(&sides, CALLERS).await;

    println!("one caller alone: what coalescing costs when nobody shares a call...");
    let alone = [
        Side::single(
            "1 caller, coalescing (200 µs window)",
            &gate,
            &coalescing,
            &pool,
        ),
        Side::single("1 caller, unary", &gate, &unary, &pool),
    ];
    let alone = measure(&alone, 1).await;

    println!("the window swept at 64 callers...");
    let windows: Vec<_> = WINDOWS_US
        .iter()
        .map(|&us| {
            let client = client(&gate, Duration::from_micros(us), 1_024);
            Side::single(&format!("{us} µs"), &gate, &client, &pool)
        })
        .collect();
    let sweep = measure(&windows, CALLERS).await;

    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results");
    let plot_path = results.join("callers-window.svg");
    if let Err(e) = plot(&sweep, &plot_path) {
        eprintln!("could not draw {}: {e}", plot_path.display());
    }
    let markdown = report(&rows, &alone, &sweep, started.elapsed());
    std::fs::write(results.join("callers.md"), &markdown).expect("writing callers.md");
    println!("{markdown}");
}

/// A client of `gate`'s `default` namespace with `window` (0 = coalescing off) and `max_keys` a batch.
fn client(gate: &Server, window: Duration, max_keys: usize) -> GateClient {
    let options = ClientOptions {
        coalesce_window: window,
        coalesce_max_keys: max_keys,
        deadline: Duration::from_secs(10),
        ..ClientOptions::default()
    };
    GateClient::new([gate.addr.to_string()], options).expect("a valid address")
}

/// One way of asking: the server asked, the call, and the client whose counters tell its RPCs.
struct Side<'a> {
    what: String,
    server: &'a Server,
    op: Op,
    client: Option<GateClient>,
}

impl<'a> Side<'a> {
    /// One key per call through `client`.
    fn single(what: &str, gate: &'a Server, client: &GateClient, pool: &Arc<Vec<Bytes>>) -> Self {
        let (caller, pool) = (client.clone(), Arc::clone(pool));
        let op = drive::op(move |_, n| {
            let (client, key) = (caller.clone(), pool[n as usize % pool.len()].clone());
            async move {
                client
                    .may_exist(key)
                    .await
                    .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
                Ok(1)
            }
        });
        Self {
            what: what.to_string(),
            server: gate,
            op,
            client: Some(client.clone()),
        }
    }

    /// `BATCH` keys per call through `client.may_exist_many`.
    fn batches(how: &str, gate: &'a Server, client: &GateClient, pool: &Arc<Vec<Bytes>>) -> Self {
        let (caller, pool) = (client.clone(), Arc::clone(pool));
        let op = drive::op(move |_, n| {
            let (client, pool) = (caller.clone(), Arc::clone(&pool));
            async move {
                let start = (n as usize * BATCH) % (pool.len() - BATCH);
                let answers = client
                    .may_exist_many(&pool[start..start + BATCH])
                    .await
                    .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
                Ok(answers.may_exist.len() as u64)
            }
        });
        let what = format!("gate, Rust client, {BATCH}-key `may_exist_many`, {how}");
        Self {
            what,
            server: gate,
            op,
            client: Some(client.clone()),
        }
    }
}

/// Each side in `ROUNDS` alternating stretches from `callers` tasks with one call in flight each.
async fn measure(sides: &[Side<'_>], callers: usize) -> Vec<Row> {
    let mut rows: Vec<Row> = sides
        .iter()
        .map(|side| Row {
            what: side.what.clone(),
            sample: Sample::default(),
            rpcs: side.client.as_ref().map(|_| 0),
        })
        .collect();
    for _ in 0..ROUNDS {
        for (side, row) in sides.iter().zip(&mut rows) {
            let pid = [side.server.pid()];
            drive::closed_loop_until(callers, 1, Until::Elapsed(WARM_UP), &pid, &side.op).await;
            let before = side.client.as_ref().map(|c| c.stats().gate_calls);
            let sample =
                drive::closed_loop_until(callers, 1, Until::Elapsed(STRETCH), &pid, &side.op).await;
            if let (Some(client), Some(before), Some(rpcs)) = (&side.client, before, &mut row.rpcs)
            {
                *rpcs += client.stats().gate_calls - before;
            }
            row.sample.merge(sample);
        }
    }
    rows.iter_mut().for_each(|row| row.sample.sort());
    rows
}

fn report(rows: &[Row], alone: &[Row], sweep: &[Row], took: Duration) -> String {
    let mut w = String::new();
    let _ = writeln!(
        w,
        "# Single-key callers: coalescing against per-call cost\n"
    );
    let _ = writeln!(
        w,
        "`cargo bench --bench load -- callers` ({:.0} s). The gate (bench profile, `default` filled with \
         {FILLED_KEYS} keys at 1%) and Redis (a Redisson-sized Bloom bitmap), each its own process on \
         loopback; the callers in this process, each with one call in flight, half of the keys added and \
         half never added. {ROUNDS} alternating stretches of {:.1} s per row; server CPU from `/proc`.\n",
        took.as_secs_f64(),
        STRETCH.as_secs_f64()
    );
    let _ = writeln!(w, "## {CALLERS} concurrent callers\n");
    table(&mut w, rows);
    let _ = writeln!(w, "\n## One caller alone\n");
    table(&mut w, alone);
    let _ = writeln!(w, "\n## The coalescing window at {CALLERS} callers\n");
    table(&mut w, sweep);
    let _ = writeln!(
        w,
        "\n![server CPU per key and p99 by window](callers-window.svg)\n"
    );
    targets(&mut w, rows);
    w
}

fn table(w: &mut String, rows: &[Row]) {
    let _ = writeln!(
        w,
        "| callers ask | server CPU per key | server CPU per call | keys per RPC | keys/s | calls/s | p50 | p99 | client CPU per key |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let s = &row.sample;
        let _ = writeln!(
            w,
            "| {} | {:.3} µs | {:.2} µs | {} | {:.0} | {:.0} | {:.0} µs | {:.0} µs | {:.2} µs |",
            row.what,
            s.server_us_per_key(),
            s.server_us_per_call(),
            match row.rpcs {
                Some(rpcs) => format!("{:.1}", s.keys as f64 / rpcs.max(1) as f64),
                None => "—".to_string(),
            },
            s.keys_per_second(),
            s.calls_per_second(),
            s.latency_us(0.5),
            s.latency_us(0.99),
            s.client_cpu * 1e6 / s.keys.max(1) as f64,
        );
    }
}

fn targets(w: &mut String, rows: &[Row]) {
    let (coalesced, unary, batch) = (&rows[0].sample, &rows[1].sample, &rows[2].sample);
    let added_p99 = coalesced.latency_us(0.99) - unary.latency_us(0.99);
    let verdict = |met: bool| if met { "met" } else { "not met" };
    let _ = writeln!(w, "## Targets\n");
    let _ = writeln!(w, "| target | measured | verdict |");
    let _ = writeln!(w, "|---|---|---|");
    let per_key = coalesced.server_us_per_key();
    let _ = writeln!(
        w,
        "| coalesced single-key lookup: server CPU ≤ 0.5x RedisBloom `BF.EXISTS` (≤ {:.1} µs) | {per_key:.2} µs ({:.2}x) | {} |",
        REDISBLOOM_EXISTS_US / 2.0,
        per_key / REDISBLOOM_EXISTS_US,
        verdict(per_key <= REDISBLOOM_EXISTS_US / 2.0)
    );
    let _ = writeln!(
        w,
        "| ... at ≤ 1 ms added p99 (coalesced p99 − unary p99, both at {CALLERS} callers) | {:+.0} µs | {} |",
        added_p99,
        verdict(added_p99 <= 1_000.0)
    );
    let per_key = batch.server_us_per_key();
    let _ = writeln!(
        w,
        "| {BATCH}-key batches: server CPU per key ≤ 0.5x RedisBloom `BF.MEXISTS` (≤ {:.2} µs) | {per_key:.3} µs ({:.2}x) | {} |",
        REDISBLOOM_MEXISTS_US / 2.0,
        per_key / REDISBLOOM_MEXISTS_US,
        verdict(per_key <= REDISBLOOM_MEXISTS_US / 2.0)
    );
    let _ = writeln!(
        w,
        "| unary without coalescing: as low as the server's per-call cost allows | {:.2} µs per call | see the main run's unary rows |",
        unary.server_us_per_call()
    );
}

/// Server CPU per key and p99 against the window, one panel each.
fn plot(sweep: &[Row], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let points = |f: &dyn Fn(&Sample) -> f64| -> Vec<(f64, f64)> {
        WINDOWS_US
            .iter()
            .zip(sweep)
            .map(|(&us, row)| (us as f64, f(&row.sample)))
            .collect()
    };
    let cpu = points(&|s| s.server_us_per_key());
    let p99 = points(&|s| s.latency_us(0.99));
    let root = SVGBackend::new(path, (960, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(480);
    for (area, series, caption, unit) in [
        (&left, &cpu, "server CPU per key", "µs"),
        (&right, &p99, "caller-seen p99", "µs"),
    ] {
        let high = series.iter().map(|p| p.1).fold(0.0f64, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{caption}, {CALLERS} callers"), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(
                0f64..*WINDOWS_US.last().unwrap() as f64,
                0f64..high.max(1.0),
            )?;
        chart
            .configure_mesh()
            .x_desc("coalescing window (µs)")
            .y_desc(unit)
            .draw()?;
        chart.draw_series(LineSeries::new(series.iter().copied(), &BLUE))?;
        chart.draw_series(series.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))?;
    }
    root.present()?;
    Ok(())
}
