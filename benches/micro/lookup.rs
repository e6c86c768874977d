//! What the rules that keep time and leases cost a lookup: `Gate::may_exist` and a 100-key
//! `Gate::batch_may_exist` on 1M keys, side by side in one run, on
//! - `system-clock`: a gate reading `SystemClock` per lookup, as every gate did before no single clock
//!   decided what expires;
//! - `steady-clock`: the single server today, reading `SteadyClock` (the wall clock at start carried by the
//!   monotonic clock, which a step of the wall clock does not move);
//! - `replica-system-clock`: a replica as it was then: its read lease checked before every answer, on the
//!   system clock;
//! - `replica`: a replica today: the steady clock agreed with the time its stream reached (`ReadTime`), and
//!   its read lease.
//!
//! The rules' promise is a lookup's CPU within 5% of what it was: `steady-clock` against `system-clock`,
//! `replica` against `replica-system-clock`. `cargo bench --bench lookup` times each variant in turn, round
//! after round (one machine, one run: its other load falls on every variant alike), and prints a table of
//! medians and of per-round ratios; benches/results/lookup-rules.md keeps a dated run.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use existence_gate::core::clock::{Clock, SteadyClock, SystemClock, SystemMonotonicClock};
use existence_gate::core::config::GateConfig;
use existence_gate::core::gate::Gate;
use existence_gate::core::hashing::KeyHasher;
use existence_gate::core::lease::ReadLease;
use existence_gate::core::log::VolatileLog;

const KEYS: u64 = 1_000_000;
const CONFIG: &str = "[namespaces.users]\nexpected_keys = 1000000\n";

/// How a gate decides its answers: a single server's rules, or a replica's with or without stream time.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rules {
    Single,
    LeaseOnly,
    Replica,
}

/// A gate on `clock` holding `KEYS` keys (`key-0` ...), with `rules`.
fn gate(clock: Arc<dyn Clock>, rules: Rules) -> Gate {
    let config = GateConfig::from_toml(CONFIG).unwrap();
    let mut gate = Gate::new(&config, KeyHasher::from_seed([7; 32]), clock);
    if rules != Rules::Single {
        let lease = Arc::new(ReadLease::new(Arc::new(SystemMonotonicClock::new())));
        lease.set_until(u64::MAX);
        gate = gate.with_read_lease(lease);
    }
    if rules == Rules::Replica {
        gate = gate.with_stream_time();
    }
    gate.open(Arc::new(VolatileLog));
    let keys: Vec<Bytes> = (0..KEYS).map(|i| Bytes::from(format!("key-{i}"))).collect();
    for chunk in keys.chunks(10_000) {
        gate.add("users", chunk.to_vec()).unwrap();
    }
    gate
}

/// Lookups per timed stretch, and stretches per variant: each round times every variant once, in turn, so
/// that what the shared machine does meanwhile falls on all of them alike; ratios are taken per round.
const PER_STRETCH: usize = 200_000;
const ROUNDS: usize = 31;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        // `cargo test --benches`: nothing to check here, and the full run takes a minute.
        return;
    }
    let steady = || Arc::new(SteadyClock::system());
    let gates = [
        ("system-clock", gate(Arc::new(SystemClock), Rules::Single)),
        ("steady-clock", gate(steady(), Rules::Single)),
        (
            "replica-system-clock",
            gate(Arc::new(SystemClock), Rules::LeaseOnly),
        ),
        ("replica", gate(steady(), Rules::Replica)),
    ];
    let keys = |prefix: &str, step: usize| -> Vec<Vec<u8>> {
        (0..4_096)
            .map(|i| format!("{prefix}-{}", i * step).into_bytes())
            .collect()
    };
    let (absent, present) = (keys("absent", 1), keys("key", 211));
    println!("| lookup | variant | ns per key (median) | against the rules' baseline (median of per-round ratios) |");
    println!("| --- | --- | --- | --- |");
    for (shape, keys, batch) in [
        ("MayExist, absent", &absent, 1),
        ("MayExist, present", &present, 1),
        ("BatchMayExist of 100, absent", &absent, 100),
    ] {
        let mut stretches = vec![Vec::with_capacity(ROUNDS); gates.len()];
        for _ in 0..ROUNDS {
            for (times, (_, gate)) in stretches.iter_mut().zip(&gates) {
                times.push(time_stretch(gate, keys, batch));
            }
        }
        for (i, (name, _)) in gates.iter().enumerate() {
            // Each rule's baseline: the single server on the system clock, or the replica on it.
            let baseline = if i < 2 { 0 } else { 2 };
            let mut ratios: Vec<f64> = stretches[i]
                .iter()
                .zip(&stretches[baseline])
                .map(|(t, b)| t / b)
                .collect();
            println!(
                "| {shape} | {name} | {:.1} | {:.3}× |",
                median(&mut stretches[i].clone()),
                median(&mut ratios)
            );
        }
    }
}

/// Nanoseconds per key of `PER_STRETCH` keys looked up on `gate`, `batch` at a time.
fn time_stretch(gate: &Gate, keys: &[Vec<u8>], batch: usize) -> f64 {
    let mut answers = Vec::new();
    let started = Instant::now();
    for call in 0..PER_STRETCH / batch {
        let at = (call * batch) % (keys.len() - batch);
        if batch == 1 {
            black_box(gate.may_exist("users", &keys[at]).unwrap());
        } else {
            black_box(
                gate.batch_may_exist("users", &keys[at..at + batch], &mut answers)
                    .unwrap(),
            );
        }
    }
    started.elapsed().as_nanos() as f64 / PER_STRETCH as f64
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
