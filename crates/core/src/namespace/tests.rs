//! The namespace's unit tests: decisions, apply, rebuilds and images against an in-memory log.

use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::answer::Answer;
use crate::log::{MemoryLog, Mutation, RebuildStep};
use crate::tombstones::AbsenceKind;

fn namespace() -> Arc<Namespace> {
    let hasher = Arc::new(KeyHasher::from_seed([9; 32]));
    Arc::new(Namespace::new(
        "default",
        NamespaceSettings::default(),
        hasher,
        1 << 16,
    ))
}

fn key(k: &str) -> Bytes {
    Bytes::copy_from_slice(k.as_bytes())
}

/// A panic while the writer lock is held (as inside `apply_locked`) stops writes, logged or replayed, and
/// snapshots of the possibly half-applied state; lookups go on.
#[test]
fn a_panic_while_applying_stops_writes_but_not_reads() {
    let namespace = namespace();
    let log = MemoryLog::default();
    namespace.add(vec![key("before")], 1_000, &log).unwrap();
    let panicking = Arc::clone(&namespace);
    let result = std::thread::spawn(move || {
        let _writer = panicking.writer();
        panic!("a bug inside the state machine");
    })
    .join();
    assert!(result.is_err());
    assert!(namespace.writes_stopped());

    let refused = namespace.add(vec![key("after")], 2_000, &log).unwrap_err();
    assert!(
        matches!(&refused, WriteError::Stopped(WritesStopped(name)) if &**name == "default"),
        "{refused}"
    );
    assert!(refused.to_string().contains("Restart the server"));
    let report = AbsenceReport {
        key: key("before"),
        kind: AbsenceKind::Missing,
        observed_seq: namespace.latest_seq(),
        ttl_seconds: 60,
    };
    assert!(namespace.record_absent(report, 2_000, &log).is_err());
    assert!(namespace.export(2_000).is_err());
    assert!(namespace.begin_rebuild().is_err());
    let replayed = Mutation::Add {
        namespace: Arc::from("default"),
        seq: namespace.latest_seq() + 1,
        at_ms: 2_000,
        keys: vec![key("replayed")].into(),
    };
    assert!(namespace.apply(replayed).is_err());
    assert_eq!(log.mutations().len(), 1, "nothing more was logged");

    assert_eq!(namespace.lookup(b"before", 3_000).answer, Answer::MayExist);
}

/// Records an absence of each of `keys` (added first) at `at_ms`; returns each one's TTL.
fn tombstone_ttls(namespace: &Namespace, keys: &[Bytes], at_ms: u64) -> Vec<u64> {
    let log = MemoryLog::default();
    namespace.add(keys.to_vec(), at_ms, &log).unwrap();
    keys.iter()
        .map(|key| {
            let report = AbsenceReport {
                key: key.clone(),
                kind: AbsenceKind::Missing,
                observed_seq: 0,
                ttl_seconds: 0,
            };
            let recorded = namespace.record_absent(report, at_ms, &log).unwrap();
            assert_eq!(recorded.outcome, RecordOutcome::Recorded);
            recorded.expires_in_ms
        })
        .collect()
}

/// Jitter is a function of key and time, so two gates given the same reports store the same expiries
/// (and replicas applying one message agree); across keys it still spreads over the whole ±10% range.
#[test]
fn tombstone_jitter_is_a_function_of_key_and_time_and_spans_its_range() {
    let keys: Vec<Bytes> = (0..2_000).map(|i| key(&format!("k{i}"))).collect();
    let first = tombstone_ttls(&namespace(), &keys, 5_000);
    assert_eq!(first, tombstone_ttls(&namespace(), &keys, 5_000));
    assert_ne!(first, tombstone_ttls(&namespace(), &keys, 5_001));
    let (base, jitter) = (60_000.0, 0.1);
    let (low, high) = (*first.iter().min().unwrap(), *first.iter().max().unwrap());
    assert!(low as f64 >= base * (1.0 - jitter) && (low as f64) < base * (1.0 - 0.99 * jitter));
    assert!(high as f64 <= base * (1.0 + jitter) && (high as f64) > base * (1.0 + 0.99 * jitter));
    let mean = first.iter().sum::<u64>() as f64 / first.len() as f64;
    assert!((mean / base - 1.0).abs() < 0.005, "mean TTL {mean} ms");
}

/// The digest follows the state: equal for equal mutations, different as soon as one bit or tombstone
/// differs, and unavailable once writes stopped.
#[test]
fn the_state_digest_tells_equal_states_from_different_ones() {
    let (left, right) = (namespace(), namespace());
    let log = MemoryLog::default();
    for namespace in [&left, &right] {
        namespace
            .add(vec![key("a"), key("b")], 1_000, &log)
            .unwrap();
    }
    let digest = |namespace: &Namespace| namespace.state_digest(2_000).unwrap();
    assert_eq!(digest(&left), digest(&right));

    let before = digest(&left);
    let report = AbsenceReport {
        key: key("a"),
        kind: AbsenceKind::Deleted,
        observed_seq: 0,
        ttl_seconds: 30,
    };
    left.record_absent(report, 1_500, &log).unwrap();
    assert_ne!(digest(&left).digest, before.digest, "a tombstone counts");
    right.add(vec![key("c")], 1_500, &log).unwrap();
    assert_eq!(digest(&left).seq, digest(&right).seq);
    assert_ne!(digest(&left).digest, digest(&right).digest);
    let expired_later = left.state_digest(1_500 + 40_000).unwrap();
    assert_ne!(
        expired_later.digest,
        digest(&left).digest,
        "an expired tombstone no longer counts"
    );

    let stopping = Arc::clone(&right);
    let _ = std::thread::spawn(move || {
        let _writer = stopping.writer();
        panic!("a bug inside the state machine");
    })
    .join();
    assert!(right.state_digest(2_000).is_err());
}

fn step(seq: u64, step: RebuildStep) -> Mutation {
    Mutation::Rebuild {
        namespace: Arc::from("default"),
        seq,
        at_ms: 1_000,
        step,
    }
}

fn addition(seq: u64, keys: &[&str]) -> Mutation {
    Mutation::Add {
        namespace: Arc::from("default"),
        seq,
        at_ms: 1_000,
        keys: keys.iter().map(|k| key(k)).collect(),
    }
}

/// A logged rebuild ends with exactly the keys it was fed plus those added after its `Begin`, swapped
/// in at its `Commit`; a namespace restored from an image taken half-way carries on with it and ends
/// in the same state.
#[test]
fn a_logged_rebuild_swaps_at_its_commit_and_carries_on_after_a_restore() {
    let live = namespace();
    let applied = |namespace: &Namespace, mutation| namespace.apply(mutation).unwrap();
    applied(&live, addition(2, &["gone", "kept"]));
    assert_eq!(
        applied(&live, step(3, RebuildStep::Begin)),
        Applied::RebuildBegun { replaced: None }
    );
    applied(&live, addition(4, &["added-meanwhile"]));
    let kept = RebuildStep::Keys {
        began: 3,
        keys: vec![key("kept")],
    };
    assert_eq!(applied(&live, step(5, kept)), Applied::RebuildFed);
    assert_eq!(live.lookup(b"gone", 2_000).answer, Answer::MayExist);

    let restored = namespace();
    let image = live.export(2_000).unwrap().detached();
    assert_eq!(
        image.rebuild.as_ref().map(|r| (r.began, r.keys)),
        Some((3, 1))
    );
    restored.restore(image, 2_000).unwrap();
    let rest = [
        step(
            6,
            RebuildStep::Keys {
                began: 3,
                keys: vec![key("fed-last")],
            },
        ),
        step(7, RebuildStep::Commit { began: 3 }),
    ];
    for namespace in [&live, &restored] {
        let outcomes: Vec<Applied> = rest.iter().map(|m| applied(namespace, m.clone())).collect();
        assert_eq!(
            outcomes,
            [
                Applied::RebuildFed,
                Applied::Rebuilt(Rebuilt {
                    keys: 2,
                    filter_bytes: live.filter.load().bytes(),
                    seq: 7
                })
            ]
        );
    }

    // Built from scratch with exactly those keys, at the same seq: the same bits.
    let expected = namespace();
    applied(
        &expected,
        addition(2, &["kept", "added-meanwhile", "fed-last"]),
    );
    let late = RebuildStep::Abort { began: 3 };
    assert_eq!(applied(&expected, step(7, late)), Applied::RebuildGone);
    let digest = |namespace: &Namespace| namespace.state_digest(2_000).unwrap();
    assert_eq!(digest(&live), digest(&expected));
    assert_eq!(digest(&restored), digest(&expected));
    assert!(live.export(2_000).unwrap().rebuild.is_none());
    let stale = RebuildStep::Keys {
        began: 3,
        keys: vec![key("late")],
    };
    for namespace in [&live, &expected] {
        assert_eq!(
            applied(namespace, step(8, stale.clone())),
            Applied::RebuildGone
        );
    }
    assert_eq!(digest(&live), digest(&expected));
}

/// A later `Begin` replaces an open rebuild, whose steps then change nothing; a new `Begin` is prepared
/// only once the open one has been idle for the given time, and an abort leaves the live filter as it was.
#[test]
fn one_logged_rebuild_at_a_time_and_an_abort_keeps_the_live_filter() {
    let live = namespace();
    let applied = |mutation| live.apply(mutation).unwrap();
    applied(addition(2, &["a", "b"]));
    let before = live.state_digest(2_000).unwrap().digest;
    let idle = Duration::from_secs(120);
    assert!(live.prepare_rebuild(1_000, idle).unwrap().is_some());
    applied(step(3, RebuildStep::Begin));
    assert!(live
        .prepare_rebuild(1_000 + 119_999, idle)
        .unwrap()
        .is_none());
    assert!(live
        .prepare_rebuild(1_000 + 120_000, idle)
        .unwrap()
        .is_some());
    assert_eq!(
        applied(step(4, RebuildStep::Begin)),
        Applied::RebuildBegun { replaced: Some(3) }
    );
    let replaced = RebuildStep::Keys {
        began: 3,
        keys: vec![key("a")],
    };
    assert_eq!(applied(step(5, replaced)), Applied::RebuildGone);
    assert_eq!(
        applied(step(6, RebuildStep::Commit { began: 3 })),
        Applied::RebuildGone
    );
    assert_eq!(
        applied(step(7, RebuildStep::Abort { began: 4 })),
        Applied::RebuildAborted
    );
    assert_eq!(live.latest_seq(), 7);
    assert_eq!(live.lookup(b"a", 2_000).answer, Answer::MayExist);
    let after = live.state_digest(2_000).unwrap();
    assert_ne!(after.digest, before, "the digest covers the seq");
    let expected = namespace();
    expected.apply(addition(2, &["a", "b"])).unwrap();
    expected
        .apply(step(7, RebuildStep::Abort { began: 4 }))
        .unwrap();
    assert_eq!(after, expected.state_digest(2_000).unwrap());
}

fn absence(seq: u64, k: &str, observed_seq: u64) -> Mutation {
    Mutation::RecordAbsent {
        namespace: Arc::from("default"),
        seq,
        at_ms: 1_000,
        key: key(k),
        kind: AbsenceKind::Missing,
        expires_at_ms: 61_000,
        observed_seq,
    }
}

/// Two replicas publish at once: an absence observed at seq 5 and an `Add` of the same key, which the
/// stream orders first (seq 7). Applying the absence at seq 8 stores nothing, on every replica; an
/// absence observed after the `Add` is stored.
#[test]
fn an_absence_applied_after_a_later_add_of_its_key_is_superseded() {
    let namespace = namespace();
    namespace.apply(addition(7, &["raced"])).unwrap();
    assert_eq!(
        namespace.apply(absence(8, "raced", 5)).unwrap(),
        Applied::Superseded
    );
    assert_eq!(namespace.latest_seq(), 8, "the seq is used all the same");
    assert_eq!(namespace.lookup(b"raced", 2_000).answer, Answer::MayExist);
    assert_eq!(
        namespace.apply(absence(9, "raced", 7)).unwrap(),
        Applied::Recorded
    );
    assert_eq!(namespace.lookup(b"raced", 2_000).answer, Answer::Absent);
}

/// A namespace restored from an export decides `SUPERSEDED` exactly as the exporter does — including
/// for absences observed before the export, which a floor at the export's seq would all refuse.
#[test]
fn a_restored_namespace_decides_superseded_as_its_exporter() {
    let exporter = namespace();
    for (seq, k) in (2..40).zip((0..).map(|i| format!("k{i}"))) {
        exporter.apply(addition(seq, &[&k])).unwrap();
    }
    let image = exporter.export(1_000).unwrap();
    assert_eq!(image.seq, 39);
    let restored = namespace();
    restored.restore(image, 1_000).unwrap();
    for (i, observed_seq) in [(3, 4), (3, 6), (30, 10), (30, 33), (37, 38)] {
        let (k, next) = (format!("k{i}"), exporter.latest_seq() + 1);
        let decided = exporter.apply(absence(next, &k, observed_seq)).unwrap();
        assert_eq!(
            restored.apply(absence(next, &k, observed_seq)).unwrap(),
            decided
        );
    }
    // k3 was added at seq 5: observed at 4 it is superseded, at a later seq recorded.
    assert_eq!(restored.lookup(b"k3", 2_000).answer, Answer::Absent);
    assert_eq!(
        restored.state_digest(2_000).unwrap(),
        exporter.state_digest(2_000).unwrap()
    );
}

/// In a namespace no one has written, an answer's seq is still not 0, so an `Add` that races a
/// `RecordAbsent` of the recommended read path makes it `SUPERSEDED`.
#[test]
fn an_observation_of_a_fresh_namespace_still_detects_a_later_add() {
    let namespace = namespace();
    let log = MemoryLog::default();
    let observed_seq = namespace.latest_seq();
    assert_eq!(observed_seq, GENESIS_SEQ);
    assert_ne!(observed_seq, 0, "0 in a request means \"not observed\"");
    namespace.add(vec![key("raced")], 1_000, &log).unwrap();
    let report = AbsenceReport {
        key: key("raced"),
        kind: AbsenceKind::Missing,
        observed_seq,
        ttl_seconds: 60,
    };
    let recorded = namespace.record_absent(report, 1_001, &log).unwrap();
    assert_eq!(recorded.outcome, RecordOutcome::Superseded);
    assert_eq!(namespace.lookup(b"raced", 1_002).answer, Answer::MayExist);
}

/// A filter swapped in whole — a logged rebuild's commit, one driven in this process — may hold keys no
/// `Add` announced, so every subscription (a client's cached absences, a mirror) is told to resync, even
/// one that had seen everything; until then it had only the `Add`s, each with its time.
#[test]
fn a_swapped_in_filter_resyncs_every_subscription() {
    use crate::invalidations::Delivery;
    let live = namespace();
    let mut caught_up = live.subscribe(0, usize::MAX).unwrap();
    live.apply(addition(2, &["a"])).unwrap();
    match caught_up.poll_ready() {
        Some(Delivery::Added(added)) => assert_eq!((added.seq, added.at_ms), (2, 1_000)),
        other => panic!("expected the Add, got {other:?}"),
    }
    live.apply(step(3, RebuildStep::Begin)).unwrap();
    live.apply(step(4, RebuildStep::Commit { began: 3 }))
        .unwrap();
    assert_eq!(caught_up.poll_ready(), Some(Delivery::Resync { seq: 4 }));
    assert_eq!(caught_up.poll_ready(), None);

    let rebuild = live.begin_rebuild().unwrap().expect("no rebuild runs");
    rebuild.finish().unwrap();
    assert_eq!(caught_up.poll_ready(), Some(Delivery::Resync { seq: 4 }));
}
