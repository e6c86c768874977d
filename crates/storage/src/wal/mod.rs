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
//! The server's writes wait without a thread each: `committed` registers the wait (a oneshot channel, keyed
//! by ticket) and unparks the log's **flusher**, a thread of its own that leads a write whenever a waiter
//! needs one; the leader of each write wakes exactly the waits it made durable (every one, with the error,
//! if the write failed). Writers that call `commit` on a thread (snapshots, shutdown, the tests) lead as
//! before. Measured on the RESP port (`BF.ADD` pipelined 16 deep, 50 connections, `--sync always`): a
//! hand-off to the blocking pool per write and a condvar waking every waiter after each group cost 7.75 µs
//! of server CPU per `Add` (5.70 in the kernel: 18 futex calls per socket read, 113 threads); with the
//! flusher, see `docs/performance.md`.
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
//!
//! # Files
//!
//! `format.rs` (segment names, the header, format upgrades), `replay.rs` (reading the segments back and
//! repairing a torn tail), `writer.rs` (the group-commit writer and its failures), `tests.rs`.

mod format;
mod replay;
mod writer;

#[cfg(test)]
mod tests;

pub use format::{
    seed_fingerprint, segment_path, segments, SegmentHeader, LOG_FORMAT, SEGMENT_BYTES,
};
pub use replay::{replay, Replayed};
pub use writer::{SyncMode, Wal};
