//! An `Add`'s keys as the gate holds them: [`PackedKeys`], every key end to end in one allocation, and
//! [`KeyBuffer`], what a decoder appends keys to one at a time before packing them. Every layer passes keys
//! on in these (the log's codec, the replay buffer, both write paths, the service's request decoding).

use bytes::Bytes;

/// Keys packed end to end in one allocation, with their end offsets in another.
///
/// Why not the `Vec<Bytes>` an `Add` arrives with: each `Bytes` is 32 bytes beside its key and keeps the
/// whole request buffer it was cut from alive (tonic reads a message into a buffer that may be twice its
/// size). Measured on 10M 11-byte keys added in 10,000-key Adds: the replay buffer counted 16.7 MB but held
/// 26 MB of heap. Packed, a key costs its length plus 4 bytes, exactly, and the request's buffer is freed
/// as soon as the `Add` is applied: the same bytes of buffer hold about three times as many keys.
#[derive(Clone, PartialEq, Eq)]
pub struct PackedKeys {
    /// Every key's bytes, in order.
    data: Bytes,
    /// `ends[i]` is where key `i` ends in `data` (it starts where key `i - 1` ends).
    ends: Box<[u32]>,
}

impl PackedKeys {
    /// Copies `keys` into one buffer. Keys are at most `max_key_bytes` and a batch at most `max_batch_keys`
    /// of them, so offsets fit in a `u32` (checked: a batch past 4 GiB would be refused long before here).
    pub fn pack(keys: &[Bytes]) -> Self {
        Self::from_slices(keys.iter().map(|key| &key[..]))
    }

    /// Copies the keys `keys` yields into one buffer (see [`pack`](Self::pack)).
    pub fn from_slices<'a>(keys: impl ExactSizeIterator<Item = &'a [u8]> + Clone) -> Self {
        let total: usize = keys.clone().map(<[u8]>::len).sum();
        let mut data = Vec::with_capacity(total);
        let ends = keys
            .map(|key| {
                data.extend_from_slice(key);
                u32::try_from(data.len()).expect("an Add's keys total under 4 GiB")
            })
            .collect();
        Self {
            data: Bytes::from(data),
            ends,
        }
    }

    /// Reads `count` keys from `next` into one buffer as they come, in one pass: for a decoder whose keys
    /// arrive framed in a record of `at_most` bytes, so that no list of them is built first. Measured on a
    /// replica applying 1,000-key Adds of 16-byte keys: collecting the record's keys as slices first, then
    /// packing them (a growing `Vec` and two passes) took 3-6% more of its CPU (three pairs of runs).
    pub fn read<'a, E>(
        count: usize,
        at_most: usize,
        mut next: impl FnMut() -> Result<&'a [u8], E>,
    ) -> Result<Self, E> {
        let mut data = Vec::with_capacity(at_most);
        let mut ends = Vec::with_capacity(count);
        for _ in 0..count {
            data.extend_from_slice(next()?);
            ends.push(u32::try_from(data.len()).expect("an Add's keys total under 4 GiB"));
        }
        // The framing is not kept: give its bytes back, so that what `bytes` counts is what is held.
        data.shrink_to_fit();
        Ok(Self {
            data: Bytes::from(data),
            ends: ends.into_boxed_slice(),
        })
    }

    /// The keys of `parts`, in order, in one buffer: one copy per part (concurrent `Add`s merged into one
    /// message). One part is returned as it is, without a copy.
    pub fn concat(parts: &[&PackedKeys]) -> Self {
        if let [only] = parts {
            return (*only).clone();
        }
        let mut data = Vec::with_capacity(parts.iter().map(|part| part.data.len()).sum());
        let mut ends = Vec::with_capacity(parts.iter().map(|part| part.len()).sum());
        for part in parts {
            let base = u32::try_from(data.len()).expect("an Add's keys total under 4 GiB");
            data.extend_from_slice(&part.data);
            ends.extend(part.ends.iter().map(|end| {
                base.checked_add(*end)
                    .expect("an Add's keys total under 4 GiB")
            }));
        }
        Self {
            data: Bytes::from(data),
            ends: ends.into_boxed_slice(),
        }
    }

    /// `count` keys of `length` bytes each, back to back in `keys` (a copy is taken, so that what
    /// [`bytes`](Self::bytes) counts is what is held, not the buffer `keys` was cut from). `None` if `keys`
    /// is not `count × length` bytes or `length` is 0 (zero-length keys would make `count` unbounded).
    pub fn uniform(keys: &[u8], count: usize, length: usize) -> Option<Self> {
        if length == 0 || count.checked_mul(length) != Some(keys.len()) {
            return None;
        }
        let length = u32::try_from(length).ok()?;
        u32::try_from(keys.len()).ok()?;
        Some(Self {
            data: Bytes::copy_from_slice(keys),
            ends: (1..=count as u32).map(|i| i * length).collect(),
        })
    }

    /// The length every key has, if there is at least one key and they all have the same, non-zero one.
    pub fn uniform_length(&self) -> Option<usize> {
        let first = *self.ends.first()?;
        let uniform = first > 0
            && self
                .ends
                .windows(2)
                .all(|pair| pair[1].wrapping_sub(pair[0]) == first);
        uniform.then_some(first as usize)
    }

    /// Every key's bytes, back to back (the keys' lengths are not in it).
    pub fn concatenated(&self) -> &[u8] {
        &self.data
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The keys, in order, borrowed (no reference count taken).
    pub fn slices(&self) -> impl ExactSizeIterator<Item = &[u8]> + Clone + '_ {
        (0..self.ends.len()).map(|i| {
            let start = if i == 0 { 0 } else { self.ends[i - 1] };
            &self.data[start as usize..self.ends[i] as usize]
        })
    }

    /// The keys, in order (each shares the packed buffer: no copy).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Bytes> + '_ {
        self.slices().map(|key| self.data.slice_ref(key))
    }

    /// Bytes held: the keys and their offsets.
    pub fn bytes(&self) -> usize {
        self.data.len() + std::mem::size_of_val(&*self.ends)
    }
}

/// Keys appended one at a time into one buffer, for a decoder that meets them one by one with no count
/// ahead (an `Add` request's repeated `keys`): one allocation for all of them instead of one `Bytes`
/// each, which a replica then drops once it has packed them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KeyBuffer {
    data: Vec<u8>,
    ends: Vec<usize>,
}

impl KeyBuffer {
    /// Appends `key`.
    pub fn push(&mut self, key: &[u8]) {
        self.data.extend_from_slice(key);
        self.ends.push(self.data.len());
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The keys, in order.
    pub fn slices(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.ends.len()).map(|i| {
            let start = if i == 0 { 0 } else { self.ends[i - 1] };
            &self.data[start..self.ends[i]]
        })
    }

    /// The keys packed, without a copy; `None` if they total 4 GiB or more (a request that large is
    /// refused long before, by the message size limit).
    pub fn into_packed(self) -> Option<PackedKeys> {
        let ends = self
            .ends
            .into_iter()
            .map(u32::try_from)
            .collect::<Result<_, _>>()
            .ok()?;
        Some(PackedKeys {
            data: Bytes::from(self.data),
            ends,
        })
    }
}

impl FromIterator<Bytes> for PackedKeys {
    fn from_iter<I: IntoIterator<Item = Bytes>>(keys: I) -> Self {
        Self::pack(&keys.into_iter().collect::<Vec<_>>())
    }
}

impl From<Vec<Bytes>> for PackedKeys {
    fn from(keys: Vec<Bytes>) -> Self {
        Self::pack(&keys)
    }
}

impl std::fmt::Debug for PackedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_keys_give_back_what_was_packed_and_count_their_bytes() {
        let keys: Vec<Bytes> = ["", "a", "key:1234567", "", "\u{0}\u{ff}"]
            .iter()
            .map(|k| Bytes::copy_from_slice(k.as_bytes()))
            .collect();
        let packed = PackedKeys::pack(&keys);
        assert_eq!(packed.len(), keys.len());
        assert_eq!(packed.iter().collect::<Vec<_>>(), keys);
        let key_bytes: usize = keys.iter().map(Bytes::len).sum();
        assert_eq!(packed.bytes(), key_bytes + 4 * keys.len());
        assert!(PackedKeys::pack(&[]).is_empty());
    }

    #[test]
    fn keys_read_one_by_one_pack_as_a_list_does_and_a_failed_read_fails_the_whole() {
        let keys: [&[u8]; 4] = [b"a", b"", b"key:1234567", b"\x00\xff"];
        let mut next = keys.iter().copied();
        let read = PackedKeys::read(keys.len(), 64, || next.next().ok_or("ran out")).unwrap();
        assert_eq!(read, PackedKeys::from_slices(keys.iter().copied()));
        assert_eq!(read.bytes(), 14 + 4 * keys.len());
        let mut short = keys[..2].iter().copied();
        let failed = PackedKeys::read(keys.len(), 64, || short.next().ok_or("ran out"));
        assert_eq!(failed, Err("ran out"));
    }

    #[test]
    fn keys_of_one_length_are_told_apart_and_unpacked_from_one_piece() {
        let of = |keys: &[&str]| PackedKeys::from_slices(keys.iter().map(|k| k.as_bytes()));
        assert_eq!(of(&["ab", "cd", "ef"]).uniform_length(), Some(2));
        assert_eq!(of(&["ab"]).uniform_length(), Some(2));
        for mixed in [&["ab", "c"][..], &["a", "bc"], &["", ""], &[]] {
            assert_eq!(of(mixed).uniform_length(), None, "{mixed:?}");
        }
        let three = of(&["ab", "cd", "ef"]);
        assert_eq!(three.concatenated(), b"abcdef");
        assert_eq!(PackedKeys::uniform(b"abcdef", 3, 2), Some(three));
        assert_eq!(
            PackedKeys::uniform(b"abcdef", 2, 2),
            None,
            "bytes left over"
        );
        assert_eq!(PackedKeys::uniform(b"", 5, 0), None, "keys of no bytes");
        assert_eq!(PackedKeys::uniform(b"ab", usize::MAX, 2), None);
    }

    #[test]
    fn a_key_buffer_packs_what_was_pushed_in_order() {
        let keys: [&[u8]; 4] = [b"a", b"", b"key:1234567", b"\x00\xff"];
        let mut buffer = KeyBuffer::default();
        assert!(buffer.is_empty());
        keys.iter().for_each(|key| buffer.push(key));
        assert_eq!(buffer.slices().collect::<Vec<_>>(), keys);
        assert_eq!(
            buffer.into_packed(),
            Some(PackedKeys::from_slices(keys.iter().copied()))
        );
    }

    #[test]
    fn concatenated_packed_keys_keep_every_part_in_order() {
        let pack = |keys: &[&str]| {
            PackedKeys::from_slices(
                keys.iter()
                    .map(|k| k.as_bytes())
                    .collect::<Vec<_>>()
                    .into_iter(),
            )
        };
        let parts = [pack(&["a", "", "bc"]), pack(&[]), pack(&["", "defg"])];
        let joined = PackedKeys::concat(&parts.iter().collect::<Vec<_>>());
        assert_eq!(
            joined.slices().collect::<Vec<_>>(),
            ["a", "", "bc", "", "defg"].map(str::as_bytes)
        );
        assert_eq!(joined, pack(&["a", "", "bc", "", "defg"]));
        assert_eq!(PackedKeys::concat(&[&parts[0]]), parts[0]);
    }
}
