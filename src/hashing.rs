//! Keyed hashing of keys: one 128-bit hash per key feeds every filter probe and names the key's tombstone.
//!
//! The hash is keyed with a per-deployment secret so that an attacker who does not know it cannot precompute
//! keys that pass the filter or that collide in the tombstone store. 128 bits make it safe to store a tombstone
//! under the hash instead of the key: two distinct keys share a hash with probability about n²/2¹²⁹, which for
//! a billion tombstones is ~10⁻²¹ — a tombstone matching a different key would be a false "absent".
//!
//! XXH3-128 with a custom secret hashes a 16-byte key in a few nanoseconds, a small part of a lookup whose cost
//! is the one cache miss per filter window.

use rand::{RngCore, SeedableRng};
use xxhash_rust::xxh3::xxh3_128_with_secret;

/// Size of the secret XXH3 mixes into every hash (its minimum is 136 bytes).
const SECRET_BYTES: usize = 192;

/// The 128-bit keyed hash of one key.
///
/// `hi` picks the filter block and the tombstone shard; `lo` supplies the bit positions inside a block and
/// the tombstone slot, so the parts a lookup uses are independent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash {
    /// Upper 64 bits.
    pub hi: u64,
    /// Lower 64 bits.
    pub lo: u64,
}

/// Hashes keys with the deployment's secret.
#[derive(Clone)]
pub struct KeyHasher {
    /// The 32-byte seed the secret is derived from: what a snapshot persists so a restarted gate hashes keys
    /// exactly as before.
    seed: [u8; 32],
    /// The expanded XXH3 secret.
    secret: Box<[u8; SECRET_BYTES]>,
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret: it is what keeps attackers from precomputing keys.
        f.debug_struct("KeyHasher").finish_non_exhaustive()
    }
}

impl KeyHasher {
    /// A hasher with a fresh random secret.
    pub fn random() -> Self {
        let mut seed = [0u8; 32];
        rand::rng().fill_bytes(&mut seed);
        Self::from_seed(seed)
    }

    /// A hasher whose secret is derived from `seed`; the same seed always hashes keys the same way.
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let mut secret = Box::new([0u8; SECRET_BYTES]);
        rand::rngs::StdRng::from_seed(seed).fill_bytes(&mut secret[..]);
        Self { seed, secret }
    }

    /// The seed this hasher was built from.
    pub fn seed(&self) -> [u8; 32] {
        self.seed
    }

    /// The keyed 128-bit hash of `key`.
    #[inline]
    pub fn hash(&self, key: &[u8]) -> KeyHash {
        let h = xxh3_128_with_secret(key, &self.secret[..]);
        KeyHash {
            hi: (h >> 64) as u64,
            lo: h as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_hash_other_seed_other_hash() {
        let a = KeyHasher::from_seed([7; 32]);
        let b = KeyHasher::from_seed([7; 32]);
        let c = KeyHasher::from_seed([8; 32]);
        assert_eq!(a.hash(b"user:42"), b.hash(b"user:42"));
        assert_ne!(a.hash(b"user:42"), c.hash(b"user:42"));
        assert_ne!(a.hash(b"user:42"), a.hash(b"user:43"));
    }

    #[test]
    fn debug_does_not_reveal_the_secret() {
        let text = format!("{:?}", KeyHasher::from_seed([1; 32]));
        assert_eq!(text, "KeyHasher { .. }");
    }
}
