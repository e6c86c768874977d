//! The RESP port beside RedisBloom, both driven by `redis-benchmark`: the gate's bench-profile binary and
//! Debian's `redis-server` with the RedisBloom module `EXISTENCE_GATE_REDISBLOOM_MODULE` names loaded
//! (without it this mode says so and stops). Each holds the same 10M keys in a filter sized for them at 1%
//! (`default` in the gate, `BF.RESERVE default 0.01 10000000` in Redis), the keys `redis-benchmark` draws
//! for `__rand_int__` (12 digits) below 10M, so that lookups drawn below 20M are half present.
//!
//! Every workload runs in `ROUNDS` alternating stretches (gate, RedisBloom, gate, ...), each a
//! `redis-benchmark` run of a fixed number of commands; server CPU is the user + system time of the server
//! process from `/proc/<pid>/stat` across the stretch, divided by the commands (or keys) it answered.
//!
//! Run with `cargo bench --bench load -- resp`; writes `benches/results/resp.md`. With `-- resp durable`, the
//! write workloads with durability on both sides, in two pairs — the gate's `--sync always` (an `Add`
//! acknowledged once its log record is fsynced, concurrent callers sharing one fsync) beside Redis's
//! `appendfsync always`, and `--sync interval` (an fsync every 100 ms) beside `appendfsync everysec` — each
//! side's files on the same disk; writes `benches/results/resp-durable.md`. Both filters are sized for
//! [`FILLED`] keys and hold [`DURABLE_FILLED`] before the writes: what an fsync costs does not depend on
//! how full the filter is.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::procs::{self, Server};

/// Stretches per side of each workload.
const ROUNDS: usize = 4;
/// Keys in each filter.
pub const FILLED: u64 = 10_000_000;
/// Keys each filter holds before the durable mode's writes.
const DURABLE_FILLED: u64 = 1_000_000;
/// Keys per `BF.MADD` while filling.
const FILL_BATCH: u64 = 1_000;
/// Keys in a `BF.MEXISTS`.
const MEXISTS_KEYS: usize = 100;
/// Keys in a `BF.MADD`.
const MADD_KEYS: usize = 100;

/// One workload: `redis-benchmark` arguments besides host and port, commands per stretch, keys per command.
#[derive(Clone)]
struct Workload {
    name: &'static str,
    args: Vec<String>,
    commands: u64,
    keys_per_command: u64,
}

fn workloads() -> Vec<Workload> {
    let exists = |clients: u32, pipeline: u32| {
        vec![
            "-c".to_string(),
            clients.to_string(),
            "-P".to_string(),
            pipeline.to_string(),
            "BF.EXISTS".to_string(),
            "default".to_string(),
            "__rand_int__".to_string(),
        ]
    };
    let mut mexists = vec!["-c", "8", "-P", "1", "BF.MEXISTS", "default"]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    mexists.extend(std::iter::repeat_n(
        "__rand_int__".to_string(),
        MEXISTS_KEYS,
    ));
    let mut madd = vec!["-c", "8", "-P", "1", "BF.MADD", "default"]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    madd.extend(std::iter::repeat_n("__rand_int__".to_string(), MADD_KEYS));
    vec![
        Workload {
            name: "BF.EXISTS, unpipelined, 8 connections",
            args: exists(8, 1),
            commands: 200_000,
            keys_per_command: 1,
        },
        Workload {
            name: "BF.EXISTS, pipelined 16 deep, 8 connections",
            args: exists(8, 16),
            commands: 1_000_000,
            keys_per_command: 1,
        },
        Workload {
            name: "BF.MEXISTS of 100 keys, 8 connections",
            args: mexists,
            commands: 40_000,
            keys_per_command: MEXISTS_KEYS as u64,
        },
        Workload {
            name: "saturation: BF.EXISTS pipelined 16 deep, 32 connections, 2 client threads",
            args: [
                vec!["--threads".to_string(), "2".to_string()],
                exists(32, 16),
            ]
            .concat(),
            commands: 2_000_000,
            keys_per_command: 1,
        },
        // Writes last: they grow both filters past the keys the lookups above are drawn against.
        Workload {
            name: "BF.ADD, pipelined 16 deep, 50 connections",
            args: ["-c", "50", "-P", "16", "BF.ADD", "default", "__rand_int__"]
                .map(String::from)
                .to_vec(),
            commands: 1_000_000,
            keys_per_command: 1,
        },
        Workload {
            name: "BF.MADD of 100 keys, 8 connections",
            args: madd,
            commands: 20_000,
            keys_per_command: MADD_KEYS as u64,
        },
    ]
}

/// A stretch's figures.
#[derive(Debug, Clone, Copy, Default)]
struct Stretch {
    seconds: f64,
    cpu_seconds: f64,
    /// The kernel's part of `cpu_seconds`: reading requests and writing replies, the same system calls for
    /// both servers.
    system_seconds: f64,
    commands: u64,
}

/// Runs `redis-benchmark` against `server` for one stretch of `workload`.
fn stretch(server: &Server, workload: &Workload) -> Stretch {
    let addr = server.resp_addr.expect("a RESP address");
    let (cpu, system) = (server.cpu_seconds(), server.system_cpu_seconds());
    let started = Instant::now();
    let output = Command::new("redis-benchmark")
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args([
            "-n",
            &workload.commands.to_string(),
            "-r",
            &(2 * FILLED).to_string(),
            "-q",
        ])
        .args(&workload.args)
        .output()
        .expect("redis-benchmark runs (apt-get install redis-tools)");
    let seconds = started.elapsed().as_secs_f64();
    assert!(
        output.status.success(),
        "redis-benchmark failed against {}: {}",
        server.name,
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("requests per second") && !text.contains("ERR"),
        "redis-benchmark against {}: {text}",
        server.name
    );
    Stretch {
        seconds,
        cpu_seconds: server.cpu_seconds() - cpu,
        system_seconds: server.system_cpu_seconds() - system,
        commands: workload.commands,
    }
}

/// A connection to `server`'s RESP port.
pub async fn connect(server: &Server) -> redis::aio::MultiplexedConnection {
    let addr = server.resp_addr.expect("a RESP address");
    redis::Client::open(format!("redis://{addr}/"))
        .expect("a redis URL")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", server.name))
}

/// Fills `server`'s `default` with the keys below `keys`, as `redis-benchmark` spells them.
pub async fn fill(server: &Server, keys: u64) {
    let mut connection = connect(server).await;
    for start in (0..keys).step_by(FILL_BATCH as usize * 100) {
        let mut pipeline = redis::pipe();
        for batch in (start..(start + FILL_BATCH * 100).min(keys)).step_by(FILL_BATCH as usize) {
            let keys: Vec<String> = (batch..batch + FILL_BATCH)
                .map(|k| format!("{k:012}"))
                .collect();
            pipeline.cmd("BF.MADD").arg("default").arg(keys).ignore();
        }
        let () = pipeline
            .query_async(&mut connection)
            .await
            .unwrap_or_else(|e| panic!("filling {}: {e}", server.name));
    }
}

pub async fn run(durable: bool) {
    let module = match procs::redisbloom_module() {
        Ok(module) => module,
        Err(why) => {
            eprintln!("{why}; the RESP bench needs it");
            return;
        }
    };
    let config = tempfile::NamedTempFile::new().expect("a temporary file");
    std::fs::write(
        config.path(),
        format!("[namespaces.default]\nexpected_keys = {FILLED}\nfalse_positive_rate = 0.01\n"),
    )
    .expect("writing the configuration");
    if durable {
        return run_durable(config.path(), &module).await;
    }
    let gate = procs::start_gate(&procs::gate_binary(), config.path(), None);
    let redisbloom = start_redisbloom(&module, &[]).await;
    println!("filling both with {FILLED} keys...");
    let filling = Instant::now();
    fill(&gate, FILLED).await;
    fill(&redisbloom, FILLED).await;
    println!("filled in {:.1} s", filling.elapsed().as_secs_f64());
    let started = Instant::now();
    let load_at_start = crate::text::load_average();
    let rows = compare(&gate, &redisbloom, workloads(), "");
    let markdown = report(
        &format!(
            "# The RESP port beside RedisBloom\n\n`cargo bench --bench load -- resp`, {} on {}; load average \
             {load_at_start} at the start; {:.0} s of stretches. The gate's bench-profile binary \
             (`--in-memory`) and `{}` with RedisBloom (the module `EXISTENCE_GATE_REDISBLOOM_MODULE` names), \
             each holding the same {FILLED} keys at 1%, driven by `redis-benchmark` on the same machine (2 cores \
             shared by client and server). Lookups draw keys below {} (half present).",
            crate::text::today(),
            crate::text::machine(),
            started.elapsed().as_secs_f64(),
            procs::redis_version(),
            2 * FILLED,
        ),
        &rows,
    );
    write_results("resp.md", &markdown);
}

/// Redis with the RedisBloom `module` loaded and `extra` arguments, holding an empty `default` filter
/// sized as the gate's.
async fn start_redisbloom(module: &Path, extra: &[&str]) -> Server {
    let module_path = module.to_string_lossy().to_string();
    let redisbloom = procs::start_redis_with(&[&["--loadmodule", &module_path], extra].concat())
        .expect("redis-server starts (apt-get install redis-server)");
    let () = redis::cmd("BF.RESERVE")
        .arg(&["default", "0.01", &FILLED.to_string()])
        .query_async(&mut connect(&redisbloom).await)
        .await
        .expect("BF.RESERVE");
    redisbloom
}

/// The write workloads with durability on (see the module's doc): a pair of fresh servers per level.
async fn run_durable(config: &Path, module: &Path) {
    let started = Instant::now();
    let load_at_start = crate::text::load_average();
    let mut rows = Vec::new();
    for (sync, appendfsync) in [("always", "always"), ("interval", "everysec")] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (gate_dir, redis_dir) = (dir.path().join("gate"), dir.path().join("redis"));
        std::fs::create_dir_all(&redis_dir).expect("creating Redis' directory");
        let gate_dir = gate_dir.to_string_lossy().to_string();
        let gate = procs::start_gate_keeping(
            &procs::gate_binary(),
            config,
            None,
            &["--data-dir", &gate_dir, "--sync", sync],
        );
        let redis_dir = redis_dir.to_string_lossy().to_string();
        let redisbloom = start_redisbloom(
            module,
            &[
                "--appendonly",
                "yes",
                "--appendfsync",
                appendfsync,
                "--dir",
                &redis_dir,
            ],
        )
        .await;
        println!(
            "--sync {sync} / appendfsync {appendfsync}: filling both with {DURABLE_FILLED} keys..."
        );
        fill(&gate, DURABLE_FILLED).await;
        fill(&redisbloom, DURABLE_FILLED).await;
        let level = format!(" (--sync {sync} / appendfsync {appendfsync})");
        let writes = workloads()
            .into_iter()
            .filter(|w| w.name.starts_with("BF.MADD") || w.name.starts_with("BF.ADD"));
        rows.extend(compare(&gate, &redisbloom, writes.collect(), &level));
    }
    let markdown = report(
        &format!(
            "# RESP writes beside RedisBloom, durable\n\n`cargo bench --bench load -- resp durable`, {} on {}; \
             load average {load_at_start} at the start; {:.0} s in all. The gate's bench-profile binary with a \
             data directory and `{}` with RedisBloom and an append-only file, both on the same ext4 disk, each \
             filter sized for {FILLED} keys at 1% and holding {DURABLE_FILLED}, driven by `redis-benchmark` on \
             the same machine (2 cores shared by client and server). `--sync always` acknowledges an `Add` once \
             its log record is fsynced (callers in flight share one fsync), as `appendfsync always` fsyncs the \
             append-only file before replying; `--sync interval` fsyncs every 100 ms, `appendfsync everysec` \
             every second.",
            crate::text::today(),
            crate::text::machine(),
            started.elapsed().as_secs_f64(),
            procs::redis_version(),
        ),
        &rows,
    );
    write_results("resp-durable.md", &markdown);
}

type Row = (Workload, [Vec<Stretch>; 2]);

/// Each of `workloads`, named with `suffix`, in [`ROUNDS`] alternating stretches on `gate` and `redisbloom`
/// after one unmeasured stretch each.
fn compare(gate: &Server, redisbloom: &Server, workloads: Vec<Workload>, suffix: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for workload in workloads {
        println!("{}...", workload.name);
        let warm = Workload {
            commands: workload.commands / 10,
            ..workload.clone()
        };
        // One unmeasured stretch each: connections and pages warm.
        stretch(gate, &warm);
        stretch(redisbloom, &warm);
        let mut sides = [Vec::new(), Vec::new()];
        for _ in 0..ROUNDS {
            sides[0].push(stretch(gate, &workload));
            sides[1].push(stretch(redisbloom, &workload));
        }
        let name = format!("{}{suffix}", workload.name).leak();
        rows.push((Workload { name, ..workload }, sides));
    }
    rows
}

/// RedisBloom's `BF.EXISTS` pipelined 16 deep from 8 connections, holding [`FILLED`] keys: its server CPU
/// per key (µs) and keys per second, the median of `ROUNDS` stretches — `None` without the module. (The
/// mirror bench's comparison: what the lookups a mirror makes local cost the fastest server.)
pub async fn exists_pipelined_16() -> Option<(f64, f64)> {
    let module = procs::redisbloom_module()
        .inspect_err(|why| eprintln!("{why}: the RedisBloom row is skipped"))
        .ok()?;
    let redisbloom = start_redisbloom(&module, &[]).await;
    println!("filling RedisBloom with {FILLED} keys...");
    fill(&redisbloom, FILLED).await;
    let workload = workloads()
        .into_iter()
        .find(|w| w.name == "BF.EXISTS, pipelined 16 deep, 8 connections")
        .expect("the workload");
    stretch(&redisbloom, &workload);
    let stretches: Vec<Stretch> = (0..ROUNDS)
        .map(|_| stretch(&redisbloom, &workload))
        .collect();
    let keys = workload.commands as f64;
    Some((
        median(
            stretches
                .iter()
                .map(|s| s.cpu_seconds * 1e6 / keys)
                .collect(),
        ),
        median(stretches.iter().map(|s| keys / s.seconds).collect()),
    ))
}

fn write_results(file: &str, markdown: &str) {
    println!("\n{markdown}");
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("benches/results")
        .join(file);
    std::fs::write(&path, markdown).expect("writing the results");
    println!("written: {}", path.display());
}

/// The median of `values`.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[middle - 1] + values[middle]) / 2.0
    } else {
        values[middle]
    }
}

/// The results page: `heading` (title and setting), how the figures are made, and the table of `rows`.
fn report(heading: &str, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{heading} {ROUNDS} alternating stretches per side; figures are medians over the stretches; server CPU \
         is user + system time of the server process per command (per key for `BF.MEXISTS` and `BF.MADD`), \
         \"of which kernel\" its system time: the kernel's work for the reads and writes (and the fsyncs), \
         which a server can only amortise over more commands per read (pipelining), not avoid.\n"
    );
    let _ = writeln!(
        out,
        "| workload | server | commands/s | keys/s | server CPU µs per key | of which kernel | gate ÷ RedisBloom |\n|---|---|---:|---:|---:|---:|---:|"
    );
    for (workload, [gate, redisbloom]) in rows {
        let per_key = |side: &[Stretch], seconds: fn(&Stretch) -> f64| {
            median(
                side.iter()
                    .map(|s| seconds(s) * 1e6 / (s.commands * workload.keys_per_command) as f64)
                    .collect(),
            )
        };
        let cpu = |side: &[Stretch]| per_key(side, |s| s.cpu_seconds);
        let kernel = |side: &[Stretch]| per_key(side, |s| s.system_seconds);
        let rate =
            |side: &[Stretch]| median(side.iter().map(|s| s.commands as f64 / s.seconds).collect());
        let (gate_cpu, redisbloom_cpu) = (cpu(gate), cpu(redisbloom));
        let (gate_rate, redisbloom_rate) = (rate(gate), rate(redisbloom));
        for (server, side_cpu, side_kernel, side_rate) in [
            ("gate", gate_cpu, kernel(gate), gate_rate),
            (
                "RedisBloom",
                redisbloom_cpu,
                kernel(redisbloom),
                redisbloom_rate,
            ),
        ] {
            let ratio = if server == "gate" {
                format!(
                    "CPU {:.2}×, throughput {:.2}×",
                    gate_cpu / redisbloom_cpu,
                    gate_rate / redisbloom_rate
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "| {} | {server} | {:.0} | {:.0} | {side_cpu:.3} | {side_kernel:.3} | {ratio} |",
                workload.name,
                side_rate,
                side_rate * workload.keys_per_command as f64
            );
        }
    }
    out
}
