//! A namespace's whole state as a snapshot holds it: export, restore and the digest replicas compare.

use std::hash::Hasher;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::answer::StateDigest;
use crate::filter::{BloomLayer, WindowedFilter};

use super::*;
use crate::recent_adds::{RecentAdds, RecentAddsImage};
use crate::tombstones::Tombstone;

/// A filter window as a snapshot holds it: its id and its layers, oldest first.
pub type WindowImage = (u64, Vec<Arc<BloomLayer>>);

/// One namespace's whole state, as [`Namespace::export`] gives it and [`Namespace::restore`] takes it back.
/// Storage encodes it; the core never sees a file. Whether an image fits this namespace (its sizing
/// fingerprint, the hash seed) is for whoever read it to check before restoring.
pub struct NamespaceImage {
    /// The namespace's name.
    pub name: String,
    /// The [fingerprint](crate::filter::FilterSpec::fingerprint) of the sizing its filter was built with.
    pub fingerprint: u64,
    /// The seq it is consistent from.
    pub seq: u64,
    /// Keys added, for stats.
    pub keys_added: u64,
    /// Filter windows, oldest first.
    pub windows: Vec<WindowImage>,
    /// Live tombstones as of when it was taken.
    pub tombstones: Vec<Tombstone>,
    /// The memory of recent adds behind `SUPERSEDED`, as of `seq`.
    pub recent_adds: RecentAddsImage,
    /// The logged rebuild in progress, if one is.
    pub rebuild: Option<RebuildImage>,
}

/// What a client's mirror of the filter downloads: the filter as of `seq`, copied, and the subscription that
/// carries every later `Add` (and tells of a wholesale replacement: a resync). Taken under the writer lock,
/// so that no `Add` falls between the copy and the subscription, nor is in both.
pub struct MirrorImage {
    /// The seq the copy is exact as of.
    pub seq: u64,
    /// The sizing the filter was built with: the mirror builds its copy with the same, so later `Add`s
    /// rotate and grow it exactly as here.
    pub spec: crate::filter::FilterSpec,
    /// The filter's windows, oldest first, each layer copied.
    pub windows: Vec<WindowImage>,
    /// Every `Add` after `seq`, in seq order.
    pub subscription: Subscription,
}

/// A logged rebuild in progress, as a snapshot holds it: a replica restored from the snapshot goes on with
/// it when the rest of its steps arrive, exactly as the replicas that applied its first steps do. (A
/// rebuild driven in this process is not in images: it ends with its caller.)
pub struct RebuildImage {
    /// The seq of its `Begin`.
    pub began: u64,
    /// Keys its steps fed it.
    pub keys: u64,
    /// Unix ms of its latest step.
    pub last_step_ms: u64,
    /// Its filter's windows, oldest first.
    pub windows: Vec<WindowImage>,
}

impl NamespaceImage {
    /// The image with its filter layers copied: it no longer shares them with the live filter, so later
    /// writes do not change it. For a snapshot that must be exactly the state as of `seq` (a replica's, whose
    /// digest must equal the others'), taken while nothing is applied; the cost is a copy of the filter.
    pub fn detached(mut self) -> Self {
        let rebuilt = self.rebuild.iter_mut().flat_map(|r| &mut r.windows);
        for (_, layers) in self.windows.iter_mut().chain(rebuilt) {
            for layer in layers.iter_mut() {
                *layer = Arc::new(layer.copy());
            }
        }
        self
    }
}

impl Namespace {
    /// Replaces the whole state with a snapshot's: filter windows, live tombstones, the memory of recent adds
    /// and seq. Invalidations before `seq` become unservable. (An image without that memory — snapshot
    /// format 2 — brings a floor instead: any absence observed before `seq` is then `SUPERSEDED`.)
    pub fn restore(
        &self,
        image: NamespaceImage,
        time: impl Into<ReadTime>,
    ) -> Result<(), WritesStopped> {
        let now_ms = time.into().tombstones_ms;
        let NamespaceImage {
            seq,
            keys_added,
            windows,
            tombstones,
            recent_adds,
            rebuild,
            ..
        } = image;
        let mut writer = self.writer()?;
        let filter = WindowedFilter::from_windows(self.settings.filter_spec(), windows);
        self.filter.store(Arc::new(filter));
        writer.shadow = rebuild.map(|r| Shadow {
            filter: Arc::new(WindowedFilter::from_windows(
                self.settings.filter_spec(),
                r.windows,
            )),
            began: Some(r.began),
            keys: r.keys,
            last_step_ms: r.last_step_ms,
        });
        for tombstone in &tombstones {
            self.tombstones.insert(
                tombstone.key,
                tombstone.kind,
                tombstone.expires_at_ms,
                now_ms,
            );
        }
        // An image's cells were checked when it was read; out of range here, fall back to the floor (every
        // absence observed before `seq` is then SUPERSEDED: a lost tombstone, never a wrong one).
        writer.recent_adds =
            RecentAdds::restore(&recent_adds).unwrap_or_else(|| RecentAdds::with_floor(seq));
        self.keys_added.store(keys_added, Ordering::Relaxed);
        self.hub.reset(seq);
        self.latest_seq.store(seq, Ordering::Release);
        Ok(())
    }

    /// The state a snapshot needs. Its seq is read under the writer lock, so every mutation logged before
    /// this call is included; later mutations may be partly included and are replayed from the log.
    pub fn export(&self, time: impl Into<ReadTime>) -> Result<NamespaceImage, WritesStopped> {
        let now_ms = time.into().tombstones_ms;
        let (seq, recent_adds, rebuild) = {
            let writer = self.writer()?;
            let rebuild = writer.shadow.as_ref().and_then(|s| {
                let began = s.began?;
                Some((began, s.keys, s.last_step_ms, Arc::clone(&s.filter)))
            });
            (self.latest_seq(), writer.recent_adds.export(), rebuild)
        };
        Ok(NamespaceImage {
            name: self.name.to_string(),
            fingerprint: self.settings.filter_spec().fingerprint(),
            seq,
            keys_added: self.keys_added.load(Ordering::Relaxed),
            windows: self.filter.load().export(),
            tombstones: self.tombstones.live(now_ms),
            recent_adds,
            rebuild: rebuild.map(|(began, keys, last_step_ms, filter)| RebuildImage {
                began,
                keys,
                last_step_ms,
                windows: filter.export(),
            }),
        })
    }

    /// The filter and the subscription a mirror starts from ([`MirrorImage`]). The copy of the layers is
    /// taken under the writer lock, so `Add`s to this namespace wait for it: a memory copy of the filter's
    /// bytes (lookups do not wait).
    pub fn mirror_image(&self) -> Result<MirrorImage, WritesStopped> {
        let _writer = self.writer()?;
        let seq = self.latest_seq();
        let windows = self
            .filter
            .load()
            .export()
            .into_iter()
            .map(|(id, layers)| (id, layers.iter().map(|l| Arc::new(l.copy())).collect()))
            .collect();
        let subscription = self
            .hub
            .subscribe(seq, &self.latest_seq, usize::MAX)
            .expect("no limit");
        Ok(MirrorImage {
            seq,
            spec: self.settings.filter_spec(),
            windows,
            subscription,
        })
    }

    /// A hash of everything this namespace answers from, as of its seq and `now_ms`: the live filter windows'
    /// bits and the live tombstones (sorted, so the store's slot layout does not count). Replicas, or a live
    /// gate and its replayed log, that applied the same mutations have equal digests; so the operator (and
    /// the tests) can see that they agree. Taken under the writer lock, so no mutation lands half-way
    /// through; reads go on. Compare digests taken at about the same time: a tombstone or window expiring
    /// between two calls changes it.
    pub fn state_digest(&self, time: impl Into<ReadTime>) -> Result<StateDigest, WritesStopped> {
        let time = time.into();
        let _writer = self.writer()?;
        let seq = self.latest_seq();
        let mut digest = siphasher::sip::SipHasher13::new();
        digest.write_u64(seq);
        self.filter.load().digest(time.windows_ms, &mut digest);
        let mut tombstones = self.tombstones.live(time.tombstones_ms);
        tombstones.sort_unstable_by_key(|t| (t.key.tag, t.key.strong.0));
        for tombstone in &tombstones {
            digest.write_u32(tombstone.key.tag);
            digest.write_u64(tombstone.key.strong.0[0]);
            digest.write_u64(tombstone.key.strong.0[1]);
            digest.write_u64(tombstone.expires_at_ms);
            digest.write_u8(tombstone.kind as u8);
        }
        Ok(StateDigest {
            seq,
            digest: digest.finish(),
        })
    }
}
