//! Property tests of time no single clock decides: a replica's core (a gate with stream time) applies
//! `Add`s and tombstones stamped on a writer's clock and stored at a stream leader's, and answers on its own
//! clock, while any one of the three clocks steps by up to days, forward or back, at any point (one host at
//! a time: the fault model's minority). Checked against the true time on every lookup, single and batched:
//! - no key answers `ABSENT` within its retention of true time unless a tombstone recorded after its last
//!   `Add` answers for it;
//! - no tombstone answers after its TTL of true time (with the replica's own clock behind: after its TTL
//!   as of the last message applied, which the lease's barriers keep within a fraction of a second).
//!
//! A step of the reader's clock stands for the reader restarted on a wrong wall clock (while it runs, its
//! [`SteadyClock`](existence_gate::core::clock::SteadyClock) does not step): it loses its read lease, as
//! a restarted replica starts without one, and holds one again once it has applied a message, as a replica
//! takes one only from a barrier of its own read after it started. The gate's own rules do the rest: no
//! `ABSENT` without a lease, and no window freed without one.
//!
//! Each rule is needed: with inserts that drop windows at their own time, with an `Add`'s window taken from
//! its writer's clock alone, or with reads on the replica's clock alone, a run finds a false `ABSENT`
//! within a few dozen cases.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use existence_gate::core::answer::{Answer, Basis, Lookup};
use existence_gate::core::clock::ManualClock;
use existence_gate::core::config::GateConfig;
use existence_gate::core::gate::Gate;
use existence_gate::core::hashing::KeyHasher;
use existence_gate::core::keys::PackedKeys;
use existence_gate::core::lease::ReadLease;
use existence_gate::core::log::{Mutation, VolatileLog};
use existence_gate::core::tombstones::AbsenceKind;
use proptest::prelude::*;

const START_MS: u64 = 1_800_000_000_000;
const HOUR_MS: u64 = 3_600_000;
const RETENTION_MS: u64 = HOUR_MS;
const KEYS: u8 = 12;
const NAMESPACE: &str = "windowed";

const CONFIG: &str = r#"
[namespaces.windowed]
expected_keys = 1000
retention = "1h"
windows = 4
"#;

/// The three clocks: the writer's that stamps a mutation, the stream leader's that stores it, the reader's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Host {
    Writer,
    Leader,
    Reader,
}

#[derive(Debug, Clone)]
enum Op {
    Add(Vec<u8>),
    /// A tombstone of `ttl_ms` for a key.
    Absent(u8, u64),
    /// A message that is no mutation (a lease barrier): only the stream's time moves.
    Barrier,
    Lookup(u8),
    Batch(Vec<u8>),
    Advance(u64),
    Maintain,
    /// One host's clock is off by `offset_ms` from now on; every other host's is right again.
    Step(Host, i64),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    let host = prop_oneof![Just(Host::Writer), Just(Host::Leader), Just(Host::Reader)];
    let offset = prop_oneof![
        Just(0i64),
        Just(1_500),
        Just(-1_500),
        Just(25 * 60_000),
        Just(-25 * 60_000),
        Just(2 * HOUR_MS as i64),
        Just(-2 * (HOUR_MS as i64)),
        Just(30 * HOUR_MS as i64),
        Just(-30 * (HOUR_MS as i64)),
    ];
    prop_oneof![
        4 => prop::collection::vec(key.clone(), 1..4).prop_map(Op::Add),
        2 => (key.clone(), prop_oneof![Just(1_000u64), Just(60_000), Just(20 * 60_000)])
            .prop_map(|(key, ttl)| Op::Absent(key, ttl)),
        2 => Just(Op::Barrier),
        4 => key.clone().prop_map(Op::Lookup),
        1 => prop::collection::vec(key, 0..6).prop_map(Op::Batch),
        3 => prop_oneof![Just(1_000u64), Just(60_000), Just(20 * 60_000), Just(HOUR_MS)]
            .prop_map(Op::Advance),
        1 => Just(Op::Maintain),
        2 => (host, offset).prop_map(|(host, offset)| Op::Step(host, offset)),
    ]
}

/// The true time and each host's offset from it (at most one non-zero).
struct Clocks {
    true_ms: u64,
    offset: Option<(Host, i64)>,
    reader: Arc<ManualClock>,
}

impl Clocks {
    fn on(&self, host: Host) -> u64 {
        match self.offset {
            Some((wrong, by)) if wrong == host => self.true_ms.saturating_add_signed(by),
            _ => self.true_ms,
        }
    }

    fn set_reader(&self) {
        self.reader.set(self.on(Host::Reader));
    }
}

/// What is exactly known, in true time.
#[derive(Default)]
struct Model {
    /// Key → true time of its last `Add`.
    added: HashMap<u8, u64>,
    /// Key → true time its tombstone, recorded after its last `Add`, stops being live.
    tombstones: HashMap<u8, u64>,
    /// True time of the last message applied.
    last_message_ms: u64,
}

fn key_bytes(key: u8) -> Bytes {
    Bytes::from(format!("key-{key}"))
}

fn check(model: &Model, clocks: &Clocks, key: u8, got: Lookup) -> Result<(), TestCaseError> {
    let now = clocks.true_ms;
    if got.basis == Basis::Tombstone {
        let expires = model.tombstones.get(&key).copied().ok_or_else(|| {
            TestCaseError::fail(format!(
                "key {key}: a tombstone answered that was cleared or never recorded"
            ))
        })?;
        // The reader's reads of tombstones go by the later of its clock and the stream's: with its own
        // clock behind, the stream's time is when the last message was stored.
        let reader_behind = matches!(clocks.offset, Some((Host::Reader, by)) if by < 0);
        let bound = if reader_behind {
            model.last_message_ms
        } else {
            now
        };
        prop_assert!(
            bound < expires,
            "key {key}: a tombstone answered {} ms past its TTL (true time), clocks {:?}",
            bound - expires,
            clocks.offset
        );
        return Ok(());
    }
    let within_retention = model
        .added
        .get(&key)
        .is_some_and(|at| now < at + RETENTION_MS);
    if within_retention {
        prop_assert_eq!(
            got.answer,
            Answer::MayExist,
            "key {} added {} ms ago (true time) answered ABSENT, clocks {:?}",
            key,
            now - model.added[&key],
            clocks.offset
        );
    }
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let reader = Arc::new(ManualClock::new(START_MS));
    let mut clocks = Clocks {
        true_ms: START_MS,
        offset: None,
        reader: Arc::clone(&reader),
    };
    let lease = Arc::new(ReadLease::new(Arc::new(ManualClock::new(0))));
    let gate = Gate::new(
        &GateConfig::from_toml(CONFIG).unwrap(),
        KeyHasher::from_seed([9; 32]),
        reader,
    )
    .with_read_lease(Arc::clone(&lease))
    .with_stream_time();
    gate.open(Arc::new(VolatileLog));
    let mut model = Model::default();
    let mut seq = 1;
    for op in ops {
        match op {
            Op::Add(keys) => {
                seq += 1;
                let mutation = Mutation::Add {
                    namespace: NAMESPACE.into(),
                    seq,
                    at_ms: clocks.on(Host::Writer),
                    keys: PackedKeys::from(keys.iter().map(|k| key_bytes(*k)).collect::<Vec<_>>()),
                };
                gate.apply_streamed(mutation, clocks.on(Host::Leader))
                    .unwrap();
                for key in keys {
                    model.added.insert(key, clocks.true_ms);
                    model.tombstones.remove(&key);
                }
                model.last_message_ms = clocks.true_ms;
                lease.set_until(u64::MAX);
                gate.lease_granted();
            }
            Op::Absent(key, ttl_ms) => {
                seq += 1;
                let at_ms = clocks.on(Host::Writer);
                let mutation = Mutation::RecordAbsent {
                    namespace: NAMESPACE.into(),
                    seq,
                    at_ms,
                    key: key_bytes(key),
                    kind: AbsenceKind::Missing,
                    expires_at_ms: at_ms + ttl_ms,
                    observed_seq: 0,
                };
                gate.apply_streamed(mutation, clocks.on(Host::Leader))
                    .unwrap();
                model.tombstones.insert(key, clocks.true_ms + ttl_ms);
                model.last_message_ms = clocks.true_ms;
                lease.set_until(u64::MAX);
                gate.lease_granted();
            }
            Op::Barrier => {
                gate.stream_time_passed(clocks.on(Host::Leader));
                model.last_message_ms = clocks.true_ms;
                lease.set_until(u64::MAX);
                gate.lease_granted();
            }
            Op::Lookup(key) => {
                let (lookup, _) = gate.may_exist(NAMESPACE, &key_bytes(key)).unwrap();
                check(&model, &clocks, key, lookup)?;
            }
            Op::Batch(keys) => {
                let bytes: Vec<Bytes> = keys.iter().map(|k| key_bytes(*k)).collect();
                let mut lookups = Vec::new();
                gate.batch_may_exist(NAMESPACE, &bytes, &mut lookups)
                    .unwrap();
                for (key, lookup) in keys.iter().zip(lookups) {
                    check(&model, &clocks, *key, lookup)?;
                }
            }
            Op::Advance(ms) => {
                clocks.true_ms += ms;
                clocks.set_reader();
            }
            Op::Maintain => gate.maintain(),
            Op::Step(host, by) => {
                clocks.offset = (by != 0).then_some((host, by));
                if host == Host::Reader {
                    lease.set_until(0);
                }
                clocks.set_reader();
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn no_single_clock_makes_a_replica_answer_absent_early(ops in prop::collection::vec(op(), 1..150)) {
        run(ops)?;
    }
}

/// A replica without its read lease keeps its windows at a maintenance tick (its stream time may be an old
/// message's), asks for the lease as a lookup would, and frees them once the lease is granted: a replica
/// that takes no lookups, and so renews no lease of itself, still frees its dead windows.
#[test]
fn windows_kept_for_want_of_a_lease_are_freed_once_it_is_granted() {
    let reader = Arc::new(ManualClock::new(START_MS));
    let lease = Arc::new(ReadLease::new(Arc::new(ManualClock::new(0))));
    let gate = Gate::new(
        &GateConfig::from_toml(CONFIG).unwrap(),
        KeyHasher::from_seed([9; 32]),
        Arc::clone(&reader) as Arc<dyn existence_gate::core::clock::Clock>,
    )
    .with_read_lease(Arc::clone(&lease))
    .with_stream_time();
    gate.open(Arc::new(VolatileLog));
    let asked = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let wake = Arc::clone(&asked);
    lease.on_wanted(move || wake.store(true, std::sync::atomic::Ordering::SeqCst));
    let add = |seq: u64, at_ms: u64| {
        let mutation = Mutation::Add {
            namespace: NAMESPACE.into(),
            seq,
            at_ms,
            keys: PackedKeys::from(vec![key_bytes(seq as u8)]),
        };
        gate.apply_streamed(mutation, at_ms).unwrap();
    };
    let held_windows = || {
        let namespace = gate.namespace(NAMESPACE).unwrap();
        namespace.export(gate.read_time()).unwrap().windows.len()
    };
    add(2, START_MS);
    let later = START_MS + 3 * HOUR_MS;
    reader.set(later);
    add(3, later);
    assert_eq!(held_windows(), 2);
    gate.maintain();
    assert_eq!(held_windows(), 2, "freed without a lease");
    assert!(
        asked.load(std::sync::atomic::Ordering::SeqCst),
        "the lease was not asked for"
    );
    lease.set_until(u64::MAX);
    gate.lease_granted();
    assert_eq!(
        held_windows(),
        1,
        "the dead window was not freed once the lease held"
    );
}
