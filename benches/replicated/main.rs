//! The replicated bench: what replicated mode costs and delivers on this machine, with real processes —
//! nats-server (one server for an R1 stream, a three-server JetStream cluster for R3) and three
//! `existence-gate serve --nats` replicas of the stream per deployment, all on loopback ports.
//!
//! `cargo bench --bench replicated` builds the gate with the bench profile (optimised like release), starts
//! both deployments side by side and measures, in one run of about two minutes:
//!
//! 0. **at rest**: the CPU each deployment uses to keep its replicas' read leases;
//! 1. **writes**: `Add` of one key (one call in flight per replica, then thirty: how many share a message),
//!    then of 1,000 keys (three in flight per replica), through all three replicas for a fixed number of calls per deployment, in stretches
//!    alternating between R1 and R3 so that a change in the machine's load hits both: keys/s and the latency
//!    of the acknowledgement (published, applied here, reported by every member or the fallback passed);
//! 2. **catch-up**: one replica stopped (SIGSTOP) while single-key Adds, then 1,000-key Adds, go through
//!    the other two; once continued, the time until its applied seq reaches the stream's last seq;
//! 3. **reads** of the R1 deployment (R3 is stopped first): `BatchMayExist` and unary `MayExist` from
//!    clients spread over one, two and three replicas, in alternating stretches;
//!
//! and writes `benches/results/replicated.md`. `cargo bench --bench replicated -- sync [r3]` ([`side_by_side`]) measures `Add`s
//! with the NATS servers syncing before they acknowledge against NATS's default, side by side
//! (`benches/results/replicated-sync.md`). `cargo bench --bench replicated -- mirrors` measures what mirrors
//! cost a replica's `Add`s (see [`mirrors`]). `cargo bench --bench replicated -- bootstrap` measures
//! instead how long a wiped replica takes to serve a stream of 10,000,000 keys (see [`bootstrap`]). The harness, the NATS servers and the replicas share the
//! machine's cores, so throughput is end to end on a crowded machine; server CPU per call (from
//! `/proc/<pid>/stat`) is the figure that carries over to a machine of their own.
//!
//! Under `cargo test --benches` (no `--bench` argument) it does nothing.

// The load harness's processes, load generators, keys and report text; the serve flags for free loopback
// ports; the tests' TCP proxy (delay, silence, cut), for the fault stretches.
use existence_gate_testkit::{drive, keys, ports, procs, proxy, text};

mod bootstrap;
mod deployment;
mod faults;
mod mirrors;
mod report;
mod side_by_side;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use existence_gate::proto::{AddRequest, Basis, BatchMayExistRequest, MayExistRequest};
use tonic::transport::Channel;

use deployment::{Deployment, Replica};
use drive::{Op, Sample, Until};
use keys::{keys, pack};
use report::{CatchUp, Idle, Reads, Report, Writes};

/// Keys per `Add` (writes, the batched catch-up) and per `BatchMayExist`.
const BATCH: u64 = 1_000;
/// Calls in flight per replica written to: 9 in all on three replicas, 6 on the two of the catch-up.
const WRITES_PER_REPLICA: usize = 3;
/// 1,000-key Adds measured per deployment, in `WRITE_ROUNDS` stretches alternating between deployments.
const WRITE_BATCHES: u64 = 2_000;
const WRITE_ROUNDS: u64 = 4;
/// Adds before the measurement (connections warm, the stream's files and the filters' pages touched).
const WARM_UP_BATCHES: u64 = 50;
/// Catch-up: single-key Adds, then 1,000-key Adds, written while one replica is stopped.
const CATCH_UP_SINGLE: u64 = 4_000;
const CATCH_UP_BATCHES: u64 = 1_000;
/// Lookups in flight, spread evenly over the replicas read (12 divides by 1, 2 and 3).
const READ_IN_FLIGHT: usize = 12;
/// Calls per stretch of reads; each replica count gets `READ_ROUNDS` stretches of each workload.
const BATCH_READS: u64 = 4_000;
const UNARY_READS: u64 = 20_000;
const READ_ROUNDS: usize = 5;
/// How long the deployments' CPU is measured at rest.
const IDLE: Duration = Duration::from_secs(2);

/// Key spaces: keys of the measured writes, of the catch-up Adds, and keys never added.
const WRITTEN: u64 = 0;
const CAUGHT_UP_SINGLE: u64 = 1 << 40;
const SINGLE_WRITTEN: u64 = 1 << 39;
const CROWDED_WRITTEN: u64 = 1 << 38;
const CAUGHT_UP_BATCHES: u64 = 1 << 41;
const NEVER_ADDED: u64 = 1 << 42;
/// Distinct keys unary lookups cycle through; prebuilt lookup batches.
const UNARY_POOL: u64 = 1 << 16;
const BATCH_POOL: u64 = 64;

/// The replicas' configuration: `default` sized for every key the run adds at 1%.
const CONFIG: &str = r#"[namespaces.default]
expected_keys = 4000000
false_positive_rate = 0.01
"#;

type Clients = Arc<Vec<ExistenceGateClient<Channel>>>;

/// What went wrong in a run beyond how often: each error message with its count, and lookups answered
/// fail-open (`MAY_EXIST` + `WARMING`: the replica held no read lease).
#[derive(Default)]
struct Tally {
    errors: Mutex<BTreeMap<String, u64>>,
    fail_open: AtomicU64,
}

impl Tally {
    /// Counts a failed call; its message, for the load generator.
    fn error(&self, status: tonic::Status) -> String {
        let message = format!("{:?}: {}", status.code(), status.message());
        *self
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(message.clone())
            .or_default() += 1;
        message
    }

    fn fail_open(&self) -> u64 {
        self.fail_open.load(Ordering::Relaxed)
    }

    fn messages(&self) -> Vec<(String, u64)> {
        let errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        errors.iter().map(|(m, n)| (m.clone(), *n)).collect()
    }
}

/// `connections` clients, each on its own connection, connection `c` to `replicas[c % replicas.len()]`.
async fn connect(replicas: &[Replica], connections: usize) -> Clients {
    let mut clients = Vec::new();
    for c in 0..connections {
        clients.push(replicas[c % replicas.len()].client().await);
    }
    Arc::new(clients)
}

/// `Add`s of `batch` keys `base + i` in `default`, each call the next `batch` keys (`next` counts calls).
fn add(clients: &Clients, base: u64, batch: u64, next: Arc<AtomicU64>, tally: &Arc<Tally>) -> Op {
    let (clients, tally) = (Arc::clone(clients), Arc::clone(tally));
    drive::op(move |c, _| {
        let mut client = clients[c].clone();
        let first = base + next.fetch_add(1, Ordering::Relaxed) * batch;
        let tally = Arc::clone(&tally);
        async move {
            let request = AddRequest {
                namespace: String::new(),
                keys: keys(first..first + batch),
                ..Default::default()
            };
            match client.add(request).await {
                Ok(_) => Ok(batch),
                Err(status) => Err(tally.error(status)),
            }
        }
    })
}

/// The `j`-th key looked up: even `j` are keys the measured writes added, odd `j` keys never added.
fn lookup_index(j: u64, written: u64) -> u64 {
    if j & 1 == 0 {
        WRITTEN + (j / 2).wrapping_mul(7_919) % written
    } else {
        NEVER_ADDED + j
    }
}

/// Builds a lookup workload: `op(clients, keys written, tally)`.
type LookupOp = fn(&Clients, u64, &Arc<Tally>) -> Op;

/// `BatchMayExist` of `BATCH` keys with `packed_keys`, cycling through prebuilt requests; a bitmap without
/// a single `ABSENT` (half the keys were never added) counts as fail-open.
fn batch_lookups(clients: &Clients, written: u64, tally: &Arc<Tally>) -> Op {
    let requests: Arc<Vec<BatchMayExistRequest>> = Arc::new(
        (0..BATCH_POOL)
            .map(|b| BatchMayExistRequest {
                namespace: String::new(),
                keys: Vec::new(),
                packed_keys: pack(&keys(
                    (0..BATCH).map(|i| lookup_index(b * BATCH + i, written)),
                )),
                ..Default::default()
            })
            .collect(),
    );
    let (clients, tally) = (Arc::clone(clients), Arc::clone(tally));
    drive::op(move |c, n| {
        let mut client = clients[c].clone();
        let request = requests[(n % BATCH_POOL) as usize].clone();
        let tally = Arc::clone(&tally);
        async move {
            let reply = client
                .batch_may_exist(request)
                .await
                .map_err(|status| tally.error(status))?
                .into_inner();
            let bitmap = &reply.may_exist_bitmap;
            if bitmap.len() != BATCH.div_ceil(8) as usize {
                return Err(format!("{} bitmap bytes for {BATCH} keys", bitmap.len()));
            }
            if bitmap.iter().all(|&byte| byte == 0xFF) {
                tally.fail_open.fetch_add(1, Ordering::Relaxed);
            }
            Ok(BATCH)
        }
    })
}

/// Unary `MayExist` cycling through `UNARY_POOL` keys; a `WARMING` answer counts as fail-open.
fn unary_lookups(clients: &Clients, written: u64, tally: &Arc<Tally>) -> Op {
    let pool: Arc<Vec<Bytes>> = Arc::new(keys((0..UNARY_POOL).map(|j| lookup_index(j, written))));
    let (clients, tally) = (Arc::clone(clients), Arc::clone(tally));
    drive::op(move |c, n| {
        let mut client = clients[c].clone();
        let key = pool[(n % UNARY_POOL) as usize].clone();
        let tally = Arc::clone(&tally);
        async move {
            let request = MayExistRequest {
                namespace: String::new(),
                key,
            };
            let reply = client
                .may_exist(request)
                .await
                .map_err(|status| tally.error(status))?
                .into_inner();
            if reply.basis() == Basis::Warming {
                tally.fail_open.fetch_add(1, Ordering::Relaxed);
            }
            Ok(1)
        }
    })
}

/// One side of an alternating comparison: the calls it sends and what its stretches measured so far.
struct Side<'a> {
    deployment: &'a Deployment,
    clients: Clients,
    op: Op,
    tally: Arc<Tally>,
    /// Calls per stretch.
    calls: u64,
    /// The replicas the calls go to, whose CPU is reported apart from the deployment's.
    focus: Vec<u32>,
    total: Sample,
    focus_cpu: f64,
    /// CPU seconds of the deployment's NATS servers over the measured stretches.
    nats_cpu: f64,
    /// CPU seconds of this process (the load generator) over the measured stretches: it shares the cores
    /// with the deployments, and spends the same per call whichever build it calls.
    client_cpu: f64,
    /// Calls per second of each stretch, to show how much the machine's load moved them.
    rates: Vec<f64>,
}

impl<'a> Side<'a> {
    /// Calls of `op(clients, tally)` to `replicas` of `deployment` over `connections` connections, one
    /// call in flight on each, `calls` per stretch.
    async fn new(
        deployment: &'a Deployment,
        replicas: &[Replica],
        connections: usize,
        calls: u64,
        op: impl FnOnce(&Clients, &Arc<Tally>) -> Op,
    ) -> Side<'a> {
        let clients = connect(replicas, connections).await;
        let tally = Arc::new(Tally::default());
        Self {
            deployment,
            op: op(&clients, &tally),
            clients,
            tally,
            calls,
            focus: replicas.iter().map(|r| r.server.pid()).collect(),
            total: Sample::default(),
            focus_cpu: 0.0,
            nats_cpu: 0.0,
            client_cpu: 0.0,
            rates: Vec::new(),
        }
    }

    /// `calls` calls from one task per connection, measuring every process of the deployment and, apart,
    /// the replicas called (their CPU seconds are returned with the sample).
    async fn stretch(&self, calls: u64) -> (Sample, f64) {
        let before = procs::total_cpu_seconds(&self.focus);
        let pids = self.deployment.pids();
        let connections = self.clients.len();
        let sample =
            drive::closed_loop_until(connections, 1, Until::Calls(calls), &pids, &self.op).await;
        (sample, procs::total_cpu_seconds(&self.focus) - before)
    }

    /// A stretch that counts towards the result.
    async fn measure(&mut self) {
        let nats = self.deployment.nats_pids();
        let nats_before = procs::total_cpu_seconds(&nats);
        let client_before = procs::own_cpu_seconds();
        let (sample, focus_cpu) = self.stretch(self.calls).await;
        self.nats_cpu += procs::total_cpu_seconds(&nats) - nats_before;
        self.client_cpu += procs::own_cpu_seconds() - client_before;
        self.rates.push(sample.calls_per_second());
        self.total.merge(sample);
        self.focus_cpu += focus_cpu;
    }

    /// The NATS servers' CPU seconds per measured call.
    fn nats_cpu_per_call(&self) -> f64 {
        self.nats_cpu / self.total.calls as f64
    }

    /// The load generator's CPU seconds per measured call.
    fn client_cpu_per_call(&self) -> f64 {
        self.client_cpu / self.total.calls as f64
    }

    /// Everything measured (latencies sorted), the CPU seconds of the replicas called, the stretches'
    /// rates and what went wrong.
    fn result(mut self) -> (Sample, f64, Vec<f64>, Arc<Tally>) {
        self.total.sort();
        (self.total, self.focus_cpu, self.rates, self.tally)
    }
}

/// One kind of `Add` measured.
struct WriteWorkload {
    label: &'static str,
    base: u64,
    batch: u64,
    per_replica: usize,
    calls: u64,
}

/// 1,000-key Adds, three in flight on each replica: throughput.
const BATCHED_WRITES: WriteWorkload = WriteWorkload {
    label: "1,000 keys, 9 in flight",
    base: WRITTEN,
    batch: BATCH,
    per_replica: WRITES_PER_REPLICA,
    calls: WRITE_BATCHES,
};

/// Single-key Adds, one in flight on each replica: how soon one key is acknowledged.
const SINGLE_WRITES: WriteWorkload = WriteWorkload {
    label: "1 key, 3 in flight",
    base: SINGLE_WRITTEN,
    batch: 1,
    per_replica: 1,
    calls: 4_000,
};

/// Single-key Adds, thirty in flight on each replica: many callers adding a key each (small Adds reaching a
/// replica during a publish share the next message).
const CROWDED_WRITES: WriteWorkload = WriteWorkload {
    label: "1 key, 90 in flight",
    base: CROWDED_WRITTEN,
    batch: 1,
    per_replica: 30,
    calls: 40_000,
};

/// The run's deployments.
struct Bench {
    r1: Deployment,
    r3: Deployment,
}

impl Bench {
    async fn start(report: &mut Report) -> Self {
        let binary = procs::gate_binary();
        println!("starting the R1 deployment (1 nats-server, 3 replicas)...");
        let r1 = Deployment::start("R1", 1, &binary, CONFIG).await;
        println!(
            "starting the R3 deployment (3 nats-servers in a JetStream cluster, 3 replicas)..."
        );
        let r3 = Deployment::start("R3", 3, &binary, CONFIG).await;
        report.commands = vec![("R1", r1.commands.clone()), ("R3", r3.commands.clone())];
        report.config = CONFIG.to_string();
        Self { r1, r3 }
    }

    /// The CPU both deployments use with nothing to do: what keeping the read lease and reporting costs.
    async fn idle(&self, report: &mut Report) {
        let deployments = [&self.r1, &self.r3];
        let before: Vec<(f64, f64)> = deployments
            .iter()
            .map(|d| {
                (
                    procs::total_cpu_seconds(&d.replica_pids()),
                    procs::total_cpu_seconds(&d.nats_pids()),
                )
            })
            .collect();
        tokio::time::sleep(IDLE).await;
        for (d, (replicas, nats)) in deployments.iter().zip(before) {
            report.idle.push(Idle {
                stream: d.name,
                replica_ms_per_s: (procs::total_cpu_seconds(&d.replica_pids()) - replicas) * 1e3
                    / IDLE.as_secs_f64()
                    / d.replicas.len() as f64,
                nats_ms_per_s: (procs::total_cpu_seconds(&d.nats_pids()) - nats) * 1e3
                    / IDLE.as_secs_f64(),
            });
        }
    }

    /// `Add`s through all three replicas of each deployment, in alternating stretches: `calls` of `batch`
    /// keys each, `per_replica` in flight on each replica, keys from `base`.
    async fn writes(&self, report: &mut Report, workload: WriteWorkload) {
        let WriteWorkload {
            label,
            base,
            batch,
            per_replica,
            calls,
        } = workload;
        let mut sides = Vec::new();
        for deployment in [&self.r1, &self.r3] {
            let replicas = &deployment.replicas;
            let connections = per_replica * replicas.len();
            let next = Arc::new(AtomicU64::new(0));
            let side = Side::new(
                deployment,
                replicas,
                connections,
                calls / WRITE_ROUNDS,
                |clients, tally| add(clients, base, batch, next, tally),
            )
            .await;
            side.stretch(WARM_UP_BATCHES).await;
            sides.push((WriteMetrics::read(deployment).await, side));
        }
        for round in 0..WRITE_ROUNDS {
            for (_, side) in &mut sides {
                println!(
                    "writes, {} stretch {}/{WRITE_ROUNDS}...",
                    side.deployment.name,
                    round + 1
                );
                side.measure().await;
            }
        }
        for (before, side) in sides {
            let deployment = side.deployment;
            let after = WriteMetrics::read(deployment).await;
            let (sample, replicas_cpu, rates, tally) = side.result();
            report.writes.push(Writes {
                workload: label,
                stream: deployment.name,
                sample,
                rates,
                replicas_cpu,
                acked_by_lease: after.acked_by_lease - before.acked_by_lease,
                publish_ack_mean: after.publish_ack.mean_since(&before.publish_ack),
                apply_wait_mean: after.apply_wait.mean_since(&before.apply_wait),
                members_wait_mean: after.members_wait.mean_since(&before.members_wait),
                adds_per_message: after.adds_per_message.mean_since(&before.adds_per_message),
                errors: tally.messages(),
            });
        }
    }

    /// Stops R3, measuring its catch-up first; then R1's.
    async fn catch_up(self, report: &mut Report) -> Deployment {
        let Self { r1, r3 } = self;
        for deployment in [&r3, &r1] {
            for (workload, base, batch, calls) in [
                ("single-key Adds", CAUGHT_UP_SINGLE, 1, CATCH_UP_SINGLE),
                ("1,000-key Adds", CAUGHT_UP_BATCHES, BATCH, CATCH_UP_BATCHES),
            ] {
                println!("catch-up, {}: {calls} {workload}...", deployment.name);
                let measured = catch_up(deployment, workload, base, batch, calls).await;
                report.catch_up.push(measured);
            }
        }
        read_logs(report, &r3);
        drop(r3);
        r1
    }
}

/// What `deployment`'s processes logged once it was up, into `report`.
fn read_logs(report: &mut Report, deployment: &Deployment) {
    report.warnings.extend(deployment.warnings());
    let not_serving = deployment.not_serving().into_iter();
    report
        .not_serving
        .extend(not_serving.map(|(replica, stretches)| (deployment.name, replica, stretches)));
}

/// The counters of a deployment's replicas that explain its write latency.
struct WriteMetrics {
    acked_by_lease: f64,
    publish_ack: Histogram,
    apply_wait: Histogram,
    members_wait: Histogram,
    adds_per_message: Histogram,
}

impl WriteMetrics {
    async fn read(deployment: &Deployment) -> Self {
        Self {
            acked_by_lease: deployment::total_metric(
                &deployment.replicas,
                "existence_replica_acked_by_lease_total",
            )
            .await,
            publish_ack: Histogram::read(deployment, "publish_ack_duration_seconds").await,
            apply_wait: Histogram::read(deployment, "apply_wait_duration_seconds").await,
            members_wait: Histogram::read(deployment, "members_wait_duration_seconds").await,
            adds_per_message: Histogram::read(deployment, "adds_per_message").await,
        }
    }
}

/// A histogram of the replicas (`existence_replica_<name>`), summed over them.
struct Histogram {
    sum: f64,
    count: f64,
}

impl Histogram {
    async fn read(deployment: &Deployment, name: &str) -> Self {
        let series = |part| format!("existence_replica_{name}_{part}");
        Self {
            sum: deployment::total_metric(&deployment.replicas, &series("sum")).await,
            count: deployment::total_metric(&deployment.replicas, &series("count")).await,
        }
    }

    /// The mean of what was recorded since `before`.
    fn mean_since(&self, before: &Self) -> f64 {
        (self.sum - before.sum) / (self.count - before.count).max(1.0)
    }
}

/// Waits until `replica` has applied the stream through `seq` (its gauge follows within 20 ms).
async fn applied_through(replica: &Replica, seq: u64) {
    let what = format!("replica {} to apply seq {seq}", replica.id);
    deployment::wait_until(&what, async || {
        let applied = replica.metric("existence_replica_applied_seq").await as u64;
        (applied >= seq).then_some(())
    })
    .await;
}

/// Stops the last replica, writes `calls` Adds of `batch` keys through the others, continues it and times
/// how long it takes to apply everything the stream stored meanwhile, then to serve again.
async fn catch_up(
    deployment: &Deployment,
    workload: &'static str,
    base: u64,
    batch: u64,
    calls: u64,
) -> CatchUp {
    let (stopped, writers) = deployment.replicas.split_last().expect("replicas");
    let connections = WRITES_PER_REPLICA * writers.len();
    let next = Arc::new(AtomicU64::new(0));
    let mut side = Side::new(deployment, writers, connections, calls, |clients, tally| {
        add(clients, base, batch, next, tally)
    })
    .await;
    // The stopped replica acknowledges nothing (and its port would not answer).
    let by_lease = || deployment::total_metric(writers, "existence_replica_acked_by_lease_total");
    let by_lease_before = by_lease().await;
    let first_seq = deployment.last_seq().await;
    applied_through(stopped, first_seq).await;
    stopped.signal("STOP");
    let stopped_at = Instant::now();
    side.measure().await;
    let last_seq = deployment.last_seq().await;
    let acked_by_lease = by_lease().await - by_lease_before;
    let stopped_for = stopped_at.elapsed();
    stopped.signal("CONT");
    let continued = Instant::now();
    applied_through(stopped, last_seq).await;
    let caught_up = continued.elapsed();
    stopped.serving().await;
    let serving = continued.elapsed();
    let in_flight = side.clients.len();
    let (write, _, _, tally) = side.result();
    CatchUp {
        stream: deployment.name,
        workload,
        in_flight,
        mutations: last_seq - first_seq,
        write,
        acked_by_lease,
        stopped_for,
        caught_up,
        serving,
        errors: tally.messages(),
    }
}

/// Lookups against one, two and three replicas of `deployment`, in alternating stretches.
async fn reads(deployment: &Deployment, report: &mut Report) {
    let written = WRITE_BATCHES * BATCH;
    let workloads: [(&'static str, u64, LookupOp); 2] = [
        (
            "BatchMayExist, 1,000 keys (`packed_keys`)",
            BATCH_READS,
            batch_lookups,
        ),
        ("MayExist (unary)", UNARY_READS, unary_lookups),
    ];
    let mut sides = Vec::new();
    for (workload, calls, lookups) in workloads {
        for serving in 1..=deployment.replicas.len() {
            let replicas = &deployment.replicas[..serving];
            let side = Side::new(
                deployment,
                replicas,
                READ_IN_FLIGHT,
                calls,
                |clients, tally| lookups(clients, written, tally),
            )
            .await;
            sides.push((workload, serving, side));
        }
    }
    for round in 0..READ_ROUNDS {
        println!("reads, stretch {}/{READ_ROUNDS}...", round + 1);
        for (_, _, side) in &mut sides {
            side.measure().await;
        }
    }
    for (workload, serving, side) in sides {
        let (sample, replicas_cpu, rates, tally) = side.result();
        report.reads.push(Reads {
            workload,
            replicas: serving,
            sample,
            rates,
            replicas_cpu,
            fail_open: tally.fail_open(),
            errors: tally.messages(),
        });
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        // `cargo test --benches`: the run is minutes long and its figures are not pass/fail.
        println!("replicated bench: run it with `cargo bench --bench replicated`");
        return;
    }
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    if args.iter().any(|a| a == "bootstrap") {
        runtime.block_on(run_bootstrap());
    } else if args.iter().any(|a| a == "faults") {
        runtime.block_on(run_faults());
    } else if args.iter().any(|a| a == "mirrors") {
        let measured = runtime.block_on(mirrors::run(&procs::gate_binary()));
        write_results("replicated-mirrors.md", &measured);
    } else if let Some(at) = args.iter().position(|a| a == "sync") {
        let servers = if args.get(at + 1).is_some_and(|a| a == "r3") {
            3
        } else {
            1
        };
        runtime.block_on(side_by_side::run_sync(servers));
    } else if let Some(at) = args.iter().position(|a| a == "compare") {
        let other = args.get(at + 1).expect("compare OTHER_BINARY [r3]");
        let servers = if args.get(at + 2).is_some_and(|a| a == "r3") {
            3
        } else {
            1
        };
        runtime.block_on(side_by_side::run_compare(
            std::path::Path::new(other),
            servers,
        ));
    } else {
        runtime.block_on(run());
    }
}

/// The bootstrap measurement alone, written to `benches/results/replicated-bootstrap.md`.
async fn run_bootstrap() {
    let measured = bootstrap::run(&procs::gate_binary()).await;
    write_results("replicated-bootstrap.md", &measured.markdown());
}

/// The fault stretches alone, written to `benches/results/replicated-faults.md`.
async fn run_faults() {
    let measured = faults::run(&procs::gate_binary()).await;
    write_results("replicated-faults.md", &measured.markdown());
}

/// `benches/results/FILE`.
fn results_path(file: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("benches/results")
        .join(file)
}

/// Writes `markdown` to `benches/results/FILE` and shows it.
fn write_results(file: &str, markdown: &str) {
    let path = results_path(file);
    std::fs::write(&path, markdown).unwrap_or_else(|e| panic!("writing {file}: {e}"));
    println!("\n{markdown}\nwritten: {}", path.display());
}

/// The run, one step per part of the report, in the order they are measured.
async fn run() {
    let started = Instant::now();
    let mut report = Report::new(WRITE_ROUNDS, READ_ROUNDS, READ_IN_FLIGHT);
    let bench = Bench::start(&mut report).await;
    bench.idle(&mut report).await;
    bench.writes(&mut report, SINGLE_WRITES).await;
    bench.writes(&mut report, CROWDED_WRITES).await;
    bench.writes(&mut report, BATCHED_WRITES).await;
    let r1 = bench.catch_up(&mut report).await;
    reads(&r1, &mut report).await;
    read_logs(&mut report, &r1);
    report.elapsed = started.elapsed();
    write_results("replicated.md", &report.markdown());
}
