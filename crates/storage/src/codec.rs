//! The binary form of a [`Mutation`] inside a log frame.
//!
//! ```text
//! Add:          u8 5, name (u16 len), u64 seq, u64 at_ms, u32 key count, keys (varint len each)
//!             | u8 7, name (u16 len), u64 seq, u64 at_ms, u32 key count, u32 key length, keys (that long each)
//! RecordAbsent: u8 3, name (u16 len), u64 seq, u64 at_ms, u8 kind, u64 expires_at_ms, u64 observed_seq,
//!               key (u32 len)
//! Rebuild:      u8 6, name (u16 len), u64 seq, u64 at_ms, u8 step: 0 Begin | 1 Keys, u64 began, u32 key
//!               count, keys (varint len each) | 2 Commit, u64 began | 3 Abort, u64 began
//! ```
//!
//! Keys carry their length as a LEB128 varint (log format 4, stream format 2): one byte for keys up to 127
//! bytes instead of four, so a 1,000-key `Add` of 16-byte keys takes 17 kB instead of 20 kB in the log, in
//! the stream and on the wire to every replica (15% less to store, send and read back on catch-up). CPU did
//! not move measurably: three replicas and a NATS server on 2 cores, seven pairs of runs alternating the
//! builds, NATS 399 vs 405 µs per `Add` on average, within the runs' ±15% noise. Types 1 and 4, the same
//! records with u32 key lengths ([`KeyLengths::Fixed`]), are still read, and still written to a stream set
//! up in format 1, whose older replicas read nothing else.
//!
//! Type 7, an `Add` whose keys all have one length, carries that length once (stream format 3, written
//! only into streams set up in it, [`KeyLengths::Uniform`]): a 1,000-key `Add` of 16-byte keys takes 16 kB
//! instead of 17 kB, and a replica reads its keys in one copy instead of a length at a time.
//!
//! Type 2, `RecordAbsent` without `observed_seq` (log formats 1 and 2, decided before it was logged), is
//! still read, as `observed_seq` 0.
//!
//! Its properties (every record round-trips, alone and framed; arbitrary and mutated bytes decode or are
//! refused, never panic) are checked in `tests/suite/fuzz_harnesses.rs`, beside the fuzz targets that share them.

use std::sync::Arc;

use bytes::Bytes;

use super::frame::{put_absence_kind, put_bytes, put_string, put_varint_bytes, Fields, Malformed};
use crate::core::keys::PackedKeys;
use crate::core::log::{Mutation, RebuildStep};

/// The type of an `Add` with u32 key lengths (log formats 1 to 3, stream format 1).
pub const ADD_FIXED: u8 = 1;
/// The type of a `RecordAbsent` before log format 3 (no `observed_seq`): still read, never written.
pub const RECORD_ABSENT_UNOBSERVED: u8 = 2;
const RECORD_ABSENT: u8 = 3;
/// The type of a `Rebuild` step with u32 key lengths (log formats 1 to 3, stream format 1).
pub const REBUILD_FIXED: u8 = 4;
const ADD: u8 = 5;
const REBUILD: u8 = 6;
/// The type of an `Add` whose keys all have one length, given once (stream format 3).
pub const ADD_UNIFORM: u8 = 7;
const BEGIN: u8 = 0;
const KEYS: u8 = 1;
const COMMIT: u8 = 2;
const ABORT: u8 = 3;

/// How a record's keys carry their lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyLengths {
    /// A LEB128 varint each: what this build writes.
    Varint,
    /// A u32 each: what a stream set up in format 1 holds, for the older builds that may follow it.
    Fixed,
    /// An `Add` whose keys all have one length gives it once (type 7); other records as [`Varint`]: what a
    /// stream set up in format 3 holds, which no build before it follows.
    ///
    /// [`Varint`]: KeyLengths::Varint
    Uniform,
}

/// Appends the encoding of `mutation` to `out`.
pub fn encode(mutation: &Mutation, out: &mut Vec<u8>) {
    encode_with_seq(mutation, mutation.seq(), KeyLengths::Varint, out);
}

/// Appends the encoding of `mutation` with `seq` in place of its own and keys framed as `lengths` says: what
/// a replica publishes (seq 0, the stream assigns it) without copying the mutation's keys to change one
/// number.
pub fn encode_with_seq(mutation: &Mutation, seq: u64, lengths: KeyLengths, out: &mut Vec<u8>) {
    let (add, rebuild) = match lengths {
        KeyLengths::Varint | KeyLengths::Uniform => (ADD, REBUILD),
        KeyLengths::Fixed => (ADD_FIXED, REBUILD_FIXED),
    };
    match mutation {
        Mutation::Add {
            namespace,
            at_ms,
            keys,
            ..
        } => {
            let uniform = keys
                .uniform_length()
                .filter(|_| lengths == KeyLengths::Uniform);
            out.push(if uniform.is_some() { ADD_UNIFORM } else { add });
            put_string(out, namespace);
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&at_ms.to_le_bytes());
            match uniform {
                Some(length) => {
                    out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
                    out.extend_from_slice(&(length as u32).to_le_bytes());
                    out.extend_from_slice(keys.concatenated());
                }
                None => put_keys(out, keys.slices(), lengths),
            }
        }
        Mutation::RecordAbsent {
            namespace,
            at_ms,
            key,
            kind,
            expires_at_ms,
            observed_seq,
            ..
        } => {
            out.push(RECORD_ABSENT);
            put_string(out, namespace);
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&at_ms.to_le_bytes());
            put_absence_kind(out, *kind);
            out.extend_from_slice(&expires_at_ms.to_le_bytes());
            out.extend_from_slice(&observed_seq.to_le_bytes());
            put_bytes(out, key);
        }
        Mutation::Rebuild {
            namespace,
            at_ms,
            step,
            ..
        } => {
            out.push(rebuild);
            put_string(out, namespace);
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&at_ms.to_le_bytes());
            let (tag, began) = match step {
                RebuildStep::Begin => {
                    out.push(BEGIN);
                    return;
                }
                RebuildStep::Keys { began, .. } => (KEYS, began),
                RebuildStep::Commit { began } => (COMMIT, began),
                RebuildStep::Abort { began } => (ABORT, began),
            };
            out.push(tag);
            out.extend_from_slice(&began.to_le_bytes());
            if let RebuildStep::Keys { keys, .. } = step {
                put_keys(out, keys.iter().map(|key| &key[..]), lengths);
            }
        }
    }
}

fn put_keys<'a>(
    out: &mut Vec<u8>,
    keys: impl ExactSizeIterator<Item = &'a [u8]>,
    lengths: KeyLengths,
) {
    out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    match lengths {
        KeyLengths::Varint | KeyLengths::Uniform => keys.for_each(|key| put_varint_bytes(out, key)),
        KeyLengths::Fixed => keys.for_each(|key| put_bytes(out, key)),
    }
}

/// How many keys a record says follow; a count more than the rest of the record could hold is damage,
/// not a reason to allocate.
fn key_count(fields: &mut Fields<'_>, lengths: KeyLengths) -> Result<usize, Malformed> {
    let count = fields.u32()? as usize;
    // Each key takes at least its length's bytes.
    let least = match lengths {
        KeyLengths::Varint | KeyLengths::Uniform => 1,
        KeyLengths::Fixed => 4,
    };
    if count > fields.remaining() / least {
        return Err(Malformed(format!(
            "claims {count} keys in {} bytes",
            fields.remaining()
        )));
    }
    Ok(count)
}

/// The record's next key.
fn next_key<'a>(fields: &mut Fields<'a>, lengths: KeyLengths) -> Result<&'a [u8], Malformed> {
    match lengths {
        KeyLengths::Varint | KeyLengths::Uniform => fields.varint_bytes(),
        KeyLengths::Fixed => fields.bytes(),
    }
}

/// An `Add`'s keys, copied into one packed buffer as they are read (see [`decode_shared`]).
fn packed_keys(fields: &mut Fields<'_>, lengths: KeyLengths) -> Result<PackedKeys, Malformed> {
    let count = key_count(fields, lengths)?;
    PackedKeys::read(count, fields.remaining(), || next_key(fields, lengths))
}

/// A type-7 `Add`'s keys: a count, one length, then the keys back to back, copied in one piece.
fn uniform_keys(fields: &mut Fields<'_>) -> Result<PackedKeys, Malformed> {
    let count = fields.u32()? as usize;
    let length = fields.u32()? as usize;
    // The writer gives one length only to one key or more of at least a byte: read back, the record
    // re-encodes to the same bytes (and a length of 0 would leave the count unbounded).
    if count == 0 || length == 0 {
        return Err(Malformed(format!(
            "{count} keys of one length, {length} bytes"
        )));
    }
    let total = count
        .checked_mul(length)
        .filter(|total| *total <= fields.remaining())
        .ok_or_else(|| {
            Malformed(format!(
                "claims {count} keys of {length} bytes in {} bytes",
                fields.remaining()
            ))
        })?;
    let keys = fields.take(total)?;
    PackedKeys::uniform(keys, count, length)
        .ok_or_else(|| Malformed(format!("{count} keys of {length} bytes past 4 GiB")))
}

fn rebuild_step(
    fields: &mut Fields<'_>,
    payload: &Bytes,
    lengths: KeyLengths,
) -> Result<RebuildStep, Malformed> {
    let tag = fields.u8()?;
    if tag == BEGIN {
        return Ok(RebuildStep::Begin);
    }
    let began = fields.u64()?;
    Ok(match tag {
        KEYS => RebuildStep::Keys {
            began,
            keys: {
                let count = key_count(fields, lengths)?;
                (0..count)
                    .map(|_| next_key(fields, lengths).map(|key| payload.slice_ref(key)))
                    .collect::<Result<_, _>>()?
            },
        },
        COMMIT => RebuildStep::Commit { began },
        ABORT => RebuildStep::Abort { began },
        other => return Err(Malformed(format!("unknown rebuild step {other}"))),
    })
}

/// Decodes one mutation; `Err` for any payload that is not exactly one well-formed mutation. The keys
/// share one copy of `payload`.
pub fn decode(payload: &[u8]) -> Result<Mutation, Malformed> {
    decode_shared(&Bytes::copy_from_slice(payload))
}

/// Decodes `payload`. An `Add`'s keys are copied into one packed buffer (two allocations for the whole
/// record, which the invalidation it publishes then shares); a rebuild step's keys are slices of `payload`.
/// A `Bytes` per key was once an allocation each (17% of a follower's CPU applying 1,000-key Adds), then a
/// reference count each (about 10% of a replica's `perf` profile; without them the replicas' CPU per
/// 1,000-key `Add` fell 5% on average over four pairs of runs, within the runs' noise in one).
pub fn decode_shared(payload: &Bytes) -> Result<Mutation, Malformed> {
    let mut fields = Fields::new(payload);
    let tag = fields.u8()?;
    let namespace: Arc<str> = Arc::from(fields.string()?);
    let seq = fields.u64()?;
    let at_ms = fields.u64()?;
    let lengths = match tag {
        ADD_FIXED | REBUILD_FIXED => KeyLengths::Fixed,
        _ => KeyLengths::Varint,
    };
    let mutation = match tag {
        ADD | ADD_FIXED => Mutation::Add {
            namespace,
            seq,
            at_ms,
            keys: packed_keys(&mut fields, lengths)?,
        },
        ADD_UNIFORM => Mutation::Add {
            namespace,
            seq,
            at_ms,
            keys: uniform_keys(&mut fields)?,
        },
        REBUILD | REBUILD_FIXED => Mutation::Rebuild {
            namespace,
            seq,
            at_ms,
            step: rebuild_step(&mut fields, payload, lengths)?,
        },
        RECORD_ABSENT | RECORD_ABSENT_UNOBSERVED => {
            let kind = fields.absence_kind()?;
            let expires_at_ms = fields.u64()?;
            let observed_seq = if tag == RECORD_ABSENT {
                fields.u64()?
            } else {
                0
            };
            let key = payload.slice_ref(fields.bytes()?);
            Mutation::RecordAbsent {
                namespace,
                seq,
                at_ms,
                key,
                kind,
                expires_at_ms,
                observed_seq,
            }
        }
        other => return Err(Malformed(format!("unknown mutation type {other}"))),
    };
    fields.finish()?;
    Ok(mutation)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(keys: Vec<Bytes>) -> Mutation {
        Mutation::Add {
            namespace: Arc::from("users"),
            seq: 7,
            at_ms: 1_700_000_000_000,
            keys: keys.into(),
        }
    }

    fn encoded(mutation: &Mutation, lengths: KeyLengths) -> Vec<u8> {
        let mut out = Vec::new();
        encode_with_seq(mutation, mutation.seq(), lengths, &mut out);
        out
    }

    #[test]
    fn both_key_framings_decode_to_the_same_mutation() {
        let lengths = [0usize, 1, 127, 128, 300, 16_384, 70_000];
        let keys: Vec<Bytes> = lengths
            .iter()
            .map(|&n| Bytes::from(vec![b'k'; n]))
            .collect();
        let rebuild = Mutation::Rebuild {
            namespace: Arc::from("users"),
            seq: 8,
            at_ms: 9,
            step: RebuildStep::Keys {
                began: 3,
                keys: keys.clone(),
            },
        };
        for mutation in [add(keys), rebuild] {
            for framing in [KeyLengths::Varint, KeyLengths::Fixed] {
                let bytes = encoded(&mutation, framing);
                assert_eq!(decode(&bytes).unwrap(), mutation, "{framing:?}");
            }
        }
    }

    /// 1,000 distinct 16-byte keys (the size of a UUID).
    fn uuid_sized_keys() -> Vec<Bytes> {
        (0..1_000u32)
            .map(|i| Bytes::from([i.to_le_bytes(); 4].concat()))
            .collect()
    }

    #[test]
    fn a_thousand_uuid_sized_keys_take_one_length_byte_each() {
        let mutation = add(uuid_sized_keys());
        let (varint, fixed) = (
            encoded(&mutation, KeyLengths::Varint).len(),
            encoded(&mutation, KeyLengths::Fixed).len(),
        );
        assert_eq!(fixed - varint, 3 * 1_000, "{varint} vs {fixed} bytes");
        assert_eq!(varint, 1 + 2 + 5 + 8 + 8 + 4 + 17 * 1_000);
    }

    #[test]
    fn keys_of_one_length_give_it_once_where_the_stream_allows() {
        let mutation = add(uuid_sized_keys());
        let uniform = encoded(&mutation, KeyLengths::Uniform);
        assert_eq!(uniform[0], ADD_UNIFORM);
        assert_eq!(uniform.len(), 1 + 2 + 5 + 8 + 8 + 4 + 4 + 16 * 1_000);
        assert_eq!(decode(&uniform).unwrap(), mutation);
        assert_eq!(
            encoded(&mutation, KeyLengths::Varint)[0],
            ADD,
            "not where it does not"
        );
        // Keys of several lengths, an empty key, no key: varint lengths, as before.
        for keys in [
            vec![Bytes::from_static(b"ab"), Bytes::from_static(b"abc")],
            vec![Bytes::new(), Bytes::new()],
            vec![],
        ] {
            let mutation = add(keys);
            let bytes = encoded(&mutation, KeyLengths::Uniform);
            assert_eq!(bytes[0], ADD, "{mutation:?}");
            assert_eq!(decode(&bytes).unwrap(), mutation);
        }
    }

    #[test]
    fn keys_of_one_length_that_do_not_add_up_are_refused() {
        let bytes = encoded(
            &add(vec![Bytes::from_static(b"ab"), Bytes::from_static(b"cd")]),
            KeyLengths::Uniform,
        );
        let count_at = bytes.len() - 4 - 4 - 4;
        let with = |at: usize, value: u32| {
            let mut changed = bytes.clone();
            changed[at..at + 4].copy_from_slice(&value.to_le_bytes());
            decode(&changed).unwrap_err().0
        };
        assert!(with(count_at, 3).contains("claims 3 keys of 2 bytes in 4 bytes"));
        assert!(with(count_at, u32::MAX).contains("claims"));
        assert!(with(count_at + 4, u32::MAX).contains("claims"));
        assert!(with(count_at, 0).contains("0 keys of one length"));
        assert!(with(count_at + 4, 0).contains("of one length, 0 bytes"));
        assert!(
            with(count_at, 1).contains("2 unexpected trailing bytes"),
            "a key's bytes left over"
        );
    }

    #[test]
    fn a_padded_or_oversized_key_length_is_refused() {
        let mut bytes = encoded(&add(vec![Bytes::from_static(b"ab")]), KeyLengths::Varint);
        let length_at = bytes.len() - 3;
        assert_eq!(bytes[length_at], 2);
        let mut padded = bytes.clone();
        padded.splice(length_at..=length_at, [0x82, 0x00]);
        assert!(decode(&padded)
            .unwrap_err()
            .0
            .contains("more bytes than it needs"));
        bytes.splice(length_at..=length_at, [0xff, 0xff, 0xff, 0xff, 0x7f]);
        assert!(decode(&bytes).is_err());
    }
}
