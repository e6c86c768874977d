//! The keys of a request as it sent them: repeated `keys`, `packed_keys` (varint lengths end to end), or an
//! `Add` read straight into one buffer ([`AddKeys`]).
//!
//! Why [`AddKeys`]: the generated `AddRequest` holds its repeated `keys` as a `Bytes` each, cut from the
//! request's buffer (a reference count taken per key, and a growing `Vec` of them), which the `Add` then
//! copies into one packed buffer and drops. Measured with `perf` on three replicas taking 1,000-key `Add`s of
//! 16-byte keys (the compare bench's `Add` stretches only): decoding those `Bytes` and dropping them was
//! 9–11% of the replicas' CPU. [`AddKeys`] decodes the same wire form, field for field, appending each key to
//! a [`KeyBuffer`] as it is met (a length read and a copy): one allocation for all of them, handed on
//! without another copy. 1,000 16-byte keys are read in 8.4 µs instead of 24.4 (`cargo bench --bench
//! add_request`); the replicas' CPU per 1,000-key `Add` fell from 364–404 to 322–356 µs (compare bench, R1).

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use tonic::Status;

use crate::core::keys::{KeyBuffer, PackedKeys};
use crate::proto;

/// Request bytes from which a batch is answered on the blocking pool rather than on a request thread:
/// about 2,000 16-byte keys, 60 µs of lookups. A request thread busy with a long batch delays every call
/// and shed refusal queued behind it (the runtime has one per core); below this size the hand-off (a few
/// µs) would cost more than it saves. A single server applies an `Add` that large there too (`writes.rs`).
pub(crate) const BLOCKING_BATCH_BYTES: usize = 32 * 1024;

/// `AddRequest` (`proto/existence/v1/existence.proto`) as the gate reads it: field 1 `namespace`, field 2
/// the repeated `keys` (each appended to one buffer), field 3 `packed_keys`; unknown fields skipped, as
/// protobuf requires.
#[derive(Debug, Default, Clone)]
pub struct AddKeys {
    pub namespace: String,
    keys: KeyBuffer,
    packed_keys: Bytes,
    /// Where `prost` reads a key that does not lie whole in the buffer's current chunk (checking its wire
    /// type and length), reused for each.
    scratch: Vec<u8>,
}

/// The request, not the decoder's scratch space.
impl PartialEq for AddKeys {
    fn eq(&self, other: &Self) -> bool {
        (&self.namespace, &self.keys, &self.packed_keys)
            == (&other.namespace, &other.keys, &other.packed_keys)
    }
}

impl AddKeys {
    /// The request's namespace and keys, from `keys` or `packed_keys` (both at once is refused), checked
    /// against `max_keys` as they are unpacked; each key's own checks are the gate's.
    pub fn into_parts(self, max_keys: usize) -> Result<(String, PackedKeys), Status> {
        let keys = match packed_instead(!self.keys.is_empty(), &self.packed_keys, max_keys)? {
            Some(packed) => PackedKeys::from_slices(packed.into_iter()),
            None => self
                .keys
                .into_packed()
                .ok_or_else(|| Status::invalid_argument("an Add's keys total 4 GiB or more"))?,
        };
        Ok((self.namespace, keys))
    }
}

impl From<proto::AddRequest> for AddKeys {
    fn from(request: proto::AddRequest) -> Self {
        let mut keys = KeyBuffer::default();
        request.keys.iter().for_each(|key| keys.push(key));
        Self {
            namespace: request.namespace,
            keys,
            packed_keys: request.packed_keys,
            scratch: Vec::new(),
        }
    }
}

impl prost::Message for AddKeys {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.namespace.is_empty() {
            encoding::string::encode(1, &self.namespace, buf);
        }
        for key in self.keys.slices() {
            encoding::encode_key(2, WireType::LengthDelimited, buf);
            encoding::encode_varint(key.len() as u64, buf);
            buf.put_slice(key);
        }
        if !self.packed_keys.is_empty() {
            encoding::bytes::encode(3, &self.packed_keys, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        match tag {
            1 => encoding::string::merge(wire_type, &mut self.namespace, buf, ctx),
            2 => {
                if wire_type == WireType::LengthDelimited {
                    if let Some(read) = push_key_in_chunk(&mut self.keys, buf.chunk()) {
                        buf.advance(read);
                        return Ok(());
                    }
                }
                // A key split across chunks, or a field that is not one: `prost` reads it (and says
                // what is wrong with it).
                encoding::bytes::merge(wire_type, &mut self.scratch, buf, ctx)?;
                self.keys.push(&self.scratch);
                Ok(())
            }
            3 => encoding::bytes::merge(wire_type, &mut self.packed_keys, buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let namespace = if self.namespace.is_empty() {
            0
        } else {
            encoding::string::encoded_len(1, &self.namespace)
        };
        let keys: usize = self
            .keys
            .slices()
            .map(|key| {
                encoding::key_len(2) + encoding::encoded_len_varint(key.len() as u64) + key.len()
            })
            .sum();
        let packed = if self.packed_keys.is_empty() {
            0
        } else {
            encoding::bytes::encoded_len(3, &self.packed_keys)
        };
        namespace + keys + packed
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

/// Pushes the key at the start of `chunk` (its varint length, then its bytes) if all of it is there, and
/// returns how many bytes it took; `None` leaves the reading to `prost`. A request arrives in one buffer,
/// so this is every key: a length read and a copy, without the scratch buffer in between.
fn push_key_in_chunk(keys: &mut KeyBuffer, chunk: &[u8]) -> Option<usize> {
    let mut rest = chunk;
    let length = usize::try_from(encoding::decode_varint(&mut rest).ok()?).ok()?;
    let key = rest.get(..length)?;
    keys.push(key);
    Some(chunk.len() - rest.len() + length)
}

/// A request's `packed_keys` unpacked if it sent them instead of `keys` (`None`: it sent `keys`); both
/// at once is refused.
pub fn packed_instead(
    keys_sent: bool,
    packed: &[u8],
    max_keys: usize,
) -> Result<Option<Vec<&[u8]>>, Status> {
    match (keys_sent, packed.is_empty()) {
        (_, true) => Ok(None),
        (false, false) => unpack_keys(packed, max_keys).map(Some),
        (true, false) => Err(Status::invalid_argument(
            "send keys or packed_keys, not both",
        )),
    }
}

/// Splits `packed_keys` (each key preceded by its varint length) into key slices, refusing more than
/// `max_keys` keys before collecting them.
pub fn unpack_keys(packed: &[u8], max_keys: usize) -> Result<Vec<&[u8]>, Status> {
    let mut keys = Vec::new();
    let mut rest = packed;
    while !rest.is_empty() {
        let offset = packed.len() - rest.len();
        let length = prost::encoding::decode_varint(&mut rest).map_err(|_| {
            Status::invalid_argument(format!(
                "packed_keys has a malformed length at byte {offset}"
            ))
        })?;
        if length > rest.len() as u64 {
            return Err(Status::invalid_argument(format!(
                "packed_keys[{}] at byte {offset} claims {length} bytes, but only {} remain",
                keys.len(),
                rest.len()
            )));
        }
        if keys.len() == max_keys {
            return Err(Status::invalid_argument(format!(
                "packed_keys has more than {max_keys} keys; the limit is max_batch_keys = {max_keys}"
            )));
        }
        let (key, tail) = rest.split_at(length as usize);
        keys.push(key);
        rest = tail;
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;

    fn request(namespace: &str, keys: &[&[u8]], packed: &[u8]) -> proto::AddRequest {
        proto::AddRequest {
            namespace: namespace.to_string(),
            keys: keys.iter().map(|k| Bytes::copy_from_slice(k)).collect(),
            packed_keys: Bytes::copy_from_slice(packed),
        }
    }

    proptest! {
        /// Whatever the generated type encodes, `AddKeys` reads as the same request, and encodes back to
        /// the same bytes.
        #[test]
        fn reads_what_the_generated_type_writes(
            namespace in "[a-z]{0,8}",
            keys in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..50),
            packed in prop::collection::vec(any::<u8>(), 0..20),
        ) {
            let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            let sent = request(&namespace, &keys, &packed);
            let wire = sent.encode_to_vec();
            let read = AddKeys::decode(&wire[..]).unwrap();
            prop_assert_eq!(&read, &AddKeys::from(sent));
            prop_assert_eq!(read.keys.slices().collect::<Vec<_>>(), keys);
            prop_assert_eq!(&read.encode_to_vec(), &wire);
            prop_assert_eq!(read.encoded_len(), read.encode_to_vec().len());
            // Split in two chunks anywhere: a key across the split is read by `prost`, the rest in place.
            for at in 0..=wire.len() {
                let split = AddKeys::decode((&wire[..at]).chain(&wire[at..])).unwrap();
                prop_assert_eq!(&split, &read, "split at {}", at);
            }
        }

        /// Bytes the generated type refuses, `AddKeys` refuses too; bytes it reads, `AddKeys` reads alike,
        /// in one chunk or two.
        #[test]
        fn refuses_what_the_generated_type_refuses(
            bytes in prop::collection::vec(any::<u8>(), 0..64),
            at in any::<prop::sample::Index>(),
        ) {
            let at = at.index(bytes.len() + 1);
            let generated = proto::AddRequest::decode(&bytes[..]);
            for read in [AddKeys::decode(&bytes[..]), AddKeys::decode((&bytes[..at]).chain(&bytes[at..]))] {
                prop_assert_eq!(generated.is_ok(), read.is_ok(), "{:?} / {:?}", generated, read);
                if let (Ok(generated), Ok(read)) = (&generated, read) {
                    prop_assert_eq!(read, AddKeys::from(generated.clone()));
                }
            }
        }
    }

    #[test]
    fn unknown_fields_are_skipped_and_one_form_of_keys_is_taken() {
        let mut wire = request("users", &[b"a", b"bc"], b"").encode_to_vec();
        // Field 9, a varint: a newer client's field this build does not know.
        wire.extend_from_slice(&[9 << 3, 1]);
        let (namespace, keys) = AddKeys::decode(&wire[..]).unwrap().into_parts(10).unwrap();
        assert_eq!(namespace, "users");
        assert_eq!(keys.slices().collect::<Vec<_>>(), [&b"a"[..], b"bc"]);

        let packed = AddKeys::from(request("", &[], &[1, b'a', 2, b'b', b'c']));
        assert_eq!(packed.into_parts(10).unwrap().1, keys);

        let both = AddKeys::from(request("", &[b"a"], &[1, b'a']));
        let refused = both.into_parts(10).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert_eq!(refused.message(), "send keys or packed_keys, not both");
        let too_many = AddKeys::from(request("", &[], &[1, b'a', 1, b'b']));
        assert!(too_many
            .into_parts(1)
            .unwrap_err()
            .message()
            .contains("max_batch_keys = 1"));
    }
}
