//! The group-commit writer: appends buffered in seq order, one leader writing (and fsyncing) for every
//! waiter, the segment rolled past its size, failures that poison the log and a full disk that is retried.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::core::log::{Committed, Log, LogError, Mutation, Ticket};
use crate::frame::{self};
use crate::segment_file::{SegmentFile, SegmentFiles};
use crate::{codec, sync_dir, PersistenceError};

use super::format::{segment_path, segments, SegmentHeader, LOG_FORMAT, SEGMENT_BYTES};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// After fsync.
    Always,
    /// After write; fsync every interval.
    Interval(Duration),
    /// After write; the OS syncs.
    Never,
}

/// Records appended but not yet written.
struct Pending {
    buffer: Vec<u8>,
    /// Tickets issued so far.
    appended: u64,
}

/// The open segment.
struct Segment {
    file: Box<dyn SegmentFile>,
    number: u64,
    bytes: u64,
    /// The open file's device and inode, read once: an open file keeps them, so each write's check that
    /// the name still leads here (see [`Wal::unlinked`]) needs only the name's.
    identity: (u64, u64),
}

/// A file's device and inode.
fn identity(metadata: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (metadata.dev(), metadata.ino())
}

/// `ENOSPC` on Linux.
const ENOSPC: i32 = 28;

/// Why a leader's write failed.
enum Failure {
    /// The disk is full: nothing of the write stayed in the file; its records wait in the buffer.
    NoSpace(std::io::Error),
    /// Anything else: the log refuses every further write.
    Poison(std::io::Error),
}

/// What one leader's write reached.
struct Written {
    /// Every ticket up to this is in the file.
    through: u64,
    /// Whether it was fsynced too.
    synced: bool,
    /// The segment the records went into (closed if the write rolled).
    segment: u64,
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
    maker: SegmentMaker,
    mode: SyncMode,
    // Lock order: `segment` before `pending` (a leader takes the buffer while it holds the segment);
    // `progress` before `no_space` and `waiters`; `progress` is never held while `segment` or `pending` is
    // taken (a leader drops it to write). No other lock is taken while holding `pending`, `no_space` or
    // `waiters`.
    /// Records appended and not yet handed to a leader. Innermost: taken after `segment`, or alone.
    pending: Mutex<Pending>,
    /// The open segment file. Outermost: taken first, never while holding another of these locks.
    segment: Mutex<Segment>,
    /// How far records got, and whether a leader is writing. Taken alone or before `no_space`; dropped
    /// before a leader takes `segment`.
    progress: Mutex<Progress>,
    progressed: Condvar,
    /// Set once a write or fsync failed; every later write is refused with it.
    failed: OnceLock<String>,
    /// Set while records wait for disk space (see the module doc); cleared by a successful retry.
    /// Innermost: taken alone or after `progress`.
    no_space: Mutex<Option<String>>,
    /// Bytes written since the last snapshot began, to trigger the next one.
    bytes_since_snapshot: AtomicU64,
    /// Writes waiting on a task ([`Log::committed`]), by ticket: the leader whose write reaches a ticket
    /// wakes its waiter, and only it. Innermost: taken alone or after `progress`.
    waiters: Mutex<BTreeMap<u64, oneshot::Sender<Result<(), String>>>>,
    /// The thread that leads the writes those waiters need ([`Wal::start_flusher`]); unparked by each of
    /// them.
    flusher: OnceLock<std::thread::Thread>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.maker.dir)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Creates segment files, each beginning with its header.
struct SegmentMaker {
    dir: PathBuf,
    files: Arc<dyn SegmentFiles>,
    header: SegmentHeader,
}

impl SegmentMaker {
    /// Creates segment `number` with its header written and fsynced, and makes its name durable.
    fn create(&self, number: u64) -> Result<Segment, PersistenceError> {
        let path = segment_path(&self.dir, number);
        let mut header = Vec::new();
        self.header.encode(&mut header);
        let mut file = self
            .files
            .create(&path)
            .map_err(|e| PersistenceError::io(&path, "create", e))?;
        file.write_all(&header)
            .and_then(|()| file.sync_data())
            .map_err(|e| PersistenceError::io(&path, "write the header of", e))?;
        sync_dir(&self.dir)?;
        let opened = file
            .metadata()
            .map_err(|e| PersistenceError::io(&path, "read the metadata of", e))?;
        Ok(Segment {
            file,
            number,
            bytes: header.len() as u64,
            identity: identity(&opened),
        })
    }
}

impl Wal {
    /// Starts appending to a new segment numbered `number` (after every existing one), in the deployment
    /// whose hash seed has `seed_fingerprint`, creating files through `files`.
    pub fn create(
        dir: &Path,
        number: u64,
        mode: SyncMode,
        seed_fingerprint: u64,
        files: Arc<dyn SegmentFiles>,
    ) -> Result<Self, PersistenceError> {
        let maker = SegmentMaker {
            dir: dir.to_path_buf(),
            files,
            header: SegmentHeader {
                format: LOG_FORMAT,
                seed_fingerprint,
            },
        };
        let segment = maker.create(number)?;
        Ok(Self {
            maker,
            mode,
            pending: Mutex::new(Pending {
                buffer: Vec::with_capacity(1 << 20),
                appended: 0,
            }),
            segment: Mutex::new(segment),
            progress: Mutex::new(Progress::default()),
            progressed: Condvar::new(),
            failed: OnceLock::new(),
            no_space: Mutex::new(None),
            bytes_since_snapshot: AtomicU64::new(0),
            waiters: Mutex::new(BTreeMap::new()),
            flusher: OnceLock::new(),
        })
    }

    /// Starts the thread that writes (and under `--sync always` fsyncs) for the writes that wait on a task
    /// ([`Log::committed`]); until it runs, the log [commits only on a thread](Log::commits_without_thread).
    /// It leads one write of every record pending whenever a waiter needs one — records appended during a
    /// write or fsync share the next, as group commit's waiters do — and ends once the log is dropped.
    pub fn start_flusher(wal: &Arc<Wal>) -> Result<(), PersistenceError> {
        let weak = Arc::downgrade(wal);
        let thread = std::thread::Builder::new()
            .name("wal-flusher".into())
            .spawn(move || flush_for_waiters(&weak))
            .map_err(|e| {
                PersistenceError::io(&wal.maker.dir, "start the log's flusher thread in", e)
            })?;
        let _ = wal.flusher.set(thread.thread().clone());
        Ok(())
    }

    /// How far records got that a commit waits for: fsynced under `always`, written otherwise.
    fn committed_through(&self, progress: &Progress) -> u64 {
        if self.mode == SyncMode::Always {
            progress.synced
        } else {
            progress.written
        }
    }

    /// Wakes the waiters a leader's write made durable (`Ok`), or every waiter with its failure: a write
    /// that failed leaves nothing a waiter could count on (under a full disk the records are retried later,
    /// unacknowledged, as [`flush`](Self::flush) tells the writers waiting on a thread).
    fn wake_waiters(&self, progress: &Progress, result: Result<(), &str>) {
        let woken = {
            let mut waiters = lock(&self.waiters);
            match result {
                Ok(()) => {
                    let later = waiters.split_off(&(self.committed_through(progress) + 1));
                    std::mem::replace(&mut *waiters, later)
                }
                Err(_) => std::mem::take(&mut *waiters),
            }
        };
        for (_, waiter) in woken {
            let _ = waiter.send(result.map_err(str::to_string));
        }
    }

    /// One round of the flusher: leads writes until no waiter waits (see
    /// [`start_flusher`](Self::start_flusher)).
    fn lead_for_waiters(&self) {
        loop {
            let Some(through) = lock(&self.waiters).keys().next_back().copied() else {
                return;
            };
            if let Err(e) = self.flush(through, self.mode == SyncMode::Always) {
                // Refused before any write (a failed log, a full disk): its waiters are told here.
                let progress = lock(&self.progress);
                self.wake_waiters(&progress, Err(&e.0.to_string()));
            }
        }
    }

    /// The durability mode.
    pub fn mode(&self) -> SyncMode {
        self.mode
    }

    /// Tickets issued so far (for tests that wait until writers have appended).
    #[cfg(test)]
    pub(super) fn appended(&self) -> u64 {
        lock(&self.pending).appended
    }

    /// Bytes written since the last snapshot began.
    pub fn bytes_since_snapshot(&self) -> u64 {
        self.bytes_since_snapshot.load(Ordering::Relaxed)
    }

    fn check_failed(&self) -> Result<(), LogError> {
        match self.failed.get() {
            Some(reason) => Err(LogError(std::io::Error::other(format!(
                "the write-ahead log failed earlier: {reason}"
            )))),
            None => Ok(()),
        }
    }

    /// Writes every pending record to the segment, fsyncing if asked, and starts the next segment when the
    /// current one is full or `roll` asks for it. Called by one leader at a time.
    ///
    /// The buffer and the ticket it reaches are taken under one lock, while the segment lock is held: a
    /// record appended a moment later is either in this buffer or left for the next leader, never counted as
    /// written without being written.
    fn write_pending(&self, fsync: bool, roll: bool) -> Result<Written, Failure> {
        let mut segment = lock(&self.segment);
        let (buffer, through) = {
            let mut pending = lock(&self.pending);
            let buffer = std::mem::replace(&mut pending.buffer, Vec::with_capacity(1 << 20));
            (buffer, pending.appended)
        };
        let wrote = !buffer.is_empty();
        if wrote {
            if let Err(error) = segment.file.write_all(&buffer) {
                return Err(self.unwrite(&mut segment, buffer, error));
            }
            segment.bytes += buffer.len() as u64;
            self.bytes_since_snapshot
                .fetch_add(buffer.len() as u64, Ordering::Relaxed);
        }
        let written = Written {
            through,
            synced: fsync || roll || segment.bytes >= SEGMENT_BYTES,
            segment: segment.number,
        };
        if written.synced {
            segment.file.sync_data().map_err(Failure::Poison)?;
        }
        // Before anything written is acknowledged: the records must be in the file a restart reads (one
        // stat call per write of a whole group of records).
        if wrote {
            if let Some(reason) = self.unlinked(&segment) {
                return Err(Failure::Poison(std::io::Error::other(reason)));
            }
        }
        if roll || segment.bytes >= SEGMENT_BYTES {
            *segment = self
                .maker
                .create(segment.number + 1)
                .map_err(|e| Failure::Poison(std::io::Error::other(e.to_string())))?;
        }
        Ok(written)
    }

    /// Undoes a write that failed: on a full disk, cuts what part of it landed back out of the file and
    /// puts its records back at the front of the buffer, to be retried; any other failure poisons.
    fn unwrite(&self, segment: &mut Segment, buffer: Vec<u8>, error: std::io::Error) -> Failure {
        let disk_full = error.raw_os_error() == Some(ENOSPC);
        if !disk_full {
            return Failure::Poison(error);
        }
        if let Err(truncate) = segment.file.truncate(segment.bytes) {
            return Failure::Poison(std::io::Error::other(format!(
                "{error}, and cutting the partial write back out failed: {truncate}"
            )));
        }
        let mut pending = lock(&self.pending);
        let newer = std::mem::replace(&mut pending.buffer, buffer);
        pending.buffer.extend_from_slice(&newer);
        Failure::NoSpace(error)
    }

    /// Leads one write of everything pending (see [`write_pending`](Self::write_pending)); the caller has
    /// checked that nobody else leads. Records how far records got and wakes every waiter. A failed write or
    /// fsync poisons the log: after a failed fsync the kernel may have dropped the dirty pages, so the
    /// file's content is unknown and retrying the fsync could report success for data that is gone.
    fn lead<'a>(
        &'a self,
        mut progress: MutexGuard<'a, Progress>,
        fsync: bool,
        roll: bool,
    ) -> (MutexGuard<'a, Progress>, std::io::Result<Written>) {
        progress.leading = true;
        drop(progress);
        let result = self.write_pending(fsync, roll);
        let mut progress = lock(&self.progress);
        progress.leading = false;
        let result = match result {
            Ok(written) => {
                progress.written = progress.written.max(written.through);
                if written.synced {
                    progress.synced = progress.synced.max(written.through);
                }
                *lock(&self.no_space) = None;
                self.wake_waiters(&progress, Ok(()));
                Ok(written)
            }
            Err(Failure::NoSpace(error)) => {
                tracing::error!(%error, "write-ahead log is out of disk space; writes are refused until space returns");
                *lock(&self.no_space) = Some(error.to_string());
                self.wake_waiters(
                    &progress,
                    Err(&format!(
                        "the write-ahead log is out of disk space ({error}); writes resume once space is \
                         freed in {}",
                        self.maker.dir.display()
                    )),
                );
                Err(error)
            }
            Err(Failure::Poison(error)) => {
                tracing::error!(%error, "write-ahead log write failed; refusing further writes");
                let _ = self.failed.set(format!(
                    "{error}; restart the server to recover from the log (everything acknowledged is in it)"
                ));
                self.wake_waiters(
                    &progress,
                    Err(&format!("the write-ahead log failed: {error}")),
                );
                Err(error)
            }
        };
        self.progressed.notify_all();
        (progress, result)
    }

    /// Refuses while records wait for disk space.
    fn check_space(&self) -> Result<(), LogError> {
        match &*lock(&self.no_space) {
            Some(reason) => Err(LogError(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "the write-ahead log is out of disk space ({reason}); writes resume once space is \
                     freed in {}",
                    self.maker.dir.display()
                ),
            ))),
            None => Ok(()),
        }
    }

    /// Tries again to write records that a full disk held back; returns whether writes are accepted now.
    /// The server calls it every second.
    pub fn retry_writes(&self) -> bool {
        if lock(&self.no_space).is_none() {
            return self.check_failed().is_ok();
        }
        let Ok(progress) = self.await_leadership() else {
            return false;
        };
        let (_progress, result) = self.lead(progress, true, false);
        if result.is_ok() {
            tracing::info!("disk space is back: the write-ahead log accepts writes again");
        }
        result.is_ok()
    }

    /// Poisons the log if its open segment's name no longer leads to it (the file or the whole data
    /// directory was deleted or replaced under the server): writes would go to a file no restart reads.
    /// Every write checks this too (see [`write_pending`](Self::write_pending)); this periodic check makes
    /// an idle server's readiness say so.
    pub fn check_segment_linked(&self) {
        let segment = lock(&self.segment);
        if let Some(reason) = self.unlinked(&segment) {
            tracing::error!("{reason}; refusing further writes");
            let _ = self.failed.set(reason);
        }
    }

    /// Why `segment`'s name no longer leads to it, if it does not.
    fn unlinked(&self, segment: &Segment) -> Option<String> {
        let path = segment_path(&self.maker.dir, segment.number);
        let same = std::fs::metadata(&path).is_ok_and(|named| identity(&named) == segment.identity);
        (!same).then(|| {
            format!(
                "{} was removed or replaced under the running server (was the data directory deleted?); \
                 writes would reach no file a restart reads. If the data directory {} is gone, so is the \
                 state: a restart on it would start empty and answer ABSENT for every key added so far. \
                 Restore the directory from a backup before restarting, or restart and add every key again \
                 (`existence-gate load`, or Admin.Rebuild from the source); `serve --require-existing-data` \
                 refuses to start on an empty directory",
                path.display(),
                self.maker.dir.display()
            )
        })
    }

    /// Waits until no leader is writing (or the log failed).
    fn await_leadership(&self) -> Result<MutexGuard<'_, Progress>, LogError> {
        let mut progress = lock(&self.progress);
        loop {
            self.check_failed()?;
            if !progress.leading {
                return Ok(progress);
            }
            progress = self
                .progressed
                .wait(progress)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits until `ticket` is written (and fsynced if `fsync`), leading the write if nobody else is.
    fn flush(&self, ticket: u64, fsync: bool) -> Result<(), LogError> {
        loop {
            let progress = self.await_leadership()?;
            let reached = if fsync {
                progress.synced
            } else {
                progress.written
            };
            if reached >= ticket {
                return Ok(());
            }
            self.check_space()?;
            drop(self.lead(progress, fsync, false));
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
        let roll_error =
            |e: std::io::Error| PersistenceError::io(&self.maker.dir, "roll the log", e);
        let progress = self.await_leadership().map_err(|e| roll_error(e.0))?;
        let (_progress, result) = self.lead(progress, true, true);
        let written = result.map_err(roll_error)?;
        self.bytes_since_snapshot.store(0, Ordering::Relaxed);
        Ok(written.segment)
    }

    /// Deletes every segment numbered at most `number` (covered by a published snapshot).
    pub fn remove_through(&self, number: u64) -> Result<usize, PersistenceError> {
        let mut removed = 0;
        let dir = &self.maker.dir;
        for old in segments(dir)?.into_iter().filter(|n| *n <= number) {
            let path = segment_path(dir, old);
            std::fs::remove_file(&path).map_err(|e| PersistenceError::io(&path, "remove", e))?;
            removed += 1;
        }
        sync_dir(dir)?;
        Ok(removed)
    }
}

impl Log for Wal {
    fn append(&self, mutation: &Mutation) -> Result<Ticket, LogError> {
        self.check_failed()?;
        self.check_space()?;
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

    fn commits_without_thread(&self) -> bool {
        self.flusher.get().is_some()
    }

    /// Registers the wait and unparks the flusher; the leader whose write reaches `ticket` wakes it.
    /// Checked and registered under `progress`, which every leader holds while it wakes waiters: a write
    /// that lands in between is either seen here or wakes this waiter.
    fn committed(&self, ticket: Ticket) -> Committed {
        if let Err(e) = self.check_failed() {
            return Box::pin(std::future::ready(Err(e)));
        }
        let (waiter, woken) = oneshot::channel();
        {
            let progress = lock(&self.progress);
            if self.committed_through(&progress) >= ticket.0 {
                return Box::pin(std::future::ready(Ok(())));
            }
            lock(&self.waiters).insert(ticket.0, waiter);
        }
        if let Some(flusher) = self.flusher.get() {
            flusher.unpark();
        }
        Box::pin(async move {
            match woken.await {
                Ok(result) => result.map_err(|e| LogError(std::io::Error::other(e))),
                Err(_) => Err(LogError(std::io::Error::other(
                    "the write-ahead log closed before the write was durable",
                ))),
            }
        })
    }

    /// The log failed for good, or waits for disk space.
    fn write_failure(&self) -> Option<String> {
        self.check_failed()
            .and_then(|()| self.check_space())
            .err()
            .map(|e| e.0.to_string())
    }
}

/// The flusher thread's loop ([`Wal::start_flusher`]): parked until a waiter unparks it, and looking once a
/// second whether the log is gone.
fn flush_for_waiters(wal: &Weak<Wal>) {
    loop {
        std::thread::park_timeout(Duration::from_secs(1));
        let Some(wal) = wal.upgrade() else {
            return;
        };
        wal.lead_for_waiters();
    }
}
