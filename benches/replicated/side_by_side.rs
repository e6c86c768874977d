//! The side-by-side modes: `compare` (this build against another, `Add`s and lookups) and `sync` (NATS
//! syncing before it acknowledges against its default). Each measures two deployments in alternating
//! stretches, so that a change in the machine's load hits both.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::deployment::{Deployment, NatsSync};
use crate::{add, batch_lookups, results_path, unary_lookups, write_results, Side};
use crate::{drive, procs, text};
use crate::{BATCH, BATCHED_WRITES, BATCH_READS, CAUGHT_UP_BATCHES, READ_IN_FLIGHT, READ_ROUNDS};
use crate::{SINGLE_WRITES, UNARY_READS, WRITES_PER_REPLICA, WRITE_ROUNDS, WRITTEN};

/// 1,000-key Adds that fill each deployment of the `compare` mode, and that it measures per stretch.
const COMPARE_FILL: u64 = 200;
const COMPARE_WRITES: u64 = 1_000;

/// The `compare` mode's configuration, sized likewise for the keys it adds: the fill and five stretches of
/// 1,000 Adds of 1,000 keys (5.2M). With [`CONFIG`]'s 4M its last stretches wrote to filters past their
/// size, each grown by a layer that every later insert also reads.
const COMPARE_CONFIG: &str = r#"[namespaces.default]
expected_keys = 6000000
false_positive_rate = 0.01
"#;

/// `Add`s and lookups on a replica of this build and of `other` (another build of the gate), side by side:
/// calls/s, p50, the CPU per call of the replicas called and of the NATS server, written to
/// `benches/results/replicated-compare.md`, or with `r3` after the binary, of two R3 deployments (three
/// nats-servers each) to `replicated-compare-r3.md`. 1,000 `Add`s a stretch: 200 (~0.15 s) moved with every
/// burst of the machine's load.
pub(crate) async fn run_compare(other: &std::path::Path, servers: usize) {
    let load_at_start = text::load_average();
    let this = procs::gate_binary();
    let mut deployments = Vec::new();
    for (name, binary) in [("other", other.to_path_buf()), ("this", this)] {
        println!("starting R{servers} of {name} ({})...", binary.display());
        let deployment = Deployment::start(name, servers, &binary, COMPARE_CONFIG).await;
        let next = Arc::new(AtomicU64::new(0));
        let mut fill = Side::new(
            &deployment,
            &deployment.replicas,
            3,
            COMPARE_FILL,
            |c, t| add(c, WRITTEN, BATCH, next, t),
        )
        .await;
        fill.measure().await;
        deployments.push(deployment);
    }
    let written = COMPARE_FILL * BATCH;
    let mut sides = Vec::new();
    for deployment in &deployments {
        let one = &deployment.replicas[..1];
        let unary = Side::new(deployment, one, READ_IN_FLIGHT, UNARY_READS, |c, t| {
            unary_lookups(c, written, t)
        })
        .await;
        let batch = Side::new(deployment, one, READ_IN_FLIGHT, BATCH_READS, |c, t| {
            batch_lookups(c, written, t)
        })
        .await;
        let next = Arc::new(AtomicU64::new(0));
        let writes = Side::new(
            deployment,
            &deployment.replicas,
            WRITES_PER_REPLICA * deployment.replicas.len(),
            COMPARE_WRITES,
            |c, t| add(c, CAUGHT_UP_BATCHES, BATCH, next, t),
        )
        .await;
        sides.push((
            deployment.name,
            "Add, 1,000 keys, 9 in flight (3 replicas)",
            writes,
        ));
        sides.push((deployment.name, "MayExist (unary)", unary));
        sides.push((deployment.name, "BatchMayExist, 1,000 keys", batch));
    }
    for round in 0..READ_ROUNDS {
        println!("compare, stretch {}/{READ_ROUNDS}...", round + 1);
        for (_, _, side) in &mut sides {
            side.measure().await;
        }
    }
    let mut markdown = format!(
        "# Adds and lookups: this build against another, side by side\n\n`cargo bench --bench replicated -- compare \
         {}{}`, {} on {} (load average at start: {load_at_start}). Two R{servers} deployments ({}, three \
         replicas each), one of each build, each filled with {} keys in 1,000-key Adds; then {READ_ROUNDS} \
         stretches alternating between the builds: {COMPARE_WRITES} 1,000-key Adds through all three replicas \
         ({WRITES_PER_REPLICA} in flight on each, new keys), then lookups with {READ_IN_FLIGHT} calls in \
         flight to the first replica (half the keys added, half never). CPU is the user + system time per call \
         of the replicas called (`/proc/<pid>/stat`), their lease upkeep included, and apart the NATS \
         servers' and the load generator's (this process, sharing the cores: the same work per call for \
         both builds).\n\n| workload | build | calls | calls/s | p50 | CPU µs/call on the replicas called | \
         NATS CPU µs/call | load generator CPU µs/call | fail-open |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
        other.display(),
        if servers == 3 { " r3" } else { "" },
        text::today(),
        text::machine(),
        if servers == 3 { "a JetStream cluster of three nats-servers" } else { "one nats-server" },
        text::si(written as f64),
    );
    for (build, workload, side) in sides {
        let nats_cpu = side.nats_cpu_per_call();
        let client_cpu = side.client_cpu_per_call();
        let (sample, replica_cpu, _, tally) = side.result();
        let calls = sample.calls;
        markdown += &format!(
            "| {workload} | {build} | {calls} | {:.0} | {:.0} µs | {:.1} | {:.1} | {:.1} | {} |\n",
            sample.calls_per_second(),
            drive::percentile_us(&sample.latencies, 0.5),
            replica_cpu / calls as f64 * 1e6,
            nats_cpu * 1e6,
            client_cpu * 1e6,
            tally.fail_open(),
        );
    }
    let file = if servers == 3 {
        "replicated-compare-r3.md"
    } else {
        "replicated-compare.md"
    };
    write_results(file, &markdown);
}

/// Single-key and 1,000-key `Add`s on two deployments of this build side by side, in alternating stretches:
/// one whose NATS servers sync before they acknowledge (`sync_interval: always`, as docs/deployment.md
/// asks), one on NATS's default (a sync every two minutes). What durability costs, added to
/// `benches/results/replicated-sync.md`.
pub(crate) async fn run_sync(servers: usize) {
    let load_at_start = text::load_average();
    let binary = procs::gate_binary();
    let mut deployments = Vec::new();
    for (name, sync) in [("always", NatsSync::Always), ("default", NatsSync::Default)] {
        println!("starting R{servers} with NATS sync {name}...");
        let config = COMPARE_CONFIG;
        deployments.push(Deployment::start_syncing(name, servers, &binary, config, sync).await);
    }
    let mut sides = Vec::new();
    for deployment in &deployments {
        for workload in [SINGLE_WRITES, BATCHED_WRITES] {
            let next = Arc::new(AtomicU64::new(0));
            let connections = workload.per_replica * deployment.replicas.len();
            let calls = workload.calls / WRITE_ROUNDS;
            let (base, batch) = (workload.base, workload.batch);
            let side = Side::new(
                deployment,
                &deployment.replicas,
                connections,
                calls,
                |c, t| add(c, base, batch, next, t),
            )
            .await;
            sides.push((deployment.name, workload, side));
        }
    }
    for round in 0..WRITE_ROUNDS {
        println!("sync, stretch {}/{WRITE_ROUNDS}...", round + 1);
        for (_, _, side) in &mut sides {
            side.measure().await;
        }
    }
    let mut markdown = format!(
        "\n## R{servers}, {}\n\n`cargo bench --bench replicated -- sync{}` on {} (load average at start: \
         {load_at_start}). Two R{servers} deployments of this build ({}, three replicas each), their NATS \
         servers' `sync_interval` the only difference; {WRITE_ROUNDS} stretches alternating between them. \
         CPU is user + system time per call of the replicas and, apart, of the NATS servers.\n\n\
         | workload | NATS sync | calls | calls/s | keys/s | p50 | p99 | replicas CPU µs/call | NATS CPU \
         µs/call |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
        text::today(),
        if servers == 3 { " r3" } else { "" },
        text::machine(),
        if servers == 3 {
            "a JetStream cluster of three nats-servers"
        } else {
            "one nats-server"
        },
    );
    for (sync, workload, side) in sides {
        let nats_cpu = side.nats_cpu_per_call();
        let (sample, replica_cpu, _, _) = side.result();
        let calls = sample.calls;
        markdown += &format!(
            "| Add, {} | {sync} | {calls} | {:.0} | {:.0} | {:.2} ms | {:.2} ms | {:.0} | {:.0} |\n",
            workload.label,
            sample.calls_per_second(),
            sample.calls_per_second() * workload.batch as f64,
            drive::percentile_us(&sample.latencies, 0.5) / 1e3,
            drive::percentile_us(&sample.latencies, 0.99) / 1e3,
            replica_cpu / calls as f64 * 1e6,
            nats_cpu * 1e6,
        );
    }
    let path = results_path("replicated-sync.md");
    let before = std::fs::read_to_string(&path).unwrap_or_else(|_| SYNC_HEADING.to_string());
    write_results("replicated-sync.md", &(before + &markdown));
}

/// The start of `benches/results/replicated-sync.md`, to which each `sync` run adds its section.
const SYNC_HEADING: &str = "# What syncing NATS costs: `sync_interval: always` against NATS's default\n\n\
    Each section is one run of `cargo bench --bench replicated -- sync [r3]`, newest last. The stream is the \
    deployment's only log, so README asks every NATS server to sync before it acknowledges (\"NATS must sync \
    before it acknowledges\"); the default syncs every two minutes and loses acknowledged `Add`s in a power \
    loss of the NATS hosts.\n";
