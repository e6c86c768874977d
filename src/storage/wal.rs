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
//! # Failures
//!
//! An fsync that fails leaves the file's state unknown: Linux may have dropped the dirty pages and marked
//! them clean, so a retried fsync can report success for data that never reached the disk. A failed fsync,
//! an I/O error on write, a failed segment creation, or a segment whose name no longer leads to the open
//! file (the data directory deleted under the server) therefore *poison* the log: it refuses every further
//! write, the gate answers `UNAVAILABLE` instead of acknowledging mutations it may not keep, and only a
//! restart (which replays what is on disk) recovers.
//!
//! A full disk is the one failure that is retried: a `write` that fails with `ENOSPC` is cut back out of
//! the file (so no partial record stays), its records go back to the front of the buffer, and until a retry
//! ([`Wal::retry_writes`], which the server calls every second) gets them into the file, every commit and
//! new append is refused with a message that says so. Nothing was fsynced, so nothing is in doubt.

use std::fs::{File, OpenOptions};
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use super::frame::{self, Next};
use super::segment_file::{SegmentFile, SegmentFiles};
use super::{codec, sync_dir, PersistenceError};
use crate::core::log::{Log, LogError, Mutation, Ticket};

/// A segment is closed and a new one begun past this size, so no single file grows without bound.
pub const SEGMENT_BYTES: u64 = 64 << 20;

/// The log format this build writes. Format 1 segments had no header and counted each namespace's seqs from
/// 0; format 2 segments begin with a [header](SegmentHeader) and count from 1 (see
/// [`crate::core::log::GENESIS_SEQ`]); format 3 records carry a `RecordAbsent`'s `observed_seq` (a new
/// record type, see [`super::codec`]), which an older build would take for damage. All three are read.
pub const LOG_FORMAT: u32 = 3;

/// The first frame of every segment since format 2: this magic, then `u32 format`, `u64 seed fingerprint`.
/// No record can start with it (a record's first byte is its kind, 1 to 3).
const SEGMENT_MAGIC: &[u8; 8] = b"EXGWALHD";

/// What a segment's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The format its records are in.
    pub format: u32,
    /// [`seed_fingerprint`] of the deployment that wrote it.
    pub seed_fingerprint: u64,
}

impl SegmentHeader {
    fn encode(&self, out: &mut Vec<u8>) {
        let mut payload = SEGMENT_MAGIC.to_vec();
        payload.extend_from_slice(&self.format.to_le_bytes());
        payload.extend_from_slice(&self.seed_fingerprint.to_le_bytes());
        frame::encode(&payload, out);
    }

    /// The header a first frame's `payload` holds: `Ok(None)` if it is a format-1 record instead.
    fn decode(payload: &[u8]) -> Result<Option<Self>, HeaderError> {
        let Some(rest) = payload.strip_prefix(SEGMENT_MAGIC) else {
            return Ok(None);
        };
        let format = rest
            .get(..4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .ok_or_else(|| HeaderError::Malformed("a segment header is cut short".to_string()))?;
        if format > LOG_FORMAT {
            return Err(HeaderError::Newer(format));
        }
        match rest[4..].try_into() {
            Ok(fingerprint) if format >= 2 => Ok(Some(Self {
                format,
                seed_fingerprint: u64::from_le_bytes(fingerprint),
            })),
            _ => Err(HeaderError::Malformed(format!(
                "a segment header of format {format} has {} bytes",
                payload.len()
            ))),
        }
    }
}

/// Why a segment header cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HeaderError {
    /// Written by a newer build, in this log format: not damage, and the remedy is that build.
    Newer(u32),
    /// Damaged.
    Malformed(String),
}

impl HeaderError {
    fn into_persistence(self, file: &Path, offset: u64) -> PersistenceError {
        match self {
            Self::Newer(format) => PersistenceError::Mismatch(format!(
                "{} was written by a newer existence-gate (log format {format}; this build reads formats 1 \
                 to {LOG_FORMAT}): run that version or a newer one",
                file.display()
            )),
            Self::Malformed(problem) => PersistenceError::Corrupt {
                file: file.to_path_buf(),
                offset,
                problem,
            },
        }
    }
}

/// A fingerprint of a deployment's hash seed, kept in each segment's header so that a segment copied from
/// another deployment is refused instead of replayed with the wrong hashes.
pub fn seed_fingerprint(seed: &[u8; 32]) -> u64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest([&b"existence-gate log seed"[..], seed].concat());
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// Brings a record of format `format` to the current one: format 1 counted seqs from 0.
fn upgrade(mutation: Mutation, format: u32) -> Mutation {
    match format {
        1 => mutation.shift_seq(1),
        _ => mutation,
    }
}

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

/// Feeds every record of the segments after `after_segment` to `apply`, in order, brought to the current
/// format. A damaged record at the very end of the last segment (a crash mid-write) is truncated away with a
/// warning; any other damage is an error naming the file and offset, and so is a segment from another
/// deployment (`seed_fingerprint` differs) or from a newer build.
pub fn replay(
    dir: &Path,
    after_segment: u64,
    seed_fingerprint: u64,
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
        let corrupt = |offset, problem| PersistenceError::Corrupt {
            file: path.clone(),
            offset,
            problem,
        };
        // Known once the first frame is read: a header, or (format 1) a record.
        let mut format = None;
        loop {
            match log_frame(&mut reader).map_err(|e| PersistenceError::io(&path, "read", e))? {
                Next::End => break,
                Next::Frame(offset, payload) => {
                    if format.is_none() {
                        let header = SegmentHeader::decode(payload)
                            .map_err(|e| e.into_persistence(&path, offset))?;
                        format = Some(header.map_or(1, |h| h.format));
                        if let Some(header) = header {
                            check_fingerprint(&path, header, seed_fingerprint)?;
                            continue;
                        }
                    }
                    let mutation = codec::decode(payload).map_err(|malformed| {
                        corrupt(
                            offset,
                            format!("a log record does not decode: {}", malformed.0),
                        )
                    })?;
                    apply(upgrade(mutation, format.unwrap_or(LOG_FORMAT)))
                        .map_err(|problem| corrupt(offset, problem))?;
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
                    return Err(corrupt(
                        damage.offset,
                        format!("damaged log record: {}", damage.reason),
                    ))
                }
            }
        }
        replayed.bytes += reader.offset();
    }
    Ok(replayed)
}

fn check_fingerprint(
    path: &Path,
    header: SegmentHeader,
    expected: u64,
) -> Result<(), PersistenceError> {
    if header.seed_fingerprint == expected {
        return Ok(());
    }
    Err(PersistenceError::Mismatch(format!(
        "{} was written by another deployment (its hash-seed fingerprint {:016x} is not this data \
         directory's {expected:016x}): a segment copied from elsewhere would replay keys under the wrong \
         hashes. Move it out of the data directory",
        path.display(),
        header.seed_fingerprint
    )))
}

/// The next frame of a log segment. The log never writes an empty frame, but an all-zero header passes its
/// checksum (crc32c of nothing is 0): zero bytes where a record should start — what a crash that extended
/// the file without writing it leaves — are damage, which is a torn tail if nothing valid follows.
fn log_frame<R: std::io::Read>(reader: &mut frame::Reader<R>) -> std::io::Result<Next<'_>> {
    Ok(match reader.next_frame()? {
        Next::Frame(offset, []) => Next::Damaged(frame::Damage {
            offset,
            reaches_end: true,
            reason: "an empty frame (zero-filled bytes where a record should start)".to_string(),
        }),
        next => next,
    })
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
    file: Box<dyn SegmentFile>,
    number: u64,
    bytes: u64,
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
    // `progress` before `no_space`; `progress` is never held while `segment` or `pending` is taken (a
    // leader drops it to write). No other lock is taken while holding `pending` or `no_space`.
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
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.maker.dir)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
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
        Ok(Segment {
            file,
            number,
            bytes: header.len() as u64,
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
        // Before anything written is acknowledged: the records must be in the file a restart reads (two
        // stat calls, ~1 µs, per write of a whole group of records).
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
                Ok(written)
            }
            Err(Failure::NoSpace(error)) => {
                tracing::error!(%error, "write-ahead log is out of disk space; writes are refused until space returns");
                *lock(&self.no_space) = Some(error.to_string());
                Err(error)
            }
            Err(Failure::Poison(error)) => {
                tracing::error!(%error, "write-ahead log write failed; refusing further writes");
                let _ = self.failed.set(error.to_string());
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
            tracing::error!("{reason}: refusing further writes; restart the server");
            let _ = self.failed.set(reason);
        }
    }

    /// Why `segment`'s name no longer leads to it, if it does not.
    fn unlinked(&self, segment: &Segment) -> Option<String> {
        let path = segment_path(&self.maker.dir, segment.number);
        let same = match (segment.file.metadata(), std::fs::metadata(&path)) {
            (Ok(open), Ok(named)) => {
                use std::os::unix::fs::MetadataExt;
                (open.dev(), open.ino()) == (named.dev(), named.ino())
            }
            _ => false,
        };
        (!same).then(|| {
            format!(
                "{} was removed or replaced under the running server (was the data directory deleted?); \
                 writes would reach no file a restart reads",
                path.display()
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

    /// The log failed for good, or waits for disk space.
    fn write_failure(&self) -> Option<String> {
        self.check_failed()
            .and_then(|()| self.check_space())
            .err()
            .map(|e| e.0.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use bytes::Bytes;

    use super::*;
    use crate::storage::faulty_files::FaultyFiles;
    use crate::storage::segment_file::RealFiles;

    const FINGERPRINT: u64 = 0x5eed;
    const EIO: i32 = 5;

    fn add(seq: u64, key: &str) -> Mutation {
        Mutation::Add {
            namespace: Arc::from("default"),
            seq,
            at_ms: 0,
            keys: vec![Bytes::copy_from_slice(key.as_bytes())],
        }
    }

    fn wal(dir: &Path, mode: SyncMode, files: Arc<dyn SegmentFiles>) -> Wal {
        Wal::create(dir, 1, mode, FINGERPRINT, files).unwrap()
    }

    fn replayed(dir: &Path) -> Result<Vec<Mutation>, PersistenceError> {
        let mut mutations = Vec::new();
        replay(dir, 0, FINGERPRINT, |m| {
            mutations.push(m);
            Ok(())
        })?;
        Ok(mutations)
    }

    /// Whether `needle` is in one of the segment files, newest first (where a fresh record almost always is).
    fn on_disk(dir: &Path, needle: &[u8]) -> bool {
        segments(dir).unwrap().iter().rev().any(|n| {
            std::fs::read(segment_path(dir, *n))
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle)
        })
    }

    /// Writers commit while another thread rolls segments as fast as it can: every acknowledged record
    /// must already be in a file. (Rolling used to read the pending buffer and the ticket count under two
    /// locks, acknowledging a record appended in between while it sat in memory.)
    #[test]
    fn a_roll_never_acknowledges_a_record_it_did_not_write() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Arc::new(wal(dir.path(), SyncMode::Always, Arc::new(RealFiles)));
        let done = Arc::new(AtomicBool::new(false));
        let roller = {
            let (wal, done) = (Arc::clone(&wal), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut rolls = 0;
                while !done.load(Ordering::Acquire) {
                    wal.roll().unwrap();
                    rolls += 1;
                }
                rolls
            })
        };
        let writers: Vec<_> = (0..4)
            .map(|writer| {
                let (wal, dir) = (Arc::clone(&wal), dir.path().to_path_buf());
                std::thread::spawn(move || {
                    for i in 0..300 {
                        let key = format!("writer-{writer}-record-{i:04}");
                        let ticket = wal.append(&add(1, &key)).unwrap();
                        wal.commit(ticket).unwrap();
                        assert!(
                            on_disk(&dir, key.as_bytes()),
                            "{key} was acknowledged but is in no segment"
                        );
                    }
                })
            })
            .collect();
        writers.into_iter().for_each(|w| w.join().unwrap());
        done.store(true, Ordering::Release);
        assert!(roller.join().unwrap() > 0);
        assert_eq!(replayed(dir.path()).unwrap().len(), 1_200);
    }

    #[test]
    fn writers_waiting_on_one_fsync_share_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let files = FaultyFiles::new();
        let wal = Arc::new(wal(dir.path(), SyncMode::Always, files.clone()));
        files.stall_syncs();
        let syncs_before = files.syncs();
        let commit = |key: String| {
            let wal = Arc::clone(&wal);
            std::thread::spawn(move || wal.commit(wal.append(&add(1, &key)).unwrap()))
        };
        let leader = commit("first".into());
        wait_until(|| files.stalled_syncs() == 1);
        let followers: Vec<_> = (0..7).map(|i| commit(format!("follower-{i}"))).collect();
        wait_until(|| lock(&wal.pending).appended == 8);
        files.release_syncs();
        leader.join().unwrap().unwrap();
        followers
            .into_iter()
            .for_each(|f| f.join().unwrap().unwrap());
        assert_eq!(
            files.syncs() - syncs_before,
            2,
            "one fsync for the first, one for the seven"
        );
    }

    #[test]
    fn a_failed_fsync_refuses_every_waiting_and_later_write_and_loses_nothing_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let files = FaultyFiles::new();
        let wal = Arc::new(wal(dir.path(), SyncMode::Always, files.clone()));
        wal.commit(wal.append(&add(1, "acknowledged")).unwrap())
            .unwrap();
        files.stall_syncs();
        let leader = {
            let wal = Arc::clone(&wal);
            std::thread::spawn(move || wal.commit(wal.append(&add(2, "leader")).unwrap()))
        };
        wait_until(|| files.stalled_syncs() == 1);
        let waiter = {
            let wal = Arc::clone(&wal);
            std::thread::spawn(move || wal.commit(wal.append(&add(3, "waiter")).unwrap()))
        };
        wait_until(|| lock(&wal.pending).appended == 3);
        files.fail_syncs(EIO);
        files.release_syncs();
        assert!(leader.join().unwrap().is_err());
        assert!(waiter.join().unwrap().is_err());
        // Poisoned: healing the disk does not bring writes back, since the failed fsync may have dropped
        // pages the kernel then reports as clean.
        files.fail_syncs(0);
        let later = wal.append(&add(4, "later"));
        assert!(later.is_err_and(|e| e.to_string().contains("failed earlier")));
        assert!(wal.sync_now().is_err());
        assert!(wal.roll().is_err());
        drop(wal);
        let recovered = replayed(dir.path()).unwrap();
        assert_eq!(recovered[0], add(1, "acknowledged"));
    }

    #[test]
    fn a_failed_write_or_roll_poisons_the_log() {
        for fault in ["write", "create"] {
            let dir = tempfile::tempdir().unwrap();
            let files = FaultyFiles::new();
            let wal = wal(dir.path(), SyncMode::Never, files.clone());
            let ticket = wal.append(&add(1, "one")).unwrap();
            if fault == "write" {
                files.fail_writes(28);
                assert!(wal.commit(ticket).is_err());
            } else {
                files.fail_creates(true);
                assert!(wal.roll().is_err());
            }
            assert!(wal.append(&add(2, "two")).is_err(), "{fault}");
        }
    }

    #[test]
    fn a_full_disk_refuses_writes_until_space_returns_and_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let files = FaultyFiles::new();
        let wal = wal(dir.path(), SyncMode::Always, files.clone());
        wal.commit(wal.append(&add(1, "before")).unwrap()).unwrap();
        files.fail_writes(28);
        let held = wal.append(&add(2, "held back")).unwrap();
        let error = wal.commit(held).unwrap_err().to_string();
        assert!(error.contains("out of disk space"), "{error}");
        assert!(wal
            .write_failure()
            .is_some_and(|r| r.contains("writes resume")));
        assert!(
            wal.append(&add(3, "refused")).is_err(),
            "nothing new is taken"
        );
        assert!(!wal.retry_writes(), "still full");
        // The partial write was cut back out: the file replays cleanly, without the held record.
        assert_eq!(replayed(dir.path()).unwrap(), [add(1, "before")]);

        files.fail_writes(0);
        assert!(wal.retry_writes());
        assert_eq!(wal.write_failure(), None);
        wal.commit(wal.append(&add(3, "after")).unwrap()).unwrap();
        assert_eq!(
            replayed(dir.path()).unwrap(),
            [add(1, "before"), add(2, "held back"), add(3, "after")]
        );
    }

    #[test]
    fn a_segment_deleted_under_the_log_poisons_it() {
        let dir = tempfile::tempdir().unwrap();
        let wal = wal(dir.path(), SyncMode::Never, Arc::new(RealFiles));
        wal.commit(wal.append(&add(1, "one")).unwrap()).unwrap();
        wal.check_segment_linked();
        assert_eq!(wal.write_failure(), None);
        std::fs::remove_file(segment_path(dir.path(), 1)).unwrap();
        wal.check_segment_linked();
        let reason = wal.write_failure().unwrap();
        assert!(reason.contains("removed or replaced"), "{reason}");
        assert!(wal.append(&add(2, "two")).is_err());
    }

    /// Between the periodic checks too: the write that finds its file gone is not acknowledged.
    #[test]
    fn a_write_into_a_deleted_segment_is_not_acknowledged() {
        for mode in [SyncMode::Always, SyncMode::Never] {
            let dir = tempfile::tempdir().unwrap();
            let wal = wal(dir.path(), mode, Arc::new(RealFiles));
            wal.commit(wal.append(&add(1, "one")).unwrap()).unwrap();
            std::fs::remove_dir_all(dir.path()).unwrap();
            let refused = wal.commit(wal.append(&add(2, "two")).unwrap()).unwrap_err();
            assert!(
                refused.to_string().contains("removed or replaced"),
                "{mode:?}: {refused}"
            );
            assert!(wal.write_failure().is_some(), "{mode:?}");
        }
    }

    /// Waits (without a fixed sleep) until `condition` holds; fails after a generous deadline.
    fn wait_until(condition: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !condition() {
            assert!(std::time::Instant::now() < deadline, "condition never held");
            std::thread::yield_now();
        }
    }

    fn write_segment(dir: &Path, number: u64, header: Option<SegmentHeader>, tail: &[u8]) {
        let mut bytes = Vec::new();
        if let Some(header) = header {
            header.encode(&mut bytes);
        }
        for seq in 1..=3 {
            let mut payload = Vec::new();
            codec::encode(&add(seq, &format!("key-{seq}")), &mut payload);
            frame::encode(&payload, &mut bytes);
        }
        bytes.extend_from_slice(tail);
        std::fs::write(segment_path(dir, number), bytes).unwrap();
    }

    const CURRENT: SegmentHeader = SegmentHeader {
        format: LOG_FORMAT,
        seed_fingerprint: FINGERPRINT,
    };

    #[test]
    fn a_zero_filled_tail_is_torn_and_truncated() {
        for zeros in [1, 5, 8, 9, 64, 4096] {
            let dir = tempfile::tempdir().unwrap();
            write_segment(dir.path(), 1, Some(CURRENT), &vec![0; zeros]);
            let full = std::fs::metadata(segment_path(dir.path(), 1))
                .unwrap()
                .len();
            assert_eq!(replayed(dir.path()).unwrap().len(), 3, "{zeros} zero bytes");
            let len = std::fs::metadata(segment_path(dir.path(), 1))
                .unwrap()
                .len();
            assert_eq!(len, full - zeros as u64);
        }
    }

    #[test]
    fn zeros_with_a_record_after_them_are_damage() {
        let dir = tempfile::tempdir().unwrap();
        let mut tail = vec![0; 16];
        let mut payload = Vec::new();
        codec::encode(&add(4, "after the zeros"), &mut payload);
        frame::encode(&payload, &mut tail);
        write_segment(dir.path(), 1, Some(CURRENT), &tail);
        let error = replayed(dir.path()).unwrap_err().to_string();
        assert!(error.contains("empty frame"), "{error}");
    }

    #[test]
    fn headerless_format_1_segments_replay_with_seqs_counted_from_1() {
        let dir = tempfile::tempdir().unwrap();
        write_segment(dir.path(), 1, None, &[]);
        write_segment(dir.path(), 2, Some(CURRENT), &[]);
        let seqs: Vec<u64> = replayed(dir.path())
            .unwrap()
            .iter()
            .map(Mutation::seq)
            .collect();
        assert_eq!(seqs, [2, 3, 4, 1, 2, 3]);
    }

    #[test]
    fn a_segment_from_a_newer_build_or_another_deployment_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let newer = SegmentHeader {
            format: LOG_FORMAT + 1,
            ..CURRENT
        };
        write_segment(dir.path(), 1, Some(newer), &[]);
        let error = replayed(dir.path()).unwrap_err().to_string();
        assert!(
            error.contains(&format!(
                "written by a newer existence-gate (log format {}",
                LOG_FORMAT + 1
            )) && !error.contains("damaged")
                && error.contains("wal-00000000000000000001.log"),
            "{error}"
        );
        let other = SegmentHeader {
            seed_fingerprint: 7,
            ..CURRENT
        };
        write_segment(dir.path(), 1, Some(other), &[]);
        let error = replayed(dir.path()).unwrap_err().to_string();
        assert!(error.contains("another deployment"), "{error}");
    }

    #[test]
    fn a_new_segment_starts_with_its_header() {
        let dir = tempfile::tempdir().unwrap();
        let wal = wal(dir.path(), SyncMode::Always, Arc::new(RealFiles));
        wal.commit(wal.append(&add(2, "k")).unwrap()).unwrap();
        let bytes = std::fs::read(segment_path(dir.path(), 1)).unwrap();
        let mut reader = frame::Reader::new(&bytes[..], bytes.len() as u64);
        let Next::Frame(_, first) = reader.next_frame().unwrap() else {
            panic!("no first frame");
        };
        assert_eq!(SegmentHeader::decode(first), Ok(Some(CURRENT)));
        assert_eq!(replayed(dir.path()).unwrap(), [add(2, "k")]);
    }
}
