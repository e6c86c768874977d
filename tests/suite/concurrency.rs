//! Many threads adding and looking up while windows rotate: once an `Add` returns, every thread must see its
//! keys as `MAY_EXIST` (no false absent under concurrency), and tombstones recorded concurrently with Adds
//! never make an added key absent unless the record observed that Add.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use bytes::Bytes;
use existence_gate::core::answer::{Answer, Basis};
use existence_gate::core::clock::ManualClock;
use existence_gate::core::config::GateConfig;
use existence_gate::core::gate::Gate;
use existence_gate::core::hashing::KeyHasher;
use existence_gate::core::log::VolatileLog;
use existence_gate::core::namespace::{AbsenceReport, RecordOutcome, Recorded};
use existence_gate::core::tombstones::AbsenceKind;

const START_MS: u64 = 1_800_000_000_000;
const MINUTE_MS: u64 = 60_000;
const WRITERS: u64 = 3;
const KEYS_PER_WRITER: u64 = 20_000;
const BATCH: u64 = 50;

fn key(writer: u64, i: u64) -> Bytes {
    Bytes::from(format!("w{writer}-k{i}"))
}

fn gate(clock: Arc<ManualClock>) -> Arc<Gate> {
    // One hour in four windows: 20-minute spans. The clock moves at most 59 minutes, so every key added
    // during the test stays within its retention, while windows rotate at least twice.
    let config = GateConfig::from_toml(
        "[namespaces.default]\nexpected_keys = 10000\nretention = \"1h\"\nwindows = 4",
    )
    .unwrap();
    let gate = Arc::new(Gate::new(&config, KeyHasher::from_seed([7; 32]), clock));
    gate.open(Arc::new(VolatileLog));
    gate
}

#[test]
fn adds_are_visible_to_every_thread_during_rotation_and_growth() {
    let clock = Arc::new(ManualClock::new(START_MS));
    let gate = gate(clock.clone());
    // How many keys each writer has had acknowledged (its Adds returned).
    let acknowledged: Arc<Vec<AtomicU64>> =
        Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));

    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (gate, acknowledged) = (gate.clone(), acknowledged.clone());
            thread::spawn(move || {
                for start in (0..KEYS_PER_WRITER).step_by(BATCH as usize) {
                    let keys: Vec<Bytes> = (start..start + BATCH).map(|i| key(writer, i)).collect();
                    gate.add("default", keys.clone()).unwrap();
                    for k in &keys {
                        let (lookup, _) = gate.may_exist("default", k).unwrap();
                        assert_eq!(lookup.answer, Answer::MayExist, "own key {k:?} lost");
                    }
                    acknowledged[writer as usize].store(start + BATCH, Ordering::Release);
                }
            })
        })
        .collect();

    let readers: Vec<_> = (0..2)
        .map(|reader| {
            let (gate, acknowledged, done) = (gate.clone(), acknowledged.clone(), done.clone());
            thread::spawn(move || {
                let mut checked = 0u64;
                let mut round = 0u64;
                while !done.load(Ordering::Acquire) {
                    round += 1;
                    let writer = (round + reader) % WRITERS;
                    let visible = acknowledged[writer as usize].load(Ordering::Acquire);
                    if visible == 0 {
                        continue;
                    }
                    let batch: Vec<Bytes> = (0..64)
                        .map(|j| key(writer, (round * 7919 + j * 31) % visible))
                        .collect();
                    let mut lookups = Vec::new();
                    gate.batch_may_exist("default", &batch, &mut lookups)
                        .unwrap();
                    for (k, lookup) in batch.iter().zip(&lookups) {
                        assert_eq!(
                            lookup.answer,
                            Answer::MayExist,
                            "acknowledged key {k:?} answered absent"
                        );
                    }
                    checked += batch.len() as u64;
                }
                checked
            })
        })
        .collect();

    let rotator = {
        let (clock, gate, done) = (clock.clone(), gate.clone(), done.clone());
        thread::spawn(move || {
            for _ in 0..59 {
                if done.load(Ordering::Acquire) {
                    break;
                }
                clock.advance(MINUTE_MS);
                gate.maintain();
                thread::yield_now();
            }
        })
    };

    for writer in writers {
        writer.join().unwrap();
    }
    done.store(true, Ordering::Release);
    rotator.join().unwrap();
    let checked: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(checked > 0, "readers checked nothing");

    for writer in 0..WRITERS {
        for i in 0..KEYS_PER_WRITER {
            let (lookup, _) = gate.may_exist("default", &key(writer, i)).unwrap();
            assert_eq!(
                lookup.answer,
                Answer::MayExist,
                "key {writer}/{i} lost at the end"
            );
        }
    }
    let stats = &gate.stats()[0];
    assert!(
        stats.filter.layers > stats.filter.windows || stats.filter.windows > 1,
        "{stats:?}"
    );
}

#[test]
fn concurrent_absences_never_hide_an_add_they_did_not_observe() {
    let clock = Arc::new(ManualClock::new(START_MS));
    let gate = gate(clock.clone());
    let hot = Bytes::from_static(b"hot");
    // The seqs of the Adds of `hot`, in order (only this thread adds).
    let mut adds = vec![gate.add("default", vec![hot.clone()]).unwrap().seq];
    let done = Arc::new(AtomicBool::new(false));
    // Each RECORDED reply as (the tombstone's seq, the observed_seq its report carried), in seq order.
    let recorded: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    // Reports refused as SUPERSEDED: an Add (may have) landed between their observation and their record,
    // the race this test is about.
    let superseded = Arc::new(AtomicU64::new(0));

    // A reporter keeps observing and recording the key absent, as a client racing the source would.
    let reporter = {
        let (gate, hot, done, recorded, superseded) = (
            gate.clone(),
            hot.clone(),
            done.clone(),
            recorded.clone(),
            superseded.clone(),
        );
        thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                let (observed_seq, reply) = look_up_then_record_absent(&gate, &hot);
                match reply.outcome {
                    RecordOutcome::Recorded => {
                        recorded.lock().unwrap().push((reply.seq, observed_seq))
                    }
                    RecordOutcome::Superseded => {
                        superseded.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        })
    };

    // Add, then look up: a tombstone answering is remembered with the Add it followed.
    // At least 5,000 rounds, and until the reporter got tombstones in between and Adds landed between its
    // observations and its records (bounded by time).
    let started = std::time::Instant::now();
    let mut tombstone_after = Vec::new();
    let mut rounds = 0;
    while rounds < 5_000
        || ((recorded.lock().unwrap().len() < 50 || superseded.load(Ordering::Relaxed) < 50)
            && started.elapsed() < std::time::Duration::from_secs(20))
    {
        rounds += 1;
        if rounds % 16 == 0 {
            thread::yield_now();
        }
        // A millisecond a round keeps refilling the tombstone admission bucket (10 tokens a millisecond at
        // the default rate), so that records keep racing Adds instead of all being throttled once the first
        // second's burst is spent.
        clock.advance(1);
        let added = gate.add("default", vec![hot.clone()]).unwrap();
        adds.push(added.seq);
        let (lookup, _) = gate.may_exist("default", &hot).unwrap();
        if lookup.basis == Basis::Tombstone {
            tombstone_after.push(added.seq);
        }
    }
    done.store(true, Ordering::Release);
    reporter.join().unwrap();
    let recorded = recorded.lock().unwrap().clone();

    // No absence is recorded past an Add it did not observe: the newest Add before each tombstone is at or
    // below the seq its report observed (otherwise the report was stale and had to be SUPERSEDED).
    for &(seq, observed) in &recorded {
        let newest_add = adds[..adds.partition_point(|&add| add < seq)]
            .last()
            .copied()
            .unwrap_or_default();
        assert!(
            observed >= newest_add,
            "a stale absence was recorded: tombstone {seq} from an observation at {observed}, \
             before the Add at {newest_add}"
        );
    }
    // Each tombstone seen right after an Add came from a record made after that Add (the Add cleared the
    // older ones) and before the next one (the lookup preceded it), whose observation saw the Add.
    for &add in &tombstone_after {
        let next_add = adds[adds.partition_point(|&a| a <= add)..]
            .first()
            .copied()
            .unwrap_or(u64::MAX);
        let sources: Vec<&(u64, u64)> = recorded
            .iter()
            .filter(|&&(seq, _)| add < seq && seq < next_add)
            .collect();
        assert!(
            !sources.is_empty(),
            "a tombstone recorded before the Add at {add} answered after it"
        );
        assert!(
            sources.iter().all(|&&(_, observed)| observed >= add),
            "a tombstone answered after the Add at {add} from an observation before it: {sources:?}"
        );
    }
    let superseded = superseded.load(Ordering::Relaxed);
    assert!(
        !recorded.is_empty() && superseded > 0,
        "the race was never exercised: {} recorded, {superseded} superseded",
        recorded.len()
    );
    println!(
        "{rounds} rounds: {} absences recorded, {superseded} superseded, {} tombstones seen right after an Add",
        recorded.len(),
        tombstone_after.len()
    );
}

/// The first `Add` of a namespace racing the recommended read path (look up, read the source, record the
/// absence with the lookup's seq): a tombstone may be stored only if its lookup came after the `Add`.
/// Answers of a fresh namespace used to carry seq 0, which in a request means "not observed", so such a
/// race stored a tombstone hiding the added key for its whole TTL. Each interleaving of the three steps is
/// played in turn on a fresh gate, so the race is exercised every run rather than when threads happen to
/// produce it.
#[test]
fn absences_racing_the_first_add_of_a_fresh_namespace_are_refused() {
    let hot = Bytes::from_static(b"first");
    // The lookup, then the Add, then the record made from that lookup: the race itself.
    let gate = gate_with_clock();
    let (_, observed_seq) = gate.may_exist("default", &hot).unwrap();
    let added_seq = gate.add("default", vec![hot.clone()]).unwrap().seq;
    assert!(observed_seq < added_seq);
    let recorded = record_absent(&gate, &hot, observed_seq);
    assert_ne!(
        recorded.outcome,
        RecordOutcome::Recorded,
        "an absence observed at seq {observed_seq}, before the Add at {added_seq}, was stored"
    );
    assert_eq!(
        gate.may_exist("default", &hot).unwrap().0.answer,
        Answer::MayExist
    );

    // The lookup and the record (the filter already says absent: REDUNDANT), then the Add: present.
    let gate = gate_with_clock();
    look_up_then_record_absent(&gate, &hot);
    gate.add("default", vec![hot.clone()]).unwrap();
    assert_eq!(
        gate.may_exist("default", &hot).unwrap().0.answer,
        Answer::MayExist
    );

    // The Add, then the lookup and the record: the lookup saw the Add.
    let gate = gate_with_clock();
    let added_seq = gate.add("default", vec![hot.clone()]).unwrap().seq;
    let (observed_seq, _) = look_up_then_record_absent(&gate, &hot);
    assert!(
        observed_seq >= added_seq,
        "a lookup after the Add observed {observed_seq}"
    );
}

fn gate_with_clock() -> Arc<Gate> {
    gate(Arc::new(ManualClock::new(START_MS)))
}

/// The recommended read path after the source said "not found": look `key` up, then record its absence
/// with the seq that lookup observed. Returns that seq and the reply.
fn look_up_then_record_absent(gate: &Gate, key: &Bytes) -> (u64, Recorded) {
    let (_, observed_seq) = gate.may_exist("default", key).unwrap();
    (observed_seq, record_absent(gate, key, observed_seq))
}

/// Records `key` absent as the source said, with the seq its lookup observed.
fn record_absent(gate: &Gate, key: &Bytes, observed_seq: u64) -> Recorded {
    let report = AbsenceReport {
        key: key.clone(),
        kind: AbsenceKind::Missing,
        observed_seq,
        ttl_seconds: 60,
    };
    gate.record_absent("default", report).unwrap()
}
