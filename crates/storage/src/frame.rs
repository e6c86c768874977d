//! Framing shared by the write-ahead log and snapshots: `[u32 length][u32 crc32c][payload]`, little-endian.
//!
//! The checksum covers the payload; the length is checked against the file's size and a ceiling. A frame
//! that is cut short or fails its checksum is reported with its offset and whether it reaches the end of the
//! file — the difference between a torn tail (a crash mid-write: safe to truncate) and corruption in the
//! middle (never silently skipped).

use std::io::{self, Read};

use crate::core::tombstones::AbsenceKind;

/// Bytes before each payload.
pub const HEADER_BYTES: u64 = 8;
/// The largest payload a frame may carry; a larger length field is damage, not data.
pub const MAX_PAYLOAD: u64 = 1 << 30;

/// Appends one frame carrying `payload` to `out`.
pub fn encode(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// Where and how a file is damaged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// Offset of the damaged frame's header.
    pub offset: u64,
    /// Whether the damaged frame runs to the end of the file (nothing valid can follow it).
    pub reaches_end: bool,
    /// What is wrong.
    pub reason: String,
}

/// What the reader found next.
#[derive(Debug)]
pub enum Next<'a> {
    /// A whole, verified frame: its offset and payload.
    Frame(u64, &'a [u8]),
    /// The end of the file, exactly after a frame.
    End,
    /// A frame that cannot be trusted.
    Damaged(Damage),
}

/// Reads frames one after another from a file of known length.
pub struct Reader<R> {
    inner: R,
    offset: u64,
    len: u64,
    payload: Vec<u8>,
}

impl<R: Read> Reader<R> {
    /// A reader of `len` bytes from `inner`.
    pub fn new(inner: R, len: u64) -> Self {
        Self {
            inner,
            offset: 0,
            len,
            payload: Vec::new(),
        }
    }

    /// Offset of the next frame.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next frame, the end, or the damage found.
    pub fn next_frame(&mut self) -> io::Result<Next<'_>> {
        let start = self.offset;
        let remaining = self.len - start;
        if remaining == 0 {
            return Ok(Next::End);
        }
        let damaged = |reaches_end, reason: String| {
            Ok(Next::Damaged(Damage {
                offset: start,
                reaches_end,
                reason,
            }))
        };
        if remaining < HEADER_BYTES {
            return damaged(
                true,
                format!("a frame header is cut short ({remaining} of 8 bytes)"),
            );
        }
        let mut header = [0u8; HEADER_BYTES as usize];
        self.inner.read_exact(&mut header)?;
        let length = u64::from(u32::from_le_bytes(header[..4].try_into().expect("4 bytes")));
        let checksum = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        if length > remaining - HEADER_BYTES {
            return damaged(
                true,
                format!("a frame of {length} bytes runs past the end of the file"),
            );
        }
        if length > MAX_PAYLOAD {
            return damaged(
                false,
                format!("a frame claims {length} bytes, more than the {MAX_PAYLOAD} allowed"),
            );
        }
        self.payload.resize(length as usize, 0);
        self.inner.read_exact(&mut self.payload)?;
        let end = start + HEADER_BYTES + length;
        if crc32c::crc32c(&self.payload) != checksum {
            return damaged(end == self.len, "checksum mismatch".to_string());
        }
        self.offset = end;
        Ok(Next::Frame(start, &self.payload))
    }
}

/// Whether a whole, valid, non-empty frame starts anywhere in `bytes`.
///
/// Tells a torn tail from a damaged length field: a crash mid-write leaves nothing valid after the torn
/// frame, while a flipped bit in a length field would hide valid frames behind it. Zero-filled tails (what a
/// crash often leaves) contain no frame, since every real frame is non-empty.
pub fn contains_valid_frame(bytes: &[u8]) -> bool {
    let header = HEADER_BYTES as usize;
    (0..bytes.len().saturating_sub(header)).any(|start| {
        let length =
            u32::from_le_bytes(bytes[start..start + 4].try_into().expect("4 bytes")) as usize;
        let end = start + header + length;
        length > 0
            && end <= bytes.len()
            && crc32c::crc32c(&bytes[start + header..end])
                == u32::from_le_bytes(bytes[start + 4..start + 8].try_into().expect("4 bytes"))
    })
}

/// A cursor that decodes the fields of one payload, failing (never panicking) on short input.
pub struct Fields<'a> {
    bytes: &'a [u8],
}

/// A payload whose fields do not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

macro_rules! int_field {
    ($name:ident, $ty:ty) => {
        /// Reads one little-endian integer.
        pub fn $name(&mut self) -> Result<$ty, Malformed> {
            let bytes = self.take(std::mem::size_of::<$ty>())?;
            Ok(<$ty>::from_le_bytes(bytes.try_into().expect("sized")))
        }
    };
}

impl<'a> Fields<'a> {
    /// A cursor over `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    /// How many bytes are left.
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.bytes.len() < n {
            return Err(Malformed(format!(
                "needs {n} more bytes, has {}",
                self.bytes.len()
            )));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    int_field!(u8, u8);
    int_field!(u16, u16);
    int_field!(u32, u32);
    int_field!(u64, u64);

    /// A byte string prefixed by its u32 length.
    pub fn bytes(&mut self) -> Result<&'a [u8], Malformed> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    /// A byte string prefixed by its length as a LEB128 varint (at most 5 bytes, at most `u32::MAX`).
    pub fn varint_bytes(&mut self) -> Result<&'a [u8], Malformed> {
        let mut len = 0u64;
        for shift in (0..35).step_by(7) {
            let byte = self.u8()?;
            len |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                if byte == 0 && shift > 0 {
                    // The writer never pads: a record read back re-encodes to the same bytes.
                    return Err(Malformed(
                        "a length in more bytes than it needs".to_string(),
                    ));
                }
                let len = u32::try_from(len)
                    .map_err(|_| Malformed(format!("a length of {len} bytes")))?;
                return self.take(len as usize);
            }
        }
        Err(Malformed("a length runs past 5 bytes".to_string()))
    }

    /// A UTF-8 string prefixed by its u16 length.
    pub fn string(&mut self) -> Result<&'a str, Malformed> {
        let len = self.u16()? as usize;
        std::str::from_utf8(self.take(len)?)
            .map_err(|_| Malformed("a name is not UTF-8".to_string()))
    }

    /// An [`AbsenceKind`] as [`put_absence_kind`] writes it.
    pub fn absence_kind(&mut self) -> Result<AbsenceKind, Malformed> {
        match self.u8()? {
            1 => Ok(AbsenceKind::Missing),
            2 => Ok(AbsenceKind::Deleted),
            other => Err(Malformed(format!("unknown absence kind {other}"))),
        }
    }

    /// Skips what is left: the fields of a newer format, which this build does not parse.
    pub fn skip_rest(&mut self) {
        self.bytes = &[];
    }

    /// Fails unless every byte was read.
    pub fn finish(self) -> Result<(), Malformed> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(Malformed(format!(
                "{} unexpected trailing bytes",
                self.bytes.len()
            )))
        }
    }
}

/// Appends a byte string prefixed by its u32 length.
pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Appends a byte string prefixed by its length as a LEB128 varint (one byte up to 127 bytes).
pub fn put_varint_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut len = bytes.len() as u32;
    while len >= 0x80 {
        out.push((len as u8) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(bytes);
}

/// Appends an [`AbsenceKind`] as one byte (the log and snapshots share it): 1 missing, 2 deleted.
pub fn put_absence_kind(out: &mut Vec<u8>, kind: AbsenceKind) {
    out.push(match kind {
        AbsenceKind::Missing => 1,
        AbsenceKind::Deleted => 2,
    });
}

/// Appends a string prefixed by its u16 length.
pub fn put_string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u16).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        payloads.iter().for_each(|p| encode(p, &mut out));
        out
    }

    fn read_all(bytes: &[u8]) -> (Vec<Vec<u8>>, Option<Damage>) {
        let mut reader = Reader::new(bytes, bytes.len() as u64);
        let mut payloads = Vec::new();
        loop {
            match reader.next_frame().unwrap() {
                Next::Frame(_, payload) => payloads.push(payload.to_vec()),
                Next::End => return (payloads, None),
                Next::Damaged(damage) => return (payloads, Some(damage)),
            }
        }
    }

    #[test]
    fn round_trip() {
        let bytes = frames(&[b"one", b"", b"three"]);
        let (payloads, damage) = read_all(&bytes);
        assert_eq!(payloads, [b"one".to_vec(), vec![], b"three".to_vec()]);
        assert_eq!(damage, None);
    }

    #[test]
    fn a_cut_tail_reaches_the_end() {
        let bytes = frames(&[b"one", b"two"]);
        for cut in 1..(HEADER_BYTES as usize + 3) {
            let (payloads, damage) = read_all(&bytes[..bytes.len() - cut]);
            assert_eq!(payloads.len(), 1);
            let damage = damage.unwrap();
            assert!(damage.reaches_end, "{damage:?}");
            assert_eq!(damage.offset, 11);
        }
    }

    #[test]
    fn a_flipped_bit_in_the_middle_does_not_reach_the_end() {
        let mut bytes = frames(&[b"one", b"two", b"three"]);
        bytes[HEADER_BYTES as usize + 3 + HEADER_BYTES as usize] ^= 0x10;
        let (payloads, damage) = read_all(&bytes);
        assert_eq!(payloads.len(), 1);
        let damage = damage.unwrap();
        assert!(!damage.reaches_end);
        assert_eq!(
            (damage.offset, damage.reason.as_str()),
            (11, "checksum mismatch")
        );
    }

    #[test]
    fn valid_frames_are_found_behind_damage_but_not_in_zeros_or_junk() {
        let bytes = frames(&[b"one", b"two"]);
        assert!(contains_valid_frame(&bytes[1..]));
        assert!(!contains_valid_frame(&[0u8; 4096]));
        assert!(!contains_valid_frame(
            &bytes[..bytes.len() - 1][HEADER_BYTES as usize + 3..]
        ));
    }

    #[test]
    fn fields_fail_cleanly_on_short_input() {
        let mut fields = Fields::new(&[1, 2, 3]);
        assert!(fields.u64().is_err());
        let mut out = Vec::new();
        put_string(&mut out, "ns");
        put_bytes(&mut out, b"key");
        let mut fields = Fields::new(&out);
        assert_eq!(fields.string().unwrap(), "ns");
        assert_eq!(fields.bytes().unwrap(), b"key");
        fields.finish().unwrap();
    }
}
