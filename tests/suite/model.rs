//! Property tests of the core against an exact model: random interleavings of Add, RecordAbsent, lookups
//! (single and batched), maintenance and clock moves that cross window boundaries, retention and TTLs.
//!
//! Asserted on every step: no false absent within a key's retention; tombstones answer exactly while live
//! (recorded after the key's last Add and not expired) and never after; seqs advance by one per mutation and
//! not otherwise; `SUPERSEDED` whenever the key was added after the caller's observation; applied TTLs stay
//! within jitter and the maximum. At the end, replaying the log into a fresh gate gives the same answers.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use existence_gate::core::answer::{Answer, Basis, Lookup};
use existence_gate::core::clock::ManualClock;
use existence_gate::core::config::GateConfig;
use existence_gate::core::gate::{Gate, GateError};
use existence_gate::core::hashing::KeyHasher;
use existence_gate::core::log::{MemoryLog, GENESIS_SEQ};
use existence_gate::core::namespace::{AbsenceReport, RecordOutcome};
use existence_gate::core::tombstones::AbsenceKind;
use proptest::prelude::*;

const START_MS: u64 = 1_800_000_000_000;
const HOUR_MS: u64 = 3_600_000;
const KEYS: u8 = 24;
const SEED: [u8; 32] = [42; 32];

/// `windowed` keeps keys 1 h in 4 windows (20-minute spans); `forever` never forgets.
const CONFIG: &str = r#"
[namespaces.windowed]
expected_keys = 1000
retention = "1h"
windows = 4
missing_ttl = "60s"
deleted_ttl = "10m"
max_ttl = "30m"
ttl_jitter = 0.1
[namespaces.forever]
expected_keys = 1000
missing_ttl = "60s"
deleted_ttl = "10m"
max_ttl = "30m"
ttl_jitter = 0.1
"#;

#[derive(Debug, Clone)]
enum Op {
    Add {
        namespace: usize,
        keys: Vec<u8>,
    },
    RecordAbsent {
        namespace: usize,
        key: u8,
        deleted: bool,
        ttl_seconds: u32,
        observe: Observe,
    },
    Lookup {
        namespace: usize,
        key: u8,
    },
    Batch {
        namespace: usize,
        keys: Vec<u8>,
    },
    Advance {
        ms: u64,
    },
    Maintain,
}

/// Which seq the caller claims to have observed before going to the source.
#[derive(Debug, Clone, Copy)]
enum Observe {
    /// No race check.
    Unknown,
    /// A fresh lookup just now.
    Fresh,
    /// An old observation: the genesis seq (anything added since must make the record `SUPERSEDED`).
    Stale,
}

fn op() -> impl Strategy<Value = Op> {
    let namespace = 0..2usize;
    let key = 0..KEYS;
    prop_oneof![
        3 => (namespace.clone(), prop::collection::vec(key.clone(), 1..5))
            .prop_map(|(namespace, keys)| Op::Add { namespace, keys }),
        3 => (
            namespace.clone(),
            key.clone(),
            any::<bool>(),
            prop_oneof![Just(0u32), Just(1), Just(30), Just(600), Just(100_000)],
            prop_oneof![Just(Observe::Unknown), Just(Observe::Fresh), Just(Observe::Stale)],
        )
            .prop_map(|(namespace, key, deleted, ttl_seconds, observe)| Op::RecordAbsent {
                namespace,
                key,
                deleted,
                ttl_seconds,
                observe
            }),
        4 => (namespace.clone(), key.clone()).prop_map(|(namespace, key)| Op::Lookup { namespace, key }),
        1 => (namespace, prop::collection::vec(key, 0..8))
            .prop_map(|(namespace, keys)| Op::Batch { namespace, keys }),
        2 => prop_oneof![
            Just(1_000u64),
            Just(60_000),
            Just(10 * 60_000),
            Just(25 * 60_000),
            Just(HOUR_MS),
            Just(2 * HOUR_MS),
        ]
        .prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Maintain),
    ]
}

/// What is exactly known about one namespace.
#[derive(Default)]
struct Model {
    seq: u64,
    /// Key → (time, seq) of its last Add.
    added: HashMap<u8, (u64, u64)>,
    /// Key → expiry of its live-or-expired tombstone (cleared by Add).
    tombstones: HashMap<u8, u64>,
}

impl Model {
    /// A namespace no one has written: at the genesis seq.
    fn fresh() -> Self {
        Self {
            seq: GENESIS_SEQ,
            ..Self::default()
        }
    }
}

const NAMESPACES: [&str; 2] = ["windowed", "forever"];

fn retention_ms(namespace: usize) -> u64 {
    if namespace == 0 {
        HOUR_MS
    } else {
        u64::MAX / 4
    }
}

fn key_bytes(key: u8) -> Bytes {
    Bytes::from(format!("key-{key}"))
}

/// The answer the model demands, or `None` where the filter may answer either way.
fn expected(model: &Model, namespace: usize, key: u8, now: u64) -> Option<Lookup> {
    if model
        .tombstones
        .get(&key)
        .is_some_and(|expires| now < *expires)
    {
        return Some(Lookup {
            answer: Answer::Absent,
            basis: Basis::Tombstone,
        });
    }
    if model
        .added
        .get(&key)
        .is_some_and(|(at, _)| now < at.saturating_add(retention_ms(namespace)))
    {
        return Some(Lookup {
            answer: Answer::MayExist,
            basis: Basis::Filter,
        });
    }
    None
}

fn check_lookup(
    model: &Model,
    namespace: usize,
    key: u8,
    now: u64,
    got: Lookup,
) -> Result<(), TestCaseError> {
    match expected(model, namespace, key, now) {
        Some(want) => prop_assert_eq!(
            got,
            want,
            "key {} in {} at +{}ms",
            key,
            NAMESPACES[namespace],
            now - START_MS
        ),
        // Not added within retention and no live tombstone: absent or a false positive, never a tombstone.
        None => prop_assert_eq!(
            got.basis,
            Basis::Filter,
            "expired tombstone answered for key {}",
            key
        ),
    }
    Ok(())
}

fn gate(log: Arc<MemoryLog>, clock: Arc<ManualClock>) -> Gate {
    let gate = Gate::new(
        &GateConfig::from_toml(CONFIG).unwrap(),
        KeyHasher::from_seed(SEED),
        clock,
    );
    gate.open(log);
    gate
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let clock = Arc::new(ManualClock::new(START_MS));
    let log = Arc::new(MemoryLog::default());
    let gate = gate(log.clone(), clock.clone());
    let mut models = [Model::fresh(), Model::fresh()];
    let mut now = START_MS;
    for op in ops {
        match op {
            Op::Add { namespace, keys } => {
                let model = &mut models[namespace];
                let added = gate
                    .add(
                        NAMESPACES[namespace],
                        keys.iter().map(|k| key_bytes(*k)).collect::<Vec<_>>(),
                    )
                    .unwrap();
                prop_assert_eq!(added.seq, model.seq + 1);
                model.seq = added.seq;
                let mut live_cleared = 0;
                for key in &keys {
                    if model
                        .tombstones
                        .remove(key)
                        .is_some_and(|expires| now < expires)
                    {
                        live_cleared += 1;
                    }
                    model.added.insert(*key, (now, added.seq));
                }
                prop_assert_eq!(added.tombstones_cleared, live_cleared);
            }
            Op::RecordAbsent {
                namespace,
                key,
                deleted,
                ttl_seconds,
                observe,
            } => {
                let model = &mut models[namespace];
                let observed_seq = match observe {
                    Observe::Unknown => 0,
                    Observe::Fresh => {
                        gate.may_exist(NAMESPACES[namespace], &key_bytes(key))
                            .unwrap()
                            .1
                    }
                    Observe::Stale => GENESIS_SEQ,
                };
                let report = AbsenceReport {
                    key: key_bytes(key),
                    kind: if deleted {
                        AbsenceKind::Deleted
                    } else {
                        AbsenceKind::Missing
                    },
                    observed_seq,
                    ttl_seconds,
                };
                let recorded = gate.record_absent(NAMESPACES[namespace], report).unwrap();
                let last_add = model.added.get(&key).copied();
                let within_retention = last_add
                    .is_some_and(|(at, _)| now < at.saturating_add(retention_ms(namespace)));
                let added_since =
                    last_add.is_some_and(|(_, seq)| observed_seq != 0 && seq > observed_seq);
                if within_retention && !added_since {
                    prop_assert_ne!(
                        recorded.outcome,
                        RecordOutcome::Redundant,
                        "the filter holds key {}",
                        key
                    );
                }
                if added_since && recorded.outcome != RecordOutcome::Redundant {
                    prop_assert_eq!(recorded.outcome, RecordOutcome::Superseded);
                }
                prop_assert_ne!(recorded.outcome, RecordOutcome::Throttled);
                if recorded.outcome == RecordOutcome::Recorded {
                    prop_assert_eq!(recorded.seq, model.seq + 1);
                    model.seq = recorded.seq;
                    let base_ms = match (ttl_seconds, deleted) {
                        (0, false) => 60_000.0,
                        (0, true) => 600_000.0,
                        (s, _) => f64::from(s) * 1_000.0,
                    };
                    let max_ms = 1_800_000.0;
                    let base_ms = f64::min(base_ms, max_ms);
                    let applied = recorded.expires_in_ms as f64;
                    prop_assert!(applied >= (base_ms * 0.9).floor() - 1.0 && applied <= max_ms);
                    prop_assert!(applied <= (base_ms * 1.1).ceil() + 1.0);
                    model.tombstones.insert(key, now + recorded.expires_in_ms);
                } else {
                    prop_assert_eq!(recorded.seq, model.seq, "non-recorded outcomes use no seq");
                    prop_assert_eq!(recorded.expires_in_ms, 0);
                }
            }
            Op::Lookup { namespace, key } => {
                let (lookup, seq) = gate
                    .may_exist(NAMESPACES[namespace], &key_bytes(key))
                    .unwrap();
                prop_assert_eq!(seq, models[namespace].seq);
                check_lookup(&models[namespace], namespace, key, now, lookup)?;
            }
            Op::Batch { namespace, keys } => {
                let bytes: Vec<Bytes> = keys.iter().map(|k| key_bytes(*k)).collect();
                let mut lookups = Vec::new();
                let seq = gate
                    .batch_may_exist(NAMESPACES[namespace], &bytes, &mut lookups)
                    .unwrap();
                prop_assert_eq!(seq, models[namespace].seq);
                prop_assert_eq!(lookups.len(), keys.len());
                for (key, lookup) in keys.iter().zip(lookups) {
                    check_lookup(&models[namespace], namespace, *key, now, lookup)?;
                }
            }
            Op::Advance { ms } => {
                now += ms;
                clock.set(now);
            }
            Op::Maintain => gate.maintain(),
        }
    }

    // Replaying the log into a fresh gate reproduces every answer.
    let replayed = gate_from_log(&log, clock.clone());
    for (namespace, name) in NAMESPACES.iter().enumerate() {
        for key in 0..KEYS {
            let original = gate.may_exist(name, &key_bytes(key)).unwrap();
            let copy = replayed.may_exist(name, &key_bytes(key)).unwrap();
            prop_assert_eq!(
                original,
                copy,
                "replay differs for key {} in {}",
                key,
                NAMESPACES[namespace]
            );
        }
    }
    Ok(())
}

fn gate_from_log(log: &MemoryLog, clock: Arc<ManualClock>) -> Gate {
    let replayed = gate(Arc::new(MemoryLog::default()), clock);
    replayed.replay(log.mutations()).unwrap();
    replayed
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_gate_matches_the_model(ops in prop::collection::vec(op(), 1..120)) {
        run(ops)?;
    }
}

#[test]
fn lookups_fail_open_while_warming() {
    let gate = Gate::new(
        &GateConfig::default(),
        KeyHasher::from_seed(SEED),
        Arc::new(ManualClock::new(START_MS)),
    );
    let warming = Lookup {
        answer: Answer::MayExist,
        basis: Basis::Warming,
    };
    assert_eq!(gate.may_exist("default", b"anything").unwrap().0, warming);
    let mut lookups = Vec::new();
    gate.batch_may_exist("default", &[key_bytes(1), key_bytes(2)], &mut lookups)
        .unwrap();
    assert_eq!(lookups, [warming, warming]);
    let refused = gate.add("default", vec![key_bytes(1)]).unwrap_err();
    assert!(
        matches!(refused, GateError::Unavailable(_)),
        "writes wait for loading: {refused:?}"
    );
    gate.open(Arc::new(MemoryLog::default()));
    assert_eq!(
        gate.may_exist("default", b"anything").unwrap().0.basis,
        Basis::Filter
    );
}
