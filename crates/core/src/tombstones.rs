//! The bounded store of negative entries ("tombstones"): keys the source recently said do not exist.
//!
//! # Why a hand-written table
//!
//! A tombstone must cost little (an attacker controls how many are asked for), must never match another key
//! (that would be a false "absent"), and a store kept full by a flood of one-off keys must answer as fast as
//! a fresh one, since every lookup of the namespace asks it first. The store is a set-associative table:
//! a key may live only in the 16 slots ("ways") of one bucket, chosen by its tag, so a lookup reads one bucket
//! whatever the table has been through, and a full bucket makes room inside itself.
//!
//! # Layout and cost
//!
//! A bucket is split by how often each part is read:
//!
//! - **tags**: the 16 tags (upper 32 bits of the key's fast hash), 64 bytes, one cache line. A lookup of a key
//!   the store does not hold — most lookups — compares its tag with the 16 and stops: one cache miss, no
//!   strong hash, since two keys' tags are equal with probability 2⁻³² per slot;
//! - **entries**: per slot, the key's strong 128-bit keyed hash (its identity, see [`crate::hashing`]) and
//!   its absolute expiry, 24 bytes; read only when a tag matches, and the strong hash is computed then;
//! - **meta**: per slot a hit counter (atomic, bumped under the read lock) and a bit for the kind.
//!
//! That is 30 bytes per slot (Redis null markers cost ~129 per key). A full store fills every slot of every
//! bucket, so it costs about 30 bytes per tombstone; while it grows it doubles its bucket count, from one
//! bucket up to `max_tombstones / 16`, whenever an insert finds its bucket full.
//!
//! Linear probing, the obvious alternative, degrades under exactly the load this store sees: kept at its
//! bound by a flood, with evictions in one place and inserts everywhere, its probe runs grew until a lookup
//! of an absent key cost 17.7 µs (75x a fresh table's) and an insert 90 µs (`cargo bench --bench
//! tombstones`). Bucketed, neither depends on history.
//!
//! # Eviction
//!
//! A key whose bucket is full takes a slot of that bucket: an expired entry's if there is one, otherwise the
//! least hit entry's (ties broken by a rotating start chosen by the incoming tag, so among equals the victim
//! is random). When every entry of the bucket has been hit, all their counters are halved as one is evicted,
//! so hits age. A flood of one-off keys (never hit) therefore evicts its own entries, while tombstones that
//! keep being asked for survive it.
//!
//! # Concurrency
//!
//! The table is split into shards, each behind a `RwLock`. Lookups take a read lock and bump the hit counter
//! atomically; inserts and removals (already serialised per namespace by the gate's writer) take a write lock
//! on one shard.

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::RwLock;

use crate::hashing::{KeyHash, StrongKey};
use crate::prefetch::prefetched_ahead;

/// Why the source says a key does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AbsenceKind {
    /// The source said "not found".
    #[default]
    Missing,
    /// The entity was deleted.
    Deleted,
}

/// Slots per bucket: 16 tags of 4 bytes fill one 64-byte cache line.
pub const WAYS: usize = 16;
/// Bytes of one bucket (tags, entries and meta).
pub const BUCKET_BYTES: u64 = (std::mem::size_of::<Tags>()
    + std::mem::size_of::<[Entry; WAYS]>()
    + std::mem::size_of::<Meta>()) as u64;
/// Shards for stores large enough to benefit; small stores use one so their bound is exact.
const SHARDS: usize = 16;
/// Hit counts stop growing here; halving on eviction brings them down again.
const HITS_CAP: u16 = u16::MAX / 2;

/// The tags of a bucket's slots, in one cache line.
#[derive(Default)]
#[repr(C, align(64))]
struct Tags([u32; WAYS]);

impl Tags {
    /// The slots whose tag is `tag`, as a bit mask (a loop the compiler turns into one vector compare).
    #[inline]
    fn matching(&self, tag: u32) -> u32 {
        self.0
            .iter()
            .enumerate()
            .fold(0, |mask, (way, &t)| mask | (u32::from(t == tag) << way))
    }
}

/// A slot's identity and lifetime; `expires_at_ms == 0` marks the slot empty.
#[derive(Default, Clone, Copy)]
struct Entry {
    strong: StrongKey,
    expires_at_ms: u64,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.expires_at_ms == 0
    }

    fn is_live(&self, now_ms: u64) -> bool {
        self.expires_at_ms > now_ms
    }
}

/// What a bucket keeps per slot beside the entries: hit counters and kinds.
#[derive(Default)]
struct Meta {
    hits: [AtomicU16; WAYS],
    /// Bit `way` set: the slot's tombstone is for a deleted entity.
    deleted: u16,
}

impl Meta {
    fn kind(&self, way: usize) -> AbsenceKind {
        if self.deleted & (1 << way) != 0 {
            AbsenceKind::Deleted
        } else {
            AbsenceKind::Missing
        }
    }

    fn set_kind(&mut self, way: usize, kind: AbsenceKind) {
        let bit = 1 << way;
        match kind {
            AbsenceKind::Deleted => self.deleted |= bit,
            AbsenceKind::Missing => self.deleted &= !bit,
        }
    }

    /// Halves every hit counter: hits age as entries are evicted.
    fn age(&self) {
        for hits in &self.hits {
            hits.store(hits.load(Ordering::Relaxed) / 2, Ordering::Relaxed);
        }
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
    /// Other tombstones evicted to make room: one when a full bucket gave up a slot, occasionally more
    /// when a table grew to its final size (see [`Shard::grow`]).
    pub evicted: u32,
}

/// A slot: bucket and way.
#[derive(Debug, Clone, Copy)]
struct Slot {
    bucket: usize,
    way: usize,
}

/// One shard's set-associative table; the three vectors have one element per bucket.
#[derive(Default)]
struct Shard {
    tags: Vec<Tags>,
    entries: Vec<[Entry; WAYS]>,
    meta: Vec<Meta>,
    /// Occupied slots (live or expired).
    len: usize,
}

impl Shard {
    /// The bucket of a tag: its upper bits, scaled to the bucket count (the shard takes its lower bits).
    fn bucket(&self, tag: u32) -> usize {
        ((u64::from(tag) * self.tags.len() as u64) >> 32) as usize
    }

    /// The slot holding the key with `tag` whose strong hash is `strong()` (computed at most once, and only
    /// if some slot's tag matches).
    #[inline]
    fn find(&self, tag: u32, strong: impl FnOnce() -> StrongKey) -> Option<Slot> {
        if self.tags.is_empty() {
            return None;
        }
        let bucket = self.bucket(tag);
        let mut matches = self.tags[bucket].matching(tag);
        if matches == 0 {
            return None;
        }
        let strong = strong();
        while matches != 0 {
            let way = matches.trailing_zeros() as usize;
            let entry = &self.entries[bucket][way];
            if !entry.is_empty() && entry.strong == strong {
                return Some(Slot { bucket, way });
            }
            matches &= matches - 1;
        }
        None
    }

    /// Whether a live tombstone holds the key with `tag` and strong hash `strong()` at `now_ms`; a hit
    /// counts towards keeping it. Needs only a read lock: the counter is atomic.
    #[inline]
    fn hit(&self, tag: u32, strong: impl FnOnce() -> StrongKey, now_ms: u64) -> bool {
        let Some(Slot { bucket, way }) = self.find(tag, strong) else {
            return false;
        };
        if !self.entries[bucket][way].is_live(now_ms) {
            return false;
        }
        let hits = &self.meta[bucket].hits[way];
        if hits.load(Ordering::Relaxed) < HITS_CAP {
            hits.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Starts loading the tag line `tag` would be found in.
    #[inline]
    fn prefetch(&self, tag: u32) {
        if let Some(tags) = self.tags.get(self.bucket(tag)) {
            crate::prefetch::prefetch(tags);
        }
    }

    /// An empty slot in the bucket of `tag`, if it has one (none before the first bucket exists).
    fn free_slot(&self, tag: u32) -> Option<Slot> {
        if self.tags.is_empty() {
            return None;
        }
        let bucket = self.bucket(tag);
        let way = self.entries[bucket].iter().position(Entry::is_empty)?;
        Some(Slot { bucket, way })
    }

    /// The slot of the bucket of `tag` to give up, by the rule in the module docs; `None` if the bucket is
    /// empty.
    fn victim(&self, tag: u32, now_ms: u64) -> Option<Slot> {
        let bucket = self.bucket(tag);
        let entries = &self.entries[bucket];
        let meta = &self.meta[bucket];
        let start = (tag >> 8) as usize % WAYS;
        let mut least: Option<(u16, usize)> = None;
        for way in (start..start + WAYS).map(|w| w % WAYS) {
            let entry = &entries[way];
            if entry.is_empty() {
                continue;
            }
            if !entry.is_live(now_ms) {
                return Some(Slot { bucket, way });
            }
            let hits = meta.hits[way].load(Ordering::Relaxed);
            if least.is_none_or(|(fewest, _)| hits < fewest) {
                least = Some((hits, way));
            }
        }
        let (hits, way) = least?;
        if hits > 0 {
            meta.age();
        }
        Some(Slot { bucket, way })
    }

    /// Writes a tombstone into `slot`, which must be empty (it then counts as occupied) or be replaced.
    fn write(&mut self, slot: Slot, key: TombstoneKey, tombstone: Written) {
        let Slot { bucket, way } = slot;
        if self.entries[bucket][way].is_empty() {
            self.len += 1;
        }
        self.tags[bucket].0[way] = key.tag;
        self.entries[bucket][way] = Entry {
            strong: key.strong,
            expires_at_ms: tombstone.expires_at_ms,
        };
        let meta = &mut self.meta[bucket];
        meta.hits[way].store(tombstone.hits, Ordering::Relaxed);
        meta.set_kind(way, tombstone.kind);
    }

    /// Empties `slot`.
    fn clear(&mut self, slot: Slot) {
        let Slot { bucket, way } = slot;
        self.tags[bucket].0[way] = 0;
        self.entries[bucket][way] = Entry::default();
        self.meta[bucket].hits[way].store(0, Ordering::Relaxed);
        self.len -= 1;
    }

    /// Every occupied slot.
    fn occupied(&self) -> impl Iterator<Item = Slot> + '_ {
        self.entries
            .iter()
            .enumerate()
            .flat_map(|(bucket, entries)| {
                entries
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| !e.is_empty())
                    .map(move |(way, _)| Slot { bucket, way })
            })
    }

    /// The tombstone in an occupied `slot`.
    fn tombstone(&self, slot: Slot) -> (TombstoneKey, Written) {
        let Slot { bucket, way } = slot;
        let entry = &self.entries[bucket][way];
        let meta = &self.meta[bucket];
        let key = TombstoneKey {
            tag: self.tags[bucket].0[way],
            strong: entry.strong,
        };
        let written = Written {
            expires_at_ms: entry.expires_at_ms,
            kind: meta.kind(way),
            hits: meta.hits[way].load(Ordering::Relaxed),
        };
        (key, written)
    }

    /// Doubles the bucket count (up to `max_buckets`) and places every entry again; returns how many were
    /// evicted. Doubling splits each bucket in two (a tag's bucket `b` becomes `2b` or `2b + 1`), so nothing
    /// is evicted then; only the last step, to a `max_buckets` that is not a power of two times the start,
    /// can bring more than 16 entries into one bucket, and the extra ones go by the eviction rule.
    fn grow(&mut self, max_buckets: usize, now_ms: u64) -> u32 {
        let buckets = (self.tags.len() * 2).clamp(1, max_buckets);
        let old = std::mem::replace(self, Shard::with_buckets(buckets));
        let mut evicted = 0;
        for slot in old.occupied() {
            let (key, written) = old.tombstone(slot);
            let slot = match self.free_slot(key.tag) {
                Some(free) => free,
                None => {
                    evicted += 1;
                    self.victim(key.tag, now_ms)
                        .expect("a full bucket has a victim")
                }
            };
            self.write(slot, key, written);
        }
        evicted
    }

    fn with_buckets(buckets: usize) -> Self {
        Shard {
            tags: (0..buckets).map(|_| Tags::default()).collect(),
            entries: vec![[Entry::default(); WAYS]; buckets],
            meta: (0..buckets).map(|_| Meta::default()).collect(),
            len: 0,
        }
    }
}

/// What a slot is written with beside its key.
#[derive(Debug, Clone, Copy)]
struct Written {
    expires_at_ms: u64,
    kind: AbsenceKind,
    hits: u16,
}

/// A namespace's bounded tombstone store.
pub struct TombstoneStore {
    shards: Box<[RwLock<Shard>]>,
    /// Entries a shard may hold: its final bucket count's slots, or fewer for a store under 16 entries.
    max_per_shard: usize,
    /// Bucket count at which a shard stops growing: `max_tombstones / shards / 16`, at least one.
    max_buckets: usize,
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
    /// A store that never holds more than `max_tombstones` entries. Rounding the bound down to whole
    /// buckets loses less than 16 slots per shard (under 2% of any bound of 1,024 or more).
    pub fn new(max_tombstones: u64) -> Self {
        let max_tombstones = usize::try_from(max_tombstones).unwrap_or(usize::MAX);
        let shards = if max_tombstones >= SHARDS * 64 {
            SHARDS
        } else {
            1
        };
        let per_shard = max_tombstones / shards;
        let max_buckets = (per_shard / WAYS).max(1);
        Self {
            shards: (0..shards).map(|_| RwLock::new(Shard::default())).collect(),
            max_per_shard: per_shard.min(max_buckets * WAYS),
            max_buckets,
            len: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// The shard of a tag: its low bits (the bucket uses its high bits).
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
        lock!(self.shard(tag), read).hit(tag, strong, now_ms)
    }

    /// [`lookup`](Self::lookup) of many keys, in order, into `found`; `strong(i)` is key `i`'s strong hash.
    /// A batch takes each shard's read lock once rather than once per key (writers, which take one shard
    /// at a time, wait for the batch), and prefetches the tag lines of the keys a few places ahead, so that
    /// their cache misses overlap.
    pub fn lookup_many(
        &self,
        hashes: &[KeyHash],
        strong: impl Fn(usize) -> StrongKey,
        now_ms: u64,
        found: &mut Vec<bool>,
    ) {
        found.clear();
        if self.is_empty() {
            found.resize(hashes.len(), false);
            return;
        }
        let shards: Vec<_> = self.shards.iter().map(|s| lock!(s, read)).collect();
        let shard = |tag: u32| &shards[tag as usize & (shards.len() - 1)];
        prefetched_ahead(
            hashes,
            found,
            |hash| shard(tag(*hash)).prefetch(tag(*hash)),
            |i, hash| shard(tag(*hash)).hit(tag(*hash), || strong(i), now_ms),
        );
    }

    /// Stores (or replaces) the tombstone of `key`, evicting another if its bucket or the store is full.
    pub fn insert(
        &self,
        key: TombstoneKey,
        kind: AbsenceKind,
        expires_at_ms: u64,
        now_ms: u64,
    ) -> Inserted {
        let written = Written {
            expires_at_ms: expires_at_ms.max(1),
            kind,
            hits: 0,
        };
        let mut shard = lock!(self.shard(key.tag), write);
        if let Some(slot) = shard.find(key.tag, || key.strong) {
            let hits = shard.meta[slot.bucket].hits[slot.way].load(Ordering::Relaxed);
            shard.write(slot, key, Written { hits, ..written });
            return Inserted {
                replaced: true,
                evicted: 0,
            };
        }
        if self.max_per_shard == 0 {
            return Inserted::default();
        }
        let len_before = shard.len;
        let mut evicted = 0;
        let slot = loop {
            let free = shard.free_slot(key.tag);
            if let Some(free) = free.filter(|_| shard.len < self.max_per_shard) {
                break free;
            }
            if free.is_none() && shard.tags.len() < self.max_buckets {
                let buckets = shard.tags.len();
                evicted += shard.grow(self.max_buckets, now_ms);
                self.bytes.fetch_add(
                    (shard.tags.len() - buckets) as u64 * BUCKET_BYTES,
                    Ordering::Relaxed,
                );
                continue;
            }
            // Full bucket of a grown table, or a store under 16 entries at its bound: make room here.
            let victim = shard
                .victim(key.tag, now_ms)
                .expect("a full store's bucket is occupied");
            shard.clear(victim);
            evicted += 1;
            break victim;
        };
        shard.write(slot, key, written);
        let len_after = shard.len;
        drop(shard);
        self.len.fetch_add(len_after as u64, Ordering::Relaxed);
        self.len.fetch_sub(len_before as u64, Ordering::Relaxed);
        Inserted {
            replaced: false,
            evicted,
        }
    }

    /// Removes the tombstone of the key with fast hash `hash` and strong hash `strong()` (computed only if
    /// a slot's tag matches); returns whether a live one was removed.
    pub fn remove(&self, hash: KeyHash, strong: impl FnOnce() -> StrongKey, now_ms: u64) -> bool {
        if self.len.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let tag = tag(hash);
        let mut shard = lock!(self.shard(tag), write);
        let Some(slot) = shard.find(tag, strong) else {
            return false;
        };
        let was_live = shard.entries[slot.bucket][slot.way].is_live(now_ms);
        shard.clear(slot);
        self.len.fetch_sub(1, Ordering::Relaxed);
        was_live
    }

    /// Removes every expired tombstone; returns how many.
    pub fn purge_expired(&self, now_ms: u64) -> usize {
        let mut purged = 0;
        for shard in self.shards.iter() {
            let mut shard = lock!(shard, write);
            let expired: Vec<Slot> = shard
                .occupied()
                .filter(|s| !shard.entries[s.bucket][s.way].is_live(now_ms))
                .collect();
            for slot in &expired {
                shard.clear(*slot);
            }
            purged += expired.len();
        }
        self.len.fetch_sub(purged as u64, Ordering::Relaxed);
        purged
    }

    /// Live tombstones at `now_ms`.
    pub fn live(&self, now_ms: u64) -> Vec<Tombstone> {
        let mut live = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock!(shard, read);
            live.extend(shard.occupied().filter_map(|slot| {
                let (key, written) = shard.tombstone(slot);
                (written.expires_at_ms > now_ms).then_some(Tombstone {
                    key,
                    expires_at_ms: written.expires_at_ms,
                    kind: written.kind,
                })
            }));
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
mod tests;
