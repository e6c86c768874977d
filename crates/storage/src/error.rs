//! Why the data directory cannot be used: each error names the file, what was being done, and the remedy.

use std::path::{Path, PathBuf};

use crate::snapshotter::log_reserve;

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
