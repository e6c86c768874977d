//! The data directory itself: its lock, its identity (the deployment's hash seed, chosen at first start),
//! directory fsyncs, and what unfinished writes left behind.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::core::hashing::KeyHasher;
use crate::{frame, wal, PersistenceError};

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
            io_fault_point!("identity-write", &temp, "write");
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

    /// Whether `path` is a data directory some server has started on (it holds an identity).
    pub fn holds_state(path: &Path) -> bool {
        path.join("identity").is_file()
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

#[cfg(test)]
mod tests {
    use super::*;

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
