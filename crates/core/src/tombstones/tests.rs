//! The tombstone store's tests.

use super::*;
use crate::hashing::KeyHasher;
use proptest::prelude::*;
use std::collections::HashMap;

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
fn a_bucket_costs_30_bytes_a_slot_with_its_tags_in_one_cache_line() {
    assert_eq!(std::mem::size_of::<Tags>(), 64);
    assert_eq!(std::mem::align_of::<Tags>(), 64);
    assert_eq!(BUCKET_BYTES, 64 + 16 * 24 + 34);
    assert!(BUCKET_BYTES as f64 / (WAYS as f64) < 30.2);
}

#[test]
fn a_full_bucket_evicts_inside_itself_and_the_store_fills_completely() {
    // 1,024 → 16 shards of 4 buckets: a long flood must end with every slot in use.
    let store = TombstoneStore::new(1_024);
    let mut evicted = 0;
    for key in keys(20_000, 7) {
        evicted += store.put(key, AbsenceKind::Missing, 10, 0).evicted;
    }
    assert_eq!(store.len(), 1_024);
    assert_eq!(u64::from(evicted), 20_000 - 1_024);
    assert_eq!(store.bytes(), 16 * 4 * BUCKET_BYTES);
}

#[test]
fn growing_to_a_bound_that_is_not_a_power_of_two_keeps_every_entry_reachable() {
    // 16 shards of 39 buckets: the last growth step (32 → 39) is not a doubling.
    let store = TombstoneStore::new(10_000);
    let keys = keys(7_000, 8);
    let mut evicted = 0;
    for key in &keys {
        evicted += store.put(*key, AbsenceKind::Missing, 10, 0).evicted;
    }
    let held = keys.iter().filter(|k| store.has(**k, 0)).count() as u64;
    assert_eq!(held, store.len());
    assert_eq!(held + u64::from(evicted), 7_000);
    assert!(
        held >= 6_500,
        "only {held} of 7,000 held in a store of 10,000"
    );
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
    // Half the bound: a bucket overflows only where more than 16 of the keys land (0.4% of buckets).
    let store = TombstoneStore::new(100_000);
    let keys = keys(50_000, 1);
    let evicted: u32 = keys
        .iter()
        .map(|key| store.put(*key, AbsenceKind::Missing, 10, 0).evicted)
        .sum();
    assert!(evicted < 250, "{evicted} evicted at half the bound");
    let held: Vec<Key> = keys.iter().copied().filter(|k| store.has(*k, 0)).collect();
    assert_eq!(held.len() as u64, store.len());
    assert_eq!(held.len() + evicted as usize, keys.len());
    for key in held.iter().step_by(2) {
        assert!(store.delete(*key, 0));
    }
    for (i, key) in held.iter().enumerate() {
        assert_eq!(store.has(*key, 0), i % 2 == 1, "key {i}");
    }
    assert_eq!(store.len(), held.len() as u64 / 2);
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

/// One step of the model test.
#[derive(Debug, Clone)]
enum Op {
    Insert(usize, bool, u64),
    Remove(usize),
    Lookup(usize),
    Purge,
    Advance(u64),
}

fn op(keys: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..keys, any::<bool>(), 1..50u64).prop_map(|(k, d, ttl)| Op::Insert(k, d, ttl)),
        1 => (0..keys).prop_map(Op::Remove),
        4 => (0..keys).prop_map(Op::Lookup),
        1 => Just(Op::Purge),
        1 => (1..20u64).prop_map(Op::Advance),
    ]
}

/// Keys whose tags take only a few values (so buckets hold several equal tags), or all distinct.
fn model_keys(n: usize, few_tags: bool) -> Vec<Key> {
    keys(n as u32, 10)
        .into_iter()
        .map(|Key(hash, key)| {
            let tag = if few_tags {
                key.tag % 5 * 0x3333_3333
            } else {
                key.tag
            };
            let hash = KeyHash(u64::from(tag) << 32 | hash.0 & 0xffff_ffff);
            Key(hash, TombstoneKey { tag, ..key })
        })
        .collect()
}

proptest! {
    /// Against an exact model of what was inserted and not removed: the store never holds a key the model
    /// does not (a false "absent"), never exceeds its bound, always holds a key just inserted, and until it
    /// first evicts holds exactly the model.
    #[test]
    fn the_store_agrees_with_a_model(
        bound in prop_oneof![Just(3u64), Just(40), Just(1_100)],
        few_tags in any::<bool>(),
        ops in prop::collection::vec(op(2_000), 1..400),
    ) {
        let keys = model_keys(2_000, few_tags);
        let store = TombstoneStore::new(bound);
        let mut model: HashMap<usize, (u64, AbsenceKind)> = HashMap::new();
        let mut now = 0;
        let mut evicted = 0;
        for op in ops {
            match op {
                Op::Insert(k, deleted, ttl) => {
                    let kind = if deleted { AbsenceKind::Deleted } else { AbsenceKind::Missing };
                    let outcome = store.put(keys[k], kind, now + ttl, now);
                    if evicted == 0 {
                        prop_assert_eq!(outcome.replaced, model.contains_key(&k));
                    }
                    evicted += outcome.evicted;
                    model.insert(k, (now + ttl, kind));
                    prop_assert!(store.has(keys[k], now), "just inserted");
                }
                Op::Remove(k) => {
                    let removed = store.delete(keys[k], now);
                    let was = model.remove(&k).is_some_and(|(expires, _)| expires > now);
                    prop_assert!(!removed || was, "removed a key the model does not hold");
                    if evicted == 0 {
                        prop_assert_eq!(removed, was);
                    }
                    prop_assert!(!store.has(keys[k], now));
                }
                Op::Lookup(k) => {
                    let held = model.get(&k).is_some_and(|(expires, _)| *expires > now);
                    let batch = [keys[k], keys[(k + 1) % keys.len()], keys[k]];
                    let mut in_batch = Vec::new();
                    store.lookup_many(
                        &batch.map(|key| key.0),
                        |i| batch[i].1.strong,
                        now,
                        &mut in_batch,
                    );
                    let found = store.has(keys[k], now);
                    prop_assert_eq!(in_batch[0], found, "batch and single lookups agree");
                    prop_assert_eq!(in_batch[2], found);
                    prop_assert_eq!(in_batch[1], store.has(batch[1], now));
                    prop_assert!(!found || held, "a tombstone for a key never recorded");
                    if evicted == 0 {
                        prop_assert_eq!(found, held);
                    }
                }
                Op::Purge => {
                    store.purge_expired(now);
                    model.retain(|_, (expires, _)| *expires > now);
                }
                Op::Advance(ms) => now += ms,
            }
            prop_assert!(store.len() <= bound);
            let live: HashMap<TombstoneKey, (u64, AbsenceKind)> = store
                .live(now)
                .into_iter()
                .map(|t| (t.key, (t.expires_at_ms, t.kind)))
                .collect();
            let expected: HashMap<TombstoneKey, (u64, AbsenceKind)> = model
                .iter()
                .filter(|(_, (expires, _))| *expires > now)
                .map(|(k, v)| (keys[*k].1, *v))
                .collect();
            for (key, value) in &live {
                prop_assert_eq!(expected.get(key), Some(value), "live entry the model lacks");
            }
            if evicted == 0 {
                prop_assert_eq!(live.len(), expected.len());
            }
        }
    }
}

#[test]
fn a_bound_under_one_bucket_is_exact() {
    let store = TombstoneStore::new(3);
    for key in keys(100, 9) {
        store.put(key, AbsenceKind::Missing, 10, 0);
        assert!(store.len() <= 3);
    }
    assert_eq!(store.live(0).len(), 3);
}

#[test]
fn a_zero_bound_stores_nothing() {
    let store = TombstoneStore::new(0);
    store.put(keys(1, 6)[0], AbsenceKind::Missing, 10, 0);
    assert!(store.is_empty());
}
