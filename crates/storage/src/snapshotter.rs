//! Taking snapshots of a running gate, one at a time: room left for the log, the snapshot written and
//! published, the segments it covers removed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::core::gate::Gate;
use crate::{snapshot, sync_dir, wal, DataDir, PersistenceError, Wal};

/// The least free space a snapshot leaves the log, and the most it asks for: see [`log_reserve`].
const MIN_LOG_RESERVE_BYTES: u64 = 16 << 20;
const MAX_LOG_RESERVE_BYTES: u64 = 2 * wal::SEGMENT_BYTES;

/// Free space a snapshot of `snapshot` bytes leaves for the log, so that writes go on while it is written
/// and until its covered segments are removed: a quarter of its size (the log writes while the snapshot
/// is written, both at disk speed), at least 16 MiB, at most two segments (128 MiB). It scales, so a small
/// volume still snapshots a small state. Should the log outgrow it anyway, a full disk only holds writes
/// back (`UNAVAILABLE`) until the snapshot removes the segments it covers; nothing is lost.
pub(super) fn log_reserve(snapshot: u64) -> u64 {
    (snapshot / 4).clamp(MIN_LOG_RESERVE_BYTES, MAX_LOG_RESERVE_BYTES)
}

/// Refuses a snapshot of about `snapshot` bytes when only `free` bytes are free: written anyway, it could
/// take the space the log needs for the next `Add`.
fn check_room(dir: &Path, snapshot: u64, free: u64) -> Result<(), PersistenceError> {
    if free >= snapshot.saturating_add(log_reserve(snapshot)) {
        return Ok(());
    }
    Err(PersistenceError::NoRoom {
        dir: dir.to_path_buf(),
        snapshot,
        free,
    })
}

/// Bytes an unprivileged writer may still use on the file system holding `dir`.
fn free_bytes(dir: &Path) -> Result<u64, PersistenceError> {
    let stat = rustix::fs::statvfs(dir)
        .map_err(|e| PersistenceError::io(dir, "measure the free space of", e.into()))?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Figures of a snapshot taken.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotTaken {
    /// Where it was published.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// Log segments removed because it covers them.
    pub segments_removed: usize,
    /// How long it took.
    pub elapsed: Duration,
    /// Unix ms when it was published.
    pub at_ms: u64,
}

/// Takes snapshots of a gate into its data directory, one at a time.
#[derive(Debug)]
pub struct Snapshotter {
    dir: Arc<DataDir>,
    wal: Arc<Wal>,
    /// Serialises snapshots and remembers the last one.
    last: Mutex<Option<SnapshotTaken>>,
}

impl Snapshotter {
    /// A snapshotter for `dir`, whose log is `wal`.
    pub fn new(dir: Arc<DataDir>, wal: Arc<Wal>) -> Self {
        Self {
            dir,
            wal,
            last: Mutex::new(None),
        }
    }

    /// The last snapshot taken by this process.
    pub fn last(&self) -> Option<SnapshotTaken> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Bytes logged since the last snapshot began.
    pub fn log_bytes_since(&self) -> u64 {
        self.wal.bytes_since_snapshot()
    }

    /// Rolls the log to a new segment, writes a snapshot covering the closed ones, publishes it, and
    /// removes the segments and older snapshots it covers.
    pub fn take(&self, gate: &Gate) -> Result<SnapshotTaken, PersistenceError> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let started = Instant::now();
        let dir = self.dir.path();
        check_room(dir, snapshot::estimated_bytes(gate), free_bytes(dir)?)?;
        let covered = self.wal.roll()?;
        let written = snapshot::write(self.dir.path(), covered, gate, self.dir.seed())?;
        let segments_removed = self.wal.remove_through(covered)?;
        remove_older_snapshots(self.dir.path(), covered)?;
        let taken = SnapshotTaken {
            path: written.path,
            bytes: written.bytes,
            segments_removed,
            elapsed: started.elapsed(),
            at_ms: gate.read_time().tombstones_ms,
        };
        tracing::info!(path = %taken.path.display(), bytes = taken.bytes, elapsed = ?taken.elapsed, "snapshot published");
        *last = Some(taken.clone());
        Ok(taken)
    }
}

/// Removes the snapshots in `dir` older than the one covering `covered` — with every file named after one
/// (`snapshot-<covered>.<anything>`: a temporary file a crash left, the replicated mode's record of the
/// message read last) — and fsyncs the directory.
pub fn remove_older_snapshots(dir: &Path, covered: u64) -> Result<(), PersistenceError> {
    for entry in std::fs::read_dir(dir)
        .map_err(|e| PersistenceError::io(dir, "list", e))?
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let older = name
            .strip_prefix("snapshot-")
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(n, _)| n.parse::<u64>().ok())
            .is_some_and(|n| n < covered);
        if older {
            std::fs::remove_file(entry.path())
                .map_err(|e| PersistenceError::io(&entry.path(), "remove", e))?;
        }
    }
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_must_leave_the_log_its_reserve() {
        let dir = Path::new("/data");
        let small = 1_000;
        check_room(dir, small, small + MIN_LOG_RESERVE_BYTES).unwrap();
        let refused = check_room(dir, small, small - 1 + MIN_LOG_RESERVE_BYTES)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("no snapshot taken")
                && refused.contains(&format!(
                    "plus {MIN_LOG_RESERVE_BYTES} bytes kept for the log"
                ))
                && refused.contains("log keeps everything"),
            "{refused}"
        );
        // The reserve scales with the snapshot, up to two segments.
        let medium = 200 << 20;
        check_room(dir, medium, medium + medium / 4).unwrap();
        assert!(check_room(dir, medium, medium + medium / 4 - 1).is_err());
        let huge = 10 << 30;
        check_room(dir, huge, huge + 2 * wal::SEGMENT_BYTES).unwrap();
        assert!(check_room(dir, huge, huge + 2 * wal::SEGMENT_BYTES - 1).is_err());
        assert!(free_bytes(&std::env::temp_dir()).unwrap() > 0);
    }
}
