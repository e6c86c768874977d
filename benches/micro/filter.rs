//! Lookup cost and accuracy of the existence filter, next to a classic Bloom filter baseline.
//!
//! Every figure is for filters sized for 10,000,000 keys at a 1% false-positive target, filled with random
//! 16-byte keys (the size of a UUID, the typical id a caller asks about):
//!
//! - **single window**: a [`WindowedFilter`] with `Retention::Forever`, the configuration of a namespace whose
//!   keys never expire — one blocked Bloom layer behind the epoch-protected window list;
//! - **bare layer**: a [`BloomLayer`] of the same geometry, to separate the cost of the blocked filter itself
//!   from that of the window machinery around it;
//! - **fastbloom**: `fastbloom` 0.17 (a classic, unblocked Bloom filter: `k` probes anywhere in the bit array)
//!   hashing with `foldhash`, sized by its own builder for the same keys and rate;
//! - **eight windows**: a [`WindowedFilter`] with a 7-day retention over 8 windows, every window filled to the
//!   capacity it is sized for (10M / 7 keys), which is the fullest state the 1% target is promised for.
//!
//! Inserts are measured too (**insert_batch_1000**): 1,000 keys never inserted before per iteration, hashing
//! included, into a single-window filter as an `Add` applies them (`insert_many`: one writer lock, prefetches
//! ahead) and into fastbloom one key at a time; each filter is replaced by an empty one, outside the timing,
//! whenever it reaches the keys it is sized for.
//!
//! Before the measurements, the bench prints each filter's size (bytes and bits per key) and its false-positive
//! rate measured on 1,000,000 keys that were never inserted, next to the 1% target.
//!
//! Each measured lookup includes hashing the key bytes (XXH3-128 with the deployment secret for ours; fastbloom
//! hashes internally), because a caller always pays it. Lookups walk a precomputed array of 2²⁰ keys in order,
//! so every lookup touches a block no recent lookup touched; consecutive lookups are independent, so the CPU
//! may overlap their cache misses, and the single-lookup figures are throughput per lookup rather than the
//! latency of one isolated lookup.
//!
//! Run with `cargo bench --bench filter`. Under `cargo test --benches` (criterion's test mode, which runs every
//! case once) the filters are built for 100,000 keys instead so the smoke test stays quick.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use existence_gate::core::filter::{BloomLayer, FilterSpec, Geometry, Retention, WindowedFilter};
use existence_gate::core::hashing::{KeyHash, KeyHasher};
use fastbloom::BloomFilter;
use foldhash::fast::FixedState;

/// Keys every filter is sized for.
const KEYS: u64 = 10_000_000;
/// Keys in test mode (`cargo test --benches`), where only a smoke run is wanted.
const TEST_MODE_KEYS: u64 = 100_000;
/// The false-positive target of every filter.
const TARGET_FP: f64 = 0.01;
/// Never-inserted keys the false-positive rate is measured on.
const FP_TRIALS: u64 = 1_000_000;
/// Keys a batched lookup asks about at once.
const BATCH: usize = 1_000;
/// Keys in each lookup array (a power of two, so the next key is found with a mask).
const PROBE_KEYS: usize = 1 << 20;
/// Retention of the windowed filter.
const SEVEN_DAYS_MS: u64 = 7 * 24 * 3_600_000;
/// Live windows of the windowed filter.
const WINDOWS: u32 = 8;
/// A day boundary (in unix milliseconds) where window 0 of the eight-window filter starts.
const EPOCH_MS: u64 = 20_000 * 24 * 3_600_000;

/// The index spaces keys are drawn from: inserted keys, keys for the false-positive measurement, and keys for
/// the absent-lookup benchmarks never overlap.
const ABSENT_FP_BASE: u64 = 1 << 40;
const ABSENT_BENCH_BASE: u64 = 1 << 41;
/// Keys the insert benchmarks insert, each once.
const INSERT_BASE: u64 = 1 << 42;

/// A bijective 64-bit mix (SplitMix64's finaliser).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The `i`-th 16-byte key: random-looking bytes, distinct for distinct `i` (the first half is a bijection of `i`).
fn key(i: u64) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&mix(i).to_le_bytes());
    bytes[8..].copy_from_slice(&mix(i ^ 0x5555_5555_5555_5555).to_le_bytes());
    bytes
}

/// Everything the measurements share, built once: filling 10M-key filters takes seconds.
struct Fixture {
    /// Keys each filter is sized for (and the single-window filters hold).
    keys: u64,
    /// The secret-keyed hasher our filters use.
    hasher: KeyHasher,
    /// Single window, retention forever.
    single: WindowedFilter,
    /// The same geometry without the window machinery.
    layer: BloomLayer,
    /// The baseline.
    fastbloom: BloomFilter<FixedState>,
    /// Eight windows over seven days, every window at capacity.
    windowed: WindowedFilter,
    /// A time at which all eight windows of `windowed` are live.
    windowed_now_ms: u64,
    /// Keys the eight-window filter holds.
    windowed_keys: u64,
    /// Inserted keys in random order (a random sample of the single-window filters' keys).
    present: Vec<[u8; 16]>,
    /// Inserted keys of the eight-window filter, in random order.
    windowed_present: Vec<[u8; 16]>,
    /// Keys never inserted anywhere.
    absent: Vec<[u8; 16]>,
}

/// A single window, retention forever, sized for `keys`.
fn single_window(keys: u64) -> FilterSpec {
    FilterSpec {
        expected_keys: keys,
        false_positive_rate: TARGET_FP,
        retention: Retention::Forever,
        windows: 1,
        max_bytes: u64::MAX,
    }
}

/// An empty fastbloom filter sized by its own builder for `keys` at the target rate.
fn sized_fastbloom(keys: u64) -> BloomFilter<FixedState> {
    BloomFilter::with_false_pos(TARGET_FP)
        .hasher(FixedState::with_seed(7))
        .expected_items(keys as usize)
}

impl Fixture {
    fn build(keys: u64) -> Self {
        let started = Instant::now();
        let hasher = KeyHasher::from_seed([7; 32]);

        let single = WindowedFilter::new(single_window(keys));
        let layer = BloomLayer::new(Geometry::for_target(keys, TARGET_FP));
        let mut fastbloom = sized_fastbloom(keys);
        for i in 0..keys {
            let k = key(i);
            let hash = hasher.hash(&k);
            single.insert(hash, 0);
            layer.insert(hash);
            fastbloom.insert(&k);
        }

        let mut spec = FilterSpec {
            expected_keys: keys,
            false_positive_rate: TARGET_FP,
            retention: Retention::Millis(SEVEN_DAYS_MS),
            windows: WINDOWS,
            max_bytes: 0,
        };
        spec.max_bytes = spec.initial_bytes() * 4;
        let windowed = WindowedFilter::new(spec);
        let span = spec.span_ms().expect("finite retention has a span");
        let per_window = spec.base_geometry().capacity;
        let mut windowed_keys = 0;
        for window in 0..u64::from(WINDOWS) {
            let at = EPOCH_MS + window * span;
            for j in 0..per_window {
                windowed.insert(hasher.hash(&key(window * per_window + j)), at);
                windowed_keys += 1;
            }
        }
        // Midway through the newest window: the oldest window is still live.
        let windowed_now_ms = EPOCH_MS + (u64::from(WINDOWS) - 1) * span + span / 2;

        let sample = |range: u64, salt: u64| -> Vec<[u8; 16]> {
            (0..PROBE_KEYS as u64)
                .map(|n| key(mix(n ^ salt) % range))
                .collect()
        };
        let present = sample(keys, 0xA);
        let windowed_present = sample(windowed_keys, 0xB);
        let absent = (0..PROBE_KEYS as u64)
            .map(|n| key(ABSENT_BENCH_BASE + n))
            .collect();

        let fixture = Self {
            keys,
            hasher,
            single,
            layer,
            fastbloom,
            windowed,
            windowed_now_ms,
            windowed_keys,
            present,
            windowed_present,
            absent,
        };
        fixture.check_shape();
        println!("fixture: built in {:.1} s", started.elapsed().as_secs_f64());
        fixture
    }

    /// The measurements are only meaningful if the filters have the shape the figures claim: no window grew an
    /// extra layer, all eight windows are live, and every inserted key is found.
    fn check_shape(&self) {
        let single = self.single.stats(0);
        assert_eq!((single.windows, single.layers), (1, 1), "{single:?}");
        let windowed = self.windowed.stats(self.windowed_now_ms);
        assert_eq!(
            (windowed.windows, windowed.layers),
            (WINDOWS as usize, WINDOWS as usize),
            "{windowed:?}"
        );
        for k in self.present.iter().take(10_000) {
            let hash = self.hasher.hash(k);
            assert!(self.single.contains(hash, 0) && self.layer.contains(hash));
            assert!(self.fastbloom.contains(k));
        }
        for k in self.windowed_present.iter().take(10_000) {
            assert!(self
                .windowed
                .contains(self.hasher.hash(k), self.windowed_now_ms));
        }
    }

    /// Prints size and measured false-positive rate of each filter, once, before the timings.
    fn report(&self) {
        let fp_keys = || (0..FP_TRIALS).map(|i| key(ABSENT_FP_BASE + i));
        let rate = |hits: usize| hits as f64 / FP_TRIALS as f64;
        let single_fp = rate(
            fp_keys()
                .filter(|k| self.single.contains(self.hasher.hash(k), 0))
                .count(),
        );
        let layer_fp = rate(
            fp_keys()
                .filter(|k| self.layer.contains(self.hasher.hash(k)))
                .count(),
        );
        let fastbloom_fp = rate(fp_keys().filter(|k| self.fastbloom.contains(k)).count());
        let windowed_fp = rate(
            fp_keys()
                .filter(|k| {
                    self.windowed
                        .contains(self.hasher.hash(k), self.windowed_now_ms)
                })
                .count(),
        );
        // One standard error of a rate near the target measured on FP_TRIALS keys.
        let stderr = (TARGET_FP * (1.0 - TARGET_FP) / FP_TRIALS as f64).sqrt();

        let single_stats = self.single.stats(0);
        let windowed_stats = self.windowed.stats(self.windowed_now_ms);
        let geometry = self.layer.geometry();
        let fastbloom_bytes = self.fastbloom.num_bits() as u64 / 8;
        let bits_per_key = |bytes: u64, keys: u64| bytes as f64 * 8.0 / keys as f64;

        println!();
        println!(
            "== filter sizes and false-positive rates ({} keys, target {:.2}%, measured on {} never-inserted keys, \
             ±{:.3}% = 1 s.e.) ==",
            self.keys,
            TARGET_FP * 100.0,
            FP_TRIALS,
            stderr * 100.0
        );
        println!(
            "{:<34} {:>12} {:>9} {:>7} {:>11} {:>11}",
            "filter", "bytes", "bits/key", "probes", "measured", "estimated"
        );
        let row =
            |name: &str, bytes: u64, keys: u64, probes: String, measured: f64, estimated: f64| {
                println!(
                    "{:<34} {:>12} {:>9.2} {:>7} {:>10.3}% {:>10.3}%",
                    name,
                    bytes,
                    bits_per_key(bytes, keys),
                    probes,
                    measured * 100.0,
                    estimated * 100.0
                );
            };
        row(
            "existence-gate, 1 window",
            self.single.bytes(),
            self.keys,
            geometry.probes.to_string(),
            single_fp,
            single_stats.estimated_false_positive_rate,
        );
        row(
            "existence-gate, bare layer",
            self.layer.bytes(),
            self.keys,
            geometry.probes.to_string(),
            layer_fp,
            self.layer.estimated_false_positive_rate(),
        );
        row(
            "fastbloom 0.17 + foldhash",
            fastbloom_bytes,
            self.keys,
            self.fastbloom.num_hashes().to_string(),
            fastbloom_fp,
            self.fastbloom.expected_false_pos(self.keys as usize),
        );
        let window_geometry = self.windowed.spec().base_geometry();
        row(
            "existence-gate, 8 windows (7 d)",
            self.windowed.bytes(),
            self.keys,
            format!("{}x8", window_geometry.probes),
            windowed_fp,
            windowed_stats.estimated_false_positive_rate,
        );
        println!(
            "8 windows: {} keys per window (capacity), {} keys live in total = {:.2} bits per live key; \
             bits/key above is per expected key ({})",
            window_geometry.capacity,
            self.windowed_keys,
            bits_per_key(self.windowed.bytes(), self.windowed_keys),
            self.keys
        );
        println!(
            "fill: 1 window {:.3}, 8 windows {:.3} (fraction of bits set)",
            self.single.fill_ratio(0),
            self.windowed.fill_ratio(self.windowed_now_ms)
        );
        println!();
    }
}

/// Sets the shared group settings: short runs, so the whole bench fits in a few minutes on two cores.
fn configure<M: criterion::measurement::Measurement>(group: &mut BenchmarkGroup<'_, M>) {
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
}

/// Times one lookup per iteration, cycling through `keys`.
fn bench_single<M: criterion::measurement::Measurement>(
    group: &mut BenchmarkGroup<'_, M>,
    name: &str,
    keys: &[[u8; 16]],
    lookup: impl Fn(&[u8; 16]) -> bool,
) {
    let mask = keys.len() - 1;
    group.bench_function(name, |b| {
        let mut next = 0usize;
        b.iter(|| {
            let k = &keys[next & mask];
            next = next.wrapping_add(1);
            black_box(lookup(black_box(k)))
        })
    });
}

/// Times the insert of `BATCH` keys never inserted before per iteration (`insert(keys)`, hashing included),
/// into a filter `fresh()` makes and replaces, untimed, once it holds `capacity` keys.
fn bench_inserts<F>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    capacity: u64,
    fresh: impl Fn() -> F,
    mut insert: impl FnMut(&mut F, &[[u8; 16]]),
) {
    group.bench_function(name, |b| {
        let mut filter = fresh();
        let (mut next, mut held) = (INSERT_BASE, 0);
        b.iter_custom(|iterations| {
            let mut timed = Duration::ZERO;
            for _ in 0..iterations {
                if held + BATCH as u64 > capacity {
                    filter = fresh();
                    held = 0;
                }
                let keys: Vec<[u8; 16]> = (next..next + BATCH as u64).map(key).collect();
                let started = Instant::now();
                insert(&mut filter, black_box(&keys));
                timed += started.elapsed();
                next += BATCH as u64;
                held += BATCH as u64;
            }
            timed
        })
    });
}

/// Times one `contains_many` call over `BATCH` keys per iteration, hashing included; reported per key.
fn bench_batch<M: criterion::measurement::Measurement>(
    group: &mut BenchmarkGroup<'_, M>,
    name: &str,
    fixture: &Fixture,
    filter: &WindowedFilter,
    now_ms: u64,
    keys: &[[u8; 16]],
) {
    let batches = keys.len() / BATCH;
    group.bench_function(name, |b| {
        let mut next = 0usize;
        let mut hashes: Vec<KeyHash> = Vec::with_capacity(BATCH);
        let mut answers: Vec<bool> = Vec::with_capacity(BATCH);
        b.iter(|| {
            let start = (next % batches) * BATCH;
            next = next.wrapping_add(1);
            hashes.clear();
            hashes.extend(
                keys[start..start + BATCH]
                    .iter()
                    .map(|k| fixture.hasher.hash(k)),
            );
            filter.contains_many(black_box(&hashes), now_ms, &mut answers);
            black_box(&answers);
        })
    });
}

fn filter_benches(c: &mut Criterion) {
    // Criterion's test mode (`cargo test --benches`) runs each case once: a small fixture is enough there.
    let measuring = std::env::args().any(|arg| arg == "--bench");
    let fixture = Fixture::build(if measuring { KEYS } else { TEST_MODE_KEYS });
    fixture.report();
    let f = &fixture;

    // One lookup in the single-window filter against fastbloom: the headline comparison. Absent keys are what
    // the gate exists for (a "definitely absent" answer saves a database read); they stop at the first unset
    // bit. Present keys test every probe, the worst case. The bare layer shows what the window list (epoch
    // pin, window walk) adds on top of the blocked filter.
    {
        let mut group = c.benchmark_group("single_window_lookup");
        configure(&mut group);
        group.throughput(Throughput::Elements(1));
        bench_single(&mut group, "existence-gate/absent", &f.absent, |k| {
            f.single.contains(f.hasher.hash(k), 0)
        });
        bench_single(&mut group, "fastbloom/absent", &f.absent, |k| {
            f.fastbloom.contains(k)
        });
        bench_single(&mut group, "existence-gate/present", &f.present, |k| {
            f.single.contains(f.hasher.hash(k), 0)
        });
        bench_single(&mut group, "fastbloom/present", &f.present, |k| {
            f.fastbloom.contains(k)
        });
        bench_single(&mut group, "bare-layer/absent", &f.absent, |k| {
            f.layer.contains(f.hasher.hash(k))
        });
        bench_single(&mut group, "bare-layer/present", &f.present, |k| {
            f.layer.contains(f.hasher.hash(k))
        });
        group.finish();
    }

    // The batched path a `ContainsMany` request takes: one epoch pin per batch and prefetches that overlap the
    // cache misses of neighbouring keys. Throughput is per key, to compare with the single lookups above.
    {
        let mut group = c.benchmark_group("single_window_batch_1000");
        configure(&mut group);
        group.throughput(Throughput::Elements(BATCH as u64));
        bench_batch(
            &mut group,
            "existence-gate/absent",
            f,
            &f.single,
            0,
            &f.absent,
        );
        bench_batch(
            &mut group,
            "existence-gate/present",
            f,
            &f.single,
            0,
            &f.present,
        );
        group.finish();
    }

    // The same lookups with a finite retention: each live window is one more block to load (and one more
    // layer sized for a tighter per-window rate), so this shows what retention costs per lookup. An absent
    // key must be rejected by all eight windows; a present key stops at the window that holds it.
    {
        let now = f.windowed_now_ms;
        let mut group = c.benchmark_group("eight_windows_lookup");
        configure(&mut group);
        group.throughput(Throughput::Elements(1));
        bench_single(&mut group, "existence-gate/absent", &f.absent, |k| {
            f.windowed.contains(f.hasher.hash(k), now)
        });
        bench_single(
            &mut group,
            "existence-gate/present",
            &f.windowed_present,
            |k| f.windowed.contains(f.hasher.hash(k), now),
        );
        group.finish();

        let mut group = c.benchmark_group("eight_windows_batch_1000");
        configure(&mut group);
        group.throughput(Throughput::Elements(BATCH as u64));
        bench_batch(
            &mut group,
            "existence-gate/absent",
            f,
            &f.windowed,
            now,
            &f.absent,
        );
        bench_batch(
            &mut group,
            "existence-gate/present",
            f,
            &f.windowed,
            now,
            &f.windowed_present,
        );
        group.finish();
    }

    // Inserts, as a 1,000-key `Add` applies them: the cache misses of a batch overlap only if no insert
    // waits for its line (see "Concurrency" in the filter's `bloom` module).
    {
        let mut group = c.benchmark_group("insert_batch_1000");
        configure(&mut group);
        group.throughput(Throughput::Elements(BATCH as u64));
        let hasher = &f.hasher;
        let spec = single_window(f.keys);
        bench_inserts(
            &mut group,
            "existence-gate",
            f.keys,
            || WindowedFilter::new(spec),
            |filter, keys| {
                let hashes: Vec<KeyHash> = keys.iter().map(|k| hasher.hash(k)).collect();
                filter.insert_many(&hashes, 0);
            },
        );
        bench_inserts(
            &mut group,
            "fastbloom",
            f.keys,
            || sized_fastbloom(f.keys),
            |filter, keys| {
                keys.iter().for_each(|k| {
                    filter.insert(k);
                })
            },
        );
        group.finish();
    }
}

criterion_group!(benches, filter_benches);
criterion_main!(benches);
