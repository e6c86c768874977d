//! What a coalesced single-key lookup costs the calling process in each client library, beside what
//! `redis-benchmark` spends per `BF.EXISTS` against RedisBloom, unpipelined and 16 deep, all in one run.
//!
//! Every client library runs the same program: 64 concurrent callers, each with one lookup in flight, against
//! a gate of its own (this bench-profile binary, one namespace, keys never added), and reports its own
//! process's CPU (user + system, every thread: callers, coalescer, gRPC, runtime, JIT and GC where there are
//! some) per lookup. Rust runs here, in this process (the gate is a separate process); Go, Node, Python and
//! Java (Java and Python with blocked threads and with asynchronous callers) run their `bench` scripts (`clients/<language>/bench.sh`, `clients/node/bench/coalesced.js`), whose
//! figures are read from their output. `redis-benchmark`'s CPU is its own, from `getrusage` of the waited
//! child. The languages alternate, `ROUNDS` times, so the machine's other load falls on all of them.
//!
//! Run with `cargo bench --bench load -- clients`; writes `benches/results/clients.md`. A language whose
//! toolchain or package is missing is said and skipped. `-- clients rust go` measures only those callers
//! and prints them without writing the file.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use existence_gate_client::{ClientOptions, GateClient};

use crate::procs;

/// Rounds of every language, alternating.
const ROUNDS: usize = 3;
/// Concurrent callers, each with one lookup in flight.
const CALLERS: u64 = 64;
/// Lookups measured per round (Python's callers are slower: fewer, for the same time).
const LOOKUPS: u64 = 200_000;
const PYTHON_LOOKUPS: u64 = 50_000;
/// `redis-benchmark` commands per round.
const REDIS_COMMANDS: u64 = 400_000;

/// One round's figures for one caller.
#[derive(Clone, Copy)]
struct Figure {
    cpu_us_per_lookup: f64,
    keys_per_call: Option<f64>,
    lookups_per_second: f64,
}

/// How a caller is run.
enum How {
    /// The Rust client, in this process: on the harness's multi-thread runtime (two workers here), or on a
    /// current-thread runtime of its own, where no lookup's completion wakes another thread.
    Rust { current_thread: bool },
    /// A script in a client's directory that prints its figures.
    Script {
        dir: &'static str,
        command: &'static [&'static str],
        lookups: u64,
    },
    /// `redis-benchmark`, `pipeline` commands deep.
    RedisBenchmark { pipeline: u32 },
}

/// One caller measured: its name, how it runs, and every round's figure (or why it could not run).
struct Caller {
    name: &'static str,
    how: How,
    rounds: Vec<Figure>,
    skipped: Option<String>,
}

/// Every caller, in the order each round runs them.
fn callers() -> Vec<Caller> {
    let script = |dir, command, lookups| How::Script {
        dir,
        command,
        lookups,
    };
    [
        (
            "Rust (64 tasks, multi-thread runtime)",
            How::Rust {
                current_thread: false,
            },
        ),
        (
            "Rust (64 tasks, current-thread runtime)",
            How::Rust {
                current_thread: true,
            },
        ),
        (
            "Go (64 goroutines)",
            script("clients/go", &["bash", "bench.sh"], LOOKUPS),
        ),
        (
            "Java (64 threads)",
            script("clients/java", &["bash", "bench.sh"], LOOKUPS),
        ),
        (
            "Java (64 async callers)",
            script("clients/java", &["bash", "bench.sh", "async"], LOOKUPS),
        ),
        (
            "Node (64 async callers)",
            script("clients/node", &["node", "bench/coalesced.js"], LOOKUPS),
        ),
        (
            "Python (64 threads)",
            script("clients/python", &["bash", "bench.sh"], PYTHON_LOOKUPS),
        ),
        (
            "Python (64 asyncio tasks)",
            script(
                "clients/python",
                &["bash", "bench.sh", "async"],
                PYTHON_LOOKUPS,
            ),
        ),
        (
            "redis-benchmark, BF.EXISTS unpipelined",
            How::RedisBenchmark { pipeline: 1 },
        ),
        (
            "redis-benchmark, BF.EXISTS 16 deep",
            How::RedisBenchmark { pipeline: 16 },
        ),
    ]
    .into_iter()
    .map(|(name, how)| Caller {
        name,
        how,
        rounds: Vec::new(),
        skipped: None,
    })
    .collect()
}

pub async fn run() {
    let started = Instant::now();
    let binary = procs::gate_binary();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let module = procs::redisbloom_module();
    // `-- clients rust go`: only the callers whose names start with these words.
    let only: Vec<String> = std::env::args()
        .skip_while(|a| a != "clients")
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(|a| a.to_lowercase())
        .collect();
    let mut callers = callers();
    callers.retain(|c| {
        only.is_empty()
            || only
                .iter()
                .any(|o| c.name.to_lowercase().starts_with(o.as_str()))
    });
    for round in 1..=ROUNDS {
        for caller in callers.iter_mut().filter(|c| c.skipped.is_none()) {
            println!("round {round}/{ROUNDS}: {}", caller.name);
            let measured = match &caller.how {
                How::Rust {
                    current_thread: false,
                } => Ok(rust(&binary).await),
                How::Rust {
                    current_thread: true,
                } => Ok(on_current_thread(&binary)),
                How::Script {
                    dir,
                    command,
                    lookups,
                } => script(root, dir, command, &binary, *lookups),
                How::RedisBenchmark { pipeline } => module
                    .clone()
                    .and_then(|module| redis_benchmark(&module, *pipeline)),
            };
            match measured {
                Ok(figure) => caller.rounds.push(figure),
                Err(why) => {
                    eprintln!("{}: skipped: {why}", caller.name);
                    caller.skipped = Some(why);
                }
            }
        }
    }
    let markdown = report(&callers, started.elapsed());
    if !only.is_empty() {
        return println!(
            "{markdown}\n(some callers only: benches/results/clients.md left as it was)"
        );
    }
    let path = root.join("benches/results/clients.md");
    std::fs::write(&path, &markdown).expect("writing clients.md");
    println!("{markdown}\nwritten: {}", path.display());
}

/// The Rust client in this process against a gate of its own.
async fn rust(binary: &Path) -> Figure {
    let config = tempfile::NamedTempFile::new().expect("a temporary file");
    std::fs::write(
        config.path(),
        "[namespaces.users]\nexpected_keys = 100000\n",
    )
    .expect("writing the configuration");
    let gate = procs::start_gate(binary, config.path(), None);
    let options = ClientOptions {
        namespace: "users".to_string(),
        ..ClientOptions::default()
    };
    let client = GateClient::new([gate.addr.to_string()], options).expect("a valid address");
    let keys: Arc<Vec<Bytes>> = Arc::new(
        (0..4096)
            .map(|i| Bytes::from(format!("bench-{i}")))
            .collect(),
    );
    lookups(&client, &keys, 10_000).await; // connections and batches warm
    let before = client.stats();
    let cpu = procs::own_cpu_seconds();
    let clock = Instant::now();
    lookups(&client, &keys, LOOKUPS).await;
    let seconds = clock.elapsed().as_secs_f64();
    let used = procs::own_cpu_seconds() - cpu;
    let after = client.stats();
    Figure {
        cpu_us_per_lookup: used * 1e6 / LOOKUPS as f64,
        keys_per_call: Some(
            (after.batched_keys - before.batched_keys) as f64
                / (after.gate_calls - before.gate_calls) as f64,
        ),
        lookups_per_second: LOOKUPS as f64 / seconds,
    }
}

/// [`rust`] on a current-thread runtime of its own, on a thread of its own.
fn on_current_thread(binary: &Path) -> Figure {
    let binary = binary.to_path_buf();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime")
            .block_on(rust(&binary))
    })
    .join()
    .expect("the current-thread round")
}

/// `total` lookups through `client` from `CALLERS` tasks.
async fn lookups(client: &GateClient, keys: &Arc<Vec<Bytes>>, total: u64) {
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (client, keys, next) = (client.clone(), Arc::clone(keys), Arc::clone(&next));
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return;
                    }
                    let key = keys[i as usize % keys.len()].clone();
                    client.may_exist(key).await.expect("a lookup");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a caller");
    }
}

/// Another language's bench, run in `dir` with the gate's binary; its figures read from its output.
fn script(
    root: &Path,
    dir: &str,
    command: &[&str],
    binary: &Path,
    lookups: u64,
) -> Result<Figure, String> {
    let output = Command::new(command[0])
        .args(&command[1..])
        .current_dir(root.join(dir))
        .env("EXISTENCE_GATE_BIN", binary)
        .env("BENCH_LOOKUPS", lookups.to_string())
        .output()
        .map_err(|e| format!("cannot run {command:?} in {dir}: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        return Err(format!(
            "{command:?} in {dir} exited with {}: {}",
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        ));
    }
    // The scripts say "X µs of client CPU per lookup, Y keys per call, Z lookups/s"; Go's benchmark line
    // "X client-cpu-µs/lookup ... Y keys/rpc ... Z lookups/s".
    let cpu = number_before(&text, "µs of client CPU per lookup")
        .or_else(|| number_before(&text, "client-cpu-µs/lookup"));
    let keys = number_before(&text, "keys per call").or_else(|| number_before(&text, "keys/rpc"));
    match (cpu, number_before(&text, "lookups/s")) {
        (Some(cpu_us_per_lookup), Some(lookups_per_second)) => Ok(Figure {
            cpu_us_per_lookup,
            keys_per_call: keys,
            lookups_per_second,
        }),
        _ => Err(format!("no figures in the output of {command:?}: {text}")),
    }
}

/// The number written just before the first `marker` in `text`.
fn number_before(text: &str, marker: &str) -> Option<f64> {
    let (before, _) = text.split_once(marker)?;
    before.split_whitespace().last()?.parse().ok()
}

/// `redis-benchmark` from 64 connections, `pipeline` commands deep, against RedisBloom holding nothing
/// (every `BF.EXISTS` answers 0, as the gates answer `ABSENT`): its own CPU per command.
fn redis_benchmark(module: &Path, pipeline: u32) -> Result<Figure, String> {
    let module = module.to_str().expect("a UTF-8 path");
    let redis = procs::start_redis_with(&["--loadmodule", module])
        .ok_or("redis-server is not installed")?;
    let port = redis.addr.port().to_string();
    let reserved = Command::new("redis-cli")
        .args(["-p", &port, "BF.RESERVE", "users", "0.01", "100000"])
        .output()
        .map_err(|e| format!("redis-cli: {e}"))?;
    if !String::from_utf8_lossy(&reserved.stdout).contains("OK") {
        return Err(format!("BF.RESERVE: {reserved:?}"));
    }
    let children = children_cpu_seconds();
    let clock = Instant::now();
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port, "-c", &CALLERS.to_string()])
        .args([
            "-n",
            &REDIS_COMMANDS.to_string(),
            "-P",
            &pipeline.to_string(),
        ])
        .args([
            "-r",
            "4096",
            "-q",
            "BF.EXISTS",
            "users",
            "bench-__rand_int__",
        ])
        .output()
        .map_err(|e| format!("redis-benchmark (apt-get install redis-tools): {e}"))?;
    let seconds = clock.elapsed().as_secs_f64();
    let used = children_cpu_seconds() - children;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() || text.contains("ERR") {
        return Err(format!("redis-benchmark: {text}"));
    }
    Ok(Figure {
        cpu_us_per_lookup: used * 1e6 / REDIS_COMMANDS as f64,
        keys_per_call: None,
        lookups_per_second: REDIS_COMMANDS as f64 / seconds.max(f64::EPSILON),
    })
}

/// User + system CPU seconds of this process's waited-for children (`getrusage(RUSAGE_CHILDREN)`).
fn children_cpu_seconds() -> f64 {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed value it is given and reads nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The median of `values` (sorted in place).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn report(callers: &[Caller], elapsed: Duration) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Client CPU per coalesced lookup, every client library beside redis-benchmark\n\n\
         `cargo bench --bench load -- clients` ({:.0} s, {ROUNDS} alternating rounds; medians, the range in \
         brackets). Each library: {CALLERS} concurrent callers with one lookup in flight each, coalescing at \
         its defaults (200 µs window, 1,024 keys), against a gate of its own on loopback; its process's CPU \
         per lookup. redis-benchmark: {CALLERS} connections, `BF.EXISTS` against RedisBloom, its own CPU per \
         command. {}\n",
        elapsed.as_secs_f64(),
        procs::redis_version()
    );
    let rust = callers
        .iter()
        .find(|c| {
            matches!(
                c.how,
                How::Rust {
                    current_thread: false
                }
            ) && !c.rounds.is_empty()
        })
        .map(|c| {
            median(
                &mut c
                    .rounds
                    .iter()
                    .map(|f| f.cpu_us_per_lookup)
                    .collect::<Vec<_>>(),
            )
        });
    md.push_str(
        "| caller | client CPU per lookup | × Rust | keys per call | lookups/s |\n|---|---|---|---|---|\n",
    );
    for caller in callers {
        if let Some(why) = &caller.skipped {
            let _ = writeln!(md, "| {} | skipped: {why} | | | |", caller.name);
            continue;
        }
        let mut cpu: Vec<f64> = caller.rounds.iter().map(|f| f.cpu_us_per_lookup).collect();
        let mut rate: Vec<f64> = caller.rounds.iter().map(|f| f.lookups_per_second).collect();
        let mut keys: Vec<f64> = caller
            .rounds
            .iter()
            .filter_map(|f| f.keys_per_call)
            .collect();
        let (low, high) = (
            cpu.iter().copied().fold(f64::MAX, f64::min),
            cpu.iter().copied().fold(0.0, f64::max),
        );
        let cpu_median = median(&mut cpu);
        let ratio = rust.map_or(String::new(), |r| format!("{:.2}x", cpu_median / r));
        let keys = if keys.is_empty() {
            "—".to_string()
        } else {
            format!("{:.1}", median(&mut keys))
        };
        let _ = writeln!(
            md,
            "| {} | {cpu_median:.2} µs [{low:.2}–{high:.2}] | {ratio} | {keys} | {:.0} |",
            caller.name,
            median(&mut rate)
        );
    }
    md
}
