//! The processes a bench measures — the gate's release binary, Redis, or any server started from a command
//! line (the load bench's trivial tonic baseline is its own binary re-run) — and what `/proc` says about
//! them: CPU time and resident memory.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `/proc/<pid>/stat` counts CPU time in clock ticks of 1/USER_HZ s; USER_HZ is 100 on every Linux ABI.
const TICKS_PER_SECOND: f64 = 100.0;

/// A child process that is killed when dropped, so that no server outlives the harness (even on a panic).
pub struct Server {
    /// What it is, for messages.
    pub name: &'static str,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Where its HTTP port (`/metrics`) listens, if it has one.
    pub http_addr: Option<SocketAddr>,
    /// Where its RESP port listens, if it has one.
    pub resp_addr: Option<SocketAddr>,
    child: Child,
}

impl Server {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// User + system CPU seconds it has used so far, all threads (including exited ones) together.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.pid())
    }

    /// The system (kernel) part of [`cpu_seconds`](Self::cpu_seconds).
    pub fn system_cpu_seconds(&self) -> f64 {
        system_cpu_seconds(self.pid())
    }

    /// Its resident memory in bytes.
    pub fn rss_bytes(&self) -> u64 {
        rss_bytes(self.pid())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// User + system CPU seconds of process `pid`, from `/proc/<pid>/stat` (fields 14 and 15).
pub fn cpu_seconds(pid: u32) -> f64 {
    let (user, system) = cpu_times(pid);
    user + system
}

/// System (kernel) CPU seconds of process `pid`: the part of [`cpu_seconds`] spent in system calls and the
/// network stack on its behalf.
pub fn system_cpu_seconds(pid: u32) -> f64 {
    cpu_times(pid).1
}

/// User and system CPU seconds of process `pid`, from `/proc/<pid>/stat` (fields 14 and 15).
fn cpu_times(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may contain spaces: count fields after its closing parenthesis.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let seconds = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0) as f64
            / TICKS_PER_SECOND
    };
    // After the name: field 3 (state) is index 0, so utime (14) is index 11 and stime (15) index 12.
    (seconds(11), seconds(12))
}

/// User + system CPU seconds of the processes `pids` together (a server made of several processes).
pub fn total_cpu_seconds(pids: &[u32]) -> f64 {
    pids.iter().map(|&pid| cpu_seconds(pid)).sum()
}

/// CPU seconds of this (the client) process.
pub fn own_cpu_seconds() -> f64 {
    cpu_seconds(std::process::id())
}

/// CPU seconds the whole machine has been busy (all CPUs; everything but idle and iowait in `/proc/stat`).
pub fn machine_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy: u64 =
        ticks.iter().sum::<u64>() - ticks.get(3).unwrap_or(&0) - ticks.get(4).unwrap_or(&0);
    busy as f64 / TICKS_PER_SECOND
}

/// Resident set size of process `pid` in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_bytes(pid: u32) -> u64 {
    status_bytes(pid, "VmRSS")
}

/// A size `field` of `/proc/<pid>/status` (`VmRSS`, `RssAnon`, `RssFile`, ...) in bytes; 0 if absent.
pub fn status_bytes(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The address after `name=` on a log line, if any.
fn address_field(line: &str, name: &str) -> Option<SocketAddr> {
    let rest = line.split(&format!("{name}=")).nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

/// Waits for a line of `child`'s stdout containing every one of `markers` and returns the values of
/// `grpc_addr=`, `http_addr=` and `resp_addr=` (seen on that or an earlier line); the rest of the output is
/// drained in the background so the child never blocks on a full pipe. Every line goes to `log` if given.
fn wait_for_address(
    child: &mut Child,
    markers: &[&str],
    what: &str,
    mut log: Option<File>,
) -> (SocketAddr, Option<SocketAddr>, Option<SocketAddr>) {
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    let mut keep = move |line: &str| {
        if let Some(log) = &mut log {
            let _ = writeln!(log, "{line}");
        }
    };
    let (mut addr, mut http_addr, mut resp_addr) = (None, None, None);
    for line in lines.by_ref() {
        let line = line.unwrap_or_else(|e| panic!("reading {what}'s output: {e}"));
        keep(&line);
        addr = address_field(&line, "grpc_addr").or(addr);
        http_addr = address_field(&line, "http_addr").or(http_addr);
        resp_addr = address_field(&line, "resp_addr").or(resp_addr);
        if let Some(addr) = addr.filter(|_| markers.iter().all(|m| line.contains(m))) {
            std::thread::spawn(move || {
                lines.for_each(|line| {
                    if let Ok(line) = line {
                        keep(&line);
                    }
                })
            });
            return (addr, http_addr, resp_addr);
        }
    }
    let status = child.wait().ok();
    panic!("{what} exited before it was serving (status {status:?})");
}

/// Starts `command`, which prints `grpc_addr=HOST:PORT` (and `http_addr=`, if it has that port) when it
/// serves, and returns once a line also holds every one of `markers`; its output goes to `log` if given.
pub fn start_serving(
    name: &'static str,
    mut command: Command,
    markers: &[&str],
    log: Option<File>,
) -> Server {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name} ({command:?}): {e}"));
    let (addr, http_addr, resp_addr) = wait_for_address(&mut child, markers, name, log);
    Server {
        name,
        addr,
        http_addr,
        resp_addr,
        child,
    }
}

/// Where `cargo bench` put the gate's binary (built with the bench profile, i.e. optimised like release),
/// or else a release build's.
pub fn gate_binary() -> PathBuf {
    if let Some(built) = crate::binary::built() {
        return built;
    }
    let release = crate::workspace_root().join("target/release/existence-gate");
    assert!(
        release.exists(),
        "the gate's binary is missing: run `cargo build --release` (or `cargo bench`, which builds it)"
    );
    release
}

/// Starts the gate, in memory only, with the configuration file `config`, on the CPUs `cpus` (a `taskset`
/// list) if given; returns once it serves.
pub fn start_gate(binary: &Path, config: &Path, cpus: Option<&str>) -> Server {
    start_gate_keeping(binary, config, cpus, &["--in-memory"])
}

/// [`start_gate`] keeping its state as `state` says: `--in-memory`, or `--data-dir DIR` with `--sync` and
/// the like.
pub fn start_gate_keeping(
    binary: &Path,
    config: &Path,
    cpus: Option<&str>,
    state: &[&str],
) -> Server {
    let mut command = match cpus {
        // `taskset` execs the gate, so the child's pid is the gate's.
        Some(cpus) => {
            let mut command = Command::new("taskset");
            command.args(["-c", cpus]).arg(binary);
            command
        }
        None => Command::new(binary),
    };
    command
        .arg("serve")
        .args(crate::ports::EPHEMERAL_PORTS)
        .args(state)
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "info")
        .env("EXISTENCE_GATE_DRAIN_DELAY", "0s");
    // The state is loaded before the "serving" line is logged.
    start_serving("gate", command, &["serving"], None)
}

// Where the benches have always looked for a free port.
pub use crate::ports::free_port;

/// Starts `command`, which listens on `port` of the loopback address, and returns once it accepts
/// connections; `None` when it cannot be started (not installed).
pub fn start_on_port(name: &'static str, mut command: Command, port: u16) -> Option<Server> {
    let child = command.stdin(Stdio::null()).spawn().ok()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let started = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{name} did not listen on {addr} within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(Server {
        name,
        addr,
        http_addr: None,
        resp_addr: Some(addr),
        child,
    })
}

/// Starts `redis-server` on a loopback port without persistence; `None` when it is not installed.
pub fn start_redis() -> Option<Server> {
    start_redis_with(&[])
}

/// The RedisBloom module the benchmarks compare against: the `redisbloom.so` that
/// `EXISTENCE_GATE_REDISBLOOM_MODULE` names (RedisBloom is in no registry these machines reach, so the
/// project ships no copy of it and no way to build it). `Err` says why it is left out.
pub fn redisbloom_module() -> Result<std::path::PathBuf, String> {
    const VARIABLE: &str = "EXISTENCE_GATE_REDISBLOOM_MODULE";
    let path = std::env::var_os(VARIABLE).ok_or_else(|| {
        format!(
            "{VARIABLE} is not set to a RedisBloom module (redisbloom.so): RedisBloom is left out"
        )
    })?;
    let path = std::path::PathBuf::from(path);
    if !path.is_file() {
        return Err(format!(
            "{VARIABLE} names {}, which is not a file: RedisBloom is left out",
            path.display()
        ));
    }
    Ok(path)
}

/// [`start_redis`] with more arguments (`--loadmodule PATH`).
pub fn start_redis_with(extra: &[&str]) -> Option<Server> {
    let port = free_port();
    let mut command = Command::new("redis-server");
    command
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    start_on_port("redis", command, port)
}

/// One line describing `redis-server`'s version.
pub fn redis_version() -> String {
    Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
