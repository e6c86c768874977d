//! Storage: the data directory, its write-ahead log, its snapshots, and recovery. It implements the core's
//! [`Log`](crate::core::log::Log) and encodes its state; it knows nothing of the service. A crate of its own
//! (`crates/storage`), depending on the core alone: that it reaches no layer above is a compile error.
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
//!
//! The files: `error.rs`, `data_dir.rs` (lock, identity, fsyncs), `recovery.rs` (restart), `snapshotter.rs`
//! (snapshots of a running gate), and beside them the formats: `wal/` (the log), `snapshot.rs`, `frame.rs`,
//! `codec.rs`, `segment_file.rs` (and, for tests and the `fault-points` feature, `faulty_files.rs`).

/// A fault point where state is written (docs/development.md, "Fault points"): with the `fault-points`
/// feature and `FAILPOINTS=NAME=return` in the process's environment, the enclosing function returns the
/// [`PersistenceError::Io`] a failed `ACTION` on `PATH` would; otherwise (and in every release build) nothing.
macro_rules! io_fault_point {
    ($name:literal, $path:expr, $action:literal) => {
        fail::fail_point!($name, |_| Err($crate::PersistenceError::io(
            $path,
            $action,
            std::io::Error::other(concat!("injected by fault point ", $name)),
        )))
    };
}

/// The core this crate stores, under the name the rest of the tree uses for it.
use existence_gate_core as core;

pub mod codec;
mod data_dir;
mod error;
#[cfg(any(test, feature = "fault-points"))]
pub mod faulty_files;
pub mod frame;
mod recovery;
pub mod segment_file;
pub mod snapshot;
mod snapshotter;
pub mod wal;

pub use data_dir::{sync_dir, DataDir};
pub use error::PersistenceError;
pub use recovery::{recover, recover_with_files, Persistence, Recovered};
pub use snapshotter::remove_older_snapshots;
pub use snapshotter::{SnapshotTaken, Snapshotter};
pub use wal::{SyncMode, Wal};
