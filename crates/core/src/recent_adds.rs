//! A bounded memory of when keys were last added, to refuse stale absences.
//!
//! The race it closes: a caller reads the source and finds nothing; meanwhile someone inserts the key and
//! `Add`s it; then the caller records the absence. Stored, that tombstone would answer a false "absent" until
//! it expires. So `RecordAbsent` carries the `observed_seq` of the lookup that sent the caller to the source,
//! and is refused (`SUPERSEDED`) if the key may have been added after it.
//!
//! Per-key history would grow without bound, so this keeps a fixed array of seqs, like a count-min sketch
//! whose cells hold the newest seq instead of a count: an `Add` writes its seq into the key's two cells; the
//! newest `Add` of a key is at most the smaller of its two cells. If that bound is ≤ `observed_seq` the key
//! was certainly not added since; otherwise it may have been. A collision only ever errs towards
//! `SUPERSEDED` (a lost tombstone, never a wrong one). With 2¹⁷ cells and two probes, a false `SUPERSEDED`
//! needs both cells of a key overwritten by the `A` keys added since the caller's lookup (each writes two
//! cells): probability about `(1 - e^(-2A/2¹⁷))²` — 0.02% for A = 1,000, 0.35% for A = 4,000.

use crate::hashing::KeyHash;

/// Number of cells (a power of two); 1 MiB of seqs per namespace, of address space: the cells start zeroed
/// (pages the allocator maps lazily), so a namespace costs memory only for the cells its `Add`s touched.
const CELLS: usize = 1 << 17;

/// Bytes of one namespace's cells (allocated at once; resident as `Add`s touch them, all of them after a
/// few hundred thousand keys).
pub const BYTES: usize = CELLS * std::mem::size_of::<u64>();

/// A [`RecentAdds`] as a snapshot holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecentAddsImage {
    /// The bound every key shares.
    pub floor: u64,
    /// The cells that are not 0: `(cell, seq)`, in cell order.
    pub cells: Vec<(u32, u64)>,
}

/// Upper bounds on the seq of each key's most recent `Add`.
pub struct RecentAdds {
    cells: Box<[u64]>,
    /// A bound every key shares (the seq of a restored snapshot): kept apart instead of written into every
    /// cell, which would make each namespace's 1 MiB resident after a restart (1,000 namespaces: 1 GiB).
    floor: u64,
}

impl std::fmt::Debug for RecentAdds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecentAdds").finish_non_exhaustive()
    }
}

impl Default for RecentAdds {
    fn default() -> Self {
        Self::with_floor(0)
    }
}

impl RecentAdds {
    /// A memory that assumes every key may have been added at `seq` (after a restart, when which keys were
    /// added recently is no longer known): any observation older than `seq` is then `SUPERSEDED`.
    pub fn with_floor(seq: u64) -> Self {
        Self {
            cells: vec![0; CELLS].into_boxed_slice(),
            floor: seq,
        }
    }

    /// The key's two cells, from two disjoint runs of hash bits.
    fn cells(hash: KeyHash) -> [usize; 2] {
        let mask = CELLS as u64 - 1;
        [(hash.0 & mask) as usize, ((hash.0 >> 17) & mask) as usize]
    }

    /// Records that `hash` was added at `seq` (seqs arrive in increasing order).
    fn record(&mut self, hash: KeyHash, seq: u64) {
        for cell in Self::cells(hash) {
            self.cells[cell] = seq;
        }
    }

    /// Records that every one of `hashes` was added at `seq`, each key's cells prefetched
    /// [`LOOKAHEAD`](crate::prefetch::LOOKAHEAD) keys ahead. The cells are 1 MiB, so a key's two stores
    /// almost always miss the core's cache; taken one after another they filled the store buffer and
    /// were ~8% of a replica's CPU applying 1,000-key `Add`s (`perf annotate` of `apply_locked`).
    pub fn record_all(&mut self, hashes: &[KeyHash], seq: u64) {
        crate::prefetch::visit_prefetched_ahead(
            hashes,
            self,
            |adds, hash| {
                Self::cells(*hash)
                    .into_iter()
                    .for_each(|cell| crate::prefetch::prefetch(&adds.cells[cell]))
            },
            |adds, _, hash| adds.record(*hash, seq),
        );
    }

    /// Its whole content, for a snapshot: the floor and every cell that is not 0, as `(cell, seq)`. A
    /// namespace restored from it decides `SUPERSEDED` exactly as this one does, which replicas applying
    /// one stream need (a floor alone would refuse every absence observed before the snapshot).
    pub fn export(&self) -> RecentAddsImage {
        RecentAddsImage {
            floor: self.floor,
            cells: self
                .cells
                .iter()
                .enumerate()
                .filter(|(_, seq)| **seq != 0)
                .map(|(cell, seq)| (cell as u32, *seq))
                .collect(),
        }
    }

    /// The memory an [`export`](Self::export) describes; `None` if a cell is out of range (a damaged or
    /// foreign image). Cells left 0 stay untouched, so a namespace with few recent adds stays small.
    pub fn restore(image: &RecentAddsImage) -> Option<Self> {
        let mut restored = Self::with_floor(image.floor);
        for &(cell, seq) in &image.cells {
            *restored.cells.get_mut(cell as usize)? = seq;
        }
        Some(restored)
    }

    /// Whether `hash` may have been added after `observed_seq`.
    pub fn may_have_been_added_after(&self, hash: KeyHash, observed_seq: u64) -> bool {
        let newest_bound = Self::cells(hash)
            .into_iter()
            .map(|cell| self.cells[cell])
            .min()
            .unwrap_or(0)
            .max(self.floor);
        newest_bound > observed_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::KeyHasher;

    #[test]
    fn an_add_after_the_observation_is_always_seen() {
        let hasher = KeyHasher::from_seed([1; 32]);
        let mut adds = RecentAdds::default();
        for seq in 1..=50_000u64 {
            adds.record(hasher.hash(&seq.to_le_bytes()), seq);
        }
        for seq in 1..=50_000u64 {
            let hash = hasher.hash(&seq.to_le_bytes());
            assert!(adds.may_have_been_added_after(hash, seq - 1));
        }
    }

    #[test]
    fn a_batch_records_every_key_as_one_by_one() {
        let hasher = KeyHasher::from_seed([4; 32]);
        let (mut batched, mut one_by_one) = (RecentAdds::default(), RecentAdds::default());
        for seq in 1..=40u64 {
            let hashes: Vec<KeyHash> = (0..seq * 25)
                .map(|i| hasher.hash(&(seq << 32 | i).to_le_bytes()))
                .collect();
            batched.record_all(&hashes, seq);
            hashes.iter().for_each(|hash| one_by_one.record(*hash, seq));
        }
        assert_eq!(batched.export(), one_by_one.export());
        assert!(batched.export().cells.len() > 10_000);
    }

    #[test]
    fn a_floor_bounds_every_key_until_a_later_add() {
        let hasher = KeyHasher::from_seed([3; 32]);
        let mut adds = RecentAdds::with_floor(100);
        let (early, late) = (hasher.hash(b"early"), hasher.hash(b"late"));
        assert!(adds.may_have_been_added_after(early, 99));
        assert!(!adds.may_have_been_added_after(early, 100));
        adds.record(late, 150);
        assert!(adds.may_have_been_added_after(late, 149));
        assert!(!adds.may_have_been_added_after(late, 150));
        assert!(!adds.may_have_been_added_after(early, 100));
    }

    #[test]
    fn keys_never_added_are_rarely_superseded() {
        let hasher = KeyHasher::from_seed([2; 32]);
        let mut adds = RecentAdds::default();
        for seq in 1..=4_000u64 {
            adds.record(hasher.hash(&seq.to_le_bytes()), seq);
        }
        let false_superseded = (0..100_000u64)
            .filter(|i| {
                adds.may_have_been_added_after(hasher.hash(&((i + 1) << 40).to_le_bytes()), 0)
            })
            .count();
        assert!(false_superseded < 500, "{false_superseded} of 100000");
    }
}
