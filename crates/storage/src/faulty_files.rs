//! Segment files with faults a test switches on and off: the write-ahead log's [seam](super::segment_file)
//! made to fail or stall, so tests can check what the log then promises.
//!
//! Built for this crate's tests and with the `fault-points` feature (which the integration tests turn on
//! through the crate's dev-dependency on itself), never into a release binary.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::segment_file::{SegmentFile, SegmentFiles};

/// Real files with faults switched on and off by a test: failing writes, failing fsyncs (`ENOSPC`, `EIO`),
/// and fsyncs that stall until released. Every file it created obeys the switches of the moment.
#[derive(Debug, Default)]
pub struct FaultyFiles {
    faults: Arc<Faults>,
}

#[derive(Debug, Default)]
struct Faults {
    /// An errno that every write fails with; 0 = none.
    write_errno: AtomicU64,
    /// An errno that every fsync fails with; 0 = none.
    sync_errno: AtomicU64,
    /// Whether fsyncs wait for [`FaultyFiles::release_syncs`].
    stall_syncs: Mutex<bool>,
    released: Condvar,
    /// Fsyncs waiting on the stall now.
    stalled: AtomicU64,
    /// Fsyncs that succeeded.
    syncs: AtomicU64,
    /// Whether creating a file fails (with `ENOSPC`).
    fail_create: AtomicBool,
}

impl FaultyFiles {
    /// Files that behave until told otherwise.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Every write fails with `errno` (e.g. `libc`'s `ENOSPC` = 28, `EIO` = 5); 0 heals writes.
    pub fn fail_writes(&self, errno: i32) {
        self.faults
            .write_errno
            .store(errno as u64, Ordering::SeqCst);
    }

    /// Every fsync fails with `errno`; 0 heals fsyncs.
    pub fn fail_syncs(&self, errno: i32) {
        self.faults.sync_errno.store(errno as u64, Ordering::SeqCst);
    }

    /// Creating a segment fails with `ENOSPC` while `fail` holds.
    pub fn fail_creates(&self, fail: bool) {
        self.faults.fail_create.store(fail, Ordering::SeqCst);
    }

    /// Fsyncs block from now on until [`release_syncs`](Self::release_syncs).
    pub fn stall_syncs(&self) {
        *self
            .faults
            .stall_syncs
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = true;
    }

    /// Lets stalled and later fsyncs proceed.
    pub fn release_syncs(&self) {
        *self
            .faults
            .stall_syncs
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = false;
        self.faults.released.notify_all();
    }

    /// Fsyncs blocked by the stall now.
    pub fn stalled_syncs(&self) -> u64 {
        self.faults.stalled.load(Ordering::SeqCst)
    }

    /// Fsyncs that succeeded so far.
    pub fn syncs(&self) -> u64 {
        self.faults.syncs.load(Ordering::SeqCst)
    }
}

impl SegmentFiles for FaultyFiles {
    fn create(&self, path: &Path) -> io::Result<Box<dyn SegmentFile>> {
        if self.faults.fail_create.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(ENOSPC));
        }
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(path)?;
        Ok(Box::new(FaultyFile {
            file,
            faults: Arc::clone(&self.faults),
        }))
    }
}

/// `ENOSPC` on Linux.
const ENOSPC: i32 = 28;

struct FaultyFile {
    file: File,
    faults: Arc<Faults>,
}

fn injected(errno: &AtomicU64) -> io::Result<()> {
    match errno.load(Ordering::SeqCst) {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno as i32)),
    }
}

impl SegmentFile for FaultyFile {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.faults.write_errno.load(Ordering::SeqCst) != 0 {
            // Like a disk that fills mid-write: part of the bytes land before the error.
            Write::write_all(&mut self.file, &bytes[..bytes.len() / 2])?;
            return injected(&self.faults.write_errno);
        }
        Write::write_all(&mut self.file, bytes)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let mut stalled = self
            .faults
            .stall_syncs
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if *stalled {
            self.faults.stalled.fetch_add(1, Ordering::SeqCst);
            while *stalled {
                stalled = self
                    .faults
                    .released
                    .wait(stalled)
                    .unwrap_or_else(|e| e.into_inner());
            }
            self.faults.stalled.fetch_sub(1, Ordering::SeqCst);
        }
        drop(stalled);
        injected(&self.faults.sync_errno)?;
        self.file.sync_data()?;
        self.faults.syncs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn metadata(&self) -> io::Result<std::fs::Metadata> {
        self.file.metadata()
    }
}
