//! The write-ahead log: every mutation, framed and checksummed, in numbered segment files
//! (`wal-00000000000000000001.log`, ...), appended in the order the gate applies them.
//!
//! # Group commit
//!
//! `append` only encodes the mutation into an in-memory buffer (under a short lock, in seq order). `commit`
//! then waits for the buffer to reach the file: the first waiter becomes the leader, writes everything
//! buffered so far with one `write` and — with `--sync always` — one `fdatasync`, and wakes every waiter its
//! write covered. Concurrent callers therefore share one fsync; while the leader syncs, new appends collect
//! in the buffer for the next round.
//!
//! # Durability modes
//!
//! - `always`: a call is answered only after its record is fsynced. Nothing acknowledged is lost.
//! - `interval`: records are written before the answer and fsynced every `--sync-interval`: a machine crash
//!   loses at most that interval of acknowledged mutations (a process crash loses nothing: the OS has them).
//! - `never`: records are written before the answer; the OS decides when they reach the disk.
//!
//! An fsync that fails leaves the file's state unknown (the kernel may have dropped the dirty pages), so the
//! log then refuses every further write: the gate answers `UNAVAILABLE` instead of acknowledging mutations it
//! may not keep.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use super::frame::{self, Next};
use super::{codec, sync_dir, PersistenceError};
use crate::log::{Log, LogError, Mutation, Ticket};

/// A segment is closed and a new one begun past this size, so no single file grows without bound.
const SEGMENT_BYTES: u64 = 64 << 20;

/// When a record is acknowledged relative to reaching the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// After fsync.
    Always,
    /// After write; fsync every interval.
    Interval(Duration),
    /// After write; the OS syncs.
    Never,
}

/// The path of segment `number` in `dir`.
pub fn segment_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("wal-{number:020}.log"))
}

/// The segment numbers present in `dir`, ascending.
pub fn segments(dir: &Path) -> Result<Vec<u64>, PersistenceError> {
    let mut numbers: Vec<u64> = std::fs::read_dir(dir)
        .map_err(|e| PersistenceError::io(dir, "list", e))?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            name.strip_prefix("wal-")?
                .strip_suffix(".log")?
                .parse()
                .ok()
        })
        .collect();
    numbers.sort_unstable();
    Ok(numbers)
}

/// What replaying the log found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// Records read.
    pub records: u64,
    /// Bytes read.
    pub bytes: u64,
    /// The last segment number seen (0 if none).
    pub last_segment: u64,
    /// A torn tail that was truncated: `(file, offset)`.
    pub truncated: Option<(PathBuf, u64)>,
}

/// Feeds every record of the segments after `after_segment` to `apply`, in order. A damaged record at the
/// very end of the last segment (a crash mid-write) is truncated away with a warning; any other damage is an
/// error naming the file and offset.
pub fn replay(
    dir: &Path,
    after_segment: u64,
    mut apply: impl FnMut(Mutation) -> Result<(), String>,
) -> Result<Replayed, PersistenceError> {
    let numbers: Vec<u64> = segments(dir)?
        .into_iter()
        .filter(|n| *n > after_segment)
        .collect();
    let mut replayed = Replayed {
        last_segment: numbers.last().copied().unwrap_or(after_segment),
        ..Replayed::default()
    };
    for (index, number) in numbers.iter().enumerate() {
        let path = segment_path(dir, *number);
        let file = File::open(&path).map_err(|e| PersistenceError::io(&path, "open", e))?;
        let len = file
            .metadata()
            .map_err(|e| PersistenceError::io(&path, "stat", e))?
            .len();
        let mut reader = frame::Reader::new(BufReader::with_capacity(1 << 20, file), len);
        let is_last = index + 1 == numbers.len();
        loop {
            match reader
                .next_frame()
                .map_err(|e| PersistenceError::io(&path, "read", e))?
            {
                Next::End => break,
                Next::Frame(offset, payload) => {
                    let mutation =
                        codec::decode(payload).map_err(|malformed| PersistenceError::Corrupt {
                            file: path.clone(),
                            offset,
                            problem: format!("a log record does not decode: {}", malformed.0),
                        })?;
                    apply(mutation).map_err(|problem| PersistenceError::Corrupt {
                        file: path.clone(),
                        offset,
                        problem,
                    })?;
                    replayed.records += 1;
                }
                Next::Damaged(damage)
                    if is_last
                        && damage.reaches_end
                        && !valid_frame_after(&path, damage.offset)? =>
                {
                    tracing::warn!(
                        file = %path.display(),
                        offset = damage.offset,
                        reason = %damage.reason,
                        "torn record at the end of the log (a crash mid-write): truncating it"
                    );
                    truncate(&path, damage.offset)?;
                    replayed.truncated = Some((path.clone(), damage.offset));
                    break;
                }
                Next::Damaged(damage) => {
                    return Err(PersistenceError::Corrupt {
                        file: path,
                        offset: damage.offset,
                        problem: format!("damaged log record: {}", damage.reason),
                    })
                }
            }
        }
        replayed.bytes += reader.offset();
    }
    Ok(replayed)
}

/// Whether a valid frame starts anywhere after `offset` in `path` (then the damage is not a torn tail).
fn valid_frame_after(path: &Path, offset: u64) -> Result<bool, PersistenceError> {
    let bytes = std::fs::read(path).map_err(|e| PersistenceError::io(path, "read", e))?;
    Ok(frame::contains_valid_frame(
        &bytes[(offset as usize + 1).min(bytes.len())..],
    ))
}

fn truncate(path: &Path, len: u64) -> Result<(), PersistenceError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| PersistenceError::io(path, "open", e))?;
    file.set_len(len)
        .and_then(|()| file.sync_all())
        .map_err(|e| PersistenceError::io(path, "truncate", e))
}

/// Records appended but not yet written.
struct Pending {
    buffer: Vec<u8>,
    /// Tickets issued so far.
    appended: u64,
}

/// The open segment.
struct Segment {
    file: File,
    number: u64,
    bytes: u64,
}

/// How far records have got.
#[derive(Default)]
struct Progress {
    /// Every ticket up to this has been written to the file.
    written: u64,
    /// Every ticket up to this has been fsynced.
    synced: u64,
    /// Whether a leader is writing now.
    leading: bool,
}

/// The write-ahead log of a data directory.
pub struct Wal {
    dir: PathBuf,
    mode: SyncMode,
    pending: Mutex<Pending>,
    segment: Mutex<Segment>,
    progress: Mutex<Progress>,
    progressed: Condvar,
    /// Set once a write or fsync failed; every later write is refused with it.
    failed: OnceLock<String>,
    /// Bytes written since the last snapshot began, to trigger the next one.
    bytes_since_snapshot: AtomicU64,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.dir)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn create_segment(dir: &Path, number: u64) -> Result<File, PersistenceError> {
    let path = segment_path(dir, number);
    let file = OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(&path)
        .map_err(|e| PersistenceError::io(&path, "create", e))?;
    sync_dir(dir)?;
    Ok(file)
}

impl Wal {
    /// Starts appending to a new segment numbered `number` (after every existing one).
    pub fn create(dir: &Path, number: u64, mode: SyncMode) -> Result<Self, PersistenceError> {
        let file = create_segment(dir, number)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            mode,
            pending: Mutex::new(Pending {
                buffer: Vec::with_capacity(1 << 20),
                appended: 0,
            }),
            segment: Mutex::new(Segment {
                file,
                number,
                bytes: 0,
            }),
            progress: Mutex::new(Progress::default()),
            progressed: Condvar::new(),
            failed: OnceLock::new(),
            bytes_since_snapshot: AtomicU64::new(0),
        })
    }

    /// The durability mode.
    pub fn mode(&self) -> SyncMode {
        self.mode
    }

    /// Bytes written since the last snapshot began.
    pub fn bytes_since_snapshot(&self) -> u64 {
        self.bytes_since_snapshot.load(Ordering::Relaxed)
    }

    fn check_failed(&self) -> Result<(), LogError> {
        match self.failed.get() {
            Some(reason) => Err(LogError(std::io::Error::other(format!(
                "the write-ahead log failed earlier ({reason}); restart the server to recover from the log"
            )))),
            None => Ok(()),
        }
    }

    /// Writes every pending record to the segment (rolling to a new segment when full), fsyncing if asked.
    /// Returns the ticket written through. Called by one leader at a time.
    fn write_pending(&self, fsync: bool) -> std::io::Result<u64> {
        let mut segment = lock(&self.segment);
        let (buffer, through) = {
            let mut pending = lock(&self.pending);
            let buffer = std::mem::replace(&mut pending.buffer, Vec::with_capacity(1 << 20));
            (buffer, pending.appended)
        };
        if !buffer.is_empty() {
            segment.file.write_all(&buffer)?;
            segment.bytes += buffer.len() as u64;
            self.bytes_since_snapshot
                .fetch_add(buffer.len() as u64, Ordering::Relaxed);
        }
        if fsync {
            segment.file.sync_data()?;
        }
        if segment.bytes >= SEGMENT_BYTES {
            segment.file.sync_data()?;
            let next = segment.number + 1;
            segment.file = create_segment(&self.dir, next)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            segment.number = next;
            segment.bytes = 0;
        }
        Ok(through)
    }

    /// Waits until `ticket` is written (and fsynced if `fsync`), leading the write if nobody else is.
    fn flush(&self, ticket: u64, fsync: bool) -> Result<(), LogError> {
        let mut progress = lock(&self.progress);
        loop {
            self.check_failed()?;
            let reached = if fsync {
                progress.synced
            } else {
                progress.written
            };
            if reached >= ticket {
                return Ok(());
            }
            if progress.leading {
                progress = self
                    .progressed
                    .wait(progress)
                    .unwrap_or_else(|e| e.into_inner());
                continue;
            }
            progress.leading = true;
            drop(progress);
            let result = self.write_pending(fsync);
            progress = lock(&self.progress);
            progress.leading = false;
            match result {
                Ok(through) => {
                    progress.written = progress.written.max(through);
                    if fsync {
                        progress.synced = progress.synced.max(through);
                    }
                }
                Err(error) => {
                    tracing::error!(%error, "write-ahead log write failed; refusing further writes");
                    let _ = self.failed.set(error.to_string());
                }
            }
            self.progressed.notify_all();
        }
    }

    /// Writes and fsyncs everything appended so far (the interval syncer, snapshots and shutdown call this).
    pub fn sync_now(&self) -> Result<(), LogError> {
        let through = lock(&self.pending).appended;
        self.flush(through, true)
    }

    /// Closes the current segment (fsynced) and starts the next; returns the number of the closed one. Every
    /// record appended before this call is in a segment numbered at most that.
    pub fn roll(&self) -> Result<u64, PersistenceError> {
        self.sync_now()
            .map_err(|e| PersistenceError::io(&self.dir, "sync the log", e.0))?;
        let mut segment = lock(&self.segment);
        // Records appended after sync_now but before this lock go to the old segment: flush them too.
        let buffer = std::mem::take(&mut lock(&self.pending).buffer);
        let closed = segment.number;
        let path = segment_path(&self.dir, closed);
        segment
            .file
            .write_all(&buffer)
            .and_then(|()| segment.file.sync_data())
            .map_err(|e| PersistenceError::io(&path, "write", e))?;
        let through = lock(&self.pending).appended;
        segment.file = create_segment(&self.dir, closed + 1)?;
        segment.number = closed + 1;
        segment.bytes = 0;
        drop(segment);
        let mut progress = lock(&self.progress);
        progress.written = progress.written.max(through);
        progress.synced = progress.synced.max(through);
        self.progressed.notify_all();
        self.bytes_since_snapshot.store(0, Ordering::Relaxed);
        Ok(closed)
    }

    /// Deletes every segment numbered at most `number` (covered by a published snapshot).
    pub fn remove_through(&self, number: u64) -> Result<usize, PersistenceError> {
        let mut removed = 0;
        for old in segments(&self.dir)?.into_iter().filter(|n| *n <= number) {
            let path = segment_path(&self.dir, old);
            std::fs::remove_file(&path).map_err(|e| PersistenceError::io(&path, "remove", e))?;
            removed += 1;
        }
        sync_dir(&self.dir)?;
        Ok(removed)
    }
}

impl Log for Wal {
    fn append(&self, mutation: &Mutation) -> Result<Ticket, LogError> {
        self.check_failed()?;
        let mut payload = Vec::with_capacity(64);
        codec::encode(mutation, &mut payload);
        let mut pending = lock(&self.pending);
        frame::encode(&payload, &mut pending.buffer);
        pending.appended += 1;
        Ok(Ticket(pending.appended))
    }

    fn commit(&self, ticket: Ticket) -> Result<(), LogError> {
        self.flush(ticket.0, self.mode == SyncMode::Always)
    }
}
