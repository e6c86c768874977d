//! Storage: the data directory, its write-ahead log, its snapshots, and recovery. It implements the core's
//! [`Log`](crate::core::log::Log) and encodes its state; it knows nothing of the service.
//!
//! ```text
//! DATA_DIR/
//!   LOCK                               held while a server uses the directory
//!   identity                           the per-deployment hash seed (chosen at first start)
//!   wal-00000000000000000007.log       log segments, appended in order
//!   snapshot-00000000000000000006.snap the state covering segments up to 6
//! ```
//!
//! Restart = load the newest snapshot, replay the segments after it, then serve. Until then lookups fail
//! open (`MAY_EXIST` + `WARMING`). A torn record at the very end of the log is truncated with a warning; any
//! other damage stops startup with the file, the offset and what to do.

pub mod codec;
#[cfg(any(test, feature = "fault-points"))]
pub mod faulty_files;
pub mod frame;
pub mod segment_file;
pub mod snapshot;
pub mod wal;

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::core::gate::Gate;
use crate::core::hashing::KeyHasher;
use segment_file::{RealFiles, SegmentFiles};
pub use wal::{SyncMode, Wal};

/// Why the data directory cannot be used.
#[derive(Debug)]
pub enum PersistenceError {
    /// An operating-system call failed.
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// A file is damaged or inconsistent.
    Corrupt {
        /// The file.
        file: PathBuf,
        /// Byte offset of the damage.
        offset: u64,
        /// What is wrong.
        problem: String,
    },
    /// The data does not fit the configuration (another hash seed, another sizing, a missing namespace).
    Mismatch(String),
    /// Another process holds the directory.
    Locked(PathBuf),
    /// Too little free space for a snapshot beside the log's reserve; nothing was written.
    NoRoom {
        /// The data directory.
        dir: PathBuf,
        /// Bytes the snapshot would take, about.
        snapshot: u64,
        /// Bytes free.
        free: u64,
    },
}

impl PersistenceError {
    /// An I/O error on `path`.
    pub fn io(path: &Path, action: &'static str, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            action,
            source,
        }
    }
}

impl std::fmt::Display for PersistenceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io { path, action, source } => write!(f, "cannot {action} {}: {source}", path.display()),
            Self::Corrupt { file, offset, problem } => write!(
                f,
                "{} is damaged at byte offset {offset}: {problem}. The gate will not start from a partial \
                 state. To recover: restore the data directory from a backup (the newest snapshot file plus \
                 the log segments after it), or move the data directory aside and start empty, then \
                 re-derive the keys from the source of truth with the Admin Rebuild call",
                file.display()
            ),
            Self::Mismatch(problem) => write!(f, "{problem}"),
            Self::NoRoom { dir, snapshot, free } => write!(
                f,
                "no snapshot taken: {} has {free} bytes free, and a snapshot needs about {snapshot} plus \
                 {} bytes kept for the log (a quarter of it, at least 16 MiB, at most 128 MiB). Nothing \
                 was written and the log keeps everything; free some space (or give the data directory a \
                 larger volume)",
                dir.display(),
                log_reserve(*snapshot)
            ),
            Self::Locked(path) => write!(
                f,
                "{} is in use by another existence-gate process (its LOCK is held)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for PersistenceError {}

/// Fsyncs a directory, making renames and new files in it durable.
pub fn sync_dir(dir: &Path) -> Result<(), PersistenceError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| PersistenceError::io(dir, "fsync", e))
}

const IDENTITY_MAGIC: &[u8; 8] = b"EXGID001";

/// Reads the deployment's hash seed, storing `first` at first start.
fn identity(dir: &Path, first: [u8; 32]) -> Result<[u8; 32], PersistenceError> {
    let path = dir.join("identity");
    match std::fs::read(&path) {
        Ok(bytes) => {
            let mut reader = frame::Reader::new(&bytes[..], bytes.len() as u64);
            let corrupt = |offset, problem: String| PersistenceError::Corrupt {
                file: path.clone(),
                offset,
                problem,
            };
            match reader
                .next_frame()
                .map_err(|e| PersistenceError::io(&path, "read", e))?
            {
                frame::Next::Frame(_, payload)
                    if payload.len() == 40 && &payload[..8] == IDENTITY_MAGIC =>
                {
                    Ok(payload[8..].try_into().expect("32 bytes"))
                }
                frame::Next::Damaged(damage) => Err(corrupt(damage.offset, damage.reason)),
                _ => Err(corrupt(0, "not an identity file".to_string())),
            }
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let seed = first;
            let mut bytes = Vec::new();
            frame::encode(&[&IDENTITY_MAGIC[..], &seed[..]].concat(), &mut bytes);
            let temp = dir.join("identity.tmp");
            std::fs::write(&temp, &bytes)
                .and_then(|()| File::open(&temp)?.sync_all())
                .map_err(|e| PersistenceError::io(&temp, "write", e))?;
            std::fs::rename(&temp, &path).map_err(|e| PersistenceError::io(&path, "publish", e))?;
            sync_dir(dir)?;
            Ok(seed)
        }
        Err(error) => Err(PersistenceError::io(&path, "read", error)),
    }
}

/// An opened, locked data directory.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    seed: [u8; 32],
    /// Held for the process's life: a second server on the same directory would interleave logs.
    _lock: File,
}

impl DataDir {
    /// Creates (if needed), locks and reads the identity of `path` (a new random seed at first start).
    pub fn open(path: &Path) -> Result<Self, PersistenceError> {
        Self::open_with(path, KeyHasher::random().seed())
    }

    /// Opens `path` for a replica of a stream whose hash seed is `seed`: a new directory takes it; one of
    /// another deployment (another seed), or holding a single server's write-ahead log, is refused.
    pub fn open_for_replica(path: &Path, seed: [u8; 32]) -> Result<Self, PersistenceError> {
        let dir = Self::open_with(path, seed)?;
        if dir.seed != seed {
            return Err(PersistenceError::Mismatch(format!(
                "the data directory {} belongs to another deployment (its hash seed is not the stream's): \
                 point --data-dir at an empty directory, or at this replica's own",
                path.display()
            )));
        }
        if !wal::segments(path)?.is_empty() {
            return Err(PersistenceError::Mismatch(format!(
                "the data directory {} holds a single server's write-ahead log; a replica's log is the \
                 stream: point --data-dir at an empty directory (the single server's state is not carried \
                 over: add its keys through a replica, or rebuild)",
                path.display()
            )));
        }
        Ok(dir)
    }

    fn open_with(path: &Path, first_seed: [u8; 32]) -> Result<Self, PersistenceError> {
        std::fs::create_dir_all(path).map_err(|e| PersistenceError::io(path, "create", e))?;
        let lock_path = path.join("LOCK");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| PersistenceError::io(&lock_path, "open", e))?;
        lock.try_lock()
            .map_err(|_| PersistenceError::Locked(path.to_path_buf()))?;
        remove_temporary_files(path)?;
        Ok(Self {
            seed: identity(path, first_seed)?,
            path: path.to_path_buf(),
            _lock: lock,
        })
    }

    /// The deployment's hash seed.
    pub fn seed(&self) -> [u8; 32] {
        self.seed
    }

    /// The fingerprint of the seed that log segment headers carry.
    pub fn seed_fingerprint(&self) -> u64 {
        wal::seed_fingerprint(&self.seed)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Removes what a write that never finished left behind (`*.tmp`: a snapshot or identity cut short by a
/// crash or a full disk). Nothing reads them, and each holds space the log may need.
fn remove_temporary_files(dir: &Path) -> Result<(), PersistenceError> {
    for entry in std::fs::read_dir(dir)
        .map_err(|e| PersistenceError::io(dir, "list", e))?
        .flatten()
    {
        if entry.file_name().to_string_lossy().ends_with(".tmp") {
            let path = entry.path();
            tracing::warn!(file = %path.display(), "removing a file an unfinished write left behind");
            std::fs::remove_file(&path).map_err(|e| PersistenceError::io(&path, "remove", e))?;
        }
    }
    Ok(())
}

/// The least free space a snapshot leaves the log, and the most it asks for: see [`log_reserve`].
const MIN_LOG_RESERVE_BYTES: u64 = 16 << 20;
const MAX_LOG_RESERVE_BYTES: u64 = 2 * wal::SEGMENT_BYTES;

/// Free space a snapshot of `snapshot` bytes leaves for the log, so that writes go on while it is written
/// and until its covered segments are removed: a quarter of its size (the log writes while the snapshot
/// is written, both at disk speed), at least 16 MiB, at most two segments (128 MiB). It scales, so a small
/// volume still snapshots a small state. Should the log outgrow it anyway, a full disk only holds writes
/// back (`UNAVAILABLE`) until the snapshot removes the segments it covers; nothing is lost.
fn log_reserve(snapshot: u64) -> u64 {
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

/// What recovery did, for the startup log.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovered {
    /// The snapshot loaded, if any.
    pub snapshot: Option<PathBuf>,
    /// Log records replayed (including ones the snapshot already covered).
    pub records: u64,
    /// Log bytes read.
    pub log_bytes: u64,
    /// A torn tail that was truncated.
    pub truncated: Option<(PathBuf, u64)>,
    /// How long it took.
    pub elapsed: Duration,
}

/// Loads the newest snapshot and replays the log after it into `gate`; returns the write-ahead log to
/// append to from now on.
pub fn recover(
    dir: &DataDir,
    gate: &Gate,
    mode: SyncMode,
) -> Result<(Wal, Recovered), PersistenceError> {
    recover_with_files(dir, gate, mode, Arc::new(RealFiles))
}

/// [`recover`], with new log segments created through `files` (a test's [faulty files](segment_file)).
pub fn recover_with_files(
    dir: &DataDir,
    gate: &Gate,
    mode: SyncMode,
    files: Arc<dyn SegmentFiles>,
) -> Result<(Wal, Recovered), PersistenceError> {
    let started = Instant::now();
    let mut covered = 0;
    let mut loaded = None;
    if let Some((number, path)) = snapshot::newest(dir.path())? {
        let image = snapshot::read(&path)?;
        if image.seed != dir.seed() {
            return Err(PersistenceError::Mismatch(format!(
                "{} was written with another hash seed than {}/identity: the two files come from different \
                 deployments; restore them together",
                path.display(),
                dir.path().display()
            )));
        }
        if image.hash_check != gate.hash_check() {
            return Err(PersistenceError::Mismatch(format!(
                "{} was written by a build whose key hash functions differ from this one's: its filter bits \
                 would answer for the wrong keys. Run the build that wrote it, or start with an empty data \
                 directory and rebuild the namespaces with Admin Rebuild",
                path.display()
            )));
        }
        for namespace in image.namespaces {
            snapshot::restore(gate, namespace).map_err(|problem| {
                PersistenceError::Mismatch(format!("{}: {problem}", path.display()))
            })?;
        }
        covered = number.max(image.covered);
        loaded = Some(path);
    }
    let fingerprint = dir.seed_fingerprint();
    let replayed = wal::replay(dir.path(), covered, fingerprint, |mutation| {
        gate.replay_one(mutation)
    })?;
    let next_segment = replayed.last_segment.max(covered) + 1;
    let wal = Wal::create(dir.path(), next_segment, mode, fingerprint, files)?;
    Ok((
        wal,
        Recovered {
            snapshot: loaded,
            records: replayed.records,
            log_bytes: replayed.bytes,
            truncated: replayed.truncated,
            elapsed: started.elapsed(),
        },
    ))
}

/// The durable side of a running server: its write-ahead log and what takes its snapshots.
#[derive(Debug)]
pub struct Persistence {
    /// The write-ahead log.
    pub wal: Arc<Wal>,
    /// Takes snapshots.
    pub snapshots: Arc<Snapshotter>,
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
            at_ms: gate.now_ms(),
        };
        tracing::info!(path = %taken.path.display(), bytes = taken.bytes, elapsed = ?taken.elapsed, "snapshot published");
        *last = Some(taken.clone());
        Ok(taken)
    }
}

pub(crate) fn remove_older_snapshots(dir: &Path, covered: u64) -> Result<(), PersistenceError> {
    for entry in std::fs::read_dir(dir)
        .map_err(|e| PersistenceError::io(dir, "list", e))?
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let older = name
            .strip_prefix("snapshot-")
            .and_then(|rest| rest.strip_suffix(".snap"))
            .and_then(|n| n.parse::<u64>().ok())
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

    #[test]
    fn opening_a_data_directory_removes_what_unfinished_writes_left() {
        let temp = tempfile::tempdir().unwrap();
        let leftover = temp.path().join("snapshot-00000000000000000003.snap.tmp");
        std::fs::write(&leftover, b"half a snapshot").unwrap();
        std::fs::write(temp.path().join("identity.tmp"), b"half an identity").unwrap();
        let dir = DataDir::open(temp.path()).unwrap();
        assert!(!leftover.exists());
        assert!(!temp.path().join("identity.tmp").exists());
        assert!(dir.path().join("identity").exists());
    }
}
