//! The file operations the write-ahead log performs, behind a seam, so that tests can make a write or an
//! fsync fail or stall and check what the log then promises: nothing unacknowledged reported as written, a
//! failed fsync refusing every later write, a slow disk never stalling reads.
//!
//! [`RealFiles`] is what the server uses; `storage::faulty_files::FaultyFiles` (built for tests and with
//! the `fault-points` feature only, never into a release binary) wraps it with switches a test flips.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// An open log segment.
pub trait SegmentFile: Send {
    /// Appends all of `bytes`.
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Makes everything written so far durable (`fdatasync`).
    fn sync_data(&mut self) -> io::Result<()>;
    /// Cuts the file to `len` bytes (what a write that failed part-way left behind).
    fn truncate(&mut self, len: u64) -> io::Result<()>;
    /// The open file's metadata (to tell whether its name still leads to it).
    fn metadata(&self) -> io::Result<std::fs::Metadata>;
}

/// Creates segment files.
pub trait SegmentFiles: std::fmt::Debug + Send + Sync + 'static {
    /// Creates `path`, which must not exist, for appending.
    fn create(&self, path: &Path) -> io::Result<Box<dyn SegmentFile>>;
}

impl SegmentFile for File {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        Write::write_all(self, bytes)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.set_len(len)
    }

    fn metadata(&self) -> io::Result<std::fs::Metadata> {
        File::metadata(self)
    }
}

/// The file system, as is.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFiles;

impl SegmentFiles for RealFiles {
    fn create(&self, path: &Path) -> io::Result<Box<dyn SegmentFile>> {
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(path)?;
        Ok(Box::new(file))
    }
}
