//! Property: replaying any prefix of the write-ahead log gives the state the live gate had at that point —
//! the same answer and basis for every key, the same seq, and the same state digest (the same filter bits
//! and tombstones, not only the same answers for the keys probed).

use std::sync::Arc;

use bytes::Bytes;
use existence_gate::core::answer::{Lookup, StateDigest};
use existence_gate::core::clock::{Clock, ManualClock};
use existence_gate::core::config::GateConfig;
use existence_gate::core::gate::Gate;
use existence_gate::core::hashing::KeyHasher;
use existence_gate::core::namespace::AbsenceReport;
use existence_gate::core::tombstones::AbsenceKind;
use existence_gate::storage::{self, wal, DataDir, SyncMode};
use proptest::prelude::*;

const START_MS: u64 = 1_800_000_000_000;
const KEYS: u8 = 16;
const CONFIG: &str = r#"
[namespaces.default]
expected_keys = 1000
retention = "1h"
windows = 3
missing_ttl = "60s"
max_ttl = "10m"
"#;

#[derive(Debug, Clone)]
enum Op {
    Add(Vec<u8>),
    /// Key, TTL, and how many seqs before the latest the absence was observed (`None`: not observed).
    RecordAbsent(u8, u32, Option<u64>),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop::collection::vec(0..KEYS, 1..4).prop_map(Op::Add),
        3 => (0..KEYS, prop_oneof![Just(0u32), Just(5), Just(120)], prop::option::of(0..4u64))
            .prop_map(|(k, ttl, lag)| Op::RecordAbsent(k, ttl, lag)),
        2 => prop_oneof![Just(1_000u64), Just(60_000), Just(20 * 60_000), Just(3_600_000)].prop_map(Op::Advance),
    ]
}

fn key(k: u8) -> Bytes {
    Bytes::from(format!("key-{k}"))
}

/// Every key's answer and the seq, and the namespace's state digest, as of now.
fn state(gate: &Gate) -> (Vec<(Lookup, u64)>, StateDigest) {
    let answers = (0..KEYS)
        .map(|k| gate.may_exist("default", &key(k)).unwrap())
        .collect();
    let digest = gate.scan()["default"]
        .digest
        .expect("writes were not stopped");
    (answers, digest)
}

fn gate_on(dir: &DataDir, clock: Arc<ManualClock>) -> Gate {
    Gate::new(
        &GateConfig::from_toml(CONFIG).unwrap(),
        KeyHasher::from_seed(dir.seed()),
        clock,
    )
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let temp = tempfile::tempdir().unwrap();
    let dir = DataDir::open(temp.path()).unwrap();
    let clock = Arc::new(ManualClock::new(START_MS));
    let gate = gate_on(&dir, clock.clone());
    let (log, _) = storage::recover(&dir, &gate, SyncMode::Never).unwrap();
    let log = Arc::new(log);
    gate.open(log.clone());

    // (records logged so far, clock, state) after every operation.
    let mut history = vec![(0u64, START_MS, state(&gate))];
    let mut logged = 0;
    for op in ops {
        match op {
            Op::Add(keys) => {
                gate.add("default", keys.into_iter().map(key).collect::<Vec<_>>())
                    .unwrap();
                logged += 1;
            }
            Op::RecordAbsent(k, ttl_seconds, lag) => {
                let latest = gate.namespace("default").unwrap().latest_seq();
                let report = AbsenceReport {
                    key: key(k),
                    kind: AbsenceKind::Missing,
                    // Logged with the record and checked again when replayed.
                    observed_seq: lag.map_or(0, |lag| latest.saturating_sub(lag).max(1)),
                    ttl_seconds,
                };
                let recorded = gate.record_absent("default", report).unwrap();
                if recorded.expires_in_ms > 0 {
                    logged += 1;
                }
            }
            Op::Advance(ms) => clock.advance(ms),
        }
        history.push((logged, clock.now_ms(), state(&gate)));
    }
    log.sync_now().unwrap();
    drop(log);

    for (records, at_ms, expected) in history {
        let clock = Arc::new(ManualClock::new(at_ms));
        let replayed = gate_on(&dir, clock);
        let mut applied = 0;
        wal::replay(temp.path(), 0, dir.seed_fingerprint(), |mutation| {
            if applied < records {
                applied += 1;
                replayed.replay_one(mutation)
            } else {
                Ok(())
            }
        })
        .unwrap();
        replayed.open(Arc::new(existence_gate::core::log::VolatileLog));
        prop_assert_eq!(state(&replayed), expected, "prefix of {} records", records);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn any_log_prefix_replays_to_the_live_state(ops in prop::collection::vec(op(), 1..40)) {
        run(ops)?;
    }
}
