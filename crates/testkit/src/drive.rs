//! Load generators: closed loop (a fixed number of calls in flight, each task sending its next call when the
//! last one returns) and open loop (calls started at a fixed rate whatever the answers' latency), and the
//! figures one measurement yields.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::procs;

/// What one measured stretch of load produced.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Calls that succeeded.
    pub calls: u64,
    /// Keys those calls carried.
    pub keys: u64,
    /// Calls that failed (or answered something unexpected).
    pub errors: u64,
    /// Wall-clock seconds from the first call to the last answer.
    pub wall: f64,
    /// CPU seconds the server used meanwhile.
    pub server_cpu: f64,
    /// CPU seconds this (client) process used meanwhile.
    pub client_cpu: f64,
    /// CPU seconds all processes on the machine used meanwhile (`/proc/stat`).
    pub machine_cpu: f64,
    /// Latency of every successful call, in nanoseconds.
    pub latencies: Vec<u64>,
    /// Latency of every call the server shed with `RESOURCE_EXHAUSTED` (open loop only; not in `errors`),
    /// in nanoseconds.
    pub refusals: Vec<u64>,
}

impl Sample {
    /// Adds another stretch of the same workload.
    pub fn merge(&mut self, other: Sample) {
        self.calls += other.calls;
        self.keys += other.keys;
        self.errors += other.errors;
        self.wall += other.wall;
        self.server_cpu += other.server_cpu;
        self.client_cpu += other.client_cpu;
        self.machine_cpu += other.machine_cpu;
        self.latencies.extend(other.latencies);
        self.refusals.extend(other.refusals);
    }

    /// Calls per second.
    pub fn calls_per_second(&self) -> f64 {
        self.calls as f64 / self.wall
    }

    /// Keys per second.
    pub fn keys_per_second(&self) -> f64 {
        self.keys as f64 / self.wall
    }

    /// Server CPU microseconds per call.
    pub fn server_us_per_call(&self) -> f64 {
        self.server_cpu * 1e6 / self.calls.max(1) as f64
    }

    /// Server CPU microseconds per key.
    pub fn server_us_per_key(&self) -> f64 {
        self.server_cpu * 1e6 / self.keys.max(1) as f64
    }

    /// Client CPU microseconds per call.
    pub fn client_us_per_call(&self) -> f64 {
        self.client_cpu * 1e6 / self.calls.max(1) as f64
    }

    /// Server cores busy on average.
    pub fn server_cores(&self) -> f64 {
        self.server_cpu / self.wall
    }

    /// Cores busy on average with processes other than the server and the client (other work on a shared
    /// machine).
    pub fn other_cores(&self) -> f64 {
        ((self.machine_cpu - self.server_cpu - self.client_cpu) / self.wall).max(0.0)
    }

    /// Keys per second of server CPU: throughput per fully used server core.
    pub fn keys_per_server_core_second(&self) -> f64 {
        self.keys as f64 / self.server_cpu.max(1e-9)
    }

    /// Sorts the latencies so percentiles can be read.
    pub fn sort(&mut self) {
        self.refusals.sort_unstable();
        self.latencies.sort_unstable();
    }

    /// The `p`-quantile latency in microseconds (latencies must be sorted).
    pub fn latency_us(&self, p: f64) -> f64 {
        percentile_us(&self.latencies, p)
    }
}

/// The `p`-quantile of sorted nanosecond latencies, in microseconds.
pub fn percentile_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index] as f64 / 1_000.0
}

/// The outcome of one call: how many keys it carried, or why it failed.
pub type CallResult = Result<u64, String>;

/// How a call's error starts when the server shed it (the `Debug` name of `Code::ResourceExhausted`).
pub const SHED_PREFIX: &str = "ResourceExhausted";

/// One kind of call: `op(connection, n)` sends call number `n` on `connection`.
pub type Op =
    Arc<dyn Fn(usize, u64) -> Pin<Box<dyn Future<Output = CallResult> + Send>> + Send + Sync>;

/// Wraps a closure returning a future as an [`Op`].
pub fn op<F, Fut>(f: F) -> Op
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = CallResult> + Send + 'static,
{
    Arc::new(move |connection, n| Box::pin(f(connection, n)))
}

/// When a closed-loop run stops sending calls (those in flight then finish).
#[derive(Debug, Clone, Copy)]
pub enum Until {
    /// Once this long has passed since the first call.
    Elapsed(Duration),
    /// Once this many calls have been sent: a run of fixed work, whose length is the measurement.
    Calls(u64),
}

/// Runs `op` closed-loop for `duration` from `connections × in_flight` tasks and measures `server_pid`.
/// `op(connection, n)` sends one call on `connection`; `n` numbers calls uniquely across tasks.
pub async fn closed_loop(
    connections: usize,
    in_flight: usize,
    duration: Duration,
    server_pid: u32,
    op: &Op,
) -> Sample {
    let until = Until::Elapsed(duration);
    closed_loop_until(connections, in_flight, until, &[server_pid], op).await
}

/// Runs `op` closed-loop from `connections × in_flight` tasks until `until`, and measures the processes
/// `servers` together (a server of several processes). `op(connection, n)` sends one call on `connection`;
/// `n` numbers calls from 0 in the order they are sent.
pub async fn closed_loop_until(
    connections: usize,
    in_flight: usize,
    until: Until,
    servers: &[u32],
    op: &Op,
) -> Sample {
    let tasks = connections * in_flight;
    let server_before = procs::total_cpu_seconds(servers);
    let client_before = procs::own_cpu_seconds();
    let machine_before = procs::machine_cpu_seconds();
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (op, next, failed) = (Arc::clone(op), Arc::clone(&next), Arc::clone(&failed));
            tokio::spawn(async move {
                let mut sample = Sample::default();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let more = match until {
                        Until::Elapsed(duration) => started.elapsed() < duration,
                        Until::Calls(calls) => n < calls,
                    };
                    if !more {
                        break;
                    }
                    let sent = Instant::now();
                    match op(task % connections, n).await {
                        Ok(keys) => {
                            sample.latencies.push(sent.elapsed().as_nanos() as u64);
                            sample.calls += 1;
                            sample.keys += keys;
                        }
                        Err(error) => {
                            // The run's first failure: the rest are counted.
                            if !failed.swap(true, Ordering::Relaxed) {
                                eprintln!("  call failed: {error}");
                            }
                            sample.errors += 1;
                        }
                    }
                }
                sample
            })
        })
        .collect();
    let mut total = Sample::default();
    for handle in handles {
        total.merge(handle.await.expect("a load task panicked"));
    }
    total.wall = started.elapsed().as_secs_f64();
    total.server_cpu = procs::total_cpu_seconds(servers) - server_before;
    total.client_cpu = procs::own_cpu_seconds() - client_before;
    total.machine_cpu = procs::machine_cpu_seconds() - machine_before;
    total
}

/// One call of an open-loop run: when it started (seconds since the run began) and its latency (ns).
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    /// Seconds from the start of the run to the call's start.
    pub at: f64,
    /// Nanoseconds until its answer.
    pub latency: u64,
}

/// Starts `op(connection, n)` at `rate` calls per second for `duration`, spread round-robin over
/// `connections`, however long answers take (no call waits for another). The pacer wakes every
/// millisecond (the timer's resolution) and starts the calls due by then, so calls leave in small bursts.
/// Returns the sample and each call's start time, for looking at a stretch of the run.
pub async fn open_loop(
    rate: f64,
    connections: usize,
    duration: Duration,
    server_pid: u32,
    op: &Op,
) -> (Sample, Vec<Timed>) {
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<(Timed, CallResult)>();
    let server_before = procs::cpu_seconds(server_pid);
    let client_before = procs::own_cpu_seconds();
    let machine_before = procs::machine_cpu_seconds();
    let started = Instant::now();
    let mut issued = 0u64;
    loop {
        let elapsed = started.elapsed();
        if elapsed >= duration {
            break;
        }
        let due = (elapsed.as_secs_f64() * rate) as u64;
        while issued < due {
            let (op, sender) = (Arc::clone(op), sender.clone());
            let n = issued;
            tokio::spawn(async move {
                let sent = Instant::now();
                let at = sent.duration_since(started).as_secs_f64();
                let result = op((n as usize) % connections, n).await;
                let latency = sent.elapsed().as_nanos() as u64;
                let _ = sender.send((Timed { at, latency }, result));
            });
            issued += 1;
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    drop(sender);
    let mut timed = Vec::with_capacity(issued as usize);
    let mut sample = Sample::default();
    while let Some((call, result)) = receiver.recv().await {
        match result {
            Ok(keys) => {
                sample.calls += 1;
                sample.keys += keys;
                sample.latencies.push(call.latency);
                timed.push(call);
            }
            Err(error) if error.starts_with(SHED_PREFIX) => sample.refusals.push(call.latency),
            Err(_) => sample.errors += 1,
        }
    }
    sample.wall = started.elapsed().as_secs_f64();
    sample.server_cpu = procs::cpu_seconds(server_pid) - server_before;
    sample.client_cpu = procs::own_cpu_seconds() - client_before;
    sample.machine_cpu = procs::machine_cpu_seconds() - machine_before;
    timed.sort_by(|a, b| a.at.total_cmp(&b.at));
    (sample, timed)
}
