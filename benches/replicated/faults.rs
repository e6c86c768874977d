//! What safety costs under a fault (`cargo bench --bench replicated -- faults`): one replica of three cut
//! off from NATS by a proxy that goes silent (a partition TCP outlasts), then healed, then cut off again and
//! removed from the membership. In each stretch: single-key `Add`s through r0, one at a time (how long an
//! acknowledgement waits), and lookups of never-added keys on the cut-off replica and on r0 (how many fail
//! open, `WARMING`). And how soon `Add`s are acknowledged early again after the heal and after the removal.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use existence_gate::proto::{AddRequest, Basis, MayExistRequest, RemoveReplicaRequest};

use crate::deployment::{Deployment, NatsSync, Replica};
use crate::proxy::{Mode, Proxy};
use crate::text::{load_average, machine, today};

/// How long each stretch is measured.
const STRETCH: Duration = Duration::from_secs(4);
/// An `Add` acknowledged sooner than this did not wait the fallback (read lease x 1.01 + 1 ms = 102 ms).
const EARLY: Duration = Duration::from_millis(50);

const CONFIG: &str = "[namespaces.default]\nexpected_keys = 1000000\nfalse_positive_rate = 0.01\n";

/// One stretch's figures.
struct Stretch {
    name: &'static str,
    /// Latencies of the `Add`s through r0.
    adds: Vec<Duration>,
    /// `Add`s acknowledged because the fallback passed (r0's `existence_replica_acked_by_lease_total`).
    by_fallback: u64,
    /// Lookups on r2: (answered `WARMING`, all).
    cut_off: (u64, u64),
    /// Lookups on r0: (answered `WARMING`, all).
    connected: (u64, u64),
}

/// The run's figures.
pub struct Faults {
    stretches: Vec<Stretch>,
    /// From the heal to the first `Add` acknowledged early, and to r2 serving again.
    early_after_heal: Duration,
    serving_after_heal: Duration,
    /// From `RemoveReplica` returning to the first `Add` acknowledged early.
    early_after_removal: Duration,
    load_at_start: String,
    commands: Vec<String>,
}

pub async fn run(binary: &std::path::Path) -> Faults {
    let load_at_start = load_average();
    let mut deployment = Deployment::start_with(
        "R1",
        1,
        binary,
        CONFIG,
        &["r0", "r1"],
        None,
        NatsSync::Always,
    )
    .await;
    let proxy = Proxy::start(deployment.nats[0].addr).await;
    deployment.add_replica_through("r2", &proxy.url());
    deployment.replicas[2].serving().await;
    let (r0, r2) = (&deployment.replicas[0], &deployment.replicas[2]);
    let next_key = AtomicU64::new(0);
    let mut stretches = vec![measure("all connected", r0, r2, &next_key).await];

    proxy.set(Mode::Silent);
    stretches.push(measure("r2 cut off from NATS", r0, r2, &next_key).await);
    proxy.set(Mode::Pass);
    let healed = Instant::now();
    let serving = async {
        r2.serving().await;
        Instant::now()
    };
    let (early, serving) = tokio::join!(first_early_add(r0, &next_key), serving);
    let (early_after_heal, serving_after_heal) = (early - healed, serving - healed);
    stretches.push(measure("healed", r0, r2, &next_key).await);

    proxy.set(Mode::Silent);
    r0.admin()
        .await
        .remove_replica(RemoveReplicaRequest { id: "r2".into() })
        .await
        .expect("r0 removes r2");
    let removed = Instant::now();
    let early_after_removal = first_early_add(r0, &next_key).await - removed;
    stretches.push(measure("r2 cut off and removed", r0, r2, &next_key).await);
    Faults {
        stretches,
        early_after_heal,
        serving_after_heal,
        early_after_removal,
        load_at_start,
        commands: deployment.commands.clone(),
    }
}

/// Adds through `r0` one at a time until one is acknowledged early; when it was.
async fn first_early_add(r0: &Replica, next_key: &AtomicU64) -> Instant {
    let mut client = r0.client().await;
    loop {
        let started = Instant::now();
        add_one(&mut client, next_key).await;
        if started.elapsed() < EARLY {
            return Instant::now();
        }
    }
}

async fn add_one(
    client: &mut existence_gate::proto::existence_gate_client::ExistenceGateClient<
        tonic::transport::Channel,
    >,
    next_key: &AtomicU64,
) {
    let key = format!("fault-{}", next_key.fetch_add(1, Ordering::Relaxed));
    client
        .add(AddRequest {
            namespace: String::new(),
            keys: vec![key.into()],
            ..Default::default()
        })
        .await
        .expect("an Add through r0");
}

/// One stretch: `Add`s through `r0` and lookups on `r2` and `r0`, all for [`STRETCH`].
async fn measure(name: &'static str, r0: &Replica, r2: &Replica, next_key: &AtomicU64) -> Stretch {
    println!("faults: {name}...");
    let by_lease = "existence_replica_acked_by_lease_total";
    let before = r0.metric(by_lease).await;
    let done = AtomicBool::new(false);
    let adds = async {
        let mut client = r0.client().await;
        let mut latencies = Vec::new();
        while !done.load(Ordering::Relaxed) {
            let started = Instant::now();
            add_one(&mut client, next_key).await;
            latencies.push(started.elapsed());
        }
        latencies
    };
    let stop = async {
        tokio::time::sleep(STRETCH).await;
        done.store(true, Ordering::Relaxed);
    };
    let (adds, cut_off, connected, ()) =
        tokio::join!(adds, lookups(r2, &done), lookups(r0, &done), stop);
    Stretch {
        name,
        adds,
        by_fallback: (r0.metric(by_lease).await - before) as u64,
        cut_off,
        connected,
    }
}

/// Lookups of never-added keys on `replica` until `done`: (answered `WARMING`, all).
async fn lookups(replica: &Replica, done: &AtomicBool) -> (u64, u64) {
    let mut client = replica.client().await;
    let (mut warming, mut all) = (0, 0);
    while !done.load(Ordering::Relaxed) {
        let key = format!("never-added-{all}");
        let reply = client
            .may_exist(MayExistRequest {
                namespace: String::new(),
                key: key.into(),
            })
            .await
            .expect("a lookup");
        warming += u64::from(reply.into_inner().basis() == Basis::Warming);
        all += 1;
        // About 500 lookups a second: enough to see the fail-open rate, little load.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (warming, all)
}

fn percentile(sorted: &[Duration], p: f64) -> String {
    if sorted.is_empty() {
        return "–".into();
    }
    let index = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    format!("{:.1} ms", sorted[index].as_secs_f64() * 1e3)
}

fn share((part, all): (u64, u64)) -> String {
    if all == 0 {
        return "–".into();
    }
    format!("{part} / {all} ({:.0}%)", part as f64 * 100.0 / all as f64)
}

impl Faults {
    /// The results as markdown.
    pub fn markdown(&self) -> String {
        let mut w = String::new();
        let _ = writeln!(w, "# What safety costs under a fault\n");
        let _ = writeln!(
            w,
            "Measured {} on {} (load average at start: {}), `cargo bench --bench replicated -- faults`. One \
             nats-server (R1 stream); replicas r0 and r1 connected to it, r2 through a TCP proxy that goes \
             silent (every byte held both ways, connections left open: a partition TCP outlasts). Replicas \
             run the defaults (`--read-lease 100ms`, `--max-clock-drift 1%`: the fallback is 102 ms). Each \
             stretch lasts {} s: single-key `Add`s through r0, one at a time; lookups of never-added keys on \
             r2 and on r0, ~500/s each. \"By fallback\" counts the `Add`s acknowledged because the fallback \
             passed rather than because every member reported them.\n",
            today(),
            machine(),
            self.load_at_start,
            STRETCH.as_secs(),
        );
        let _ = writeln!(
            w,
            "| stretch | Adds | p50 | p99 | by fallback | lookups on r2 failing open (`WARMING`) | on r0 |\n\
             |---|---:|---:|---:|---:|---:|---:|"
        );
        for stretch in &self.stretches {
            let mut sorted = stretch.adds.clone();
            sorted.sort();
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} | {} |",
                stretch.name,
                sorted.len(),
                percentile(&sorted, 0.5),
                percentile(&sorted, 0.99),
                stretch.by_fallback,
                share(stretch.cut_off),
                share(stretch.connected),
            );
        }
        let _ = writeln!(
            w,
            "\nAfter the heal: the first `Add` acknowledged early (under {} ms) {:.0} ms later, r2 serving \
             (`SERVING`: caught up, read lease held) {:.0} ms later. After `RemoveReplica r2` returned (r2 \
             still cut off): the first `Add` acknowledged early {:.0} ms later.\n",
            EARLY.as_millis(),
            self.early_after_heal.as_secs_f64() * 1e3,
            self.serving_after_heal.as_secs_f64() * 1e3,
            self.early_after_removal.as_secs_f64() * 1e3,
        );
        let _ = writeln!(w, "Commands (`$DIR` is the run's temporary directory; r2's `--nats` is the proxy):\n\n```sh");
        for command in &self.commands {
            let _ = writeln!(w, "{command}");
        }
        let _ = writeln!(w, "```");
        w
    }
}
