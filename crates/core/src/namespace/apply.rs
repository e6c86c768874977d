//! The state machine the log feeds: applying one mutation, in seq order, under the writer lock.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::*;
use crate::filter::WindowedFilter;
use crate::hashing::KeyHash;
use crate::invalidations::Invalidation;
use crate::log::{Mutation, RebuildStep};
use crate::tombstones::{self, TombstoneKey};

impl Namespace {
    /// Applies a mutation from the log (replay, or a replica's feed). Mutations must arrive in seq order.
    pub fn apply(&self, mutation: Mutation) -> Result<Applied, WritesStopped> {
        self.apply_with(mutation, NewKeys::Skip)
    }

    /// [`apply`](Self::apply), an `Add` reporting its new keys if `new_keys` asks.
    pub fn apply_with(
        &self,
        mutation: Mutation,
        new_keys: NewKeys,
    ) -> Result<Applied, WritesStopped> {
        let mut writer = self.writer()?;
        Ok(self.apply_locked(&mut writer, mutation, new_keys))
    }

    /// The positions of `hashes` (an `Add`'s keys, about to be inserted at `at_ms`) that the filter answers
    /// absent for now and that are not earlier among them: with those whose tombstone the `Add` clears, the
    /// keys it makes new. The filter is asked for all of them at once: one epoch pin, and each key's blocks
    /// prefetched ahead, where a `contains` per key paid a fence per key that kept the cache misses of
    /// successive keys from overlapping (16% of the gate's CPU under `BF.MADD` of 100 keys).
    fn new_among(&self, hashes: &[KeyHash], at_ms: u64) -> Vec<u32> {
        let mut present = Vec::with_capacity(hashes.len());
        self.filter
            .load()
            .contains_many(hashes, at_ms, &mut present);
        // The hashes are keyed hashes already: a fast hasher over them is enough (SipHash was 1% of the CPU).
        let mut earlier =
            std::collections::HashSet::with_hasher(foldhash::fast::FixedState::default());
        hashes
            .iter()
            .zip(present)
            .enumerate()
            .filter(|(_, (hash, present))| !present && earlier.insert(**hash))
            .map(|(position, _)| position as u32)
            .collect()
    }

    /// The state machine's step.
    pub(super) fn apply_locked(
        &self,
        writer: &mut Writer,
        mutation: Mutation,
        new_keys: NewKeys,
    ) -> Applied {
        match mutation {
            Mutation::Add {
                seq, at_ms, keys, ..
            } => {
                let hashes: Vec<KeyHash> = keys.slices().map(|key| self.hasher.hash(key)).collect();
                let new = (new_keys == NewKeys::Report).then(|| self.new_among(&hashes, at_ms));
                self.filter.load().insert_many(&hashes, at_ms);
                if let Some(shadow) = &writer.shadow {
                    shadow.filter.insert_many(&hashes, at_ms);
                }
                writer.recent_adds.record_all(&hashes, seq);
                let mut cleared = Vec::new();
                for (position, (key, &hash)) in keys.slices().zip(&hashes).enumerate() {
                    if self
                        .tombstones
                        .remove(hash, || self.hasher.strong(key), at_ms)
                    {
                        cleared.push(position as u32);
                    }
                }
                self.keys_added
                    .fetch_add(keys.len() as u64, Ordering::Relaxed);
                self.metrics.keys_added.increment(keys.len() as u64);
                self.hub
                    .publish(Invalidation { seq, at_ms, keys }, &self.latest_seq);
                // A key whose live tombstone this `Add` cleared answered `ABSENT` before it too.
                let new = new.map(|mut new| {
                    new.extend_from_slice(&cleared);
                    new.sort_unstable();
                    new.dedup();
                    new
                });
                Applied::Added { cleared, new }
            }
            Mutation::RecordAbsent {
                seq,
                at_ms,
                key,
                kind,
                expires_at_ms,
                observed_seq,
                ..
            } => {
                let hash = self.hasher.hash(&key);
                if observed_seq != 0
                    && writer
                        .recent_adds
                        .may_have_been_added_after(hash, observed_seq)
                {
                    self.latest_seq.store(seq, Ordering::Release);
                    return Applied::Superseded;
                }
                let tombstone = TombstoneKey {
                    tag: tombstones::tag(hash),
                    strong: self.hasher.strong(&key),
                };
                let evicted = self
                    .tombstones
                    .insert(tombstone, kind, expires_at_ms, at_ms)
                    .evicted;
                if evicted > 0 {
                    self.metrics
                        .tombstones_evicted
                        .increment(u64::from(evicted));
                }
                self.latest_seq.store(seq, Ordering::Release);
                Applied::Recorded
            }
            Mutation::Rebuild {
                seq, at_ms, step, ..
            } => {
                let applied = self.apply_rebuild_step(writer, seq, at_ms, step);
                self.latest_seq.store(seq, Ordering::Release);
                if matches!(applied, Applied::Rebuilt(_)) {
                    self.hub.reset(seq);
                }
                applied
            }
        }
    }

    /// A logged rebuild's step; steps of a rebuild that is not open change nothing.
    fn apply_rebuild_step(
        &self,
        writer: &mut Writer,
        seq: u64,
        at_ms: u64,
        step: RebuildStep,
    ) -> Applied {
        match step {
            RebuildStep::Begin => {
                let fresh = Shadow {
                    filter: Arc::new(WindowedFilter::new(self.settings.filter_spec())),
                    began: Some(seq),
                    keys: 0,
                    last_step_ms: at_ms,
                };
                let replaced = writer.shadow.replace(fresh).and_then(|old| old.began);
                if let Some(replaced) = replaced {
                    tracing::warn!(namespace = %self.name, replaced, began = seq, "a rebuild replaced the open one");
                }
                Applied::RebuildBegun { replaced }
            }
            RebuildStep::Keys { began, keys } => {
                let Some(shadow) = writer.logged_rebuild(began) else {
                    return Applied::RebuildGone;
                };
                let hashes: Vec<KeyHash> = keys.iter().map(|key| self.hasher.hash(key)).collect();
                shadow.filter.insert_many(&hashes, at_ms);
                shadow.keys += keys.len() as u64;
                shadow.last_step_ms = at_ms;
                Applied::RebuildFed
            }
            RebuildStep::Commit { began } => {
                if writer.logged_rebuild(began).is_none() {
                    return Applied::RebuildGone;
                }
                let shadow = writer.shadow.take().expect("checked open");
                self.filter.store(Arc::clone(&shadow.filter));
                Applied::Rebuilt(Rebuilt {
                    keys: shadow.keys,
                    filter_bytes: shadow.filter.bytes(),
                    seq,
                })
            }
            RebuildStep::Abort { began } => {
                if writer.logged_rebuild(began).is_none() {
                    return Applied::RebuildGone;
                }
                writer.shadow = None;
                Applied::RebuildAborted
            }
        }
    }
}
