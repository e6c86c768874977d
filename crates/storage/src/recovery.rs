//! Restart: the newest snapshot loaded, the log after it replayed, the log opened for appending.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::gate::Gate;
use crate::segment_file::{RealFiles, SegmentFiles};
use crate::{snapshot, wal, DataDir, PersistenceError, Snapshotter, SyncMode, Wal};

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

/// [`recover`], with new log segments created through `files` (a test's [faulty files](crate::segment_file)).
pub fn recover_with_files(
    dir: &DataDir,
    gate: &Gate,
    mode: SyncMode,
    files: Arc<dyn SegmentFiles>,
) -> Result<(Wal, Recovered), PersistenceError> {
    // A slow load (a large snapshot), for the tests of what is answered meanwhile: `sleep(ms)`.
    fail::fail_point!("recovery-start");
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
