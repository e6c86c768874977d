use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::core::log::{Committed, Log, LogError, Mutation};
use crate::faulty_files::FaultyFiles;
use crate::frame::{self, Next};
use crate::segment_file::RealFiles;
use crate::segment_file::SegmentFiles;
use crate::{codec, PersistenceError};

const FINGERPRINT: u64 = 0x5eed;
const EIO: i32 = 5;

fn add(seq: u64, key: &str) -> Mutation {
    Mutation::Add {
        namespace: Arc::from("default"),
        seq,
        at_ms: 0,
        keys: vec![Bytes::copy_from_slice(key.as_bytes())].into(),
    }
}

fn wal(dir: &Path, mode: SyncMode, files: Arc<dyn SegmentFiles>) -> Wal {
    Wal::create(dir, 1, mode, FINGERPRINT, files).unwrap()
}

fn replayed(dir: &Path) -> Result<Vec<Mutation>, PersistenceError> {
    let mut mutations = Vec::new();
    replay(dir, 0, FINGERPRINT, |m| {
        mutations.push(m);
        Ok(())
    })?;
    Ok(mutations)
}

/// Whether `needle` is in one of the segment files, newest first (where a fresh record almost always is).
fn on_disk(dir: &Path, needle: &[u8]) -> bool {
    segments(dir).unwrap().iter().rev().any(|n| {
        std::fs::read(segment_path(dir, *n))
            .unwrap()
            .windows(needle.len())
            .any(|w| w == needle)
    })
}

/// Writers commit while another thread rolls segments as fast as it can: every acknowledged record
/// must already be in a file. (Rolling used to read the pending buffer and the ticket count under two
/// locks, acknowledging a record appended in between while it sat in memory.)
#[test]
fn a_roll_never_acknowledges_a_record_it_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Arc::new(wal(dir.path(), SyncMode::Always, Arc::new(RealFiles)));
    let done = Arc::new(AtomicBool::new(false));
    let roller = {
        let (wal, done) = (Arc::clone(&wal), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut rolls = 0;
            while !done.load(Ordering::Acquire) {
                wal.roll().unwrap();
                rolls += 1;
            }
            rolls
        })
    };
    let writers: Vec<_> = (0..4)
        .map(|writer| {
            let (wal, dir) = (Arc::clone(&wal), dir.path().to_path_buf());
            std::thread::spawn(move || {
                for i in 0..300 {
                    let key = format!("writer-{writer}-record-{i:04}");
                    let ticket = wal.append(&add(1, &key)).unwrap();
                    wal.commit(ticket).unwrap();
                    assert!(
                        on_disk(&dir, key.as_bytes()),
                        "{key} was acknowledged but is in no segment"
                    );
                }
            })
        })
        .collect();
    writers.into_iter().for_each(|w| w.join().unwrap());
    done.store(true, Ordering::Release);
    assert!(roller.join().unwrap() > 0);
    assert_eq!(replayed(dir.path()).unwrap().len(), 1_200);
}

#[test]
fn writers_waiting_on_one_fsync_share_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let files = FaultyFiles::new();
    let wal = Arc::new(wal(dir.path(), SyncMode::Always, files.clone()));
    files.stall_syncs();
    let syncs_before = files.syncs();
    let commit = |key: String| {
        let wal = Arc::clone(&wal);
        std::thread::spawn(move || wal.commit(wal.append(&add(1, &key)).unwrap()))
    };
    let leader = commit("first".into());
    wait_until(|| files.stalled_syncs() == 1);
    let followers: Vec<_> = (0..7).map(|i| commit(format!("follower-{i}"))).collect();
    wait_until(|| wal.appended() == 8);
    files.release_syncs();
    leader.join().unwrap().unwrap();
    followers
        .into_iter()
        .for_each(|f| f.join().unwrap().unwrap());
    assert_eq!(
        files.syncs() - syncs_before,
        2,
        "one fsync for the first, one for the seven"
    );
}

#[test]
fn a_failed_fsync_refuses_every_waiting_and_later_write_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let files = FaultyFiles::new();
    let wal = Arc::new(wal(dir.path(), SyncMode::Always, files.clone()));
    wal.commit(wal.append(&add(1, "acknowledged")).unwrap())
        .unwrap();
    files.stall_syncs();
    let leader = {
        let wal = Arc::clone(&wal);
        std::thread::spawn(move || wal.commit(wal.append(&add(2, "leader")).unwrap()))
    };
    wait_until(|| files.stalled_syncs() == 1);
    let waiter = {
        let wal = Arc::clone(&wal);
        std::thread::spawn(move || wal.commit(wal.append(&add(3, "waiter")).unwrap()))
    };
    wait_until(|| wal.appended() == 3);
    files.fail_syncs(EIO);
    files.release_syncs();
    assert!(leader.join().unwrap().is_err());
    assert!(waiter.join().unwrap().is_err());
    // Poisoned: healing the disk does not bring writes back, since the failed fsync may have dropped
    // pages the kernel then reports as clean.
    files.fail_syncs(0);
    let later = wal.append(&add(4, "later"));
    assert!(later.is_err_and(|e| e.to_string().contains("failed earlier")));
    assert!(wal.sync_now().is_err());
    assert!(wal.roll().is_err());
    drop(wal);
    let recovered = replayed(dir.path()).unwrap();
    assert_eq!(recovered[0], add(1, "acknowledged"));
}

#[test]
fn a_failed_write_or_roll_poisons_the_log() {
    for fault in ["write", "create"] {
        let dir = tempfile::tempdir().unwrap();
        let files = FaultyFiles::new();
        let wal = wal(dir.path(), SyncMode::Never, files.clone());
        let ticket = wal.append(&add(1, "one")).unwrap();
        if fault == "write" {
            files.fail_writes(28);
            assert!(wal.commit(ticket).is_err());
        } else {
            files.fail_creates(true);
            assert!(wal.roll().is_err());
        }
        assert!(wal.append(&add(2, "two")).is_err(), "{fault}");
    }
}

#[test]
fn a_full_disk_refuses_writes_until_space_returns_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let files = FaultyFiles::new();
    let wal = wal(dir.path(), SyncMode::Always, files.clone());
    wal.commit(wal.append(&add(1, "before")).unwrap()).unwrap();
    files.fail_writes(28);
    let held = wal.append(&add(2, "held back")).unwrap();
    let error = wal.commit(held).unwrap_err().to_string();
    assert!(error.contains("out of disk space"), "{error}");
    assert!(wal
        .write_failure()
        .is_some_and(|r| r.contains("writes resume")));
    assert!(
        wal.append(&add(3, "refused")).is_err(),
        "nothing new is taken"
    );
    assert!(!wal.retry_writes(), "still full");
    // The partial write was cut back out: the file replays cleanly, without the held record.
    assert_eq!(replayed(dir.path()).unwrap(), [add(1, "before")]);

    files.fail_writes(0);
    assert!(wal.retry_writes());
    assert_eq!(wal.write_failure(), None);
    wal.commit(wal.append(&add(3, "after")).unwrap()).unwrap();
    assert_eq!(
        replayed(dir.path()).unwrap(),
        [add(1, "before"), add(2, "held back"), add(3, "after")]
    );
}

#[test]
fn a_segment_deleted_under_the_log_poisons_it() {
    let dir = tempfile::tempdir().unwrap();
    let wal = wal(dir.path(), SyncMode::Never, Arc::new(RealFiles));
    wal.commit(wal.append(&add(1, "one")).unwrap()).unwrap();
    wal.check_segment_linked();
    assert_eq!(wal.write_failure(), None);
    std::fs::remove_file(segment_path(dir.path(), 1)).unwrap();
    wal.check_segment_linked();
    let reason = wal.write_failure().unwrap();
    assert!(reason.contains("removed or replaced"), "{reason}");
    assert!(wal.append(&add(2, "two")).is_err());
}

/// Between the periodic checks too: the write that finds its file gone is not acknowledged.
#[test]
fn a_write_into_a_deleted_segment_is_not_acknowledged() {
    for mode in [SyncMode::Always, SyncMode::Never] {
        let dir = tempfile::tempdir().unwrap();
        let wal = wal(dir.path(), mode, Arc::new(RealFiles));
        wal.commit(wal.append(&add(1, "one")).unwrap()).unwrap();
        std::fs::remove_dir_all(dir.path()).unwrap();
        let refused = wal.commit(wal.append(&add(2, "two")).unwrap()).unwrap_err();
        assert!(
            refused.to_string().contains("removed or replaced"),
            "{mode:?}: {refused}"
        );
        assert!(wal.write_failure().is_some(), "{mode:?}");
    }
}

/// A log with its flusher running, for writes that wait on tasks ([`Log::committed`]).
fn flushed_wal(dir: &Path, mode: SyncMode, files: Arc<dyn SegmentFiles>) -> Arc<Wal> {
    let wal = Arc::new(wal(dir, mode, files));
    Wal::start_flusher(&wal).unwrap();
    assert!(wal.commits_without_thread());
    wal
}

/// The wait's outcome if it has one now (polled once; the flusher wakes no task here).
fn outcome_now(wait: &mut Committed) -> Option<Result<(), LogError>> {
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match wait.as_mut().poll(&mut context) {
        std::task::Poll::Ready(outcome) => Some(outcome),
        std::task::Poll::Pending => None,
    }
}

/// The wait's outcome, once it has one.
fn outcome(mut wait: Committed) -> Result<(), LogError> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(outcome) = outcome_now(&mut wait) {
            return outcome;
        }
        assert!(std::time::Instant::now() < deadline, "the wait never ended");
        std::thread::yield_now();
    }
}

/// Writes waiting on tasks share fsyncs as writers on threads do: seven that arrive during one fsync are
/// made durable by the next, and none is told before.
#[test]
fn waits_on_tasks_share_one_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let files = FaultyFiles::new();
    let wal = flushed_wal(dir.path(), SyncMode::Always, files.clone());
    files.stall_syncs();
    let syncs_before = files.syncs();
    let first = wal.committed(wal.append(&add(1, "first")).unwrap());
    wait_until(|| files.stalled_syncs() == 1);
    let mut followers: Vec<_> = (0..7)
        .map(|i| wal.committed(wal.append(&add(2 + i, &format!("follower-{i}"))).unwrap()))
        .collect();
    assert!(followers.iter_mut().all(|f| outcome_now(f).is_none()));
    files.release_syncs();
    outcome(first).unwrap();
    followers.into_iter().for_each(|f| outcome(f).unwrap());
    assert_eq!(
        files.syncs() - syncs_before,
        2,
        "one fsync for the first, one for the seven"
    );
    assert_eq!(replayed(dir.path()).unwrap().len(), 8);
}

/// A group's write wakes only the waits it made durable: one whose record went into the next write,
/// which the disk refused, is told so — not "durable" by the write before it.
#[test]
fn a_write_wakes_only_the_waits_it_reached() {
    let dir = tempfile::tempdir().unwrap();
    let files = FaultyFiles::new();
    let wal = flushed_wal(dir.path(), SyncMode::Always, files.clone());
    files.stall_syncs();
    let first = wal.committed(wal.append(&add(1, "first")).unwrap());
    wait_until(|| files.stalled_syncs() == 1);
    let mut second = wal.committed(wal.append(&add(2, "second")).unwrap());
    assert!(outcome_now(&mut second).is_none());
    files.fail_writes(28);
    files.release_syncs();
    outcome(first).unwrap();
    let refused = outcome(second).unwrap_err().to_string();
    assert!(refused.contains("out of disk space"), "{refused}");
    assert_eq!(replayed(dir.path()).unwrap(), [add(1, "first")]);
}

/// A log that failed tells a waiting write at once, and the flusher keeps nobody waiting for it.
#[test]
fn a_failed_log_refuses_waits_on_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let files = FaultyFiles::new();
    let wal = flushed_wal(dir.path(), SyncMode::Always, files.clone());
    outcome(wal.committed(wal.append(&add(1, "acknowledged")).unwrap())).unwrap();
    files.fail_syncs(EIO);
    let failed = outcome(wal.committed(wal.append(&add(2, "failed")).unwrap()));
    assert!(failed.is_err());
    assert!(wal.append(&add(3, "later")).is_err(), "poisoned");
    assert_eq!(replayed(dir.path()).unwrap()[0], add(1, "acknowledged"));
}

/// Waits (without a fixed sleep) until `condition` holds; fails after a generous deadline.
fn wait_until(condition: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "condition never held");
        std::thread::yield_now();
    }
}

fn write_segment(dir: &Path, number: u64, header: Option<SegmentHeader>, tail: &[u8]) {
    let mut bytes = Vec::new();
    if let Some(header) = header {
        header.encode(&mut bytes);
    }
    // Formats before 4 framed keys with u32 lengths (format 1 had no header).
    let lengths = match header.map_or(1, |header| header.format) {
        ..=3 => codec::KeyLengths::Fixed,
        _ => codec::KeyLengths::Varint,
    };
    for seq in 1..=3 {
        let mut payload = Vec::new();
        codec::encode_with_seq(&add(seq, &format!("key-{seq}")), seq, lengths, &mut payload);
        frame::encode(&payload, &mut bytes);
    }
    bytes.extend_from_slice(tail);
    std::fs::write(segment_path(dir, number), bytes).unwrap();
}

const CURRENT: SegmentHeader = SegmentHeader {
    format: LOG_FORMAT,
    seed_fingerprint: FINGERPRINT,
};

#[test]
fn a_zero_filled_tail_is_torn_and_truncated() {
    for zeros in [1, 5, 8, 9, 64, 4096] {
        let dir = tempfile::tempdir().unwrap();
        write_segment(dir.path(), 1, Some(CURRENT), &vec![0; zeros]);
        let full = std::fs::metadata(segment_path(dir.path(), 1))
            .unwrap()
            .len();
        assert_eq!(replayed(dir.path()).unwrap().len(), 3, "{zeros} zero bytes");
        let len = std::fs::metadata(segment_path(dir.path(), 1))
            .unwrap()
            .len();
        assert_eq!(len, full - zeros as u64);
    }
}

#[test]
fn zeros_with_a_record_after_them_are_damage() {
    let dir = tempfile::tempdir().unwrap();
    let mut tail = vec![0; 16];
    let mut payload = Vec::new();
    codec::encode(&add(4, "after the zeros"), &mut payload);
    frame::encode(&payload, &mut tail);
    write_segment(dir.path(), 1, Some(CURRENT), &tail);
    let error = replayed(dir.path()).unwrap_err().to_string();
    assert!(error.contains("empty frame"), "{error}");
}

#[test]
fn format_3_segments_with_u32_key_lengths_replay_beside_format_4_ones() {
    let dir = tempfile::tempdir().unwrap();
    let format_3 = SegmentHeader {
        format: 3,
        seed_fingerprint: FINGERPRINT,
    };
    write_segment(dir.path(), 1, Some(format_3), &[]);
    write_segment(dir.path(), 2, Some(CURRENT), &[]);
    let expected: Vec<Mutation> = (1..=3)
        .chain(1..=3)
        .map(|seq| add(seq, &format!("key-{seq}")))
        .collect();
    assert_eq!(replayed(dir.path()).unwrap(), expected);
}

#[test]
fn headerless_format_1_segments_replay_with_seqs_counted_from_1() {
    let dir = tempfile::tempdir().unwrap();
    write_segment(dir.path(), 1, None, &[]);
    write_segment(dir.path(), 2, Some(CURRENT), &[]);
    let seqs: Vec<u64> = replayed(dir.path())
        .unwrap()
        .iter()
        .map(Mutation::seq)
        .collect();
    assert_eq!(seqs, [2, 3, 4, 1, 2, 3]);
}

#[test]
fn a_segment_from_a_newer_build_or_another_deployment_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let newer = SegmentHeader {
        format: LOG_FORMAT + 1,
        ..CURRENT
    };
    write_segment(dir.path(), 1, Some(newer), &[]);
    let error = replayed(dir.path()).unwrap_err().to_string();
    assert!(
        error.contains(&format!(
            "written by a newer existence-gate (log format {}",
            LOG_FORMAT + 1
        )) && !error.contains("damaged")
            && error.contains("wal-00000000000000000001.log"),
        "{error}"
    );
    let other = SegmentHeader {
        seed_fingerprint: 7,
        ..CURRENT
    };
    write_segment(dir.path(), 1, Some(other), &[]);
    let error = replayed(dir.path()).unwrap_err().to_string();
    assert!(error.contains("another deployment"), "{error}");
}

#[test]
fn a_new_segment_starts_with_its_header() {
    let dir = tempfile::tempdir().unwrap();
    let wal = wal(dir.path(), SyncMode::Always, Arc::new(RealFiles));
    wal.commit(wal.append(&add(2, "k")).unwrap()).unwrap();
    let bytes = std::fs::read(segment_path(dir.path(), 1)).unwrap();
    let mut reader = frame::Reader::new(&bytes[..], bytes.len() as u64);
    let Next::Frame(_, first) = reader.next_frame().unwrap() else {
        panic!("no first frame");
    };
    assert_eq!(SegmentHeader::decode(first), Ok(Some(CURRENT)));
    assert_eq!(replayed(dir.path()).unwrap(), [add(2, "k")]);
}
