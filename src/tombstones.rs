//! The bounded store of negative entries ("tombstones"): keys the source recently said do not exist.
//!
//! # Why a hand-written table
//!
//! A tombstone must cost little (an attacker controls how many are asked for) and must never match another
//! key (that would be a false "absent"). Each entry lives in an open-addressing table with linear probing,
//! in a 32-byte slot and with no per-entry allocation: the key's strong 128-bit keyed hash (its identity, see
//! [`crate::hashing`]), its absolute expiry, a 32-bit tag from the fast hash, a hit counter and the kind.
//! The tag places the entry (shard and home slot) and lets a lookup skip non-matching slots without
//! computing the strong hash; the strong hash is computed only when a tag matches. Tables grow by doubling up
//! to the size that holds `max_tombstones` at a load of at most 85%, so a full store costs about
//! 32 / 0.85 ≈ 38 bytes per tombstone (Redis null markers cost ~129).
//!
//! # Eviction
//!
//! When full, a CLOCK hand sweeps the table: an expired slot is taken at once; a slot with hits has its
//! counter halved and is passed over (so a hot tombstone survives while it keeps being hit); the first slot
//! found with no hits is evicted. After 64 hit slots in a row the least hit of them goes. A flood of one-off
//! keys therefore evicts mostly its own entries, while frequently hit tombstones survive.
//!
//! # Concurrency
//!
//! The table is split into shards, each behind a `RwLock`. Lookups take a read lock and bump the hit counter
//! atomically; inserts and removals (already serialised per namespace by the gate's writer) take a write lock
//! on one shard.

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::RwLock;

use crate::hashing::{KeyHash, StrongKey};

/// Why the source says a key does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AbsenceKind {
    /// The source said "not found".
    #[default]
    Missing,
    /// The entity was deleted.
    Deleted,
}

/// Highest load factor a table reaches before it grows; linear probing stays short below it.
const MAX_LOAD: f64 = 0.85;
/// Shards for stores large enough to benefit; small stores use one so their bound is exact.
const SHARDS: usize = 16;
/// Hit counts stop growing here; halving on each sweep brings them down again.
const HITS_CAP: u16 = u16::MAX / 2;
/// How many hit slots the CLOCK hand passes before it evicts the least hit of them.
const CLOCK_SCAN: usize = 64;
/// Bytes of one slot.
pub const SLOT_BYTES: u64 = std::mem::size_of::<Slot>() as u64;

/// One table slot; `expires_at_ms == 0` marks it empty.
#[derive(Default)]
struct Slot {
    strong: StrongKey,
    expires_at_ms: u64,
    tag: u32,
    hits: AtomicU16,
    kind: AbsenceKind,
}

impl Slot {
    fn is_empty(&self) -> bool {
        self.expires_at_ms == 0
    }

    fn is_live(&self, now_ms: u64) -> bool {
        self.expires_at_ms > now_ms
    }
}

/// How a key is known to the store: the tag of its fast hash (placement) and its strong hash (identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TombstoneKey {
    /// Upper 32 bits of the fast hash.
    pub tag: u32,
    /// The strong hash.
    pub strong: StrongKey,
}

/// The tag of a fast hash.
#[inline]
pub fn tag(hash: KeyHash) -> u32 {
    (hash.0 >> 32) as u32
}

/// A live tombstone as seen from outside (for snapshots and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tombstone {
    /// The key.
    pub key: TombstoneKey,
    /// Unix milliseconds at which it stops answering.
    pub expires_at_ms: u64,
    /// Why the key is absent.
    pub kind: AbsenceKind,
}

/// What an insert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Inserted {
    /// A tombstone for the key existed and was replaced.
    pub replaced: bool,
    /// Another tombstone was evicted to make room.
    pub evicted: bool,
}

/// One shard's open-addressing table.
#[derive(Default)]
struct Shard {
    slots: Vec<Slot>,
    /// Occupied slots (live or expired).
    len: usize,
    /// The CLOCK hand's position.
    hand: usize,
}

impl Shard {
    fn home(&self, tag: u32) -> usize {
        ((u64::from(tag) * self.slots.len() as u64) >> 32) as usize
    }

    /// The slot holding the key with `tag` whose strong hash is `strong()` (computed at most once, and only
    /// if some slot's tag matches).
    fn find(&self, tag: u32, strong: impl FnOnce() -> StrongKey) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mut strong = Some(strong);
        let mut known: Option<StrongKey> = None;
        let mut i = self.home(tag);
        // Terminates: the load factor keeps at least one slot empty.
        loop {
            let slot = &self.slots[i];
            if slot.is_empty() {
                return None;
            }
            if slot.tag == tag {
                let key = *known.get_or_insert_with(|| (strong.take().expect("computed once"))());
                if slot.strong == key {
                    return Some(i);
                }
            }
            i = (i + 1) % self.slots.len();
        }
    }

    /// Places a key known to be absent; the caller ensured a free slot.
    fn place(&mut self, key: TombstoneKey, expires_at_ms: u64, kind: AbsenceKind, hits: u16) {
        let mut i = self.home(key.tag);
        while !self.slots[i].is_empty() {
            i = (i + 1) % self.slots.len();
        }
        self.slots[i] = Slot {
            strong: key.strong,
            expires_at_ms,
            tag: key.tag,
            hits: AtomicU16::new(hits),
            kind,
        };
        self.len += 1;
    }

    /// Empties slot `i`, shifting later entries of its probe run back so every entry stays reachable.
    fn remove_at(&mut self, mut hole: usize) {
        let n = self.slots.len();
        self.slots[hole] = Slot::default();
        self.len -= 1;
        let mut next = (hole + 1) % n;
        while !self.slots[next].is_empty() {
            let home = self.home(self.slots[next].tag);
            // Move `next` into the hole unless its home lies cyclically in (hole, next].
            let stays = if hole <= next {
                hole < home && home <= next
            } else {
                hole < home || home <= next
            };
            if !stays {
                self.slots[hole] = std::mem::take(&mut self.slots[next]);
                hole = next;
            }
            next = (next + 1) % n;
        }
    }

    /// Doubles the table (up to `max_slots`), rehashing every entry.
    fn grow(&mut self, max_slots: usize) {
        let size = (self.slots.len() * 2).max(16).min(max_slots);
        let old = std::mem::replace(
            &mut self.slots,
            (0..size).map(|_| Slot::default()).collect(),
        );
        self.len = 0;
        self.hand = 0;
        for slot in old.into_iter().filter(|s| !s.is_empty()) {
            let key = TombstoneKey {
                tag: slot.tag,
                strong: slot.strong,
            };
            self.place(key, slot.expires_at_ms, slot.kind, slot.hits.into_inner());
        }
    }

    /// Evicts one entry by the CLOCK rule in the module docs.
    fn evict_one(&mut self, now_ms: u64) {
        let n = self.slots.len();
        let mut least: Option<(u16, usize)> = None;
        let mut passed = 0;
        loop {
            let i = self.hand;
            self.hand = (self.hand + 1) % n;
            let slot = &self.slots[i];
            if slot.is_empty() {
                continue;
            }
            let hits = slot.hits.load(Ordering::Relaxed);
            if !slot.is_live(now_ms) || hits == 0 {
                return self.remove_at(i);
            }
            slot.hits.store(hits / 2, Ordering::Relaxed);
            if least.is_none_or(|(fewest, _)| hits < fewest) {
                least = Some((hits, i));
            }
            passed += 1;
            if passed == CLOCK_SCAN {
                let (_, victim) = least.expect("passed a slot");
                return self.remove_at(victim);
            }
        }
    }
}

/// A namespace's bounded tombstone store.
pub struct TombstoneStore {
    shards: Box<[RwLock<Shard>]>,
    /// Entries a shard may hold; the store holds at most `shards × max_per_shard ≤ max_tombstones`.
    max_per_shard: usize,
    /// Slot count at which a shard stops growing (holds `max_per_shard` at ≤ 85% load, plus one empty slot).
    max_slots: usize,
    /// Occupied slots across shards (live, or expired and not yet purged).
    len: AtomicU64,
    /// Bytes of all shards' tables.
    bytes: AtomicU64,
}

impl std::fmt::Debug for TombstoneStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TombstoneStore")
            .field("len", &self.len())
            .field("bytes", &self.bytes())
            .finish()
    }
}

/// Locks for reading or writing without propagating poison: a panicking holder cannot leave a slot half
/// written (every write is a whole-slot store), so the table stays usable.
macro_rules! lock {
    ($lock:expr, read) => {
        $lock.read().unwrap_or_else(|e| e.into_inner())
    };
    ($lock:expr, write) => {
        $lock.write().unwrap_or_else(|e| e.into_inner())
    };
}

impl TombstoneStore {
    /// A store that never holds more than `max_tombstones` entries.
    pub fn new(max_tombstones: u64) -> Self {
        let max_tombstones = usize::try_from(max_tombstones).unwrap_or(usize::MAX);
        let shards = if max_tombstones >= SHARDS * 64 {
            SHARDS
        } else {
            1
        };
        let max_per_shard = max_tombstones / shards;
        let max_slots = ((max_per_shard as f64 / MAX_LOAD).ceil() as usize + 1).max(2);
        Self {
            shards: (0..shards).map(|_| RwLock::new(Shard::default())).collect(),
            max_per_shard,
            max_slots,
            len: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// The shard of a tag: its low bits (the home slot uses its high bits).
    fn shard(&self, tag: u32) -> &RwLock<Shard> {
        &self.shards[tag as usize & (self.shards.len() - 1)]
    }

    /// Whether a live tombstone holds the key with fast hash `hash` and strong hash `strong()` at `now_ms`
    /// (the strong hash is computed only if a slot's tag matches); a hit counts towards keeping it.
    #[inline]
    pub fn lookup(&self, hash: KeyHash, strong: impl FnOnce() -> StrongKey, now_ms: u64) -> bool {
        if self.len.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let tag = tag(hash);
        let shard = lock!(self.shard(tag), read);
        let Some(i) = shard.find(tag, strong) else {
            return false;
        };
        let slot = &shard.slots[i];
        if !slot.is_live(now_ms) {
            return false;
        }
        if slot.hits.load(Ordering::Relaxed) < HITS_CAP {
            slot.hits.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Stores (or replaces) the tombstone of `key`, evicting another if the store is full.
    pub fn insert(
        &self,
        key: TombstoneKey,
        kind: AbsenceKind,
        expires_at_ms: u64,
        now_ms: u64,
    ) -> Inserted {
        let expires_at_ms = expires_at_ms.max(1);
        let mut shard = lock!(self.shard(key.tag), write);
        if let Some(i) = shard.find(key.tag, || key.strong) {
            let slot = &mut shard.slots[i];
            slot.expires_at_ms = expires_at_ms;
            slot.kind = kind;
            return Inserted {
                replaced: true,
                evicted: false,
            };
        }
        if self.max_per_shard == 0 {
            return Inserted::default();
        }
        let mut outcome = Inserted::default();
        if shard.len >= self.max_per_shard {
            shard.evict_one(now_ms);
            self.len.fetch_sub(1, Ordering::Relaxed);
            outcome.evicted = true;
        } else if (shard.len + 1) as f64 > shard.slots.len() as f64 * MAX_LOAD {
            let before = shard.slots.len();
            shard.grow(self.max_slots);
            self.bytes.fetch_add(
                (shard.slots.len() - before) as u64 * SLOT_BYTES,
                Ordering::Relaxed,
            );
        }
        shard.place(key, expires_at_ms, kind, 0);
        self.len.fetch_add(1, Ordering::Relaxed);
        outcome
    }

    /// Removes the tombstone of the key with fast hash `hash` and strong hash `strong()` (computed only if
    /// a slot's tag matches); returns whether a live one was removed.
    pub fn remove(&self, hash: KeyHash, strong: impl FnOnce() -> StrongKey, now_ms: u64) -> bool {
        if self.len.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let tag = tag(hash);
        let mut shard = lock!(self.shard(tag), write);
        let Some(i) = shard.find(tag, strong) else {
            return false;
        };
        let was_live = shard.slots[i].is_live(now_ms);
        shard.remove_at(i);
        self.len.fetch_sub(1, Ordering::Relaxed);
        was_live
    }

    /// Removes every expired tombstone; returns how many.
    pub fn purge_expired(&self, now_ms: u64) -> usize {
        let mut purged = 0;
        for shard in self.shards.iter() {
            let mut shard = lock!(shard, write);
            let mut i = 0;
            while i < shard.slots.len() {
                let slot = &shard.slots[i];
                if !slot.is_empty() && !slot.is_live(now_ms) {
                    // The backward shift may pull a later entry into `i`: look at `i` again.
                    shard.remove_at(i);
                    purged += 1;
                } else {
                    i += 1;
                }
            }
        }
        self.len.fetch_sub(purged as u64, Ordering::Relaxed);
        purged
    }

    /// Live tombstones at `now_ms`.
    pub fn live(&self, now_ms: u64) -> Vec<Tombstone> {
        let mut live = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock!(shard, read);
            live.extend(
                shard
                    .slots
                    .iter()
                    .filter(|s| s.is_live(now_ms))
                    .map(|s| Tombstone {
                        key: TombstoneKey {
                            tag: s.tag,
                            strong: s.strong,
                        },
                        expires_at_ms: s.expires_at_ms,
                        kind: s.kind,
                    }),
            );
        }
        live
    }

    /// Stored entries (live, or expired and not yet purged).
    pub fn len(&self) -> u64 {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether the store holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the tables.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::KeyHasher;

    /// A key as the store sees it: its fast hash and its tombstone key.
    #[derive(Clone, Copy)]
    struct Key(KeyHash, TombstoneKey);

    fn keys(n: u32, salt: u32) -> Vec<Key> {
        let hasher = KeyHasher::from_seed([9; 32]);
        (0..n)
            .map(|i| {
                let bytes = [i.to_le_bytes(), salt.to_le_bytes()].concat();
                let hash = hasher.hash(&bytes);
                let strong = hasher.strong(&bytes);
                Key(
                    hash,
                    TombstoneKey {
                        tag: tag(hash),
                        strong,
                    },
                )
            })
            .collect()
    }

    impl TombstoneStore {
        fn has(&self, key: Key, now_ms: u64) -> bool {
            self.lookup(key.0, || key.1.strong, now_ms)
        }

        fn put(&self, key: Key, kind: AbsenceKind, expires_at_ms: u64, now_ms: u64) -> Inserted {
            self.insert(key.1, kind, expires_at_ms, now_ms)
        }

        fn delete(&self, key: Key, now_ms: u64) -> bool {
            self.remove(key.0, || key.1.strong, now_ms)
        }
    }

    #[test]
    fn slots_are_32_bytes() {
        assert_eq!(SLOT_BYTES, 32);
    }

    #[test]
    fn insert_lookup_expire_remove() {
        let store = TombstoneStore::new(1_000);
        let keys = keys(3, 0);
        store.put(keys[0], AbsenceKind::Missing, 1_000, 0);
        store.put(keys[1], AbsenceKind::Deleted, 2_000, 0);
        assert!(store.has(keys[0], 999));
        assert!(!store.has(keys[0], 1_000), "expired at its expiry time");
        assert!(!store.has(keys[2], 0));
        assert!(store.delete(keys[1], 0));
        assert!(!store.has(keys[1], 0));
        assert!(
            !store.delete(keys[0], 1_500),
            "an expired tombstone is not counted as cleared"
        );
        assert!(store.is_empty());
    }

    #[test]
    fn a_tag_collision_never_matches_another_key() {
        let store = TombstoneStore::new(1_000);
        let keys = keys(2, 1);
        // Same fast hash (so same tag and slot), different strong keys: two different keys.
        let impostor = Key(
            keys[0].0,
            TombstoneKey {
                tag: keys[0].1.tag,
                strong: keys[1].1.strong,
            },
        );
        store.put(keys[0], AbsenceKind::Missing, 1_000, 0);
        assert!(!store.has(impostor, 0));
        assert!(!store.delete(impostor, 0));
        store.put(impostor, AbsenceKind::Missing, 1_000, 0);
        assert_eq!(store.len(), 2);
        assert!(store.has(keys[0], 0) && store.has(impostor, 0));
    }

    #[test]
    fn the_strong_hash_is_computed_only_when_a_tag_matches() {
        let store = TombstoneStore::new(1_000);
        let keys = keys(100, 2);
        keys[..50].iter().for_each(|k| {
            store.put(*k, AbsenceKind::Missing, 1_000, 0);
        });
        let computed = std::cell::Cell::new(0);
        for key in &keys[50..] {
            store.lookup(
                key.0,
                || {
                    computed.set(computed.get() + 1);
                    key.1.strong
                },
                0,
            );
        }
        assert_eq!(
            computed.get(),
            0,
            "absent keys never needed the strong hash"
        );
    }

    #[test]
    fn replacing_keeps_one_entry_with_the_new_expiry() {
        let store = TombstoneStore::new(1_000);
        let key = keys(1, 0)[0];
        store.put(key, AbsenceKind::Missing, 1_000, 0);
        let outcome = store.put(key, AbsenceKind::Deleted, 5_000, 0);
        assert!(outcome.replaced);
        assert_eq!(store.len(), 1);
        assert!(store.has(key, 4_000));
        assert_eq!(store.live(0)[0].kind, AbsenceKind::Deleted);
    }

    #[test]
    fn many_inserts_and_removals_keep_every_entry_reachable() {
        let store = TombstoneStore::new(100_000);
        let keys = keys(50_000, 1);
        for key in &keys {
            store.put(*key, AbsenceKind::Missing, 10, 0);
        }
        for key in keys.iter().step_by(2) {
            assert!(store.delete(*key, 0));
        }
        for (i, key) in keys.iter().enumerate() {
            assert_eq!(store.has(*key, 0), i % 2 == 1, "key {i}");
        }
        assert_eq!(store.len(), 25_000);
    }

    #[test]
    fn the_bound_holds_and_memory_per_tombstone_is_small() {
        let store = TombstoneStore::new(10_000);
        for key in keys(50_000, 2) {
            store.put(key, AbsenceKind::Missing, 10, 0);
        }
        assert!(store.len() <= 10_000);
        let per_tombstone = store.bytes() as f64 / store.len() as f64;
        assert!(per_tombstone < 40.0, "{per_tombstone} bytes per tombstone");
    }

    #[test]
    fn expired_entries_are_evicted_first_then_hot_ones_survive_a_flood() {
        let store = TombstoneStore::new(16 * 1024);
        let hot = keys(1_000, 3);
        for key in &hot {
            store.put(*key, AbsenceKind::Missing, 1_000_000, 0);
        }
        let flood = keys(200_000, 4);
        for (i, key) in flood.iter().enumerate() {
            store.put(*key, AbsenceKind::Missing, 1_000_000, 1);
            if i % 2_000 == 0 {
                hot.iter().for_each(|h| {
                    store.has(*h, 1);
                });
            }
        }
        let surviving = hot.iter().filter(|h| store.has(**h, 1)).count();
        assert!(
            surviving >= 950,
            "only {surviving} of 1000 hot tombstones survived"
        );
    }

    #[test]
    fn purge_removes_only_expired() {
        let store = TombstoneStore::new(10_000);
        let keys = keys(2_000, 5);
        for (i, key) in keys.iter().enumerate() {
            store.put(
                *key,
                AbsenceKind::Missing,
                if i % 2 == 0 { 10 } else { 100 },
                0,
            );
        }
        assert_eq!(store.purge_expired(50), 1_000);
        for (i, key) in keys.iter().enumerate() {
            assert_eq!(store.has(*key, 50), i % 2 == 1);
        }
    }

    #[test]
    fn a_zero_bound_stores_nothing() {
        let store = TombstoneStore::new(0);
        store.put(keys(1, 6)[0], AbsenceKind::Missing, 10, 0);
        assert!(store.is_empty());
    }
}
