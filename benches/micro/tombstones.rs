//! Cost of the tombstone store's lookups and inserts as it fills and then churns.
//!
//! A namespace's store is bounded (`max_tombstones`, 1,000,000 by default) and a flood of one-off keys keeps
//! it full and evicting for as long as the flood lasts, so lookups must stay as cheap in a full, churning
//! store as in a fresh one: every `MayExist` of the namespace asks the store first. The bench fills a store of
//! the default bound in three stages and measures, at each stage, lookups of keys it never held (what most
//! lookups are: the filter's "maybe" keys and never-recorded keys), lookups of keys it holds, and inserts:
//!
//! - **half**: 500,000 tombstones;
//! - **full**: 1,000,000 inserted, the bound;
//! - **churned**: another 1,000,000 inserted, every one evicting an older tombstone (a flood's steady state).
//!
//! Keys are uniformly random hashes made by a cheap mix of a counter (the gate hashes a key once for the
//! filter and the store, so hashing is not the store's cost): one lookup or insert per iteration, walking the
//! keys in order so that consecutive operations touch unrelated memory.
//!
//! Run with `cargo bench --bench tombstones`. Under `cargo test --benches` (criterion's test mode) the store
//! is bounded at 10,000 so the smoke test stays quick.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use existence_gate::core::hashing::{KeyHash, StrongKey};
use existence_gate::core::tombstones::{tag, AbsenceKind, TombstoneKey, TombstoneStore};

/// The default `max_tombstones`.
const BOUND: u64 = 1_000_000;
/// The bound in criterion's test mode.
const TEST_MODE_BOUND: u64 = 10_000;
/// Keys each lookup case walks through (a power of two, so the next key is found with a mask).
const PROBE_KEYS: usize = 1 << 16;
/// Far in the future: nothing expires during the bench.
const NEVER_MS: u64 = u64::MAX / 2;

/// A key as the store sees it.
#[derive(Clone, Copy)]
struct Key {
    hash: KeyHash,
    strong: StrongKey,
}

impl Key {
    fn tombstone(self) -> TombstoneKey {
        TombstoneKey {
            tag: tag(self.hash),
            strong: self.strong,
        }
    }
}

impl Key {
    /// Key number `i`: its hashes are SplitMix64 outputs, as uniform as a keyed hash's.
    fn nth(i: u64) -> Self {
        Key {
            hash: KeyHash(mix(i)),
            strong: StrongKey([mix(i ^ (1 << 62)), mix(i ^ (1 << 63))]),
        }
    }
}

/// A bijective 64-bit mix (SplitMix64's finaliser).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Keys `from..from + n`.
fn keys(from: u64, n: u64) -> Vec<Key> {
    (from..from + n).map(Key::nth).collect()
}

fn insert_all(store: &TombstoneStore, keys: &[Key]) {
    for key in keys {
        store.insert(key.tombstone(), AbsenceKind::Missing, NEVER_MS, 1);
    }
}

/// Lookups of never-held keys, of held keys, and inserts of new keys, at one stage of the fill.
fn measure(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    stage: &str,
    store: &TombstoneStore,
    held: &[Key],
    never_held: &[Key],
) {
    let mut i = 0;
    group.bench_function(format!("{stage}/lookup never-held key"), |b| {
        b.iter(|| {
            let key = never_held[i & (PROBE_KEYS - 1)];
            i += 1;
            black_box(store.lookup(key.hash, || key.strong, 1))
        })
    });
    let present: Vec<Key> = held
        .iter()
        .copied()
        .filter(|k| store.lookup(k.hash, || k.strong, 1))
        .take(PROBE_KEYS)
        .collect();
    assert!(!present.is_empty(), "{stage}: no held key is still stored");
    let mut i = 0;
    group.bench_function(format!("{stage}/lookup held key"), |b| {
        b.iter(|| {
            let key = present[i % present.len()];
            i += 1;
            black_box(store.lookup(key.hash, || key.strong, 1))
        })
    });
    // Last, as inserts change the stage: each a key never inserted before (evicting one in a full store).
    let mut i = 1 << 42;
    group.bench_function(format!("{stage}/insert new key"), |b| {
        b.iter(|| {
            let key = Key::nth(i);
            i += 1;
            black_box(store.insert(key.tombstone(), AbsenceKind::Missing, NEVER_MS, 1))
        })
    });
}

fn tombstone_benches(c: &mut Criterion) {
    // Criterion's test mode (`cargo test --benches`) runs each case once: a small store is enough there.
    let measuring = std::env::args().any(|arg| arg == "--bench");
    let bound = if measuring { BOUND } else { TEST_MODE_BOUND };
    let first = keys(0, bound);
    let churn = keys(bound, bound);
    let never_held = keys(1 << 40, PROBE_KEYS as u64);

    let mut group = c.benchmark_group("tombstones");
    let store = TombstoneStore::new(bound);
    let half = first.len() / 2;
    insert_all(&store, &first[..half]);
    measure(&mut group, "half", &store, &first[..half], &never_held);

    let store = TombstoneStore::new(bound);
    insert_all(&store, &first);
    println!(
        "full: {} tombstones, {:.1} bytes of table each",
        store.len(),
        store.bytes() as f64 / store.len() as f64
    );
    measure(&mut group, "full", &store, &first, &never_held);

    insert_all(&store, &churn);
    measure(&mut group, "churned", &store, &churn, &never_held);
    group.finish();
}

criterion_group!(benches, tombstone_benches);
criterion_main!(benches);
