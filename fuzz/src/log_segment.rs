//! The `log_segment` target: whole segment files replayed into a gate, as recovery does.

use std::path::Path;

use bytes::Bytes;
use existence_gate::core::answer::{Answer, Basis};
use existence_gate::core::gate::Gate;
use existence_gate::core::log::Mutation;
use existence_gate::storage::wal;

use crate::shared::{exercise, fix_checksums, frame_ends, new_gate, scratch, CONFIG, SEED};

/// Replays `data` as a log segment into a fresh gate, as recovery does: as it is (one segment), and with
/// its checksums fixed (split into two segments at a frame boundary when it has several frames).
pub fn log_segment(data: &[u8]) {
    let dir = scratch();
    replay_files(dir.path(), &[data]);
    let mut fixed = data.to_vec();
    let changed = fix_checksums(&mut fixed);
    let ends = frame_ends(&fixed);
    if ends.len() >= 2 {
        let split = ends[ends.len() / 2 - 1];
        let dir = scratch();
        replay_files(dir.path(), &[&fixed[..split], &fixed[split..]]);
    } else if changed {
        let dir = scratch();
        replay_files(dir.path(), &[&fixed]);
    }
}

/// The seed fingerprint replayed segments are checked against: the seeds' data directory's (a mutated header
/// with another fingerprint is refused like any other damage).
pub fn seed_fingerprint() -> u64 {
    wal::seed_fingerprint(&SEED)
}

/// Writes `segments` as consecutive log segments in `dir`, replays them into a fresh gate, and checks what
/// replay promises: a torn tail it truncated is gone on the next replay, and every key of an `Add` to a
/// `forever` namespace answers `MAY_EXIST` unless a tombstone answers for it.
fn replay_files(dir: &Path, segments: &[&[u8]]) {
    for (number, bytes) in segments.iter().enumerate() {
        std::fs::write(wal::segment_path(dir, number as u64 + 1), bytes).expect("write a segment");
    }
    // Gates are built on the first record only: most mutated segments fail before one, and building a
    // gate (sizing its filters) costs more than the rest of a run.
    let mut gate: Option<Gate> = None;
    let mut added: Vec<Bytes> = Vec::new();
    let first = wal::replay(dir, 0, seed_fingerprint(), |mutation| {
        let gate = gate.get_or_insert_with(|| new_gate(CONFIG).0);
        // Replay skips records the state already holds: only the next seq is applied.
        let next = gate
            .namespace("default")
            .expect("configured")
            .latest_seq()
            .wrapping_add(1);
        let applied_keys = match &mutation {
            Mutation::Add {
                namespace,
                keys,
                seq,
                ..
            } if &**namespace == "default" && *seq == next => Some(keys.clone()),
            _ => None,
        };
        gate.replay_one(mutation)?;
        if let Some(keys) = applied_keys {
            added.extend(keys.iter().take(64 - added.len().min(64)));
        }
        Ok(())
    });
    let Ok(first) = first else {
        return;
    };
    assert_eq!(first.last_segment, segments.len() as u64);
    let seqs = |g: &Option<Gate>| -> Vec<u64> {
        g.as_ref().map_or_else(Vec::new, |g| {
            g.namespaces().iter().map(|n| n.latest_seq()).collect()
        })
    };
    let mut again_gate: Option<Gate> = None;
    let again = wal::replay(dir, 0, seed_fingerprint(), |mutation| {
        again_gate
            .get_or_insert_with(|| new_gate(CONFIG).0)
            .replay_one(mutation)
    })
    .expect("a log that replayed once replays again");
    assert_eq!(again.truncated, None, "replay truncated twice");
    assert_eq!(again.records, first.records);
    assert_eq!(
        seqs(&again_gate),
        seqs(&gate),
        "two replays of one log disagree"
    );
    let Some(gate) = gate else {
        return;
    };
    for key in &added {
        if key.is_empty() || key.len() > gate.limits().max_key_bytes {
            continue;
        }
        let (lookup, _) = gate.may_exist("default", key).expect("a valid lookup");
        assert!(
            lookup.answer == Answer::MayExist || lookup.basis == Basis::Tombstone,
            "a replayed key answers ABSENT from the filter"
        );
    }
    exercise(&gate);
}
