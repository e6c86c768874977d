//! What a segment is on disk: its name, its header (format and the deployment's seed fingerprint), and
//! how records of older formats are brought to the current one.

use std::path::{Path, PathBuf};

use crate::core::log::Mutation;
use crate::frame::{self};
use crate::PersistenceError;

/// A segment is closed and a new one begun past this size, so no single file grows without bound.
pub const SEGMENT_BYTES: u64 = 64 << 20;

/// The log format this build writes. Format 1 segments had no header and counted each namespace's seqs from
/// 0; format 2 segments begin with a [header](SegmentHeader) and count from 1 (see
/// [`crate::core::log::GENESIS_SEQ`]); format 3 records carry a `RecordAbsent`'s `observed_seq` (a new
/// record type, see [`crate::codec`]), which an older build would take for damage; format 4 records frame
/// keys with varint lengths (new `Add` and `Rebuild` types). All four are read.
pub const LOG_FORMAT: u32 = 4;

/// The first frame of every segment since format 2: this magic, then `u32 format`, `u64 seed fingerprint`.
/// No record can start with it (a record's first byte is its kind, 1 to 6).
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
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        let mut payload = SEGMENT_MAGIC.to_vec();
        payload.extend_from_slice(&self.format.to_le_bytes());
        payload.extend_from_slice(&self.seed_fingerprint.to_le_bytes());
        frame::encode(&payload, out);
    }

    /// The header a first frame's `payload` holds: `Ok(None)` if it is a format-1 record instead.
    pub(super) fn decode(payload: &[u8]) -> Result<Option<Self>, HeaderError> {
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
pub(super) enum HeaderError {
    /// Written by a newer build, in this log format: not damage, and the remedy is that build.
    Newer(u32),
    /// Damaged.
    Malformed(String),
}

impl HeaderError {
    pub(super) fn into_persistence(self, file: &Path, offset: u64) -> PersistenceError {
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
pub(super) fn upgrade(mutation: Mutation, format: u32) -> Mutation {
    match format {
        1 => mutation.shift_seq(1),
        _ => mutation,
    }
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
