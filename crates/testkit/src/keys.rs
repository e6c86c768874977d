//! The harness's keys: 16-byte (UUID-sized), random-looking and distinct, numbered so that a run can name
//! key spaces (added, never added) by ranges of numbers.

use bytes::Bytes;

/// A bijective 64-bit mix (SplitMix64's finaliser).
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The `i`-th 16-byte key (the size of a UUID): random-looking, distinct for distinct `i`.
pub fn key_bytes(i: u64) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&mix(i).to_le_bytes());
    bytes[8..].copy_from_slice(&mix(i ^ 0x5555_5555_5555_5555).to_le_bytes());
    bytes
}

/// Keys `indexes` as slices of one buffer (one allocation for all of them).
pub fn keys(indexes: impl Iterator<Item = u64>) -> Vec<Bytes> {
    let mut buffer = Vec::new();
    indexes.for_each(|i| buffer.extend_from_slice(&key_bytes(i)));
    let buffer = Bytes::from(buffer);
    (0..buffer.len() / 16)
        .map(|k| buffer.slice(k * 16..k * 16 + 16))
        .collect()
}

/// Keys concatenated, each preceded by its varint length (`BatchMayExistRequest.packed_keys`).
pub fn pack(keys: &[Bytes]) -> Bytes {
    let mut packed = Vec::with_capacity(keys.len() * 17);
    for key in keys {
        prost::encoding::encode_varint(key.len() as u64, &mut packed);
        packed.extend_from_slice(key);
    }
    packed.into()
}
