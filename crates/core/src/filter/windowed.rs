//! The time-windowed, growable filter of one namespace.
//!
//! # Windows
//!
//! With a finite retention `R` and `W` windows, time is cut into spans of `R / (W - 1)` aligned to the unix
//! epoch (window id = ⌊t / span⌋, so replicas agree on ids). A key added at time `t` goes into window
//! ⌊t / span⌋; a lookup at time `now` consults the windows with id ≥ ⌊now / span⌋ - (W - 1). Hence a key answers
//! `MAY_EXIST` from `t` until at least `t + R` and at most `t + R + span`; then its window is dropped whole. A key
//! that still exists must be re-added within its retention (re-adding puts it in the current window). With
//! retention `forever` there is a single window that never rotates.
//!
//! # Sizing and growth
//!
//! The namespace's false-positive target `p` is for all live windows together: a lookup that misses must miss
//! in all of them, so each of the `W` windows is sized for `p / W` and for the keys one span receives,
//! `expected_keys / (W - 1)`. The union bound keeps the total at or under `p`.
//!
//! A window that fills past its capacity grows as a scalable Bloom filter does: a further layer with twice the
//! capacity and half the rate, so a window that grows without end approaches `2·p/W`. Growth stops at the
//! namespace's memory cap; the newest layer then saturates — more `MAY_EXIST`, never a wrong `ABSENT`.
//!
//! # Concurrency
//!
//! The set of windows and layers is an immutable [`Windows`] value behind a crossbeam-epoch pointer. Lookups
//! pin the epoch and read it without locks; rotation and growth (rare, serialised by `structure`) build a new
//! value sharing the existing layers and swap it in; the old value is freed once no reader can hold it.
//! Inserts take the newest layer's writer lock for a batch (a layer has one writer at a time, see
//! [`bloom`](super::bloom)); writers of one filter — a rebuild feeding its shadow while `Add`s are applied to
//! it — take turns per batch. A writer lets go of a full layer's lock before it grows the window, so it never
//! holds two.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned};

use super::bloom::{BloomLayer, Geometry, LayerWriter};
use crate::hashing::KeyHash;
use crate::prefetch::{prefetched_ahead, visit_prefetched_ahead};

/// How long keys stay in the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Keys never expire; one window that never rotates.
    Forever,
    /// Keys expire this many milliseconds after their last `Add` (plus up to one span).
    Millis(u64),
}

/// The sizing of a namespace's filter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FilterSpec {
    /// Live keys the namespace is sized for (across its retention).
    pub expected_keys: u64,
    /// Target false-positive rate for all live windows together.
    pub false_positive_rate: f64,
    /// How long keys live.
    pub retention: Retention,
    /// Number of live windows (ignored for `Forever`).
    pub windows: u32,
    /// Memory cap for all windows and layers; growth stops here.
    pub max_bytes: u64,
}

impl FilterSpec {
    /// Live windows at any time.
    fn live_windows(&self) -> u32 {
        match self.retention {
            Retention::Forever => 1,
            Retention::Millis(_) => self.windows,
        }
    }

    /// Milliseconds per window, `None` for a filter that never rotates.
    pub fn span_ms(&self) -> Option<u64> {
        match self.retention {
            Retention::Forever => None,
            // Rounded up, so that W - 1 spans always cover the retention.
            Retention::Millis(ms) => Some(ms.div_ceil(u64::from(self.windows - 1)).max(1)),
        }
    }

    /// The shape of a window's first layer.
    pub fn base_geometry(&self) -> Geometry {
        let windows = self.live_windows();
        let keys_per_window = match self.retention {
            Retention::Forever => self.expected_keys,
            Retention::Millis(_) => self.expected_keys.div_ceil(u64::from(windows - 1)),
        };
        Geometry::for_target(
            keys_per_window,
            self.false_positive_rate / f64::from(windows),
        )
    }

    /// A digest of everything that decides where a key's bits go: a snapshot taken under another sizing
    /// cannot be loaded (its bits would answer for the wrong keys).
    pub fn fingerprint(&self) -> u64 {
        let base = self.base_geometry();
        let retention = match self.retention {
            Retention::Forever => u64::MAX,
            Retention::Millis(ms) => ms,
        };
        let fields = [
            self.expected_keys,
            self.false_positive_rate.to_bits(),
            retention,
            u64::from(self.live_windows()),
            base.blocks as u64,
            u64::from(base.probes),
        ];
        let bytes: Vec<u8> = fields.iter().flat_map(|f| f.to_le_bytes()).collect();
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }

    /// Everything that decides which bits a sequence of inserts sets, as a person reads it: what replicas
    /// applying one log must agree on (the [fingerprint](Self::fingerprint), plus the growth cap, which
    /// decides when a layer is added).
    pub fn describe(&self) -> String {
        let retention = match self.retention {
            Retention::Forever => "forever".to_string(),
            Retention::Millis(ms) => format!("{ms} ms"),
        };
        format!(
            "expected_keys = {}, false_positive_rate = {}, retention = {retention}, windows = {}, \
             max_filter_bytes = {}",
            self.expected_keys,
            self.false_positive_rate,
            self.live_windows(),
            self.max_bytes
        )
    }

    /// Bytes of all windows before any growth: what the default memory cap is a multiple of.
    pub fn initial_bytes(&self) -> u64 {
        self.base_geometry().bytes() * u64::from(self.live_windows())
    }
}

/// One time window: the layers that hold the keys added during its span.
#[derive(Clone)]
struct Window {
    /// ⌊start time / span⌋; 0 for a filter that never rotates.
    id: u64,
    /// Oldest first; only the last one takes inserts.
    layers: Vec<Arc<BloomLayer>>,
    /// Its newest layer is full and the memory cap refused another: inserts stop asking to grow it until
    /// an expiry frees memory (a rotation starts a new window, which takes the inserts from then on).
    /// Without this mark every key that set a bit in a saturated window asked again, and each refusal sized
    /// the next layer anew (a bisection over the false-positive formula): with three replicas applying
    /// 1,000-key `Add`s into a namespace at its cap (4M keys expected, over 12M added), 63% of a replica's
    /// CPU went to sizing layers it would never get (`perf`), and the replicas took 2,216 / 2,679 µs of CPU
    /// per `Add` against 616 / 632 µs with the mark (two pairs of runs).
    saturated: bool,
}

impl Window {
    fn new(id: u64, layers: Vec<Arc<BloomLayer>>) -> Self {
        Self {
            id,
            layers,
            saturated: false,
        }
    }

    /// The same window, allowed to ask to grow again (memory was freed).
    fn unsaturated(&self) -> Self {
        Self::new(self.id, self.layers.clone())
    }
}

/// The immutable set of windows a lookup sees; oldest window first.
#[derive(Clone, Default)]
struct Windows {
    list: Vec<Window>,
}

impl Windows {
    fn bytes(&self) -> u64 {
        self.list
            .iter()
            .flat_map(|w| &w.layers)
            .map(|l| l.bytes())
            .sum()
    }

    /// The window inserts go to once a rotation made sure one exists for their time. A clock stepped
    /// backwards lands here too: the key then lives longer, never shorter.
    fn newest(&self) -> &Window {
        self.list.last().expect("rotate leaves a window")
    }
}

/// Where a batch of inserts goes: the newest window of a set of windows, as the writer of its newest layer.
struct Target<'g> {
    windows: &'g Windows,
    writer: LayerWriter<'g>,
}

impl<'g> Target<'g> {
    fn newest(windows: &'g Windows) -> Self {
        let layer = windows
            .newest()
            .layers
            .last()
            .expect("a window has a layer");
        Self {
            windows,
            writer: layer.writer(),
        }
    }

    /// Adds `hash` unless an older layer of the window already holds it; the window's id if its newest layer
    /// is now full (so the window should grow).
    #[inline]
    fn insert(&self, hash: KeyHash) -> Option<u64> {
        let window = self.windows.newest();
        let older = &window.layers[..window.layers.len() - 1];
        if older.iter().any(|layer| layer.contains(hash)) {
            return None;
        }
        let added = self.writer.insert(hash);
        (added && !window.saturated && self.writer.layer().is_full()).then_some(window.id)
    }
}

/// Per-namespace figures for `Stats` and metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FilterStats {
    /// Live windows.
    pub windows: usize,
    /// Layers across live windows (more than `windows` once a window grew).
    pub layers: usize,
    /// Bytes of bit arrays.
    pub bytes: u64,
    /// Estimated distinct keys held across live windows.
    pub keys: u64,
    /// Estimated false-positive rate of a lookup now.
    pub estimated_false_positive_rate: f64,
}

/// A namespace's time-windowed, growable Bloom filter.
pub struct WindowedFilter {
    /// What it was sized for.
    spec: FilterSpec,
    /// The shape of each window's first layer.
    base: Geometry,
    /// The live windows; swapped whole on rotation and growth.
    windows: Atomic<Windows>,
    /// Serialises rotation and growth (inserts into existing layers need no lock).
    structure: Mutex<()>,
    /// Bytes of every layer in the published list (windows past retention count until `expire` drops
    /// them), kept for stats; growth checks the cap against the list itself.
    bytes: AtomicU64,
    /// Calls of `grow`: a test checks that a saturated window is not asked again.
    #[cfg(test)]
    growth_requests: AtomicU64,
}

impl std::fmt::Debug for WindowedFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowedFilter")
            .field("spec", &self.spec)
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Drop for WindowedFilter {
    fn drop(&mut self) {
        // SAFETY: `&mut self` means no reader or writer can still reach the pointer, so it may be taken and
        // freed now rather than through the epoch.
        unsafe {
            let current = self.windows.swap(
                epoch::Shared::null(),
                Ordering::AcqRel,
                epoch::unprotected(),
            );
            if !current.is_null() {
                drop(current.into_owned());
            }
        }
    }
}

impl WindowedFilter {
    /// An empty filter.
    pub fn new(spec: FilterSpec) -> Self {
        let base = spec.base_geometry();
        Self {
            spec,
            base,
            windows: Atomic::new(Windows::default()),
            structure: Mutex::new(()),
            bytes: AtomicU64::new(0),
            #[cfg(test)]
            growth_requests: AtomicU64::new(0),
        }
    }

    /// A filter holding restored windows: `(window id, layers oldest first)`, oldest window first.
    pub fn from_windows(spec: FilterSpec, windows: Vec<(u64, Vec<Arc<BloomLayer>>)>) -> Self {
        let restored = Windows {
            list: windows
                .into_iter()
                .map(|(id, layers)| Window::new(id, layers))
                .collect(),
        };
        Self {
            spec,
            base: spec.base_geometry(),
            bytes: AtomicU64::new(restored.bytes()),
            windows: Atomic::new(restored),
            structure: Mutex::new(()),
            #[cfg(test)]
            growth_requests: AtomicU64::new(0),
        }
    }

    /// The current windows and their layers, oldest first (their bits keep changing under concurrent inserts;
    /// a snapshot copies them and replays the log from before the copy began).
    pub fn export(&self) -> Vec<(u64, Vec<Arc<BloomLayer>>)> {
        let guard = epoch::pin();
        self.load(&guard)
            .list
            .iter()
            .map(|w| (w.id, w.layers.clone()))
            .collect()
    }

    /// The sizing it was built with.
    pub fn spec(&self) -> &FilterSpec {
        &self.spec
    }

    /// The window id that time `now_ms` falls in.
    fn window_id(&self, now_ms: u64) -> u64 {
        self.spec.span_ms().map_or(0, |span| now_ms / span)
    }

    /// The oldest window id still live at `now_ms`.
    fn oldest_live_id(&self, now_ms: u64) -> u64 {
        self.window_id(now_ms)
            .saturating_sub(u64::from(self.spec.live_windows() - 1))
    }

    /// Reads the current windows under `guard`.
    fn load<'g>(&self, guard: &'g Guard) -> &'g Windows {
        let shared = self.windows.load(Ordering::Acquire, guard);
        // SAFETY: the pointer is never null while `self` lives (set in `new`, replaced only by non-null values,
        // nulled only in `drop`), and a value swapped out is destroyed only after every guard pinned before the
        // swap — including `guard` — is dropped.
        unsafe { shared.deref() }
    }

    /// Whether `hash` may have been added within its retention, as of `now_ms`.
    #[inline]
    pub fn contains(&self, hash: KeyHash, now_ms: u64) -> bool {
        self.any_live_layer(now_ms, &epoch::pin(), |layer| layer.contains(hash))
    }

    /// [`contains`](Self::contains) for a caller that pins anyway (a mirror pins to read its copy: a second,
    /// nested pin measured ~2% of its lookup) and whose lookups mostly miss the cache
    /// ([`BloomLayer::contains_cold`]).
    #[inline]
    pub fn contains_cold(&self, hash: KeyHash, now_ms: u64, guard: &Guard) -> bool {
        self.any_live_layer(now_ms, guard, |layer| layer.contains_cold(hash))
    }

    /// Whether `probe` holds for any layer of a window live at `now_ms`, newest first.
    #[inline]
    fn any_live_layer(
        &self,
        now_ms: u64,
        guard: &Guard,
        probe: impl Fn(&BloomLayer) -> bool,
    ) -> bool {
        let oldest = self.oldest_live_id(now_ms);
        self.load(guard)
            .list
            .iter()
            .rev()
            .take_while(|w| w.id >= oldest)
            .any(|w| w.layers.iter().any(|layer| probe(layer)))
    }

    /// Answers for many hashes at once: prefetches every key's block in every live layer, then probes, so the
    /// cache misses overlap instead of queueing one after another.
    pub fn contains_many(&self, hashes: &[KeyHash], now_ms: u64, answers: &mut Vec<bool>) {
        let guard = epoch::pin();
        let oldest = self.oldest_live_id(now_ms);
        let windows = self.load(&guard);
        let live: Vec<&BloomLayer> = windows
            .list
            .iter()
            .filter(|w| w.id >= oldest)
            .flat_map(|w| w.layers.iter().map(Arc::as_ref))
            .collect();
        answers.clear();
        prefetched_ahead(
            hashes,
            answers,
            |hash| live.iter().for_each(|layer| layer.prefetch(*hash)),
            |_, hash| live.iter().any(|layer| layer.contains(*hash)),
        );
    }

    /// Adds `hash` as of time `at_ms`, rotating or growing as needed.
    pub fn insert(&self, hash: KeyHash, at_ms: u64) {
        self.insert_many(std::slice::from_ref(&hash), at_ms);
    }

    /// Adds every hash as of time `at_ms`: one epoch pin, one window lookup and one writer lock for the batch
    /// (the newest layer's, taken again only when that layer fills and the window grows), and each key's
    /// blocks prefetched [`LOOKAHEAD`](crate::prefetch::LOOKAHEAD) keys ahead, so the cache misses of a
    /// 1,000-key `Add` overlap instead of queueing (an epoch pin per key was 8% of a replica's CPU applying
    /// 1,000-key Adds, and the misses taken one at a time most of the rest of its filter time).
    pub fn insert_many(&self, hashes: &[KeyHash], at_ms: u64) {
        let guard = epoch::pin();
        let target_id = self.window_id(at_ms);
        let windows = match self.load(&guard).list.last() {
            Some(newest) if newest.id >= target_id => self.load(&guard),
            _ => self.rotate(at_ms, &guard),
        };
        let mut target = Some(Target::newest(windows));
        visit_prefetched_ahead(
            hashes,
            &mut target,
            |target, hash| {
                let window = target.as_ref().expect("a target").windows.newest();
                window.layers.iter().for_each(|l| l.prefetch(*hash))
            },
            |target, _, hash| {
                let full = target.as_ref().expect("a target").insert(*hash);
                if let Some(id) = full {
                    // The full layer's writer lock is let go before growing, so the next layer is taken
                    // (or this one again, if growth stopped at the memory cap) without holding two.
                    *target = None;
                    self.grow(id, &guard);
                    *target = Some(Target::newest(self.load(&guard)));
                }
            },
        );
    }

    /// Drops windows that are no longer live at `now_ms` so their memory is freed, and returns how many.
    pub fn expire(&self, now_ms: u64) -> usize {
        let _structure = self.structure.lock().unwrap_or_else(|e| e.into_inner());
        let guard = epoch::pin();
        let oldest = self.oldest_live_id(now_ms);
        let current = self.load(&guard);
        let dead = current.list.iter().take_while(|w| w.id < oldest).count();
        if dead > 0 {
            let next = Windows {
                list: current.list[dead..]
                    .iter()
                    .map(Window::unsaturated)
                    .collect(),
            };
            self.publish(next, &guard);
        }
        dead
    }

    /// Makes sure a window for `at_ms` exists; returns the new set.
    ///
    /// It drops nothing: only [`expire`](Self::expire), at the reader's time, does. An insert's time is the
    /// time its writer's clock gave (in a replica, agreed with the stream's: see
    /// [`Mutation::agreed`](crate::log::Mutation::agreed)), and one writer's clock ahead by two hours must
    /// not expire every key added before it — which is what dropping here did, on every replica applying
    /// that `Add`, for good. A window ahead of the reader's time is live (its id is above the oldest live
    /// one), so keys inserted there are found; they live longer, never shorter.
    fn rotate<'g>(&self, at_ms: u64, guard: &'g Guard) -> &'g Windows {
        let _structure = self.structure.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.load(guard);
        let target_id = self.window_id(at_ms);
        if current.list.last().is_some_and(|w| w.id >= target_id) {
            return current; // another writer rotated first
        }
        let mut next = current.clone();
        next.list.push(Window::new(
            target_id,
            vec![Arc::new(BloomLayer::new(self.base))],
        ));
        self.publish(next, guard)
    }

    /// Adds a larger, tighter layer to window `id` if the memory cap allows; otherwise the window saturates.
    fn grow(&self, id: u64, guard: &Guard) {
        #[cfg(test)]
        self.growth_requests.fetch_add(1, Ordering::Relaxed);
        let _structure = self.structure.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.load(guard);
        let Some(position) = current.list.iter().position(|w| w.id == id) else {
            return; // the window was dropped meanwhile
        };
        let layers = &current.list[position].layers;
        if current.list[position].saturated || !layers.last().is_some_and(|l| l.is_full()) {
            return; // another writer grew it, or found it at the cap, first
        }
        let growth = layers.len() as u32;
        let geometry = Geometry::for_target(
            self.base.capacity << growth.min(32),
            self.spec.false_positive_rate
                / f64::from(self.spec.live_windows())
                / f64::from(1u32 << growth.min(30)),
        );
        if current.bytes() + geometry.bytes() > self.spec.max_bytes {
            let mut next = current.clone();
            next.list[position].saturated = true;
            self.publish(next, guard);
            return;
        }
        let mut next = current.clone();
        next.list[position]
            .layers
            .push(Arc::new(BloomLayer::new(geometry)));
        self.publish(next, guard);
    }

    /// Swaps in `next` and schedules the old value's destruction once no reader can hold it.
    fn publish<'g>(&self, next: Windows, guard: &'g Guard) -> &'g Windows {
        self.bytes.store(next.bytes(), Ordering::Relaxed);
        let old = self.windows.swap(Owned::new(next), Ordering::AcqRel, guard);
        // SAFETY: `old` is no longer reachable from `self.windows`; readers that loaded it hold a guard pinned
        // before this swap, and `defer_destroy` runs only after all such guards are gone.
        unsafe { guard.defer_destroy(old) };
        self.load(guard)
    }

    /// Bytes of every layer in the published list, windows past retention included until `expire` drops
    /// them.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Figures for stats and metrics as of `now_ms`: from counters kept as keys are added, so cheap enough
    /// for every metrics export.
    pub fn stats(&self, now_ms: u64) -> FilterStats {
        let guard = epoch::pin();
        let live = self.live_layers(now_ms, &guard);
        let pass_all = live
            .iter()
            .map(|l| 1.0 - l.estimated_false_positive_rate())
            .product::<f64>();
        FilterStats {
            windows: self
                .load(&guard)
                .list
                .iter()
                .filter(|w| w.id >= self.oldest_live_id(now_ms))
                .count(),
            layers: live.len(),
            bytes: live.iter().map(|l| l.bytes()).sum(),
            keys: live.iter().map(|l| l.inserted()).sum(),
            estimated_false_positive_rate: 1.0 - pass_all,
        }
    }

    /// Fraction of bits set across live layers as of `now_ms`. It counts every bit (about 2 ms per 16 MB),
    /// so only `Stats` asks for it, off the request threads.
    pub fn fill_ratio(&self, now_ms: u64) -> f64 {
        let guard = epoch::pin();
        let live = self.live_layers(now_ms, &guard);
        let bytes: u64 = live.iter().map(|l| l.bytes()).sum();
        let ones: f64 = live.iter().map(|l| l.fill_ratio() * l.bytes() as f64).sum();
        if bytes == 0 {
            0.0
        } else {
            ones / bytes as f64
        }
    }

    /// Feeds what the filter answers as of `now_ms` into `digest`: each live window's id and, per layer, its
    /// geometry, insert count and bit words. Dead windows not yet freed are left out, so two filters that
    /// answer alike digest alike whenever each last ran [`expire`](Self::expire).
    pub fn digest(&self, now_ms: u64, digest: &mut impl std::hash::Hasher) {
        let guard = epoch::pin();
        let oldest = self.oldest_live_id(now_ms);
        for window in self.load(&guard).list.iter().filter(|w| w.id >= oldest) {
            digest.write_u64(window.id);
            for layer in &window.layers {
                let geometry = layer.geometry();
                digest.write_u64(geometry.blocks as u64);
                digest.write_u32(geometry.probes);
                digest.write_u64(geometry.capacity);
                digest.write_u64(layer.inserted());
                layer.words().for_each(|word| digest.write_u64(word));
            }
        }
    }

    /// The layers of windows live at `now_ms`.
    fn live_layers<'g>(&self, now_ms: u64, guard: &'g Guard) -> Vec<&'g Arc<BloomLayer>> {
        let oldest = self.oldest_live_id(now_ms);
        self.load(guard)
            .list
            .iter()
            .filter(|w| w.id >= oldest)
            .flat_map(|w| &w.layers)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::KeyHasher;

    const HOUR: u64 = 3_600_000;

    fn spec(retention: Retention, expected_keys: u64) -> FilterSpec {
        let mut spec = FilterSpec {
            expected_keys,
            false_positive_rate: 0.01,
            retention,
            windows: 4,
            max_bytes: 0,
        };
        spec.max_bytes = spec.initial_bytes() * 8;
        spec
    }

    #[test]
    fn a_key_lives_at_least_its_retention_and_at_most_one_span_more() {
        let filter = WindowedFilter::new(spec(Retention::Millis(3 * HOUR), 1_000));
        let span = filter.spec().span_ms().unwrap();
        assert_eq!(span, HOUR);
        let hash = KeyHasher::from_seed([1; 32]).hash(b"k");
        let added_at = 100 * HOUR + 1234;
        filter.insert(hash, added_at);
        assert!(filter.contains(hash, added_at));
        assert!(filter.contains(hash, added_at + 3 * HOUR));
        // The window of `added_at` starts at 100h; it is dropped once 100h + 4 spans is reached.
        assert!(filter.contains(hash, 104 * HOUR - 1));
        assert!(!filter.contains(hash, 104 * HOUR));
    }

    /// Writers that share a filter — a rebuild feeding its shadow while `Add`s are applied to it — set bits
    /// with plain stores, so only the layer's writer lock keeps one from overwriting the other's bits. Small
    /// layers (a few blocks, so batches collide in them constantly) that fill and grow during the run; every
    /// key of every batch must be found afterwards. Without the lock, lost bits lose keys here within a few
    /// rounds.
    #[test]
    fn concurrent_batches_lose_no_key_while_the_filter_grows() {
        const WRITERS: u64 = 2;
        const BATCHES: u64 = 40;
        const BATCH: u64 = 50;
        let hasher = KeyHasher::from_seed([6; 32]);
        let key = |writer: u64, i: u64| hasher.hash(&(writer << 32 | i).to_le_bytes());
        for round in 0..20 {
            let filter = WindowedFilter::new(FilterSpec {
                max_bytes: u64::MAX,
                ..spec(Retention::Forever, 200)
            });
            let start = std::sync::Barrier::new(WRITERS as usize);
            std::thread::scope(|threads| {
                for writer in 0..WRITERS {
                    let (filter, start) = (&filter, &start);
                    threads.spawn(move || {
                        start.wait();
                        for batch in 0..BATCHES {
                            let hashes: Vec<KeyHash> = (batch * BATCH..(batch + 1) * BATCH)
                                .map(|i| key(writer, i))
                                .collect();
                            filter.insert_many(&hashes, 0);
                        }
                    });
                }
            });
            for writer in 0..WRITERS {
                for i in 0..BATCHES * BATCH {
                    assert!(
                        filter.contains(key(writer, i), 0),
                        "round {round}: key {i} of writer {writer} lost"
                    );
                }
            }
        }
    }

    /// An insert stamped two hours ahead (a writer whose clock stepped) creates its window but drops none:
    /// the keys added before it answer until their own retention ends by the reader's time.
    #[test]
    fn an_insert_from_a_clock_ahead_expires_nothing() {
        let filter = WindowedFilter::new(spec(Retention::Millis(3 * HOUR), 1_000));
        let hasher = KeyHasher::from_seed([1; 32]);
        let (before, ahead) = (hasher.hash(b"before"), hasher.hash(b"ahead"));
        filter.insert(before, 100 * HOUR);
        filter.insert(ahead, 200 * HOUR);
        assert!(filter.contains(before, 100 * HOUR + 1));
        assert!(filter.contains(ahead, 100 * HOUR + 1));
        assert_eq!(filter.expire(100 * HOUR + 1), 0);
        assert!(filter.contains(before, 103 * HOUR));
        // Once the reader's time passes its retention, the key expires as it would have.
        assert!(!filter.contains(before, 104 * HOUR));
    }

    #[test]
    fn re_adding_refreshes_retention() {
        let filter = WindowedFilter::new(spec(Retention::Millis(3 * HOUR), 1_000));
        let hash = KeyHasher::from_seed([1; 32]).hash(b"k");
        filter.insert(hash, 0);
        filter.insert(hash, 3 * HOUR);
        assert!(filter.contains(hash, 6 * HOUR));
    }

    #[test]
    fn forever_never_rotates() {
        let filter = WindowedFilter::new(spec(Retention::Forever, 1_000));
        let hash = KeyHasher::from_seed([1; 32]).hash(b"k");
        filter.insert(hash, 0);
        assert!(filter.contains(hash, u64::MAX / 2));
        assert_eq!(filter.expire(u64::MAX / 2), 0);
    }

    #[test]
    fn expire_frees_dead_windows() {
        let filter = WindowedFilter::new(spec(Retention::Millis(3 * HOUR), 1_000));
        let hasher = KeyHasher::from_seed([1; 32]);
        for hour in 0..4 {
            filter.insert(hasher.hash(&[hour as u8]), hour * HOUR);
        }
        assert_eq!(filter.stats(5 * HOUR).windows, 2);
        assert_eq!(filter.expire(5 * HOUR), 2);
        assert_eq!(filter.bytes(), 2 * filter.spec().base_geometry().bytes());
    }

    #[test]
    fn overfilled_windows_grow_and_keep_the_rate_near_target() {
        let mut roomy = spec(Retention::Forever, 10_000);
        roomy.max_bytes = roomy.initial_bytes() * 64;
        let filter = WindowedFilter::new(roomy);
        let hasher = KeyHasher::from_seed([2; 32]);
        for i in 0..80_000u32 {
            filter.insert(hasher.hash(&i.to_le_bytes()), 0);
        }
        for i in 0..80_000u32 {
            assert!(filter.contains(hasher.hash(&i.to_le_bytes()), 0));
        }
        let stats = filter.stats(0);
        assert!(stats.layers >= 3, "{stats:?}");
        let fp = (0..100_000u32)
            .filter(|i| filter.contains(hasher.hash(&(i + 10_000_000).to_le_bytes()), 0))
            .count() as f64
            / 100_000.0;
        assert!(fp < 0.02, "measured {fp} after 8x growth");
    }

    #[test]
    fn growth_stops_at_the_memory_cap_and_the_filter_saturates_without_losing_keys() {
        let mut capped = spec(Retention::Forever, 1_000);
        capped.max_bytes = capped.initial_bytes() * 3;
        let filter = WindowedFilter::new(capped);
        let hasher = KeyHasher::from_seed([2; 32]);
        for i in 0..50_000u32 {
            filter.insert(hasher.hash(&i.to_le_bytes()), 0);
        }
        assert!(filter.bytes() <= capped.max_bytes);
        for i in 0..50_000u32 {
            assert!(filter.contains(hasher.hash(&i.to_le_bytes()), 0));
        }
    }

    /// Inserts the keys numbered `keys` as one batch at `at_ms`.
    fn insert_batch(
        filter: &WindowedFilter,
        hasher: &KeyHasher,
        keys: std::ops::Range<u32>,
        at_ms: u64,
    ) {
        let hashes: Vec<KeyHash> = keys.map(|i| hasher.hash(&i.to_le_bytes())).collect();
        filter.insert_many(&hashes, at_ms);
    }

    #[test]
    fn a_window_at_the_memory_cap_is_asked_to_grow_once_not_per_key() {
        let mut capped = spec(Retention::Forever, 1_000);
        capped.max_bytes = capped.initial_bytes() * 8;
        let filter = WindowedFilter::new(capped);
        let hasher = KeyHasher::from_seed([3; 32]);
        for batch in 0..100u32 {
            insert_batch(&filter, &hasher, batch * 1_000..(batch + 1) * 1_000, 0);
        }
        let layers = filter.stats(0).layers as u64;
        assert!(layers > 1, "the filter grew before reaching its cap");
        // One request per layer added, and one refused at the cap: not one per key inserted since.
        assert_eq!(filter.growth_requests.load(Ordering::Relaxed), layers);
    }

    #[test]
    fn a_saturated_window_grows_again_once_an_expiry_frees_memory() {
        let mut capped = spec(Retention::Millis(3 * HOUR), 1_000);
        // Four first layers' worth: window 0 can add one larger layer, then nothing fits beside it.
        capped.max_bytes = capped.initial_bytes();
        let filter = WindowedFilter::new(capped);
        let hasher = KeyHasher::from_seed([4; 32]);
        let add = |keys, at_ms| insert_batch(&filter, &hasher, keys, at_ms);
        let window_1_layers = || {
            let windows = filter.export();
            windows
                .iter()
                .find(|(id, _)| *id == 1)
                .map(|(_, l)| l.len())
        };
        // Window 0 grows until the cap; window 1, beside it, saturates at its first layer.
        add(0..20_000, 0);
        add(20_000..22_000, HOUR + HOUR / 2);
        assert_eq!(
            window_1_layers(),
            Some(1),
            "window 1 saturated beside window 0"
        );
        let asked = filter.growth_requests.load(Ordering::Relaxed);
        add(22_000..23_000, HOUR + HOUR / 2);
        assert_eq!(
            filter.growth_requests.load(Ordering::Relaxed),
            asked,
            "saturated: not asked again"
        );
        // Four hours in, window 0 is dead and expires; its memory lets window 1 grow.
        assert_eq!(filter.expire(4 * HOUR), 1);
        add(23_000..24_000, HOUR + HOUR / 2);
        assert!(
            window_1_layers() > Some(1),
            "window 1 grew once window 0's memory was freed"
        );
    }

    #[test]
    fn batch_answers_match_single_answers() {
        let filter = WindowedFilter::new(spec(Retention::Millis(3 * HOUR), 1_000));
        let hasher = KeyHasher::from_seed([5; 32]);
        let hashes: Vec<KeyHash> = (0..500u32).map(|i| hasher.hash(&i.to_le_bytes())).collect();
        for (i, hash) in hashes.iter().enumerate().step_by(3) {
            filter.insert(*hash, i as u64 * 60_000);
        }
        let now = 500 * 60_000;
        let mut answers = Vec::new();
        filter.contains_many(&hashes, now, &mut answers);
        let single: Vec<bool> = hashes.iter().map(|h| filter.contains(*h, now)).collect();
        assert_eq!(answers, single);
    }
}
