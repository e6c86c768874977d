//! Reading the segments back at start: every record in order, a torn tail truncated away, any other
//! damage refused with the file, the offset and the remedy.

use std::fs::{File, OpenOptions};
use std::io::BufReader;
use std::path::{Path, PathBuf};

use crate::core::log::Mutation;
use crate::frame::{self, Next};
use crate::{codec, PersistenceError};

use super::format::{segment_path, segments, upgrade, SegmentHeader, LOG_FORMAT};

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
    io_fault_point!("log-truncate", path, "truncate");
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| PersistenceError::io(path, "open", e))?;
    file.set_len(len)
        .and_then(|()| file.sync_all())
        .map_err(|e| PersistenceError::io(path, "truncate", e))
}
