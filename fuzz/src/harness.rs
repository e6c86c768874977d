//! The checks behind every fuzz target, shared with `tests/suite/fuzz_harnesses.rs` (which includes this file with
//! `#[path]`), so that `cargo fuzz` and plain `cargo test` run exactly the same code on their inputs.
//!
//! Each check takes arbitrary bytes, feeds them to one decoder or request path, and panics only when the
//! code under test panics or breaks a stated property (a decoded record re-encodes to the same bytes, an
//! added key answers `MAY_EXIST`, a snapshot read back equals what was written, ...). Errors are expected
//! answers to hostile input, never findings.
//!
//! Frames carry CRC-32C checksums, so nearly every mutation of a log segment or snapshot is refused at the
//! frame layer. The segment and snapshot checks therefore run each input twice: as it is, and with every
//! frame's checksum recomputed ([`fix_checksums`]), which lets mutations reach the record and snapshot
//! decoders behind the frames and the recovery code behind those.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use existence_gate::core::answer::{Answer, Basis};
use existence_gate::core::clock::ManualClock;
use existence_gate::core::config::{parse_duration, GateConfig};
use existence_gate::core::filter::Retention;
use existence_gate::core::gate::{Gate, GateError};
use existence_gate::core::hashing::KeyHasher;
use existence_gate::core::log::{Mutation, RebuildStep, VolatileLog};
use existence_gate::core::namespace::{AbsenceReport, Rebuild, RecordOutcome, WindowImage};
use existence_gate::core::recent_adds::RecentAddsImage;
use existence_gate::core::tombstones::AbsenceKind;
use existence_gate::proto;
use existence_gate::storage::snapshot::{self, Image};
use existence_gate::storage::{codec, frame, wal, DataDir, Snapshotter, SyncMode};
use prost::Message;

/// The configuration of every gate the checks build. Snapshot seeds are written under it, so their
/// namespaces' sizing fingerprints match and restores go all the way through.
pub const CONFIG: &str = r#"
[limits]
max_batch_keys = 16
max_key_bytes = 64
replay_buffer_bytes = 4096
max_subscribers_per_namespace = 4

[[tokens]]
name = "reader"
sha256 = "ba5005a40cf5212e4ac0190104cc127edab013294bb71279a975b27a80982d45"
roles = ["read"]
namespaces = ["users"]

[[tokens]]
name = "writer"
sha256 = "3590c0a59f72ce02700194a05f228a725c1f135a6dcb3ded9b2d86ab6a6f52cb"
roles = ["read", "write"]
namespaces = ["*"]

[namespaces.default]
expected_keys = 1000

[namespaces.users]
expected_keys = 3000
retention = "1h"
windows = 4
missing_ttl = "30s"
deleted_ttl = "5m"
max_ttl = "1h"
max_tombstones = 100
max_tombstone_rate = 50
"#;

/// A configuration at the edges of what validation accepts: one-byte keys, one-key batches, the smallest
/// replay buffer, a 1 s retention cut into 1024 windows, a 50% false-positive rate, one tombstone.
pub const EDGE_CONFIG: &str = r#"
[limits]
max_batch_keys = 1
max_key_bytes = 1
replay_buffer_bytes = 4096

[namespaces.default]
expected_keys = 1
false_positive_rate = 0.5
retention = "1s"
windows = 1024
missing_ttl = "1s"
deleted_ttl = "1s"
max_ttl = "1s"
ttl_jitter = 0.5
max_tombstones = 1
max_tombstone_rate = 1

[namespaces.e]
expected_keys = 1
false_positive_rate = 0.000000002
ttl_jitter = 0.0
"#;

/// The hash seed of every gate the checks build (and of the snapshot seeds).
pub const SEED: [u8; 32] = [7; 32];
/// The time the checks' clocks start at: 2027-01-15, far from any window boundary of `CONFIG`.
pub const START_MS: u64 = 1_800_000_000_000;

/// The tokens whose digests [`CONFIG`] lists, and one it does not.
const TOKENS: [&str; 3] = ["reader-token", "writer-token", "admin-token"];

/// Namespace names the request check picks from before making up its own.
const NAMES: [&str; 7] = ["", "default", "users", "e", "Default", "nope", "users\0"];

/// `config` parsed; [`CONFIG`] and [`EDGE_CONFIG`] once per process (sizing a namespace is costly).
pub fn parsed(config: &str) -> Arc<GateConfig> {
    static MAIN: OnceLock<Arc<GateConfig>> = OnceLock::new();
    static EDGE: OnceLock<Arc<GateConfig>> = OnceLock::new();
    let parse =
        || Arc::new(GateConfig::from_toml(config).expect("the checks' configurations are valid"));
    match config {
        CONFIG => Arc::clone(MAIN.get_or_init(parse)),
        EDGE_CONFIG => Arc::clone(EDGE.get_or_init(parse)),
        _ => parse(),
    }
}

/// A gate on a manual clock at [`START_MS`], opened on a log that records nothing.
pub fn new_gate(config: &str) -> (Gate, Arc<ManualClock>) {
    let config = parsed(config);
    let clock = Arc::new(ManualClock::new(START_MS));
    let gate = Gate::new(&config, KeyHasher::from_seed(SEED), clock.clone());
    gate.open(Arc::new(VolatileLog));
    (gate, clock)
}

/// A scratch directory for one input: in `/dev/shm` where it exists (the checks write a file per input).
pub fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let builder = tempfile::Builder::new()
        .prefix("existence-gate-fuzz-")
        .to_owned();
    if shm.is_dir() {
        if let Ok(dir) = builder.tempdir_in(shm) {
            return dir;
        }
    }
    builder.tempdir().expect("a temporary directory")
}

/// Recomputes the checksum of every frame in `bytes` whose length fits, front to back, stopping at the
/// first that does not. Returns whether anything changed.
pub fn fix_checksums(bytes: &mut [u8]) -> bool {
    let mut changed = false;
    let mut at = 0usize;
    let mut framed = Vec::new();
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let Some(end) = (at + 8).checked_add(len).filter(|end| *end <= bytes.len()) else {
            break;
        };
        framed.clear();
        frame::encode(&bytes[at + 8..end], &mut framed);
        if bytes[at + 4..at + 8] != framed[4..8] {
            bytes[at + 4..at + 8].copy_from_slice(&framed[4..8]);
            changed = true;
        }
        at = end;
    }
    changed
}

/// Offsets where each whole frame of `bytes` ends.
fn frame_ends(bytes: &[u8]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut at = 0usize;
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        match (at + 8).checked_add(len).filter(|end| *end <= bytes.len()) {
            Some(end) => {
                ends.push(end);
                at = end;
            }
            None => break,
        }
    }
    ends
}

// ---------------------------------------------------------------------------------------------------------
// log_record: one log record's payload, and the frame layer.

/// Decodes `data` as one log record (a decoded record must re-encode to exactly `data`, or — a record of an
/// older type, which is written in the current one — to bytes that decode to the same mutation), reads it
/// as a sequence of frames decoding each payload, and scans it for a valid frame.
pub fn log_record(data: &[u8]) {
    if let Ok(mutation) = codec::decode(data) {
        let mut again = Vec::new();
        codec::encode(&mutation, &mut again);
        let older = [
            codec::RECORD_ABSENT_UNOBSERVED,
            codec::ADD_FIXED,
            codec::REBUILD_FIXED,
        ];
        if data[0] == codec::ADD_UNIFORM {
            again.clear();
            codec::encode_with_seq(
                &mutation,
                mutation.seq(),
                codec::KeyLengths::Uniform,
                &mut again,
            );
            assert_eq!(
                again, data,
                "an Add of keys of one length re-encodes differently"
            );
        } else if older.contains(&data[0]) {
            let upgraded = codec::decode(&again).expect("a re-encoded record decodes");
            assert_eq!(
                upgraded, mutation,
                "an older record re-encodes to another mutation"
            );
        } else {
            assert_eq!(again, data, "a decoded record re-encodes differently");
        }
    }
    let mut reader = frame::Reader::new(data, data.len() as u64);
    let mut last_offset = None;
    loop {
        match reader.next_frame() {
            Ok(frame::Next::Frame(offset, payload)) => {
                assert!(last_offset.is_none_or(|last| offset > last) || payload.is_empty());
                assert!(offset + frame::HEADER_BYTES + payload.len() as u64 <= data.len() as u64);
                last_offset = Some(offset);
                let _ = codec::decode(payload);
            }
            Ok(frame::Next::End) => {
                assert_eq!(reader.offset(), data.len() as u64);
                break;
            }
            Ok(frame::Next::Damaged(damage)) => {
                assert!(damage.offset <= data.len() as u64);
                break;
            }
            Err(error) => panic!("reading frames from memory failed: {error}"),
        }
    }
    let _ = frame::contains_valid_frame(data);
}

// ---------------------------------------------------------------------------------------------------------
// log_segment: recovery's replay of whole segment files into a gate.

/// Replays `data` as a log segment into a fresh gate, as recovery does: as it is (one segment), and with
/// its checksums fixed (split into two segments at a frame boundary when it has several frames).
pub fn log_segment(data: &[u8]) {
    let dir = scratch();
    replay_files(dir.path(), &[data]);
    let mut fixed = data.to_vec();
    let changed = fix_checksums(&mut fixed);
    let ends = frame_ends(&fixed);
    if ends.len() >= 2 {
        let split = ends[ends.len() / 2 - 1];
        let dir = scratch();
        replay_files(dir.path(), &[&fixed[..split], &fixed[split..]]);
    } else if changed {
        let dir = scratch();
        replay_files(dir.path(), &[&fixed]);
    }
}

/// Writes `segments` as consecutive log segments in `dir`, replays them into a fresh gate, and checks what
/// replay promises: a torn tail it truncated is gone on the next replay, and every key of an `Add` to a
/// `forever` namespace answers `MAY_EXIST` unless a tombstone answers for it.
/// The seed fingerprint replayed segments are checked against: the seeds' data directory's (a mutated header
/// with another fingerprint is refused like any other damage).
pub fn seed_fingerprint() -> u64 {
    wal::seed_fingerprint(&SEED)
}

fn replay_files(dir: &Path, segments: &[&[u8]]) {
    for (number, bytes) in segments.iter().enumerate() {
        std::fs::write(wal::segment_path(dir, number as u64 + 1), bytes).expect("write a segment");
    }
    // Gates are built on the first record only: most mutated segments fail before one, and building a
    // gate (sizing its filters) costs more than the rest of a run.
    let mut gate: Option<Gate> = None;
    let mut added: Vec<Bytes> = Vec::new();
    let first = wal::replay(dir, 0, seed_fingerprint(), |mutation| {
        let gate = gate.get_or_insert_with(|| new_gate(CONFIG).0);
        // Replay skips records the state already holds: only the next seq is applied.
        let next = gate
            .namespace("default")
            .expect("configured")
            .latest_seq()
            .wrapping_add(1);
        let applied_keys = match &mutation {
            Mutation::Add {
                namespace,
                keys,
                seq,
                ..
            } if &**namespace == "default" && *seq == next => Some(keys.clone()),
            _ => None,
        };
        gate.replay_one(mutation)?;
        if let Some(keys) = applied_keys {
            added.extend(keys.iter().take(64 - added.len().min(64)));
        }
        Ok(())
    });
    let Ok(first) = first else {
        return;
    };
    assert_eq!(first.last_segment, segments.len() as u64);
    let seqs = |g: &Option<Gate>| -> Vec<u64> {
        g.as_ref().map_or_else(Vec::new, |g| {
            g.namespaces().iter().map(|n| n.latest_seq()).collect()
        })
    };
    let mut again_gate: Option<Gate> = None;
    let again = wal::replay(dir, 0, seed_fingerprint(), |mutation| {
        again_gate
            .get_or_insert_with(|| new_gate(CONFIG).0)
            .replay_one(mutation)
    })
    .expect("a log that replayed once replays again");
    assert_eq!(again.truncated, None, "replay truncated twice");
    assert_eq!(again.records, first.records);
    assert_eq!(
        seqs(&again_gate),
        seqs(&gate),
        "two replays of one log disagree"
    );
    let Some(gate) = gate else {
        return;
    };
    for key in &added {
        if key.is_empty() || key.len() > gate.limits().max_key_bytes {
            continue;
        }
        let (lookup, _) = gate.may_exist("default", key).expect("a valid lookup");
        assert!(
            lookup.answer == Answer::MayExist || lookup.basis == Basis::Tombstone,
            "a replayed key answers ABSENT from the filter"
        );
    }
    exercise(&gate);
}

/// Lookups, writes, upkeep and stats on every namespace of `gate`: state restored from a snapshot or a log
/// must serve whatever it holds.
fn exercise(gate: &Gate) {
    let batch = gate.limits().max_batch_keys.min(4);
    let keys: Vec<Bytes> = (b'a'..b'e').map(|k| Bytes::from(vec![k])).collect();
    for namespace in gate.namespaces() {
        let name = namespace.name().to_string();
        let _ = gate.may_exist(&name, b"p").expect("a valid lookup");
        let mut answers = Vec::new();
        gate.batch_may_exist(&name, &keys[..batch], &mut answers)
            .expect("a valid batch");
        gate.add(&name, keys[..batch.min(2)].to_vec())
            .expect("a valid add");
        let report = AbsenceReport {
            key: keys[0].clone(),
            kind: AbsenceKind::Deleted,
            observed_seq: 0,
            ttl_seconds: 0,
        };
        gate.record_absent(&name, report).expect("a valid report");
        let (_, mut subscription) = gate.subscribe(&name, 1).expect("a valid subscription");
        for _ in 0..4 {
            if subscription.poll_ready().is_none() {
                break;
            }
        }
    }
    gate.maintain();
    let _ = gate.stats();
    gate.export_gauges();
}

// ---------------------------------------------------------------------------------------------------------
// snapshot: reading a snapshot file and restoring it.

/// Reads `data` as a snapshot file (as it is, and with its checksums fixed); restores whatever reads into a
/// fresh gate and serves from it; and for a snapshot whose namespaces all restore, checks that writing the
/// restored gate's snapshot and reading it back gives the same image.
pub fn snapshot(data: &[u8]) {
    let dir = scratch();
    read_snapshot(dir.path(), data);
    let mut fixed = data.to_vec();
    if fix_checksums(&mut fixed) {
        read_snapshot(dir.path(), &fixed);
    }
}

/// Whether restoring kept every tombstone of the image: a key may live only in its 16-slot bucket, so an
/// image (crafted, or from a store of another shape) with more than 16 tombstones for one bucket loses the
/// extra ones on restore, as the store's eviction rule says.
fn kept_every_tombstone(gate: &Gate, summary: &ImageSummary) -> bool {
    gate.stats().iter().all(|stats| {
        summary
            .namespaces
            .iter()
            .filter(|n| *n.name == *stats.name)
            .all(|n| stats.tombstones == n.tombstones.len() as u64)
    })
}

/// Reads, restores and serves one snapshot file's bytes.
pub fn read_snapshot(dir: &Path, data: &[u8]) {
    let path = snapshot::snapshot_path(dir, 1);
    std::fs::write(&path, data).expect("write the snapshot");
    let Ok(image) = snapshot::read(&path) else {
        return;
    };
    let (gate, _clock) = new_gate(CONFIG);
    let summary = ImageSummary::of(&image);
    let mut all_restored = true;
    for namespace in image.namespaces {
        all_restored &= snapshot::restore(&gate, namespace).is_ok();
    }
    if all_restored && summary.round_trips() && kept_every_tombstone(&gate, &summary) {
        let out = scratch();
        let written = snapshot::write(out.path(), image.covered, &gate, image.seed)
            .expect("write a snapshot of a restored gate");
        let back = snapshot::read(&written.path).expect("a snapshot just written reads back");
        assert_eq!(ImageSummary::of(&back).namespaces, summary.namespaces);
        assert_eq!((back.covered, back.seed), (image.covered, image.seed));
    }
    exercise(&gate);
}

/// A layer of a snapshot: `(blocks, probes, capacity, inserted, words)`.
pub type LayerSummary = (usize, u32, u64, u64, Vec<u64>);

/// What a namespace of a snapshot holds, comparable.
#[derive(Debug, PartialEq, Eq)]
pub struct NamespaceSummary {
    pub name: String,
    pub fingerprint: u64,
    pub seq: u64,
    pub keys_added: u64,
    pub windows: Vec<WindowSummary>,
    /// `(tag, strong hash, expires_at_ms, deleted)`, sorted.
    pub tombstones: Vec<(u32, [u64; 2], u64, bool)>,
    pub recent_adds: RecentAddsImage,
    /// `(began, keys, last step ms, windows)` of a logged rebuild in progress.
    pub rebuild: Option<(u64, u64, u64, Vec<WindowSummary>)>,
}

/// A window of a snapshot: `(id, layers)`.
pub type WindowSummary = (u64, Vec<LayerSummary>);

fn summarize_windows(windows: &[WindowImage]) -> Vec<WindowSummary> {
    windows
        .iter()
        .map(|(id, layers)| {
            let layers = layers
                .iter()
                .map(|l| {
                    let g = l.geometry();
                    (
                        g.blocks,
                        g.probes,
                        g.capacity,
                        l.inserted(),
                        l.words().collect(),
                    )
                })
                .collect();
            (*id, layers)
        })
        .collect()
}

/// What a snapshot holds, comparable.
#[derive(Debug, PartialEq, Eq)]
pub struct ImageSummary {
    pub namespaces: Vec<NamespaceSummary>,
}

impl ImageSummary {
    pub fn of(image: &Image) -> Self {
        let namespaces = image
            .namespaces
            .iter()
            .map(|n| {
                let mut tombstones: Vec<_> = n
                    .tombstones
                    .iter()
                    .map(|t| {
                        (
                            t.key.tag,
                            t.key.strong.0,
                            t.expires_at_ms,
                            t.kind == AbsenceKind::Deleted,
                        )
                    })
                    .collect();
                tombstones.sort_unstable();
                NamespaceSummary {
                    recent_adds: n.recent_adds.clone(),
                    name: n.name.clone(),
                    fingerprint: n.fingerprint,
                    seq: n.seq,
                    keys_added: n.keys_added,
                    windows: summarize_windows(&n.windows),
                    tombstones,
                    rebuild: n.rebuild.as_ref().map(|r| {
                        (
                            r.began,
                            r.keys,
                            r.last_step_ms,
                            summarize_windows(&r.windows),
                        )
                    }),
                }
            })
            .collect();
        Self { namespaces }
    }

    /// Whether restoring and writing again must reproduce this image exactly: every namespace of
    /// [`CONFIG`] appears exactly once, in name order (as snapshots are written), and every tombstone is
    /// distinct and live at [`START_MS`] (restore keeps only those; the store's own limits keep them all).
    fn round_trips(&self) -> bool {
        let names: Vec<&str> = self.namespaces.iter().map(|n| n.name.as_str()).collect();
        names == ["default", "users"]
            && self.namespaces.iter().all(|n| {
                let distinct: BTreeSet<_> = n.tombstones.iter().map(|t| (t.0, t.1)).collect();
                distinct.len() == n.tombstones.len()
                    && n.tombstones.len() <= if n.name == "users" { 100 } else { 1_000 }
                    && n.tombstones.iter().all(|t| t.2 > START_MS)
            })
    }
}

// ---------------------------------------------------------------------------------------------------------
// config: the TOML configuration and durations.

/// Parses `data` (lossily as UTF-8) as a configuration and as durations; for a configuration that parses,
/// derives every namespace's sizing and, when it is small enough to allocate, serves a few requests with
/// it (a configuration that validation accepts must not make requests panic).
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = parse_duration(&text);
    for word in text.split(|c: char| c.is_whitespace() || c == '"' || c == '=') {
        if let Ok(duration) = parse_duration(word) {
            assert!(word.trim().starts_with(|c: char| c.is_ascii_digit()));
            let _ = duration.as_millis();
        }
    }
    let config = match GateConfig::from_toml(&text) {
        Ok(config) => config,
        Err(error) => {
            let _ = error.to_string();
            return;
        }
    };
    assert!(config.namespaces.contains_key("default"));
    let mut total_bytes = 0u64;
    for settings in config.namespaces.values() {
        let spec = settings.filter_spec();
        let _ = (spec.fingerprint(), spec.span_ms(), spec.base_geometry());
        let initial = spec.initial_bytes();
        assert!(
            spec.max_bytes >= initial,
            "the filter cap is below its initial size"
        );
        total_bytes = total_bytes.saturating_add(initial);
        if let Retention::Millis(ms) = spec.retention {
            assert!(ms >= 1_000);
        }
    }
    if total_bytes > 1 << 20 || config.namespaces.len() > 4 {
        return;
    }
    let clock = Arc::new(ManualClock::new(START_MS));
    let gate = Gate::new(&config, KeyHasher::from_seed(SEED), clock.clone());
    gate.open(Arc::new(VolatileLog));
    for name in config.namespaces.keys() {
        let key = Bytes::from_static(b"k");
        gate.add(name, vec![key.clone()]).expect("a valid add");
        for (kind, ttl_seconds) in [
            (AbsenceKind::Missing, 0),
            (AbsenceKind::Deleted, 0),
            (AbsenceKind::Missing, u32::MAX),
        ] {
            let report = AbsenceReport {
                key: key.clone(),
                kind,
                observed_seq: 0,
                ttl_seconds,
            };
            let recorded = gate.record_absent(name, report).expect("a valid report");
            if recorded.outcome == RecordOutcome::Recorded {
                let max_ttl = config.namespaces[name].max_ttl.as_millis();
                assert!(u128::from(recorded.expires_in_ms) <= max_ttl.max(1));
            }
        }
        let _ = gate.may_exist(name, &key).expect("a valid lookup");
        clock.advance(61_000);
        gate.maintain();
    }
    let _ = gate.stats();
}

// ---------------------------------------------------------------------------------------------------------
// requests: what a client can send.

/// Reads `data` as a little program of requests against a fresh gate: typed calls with made-up namespaces,
/// keys, kinds, seqs and TTLs, and raw protobuf bytes decoded into the request messages as the gRPC layer
/// does, then passed to the same calls. Checks that validation refuses exactly what breaks the limits, and
/// that answers keep their promises (an added key answers `MAY_EXIST`; a recorded absence answers `ABSENT`).
pub fn requests(data: &[u8]) {
    let mut input = Input(data);
    let config_text = if input.u8() % 4 == 3 {
        EDGE_CONFIG
    } else {
        CONFIG
    };
    let config = parsed(config_text);
    let (gate, clock) = new_gate(config_text);
    let mut rebuild: Option<(String, Rebuild)> = None;
    for _ in 0..64 {
        if input.is_empty() {
            break;
        }
        match input.u8() % 17 {
            0 => {
                let namespace = input.namespace();
                let key = input.bytes(80);
                check_may_exist(&gate, &namespace, key);
            }
            1 => {
                let namespace = input.namespace();
                let keys = input.keys();
                check_batch(&gate, &namespace, &keys);
            }
            2 => {
                let namespace = input.namespace();
                let keys = input.keys();
                check_add(&gate, &namespace, keys);
            }
            3 => {
                let namespace = input.namespace();
                let key = Bytes::copy_from_slice(input.bytes(80));
                let kind = input.u32() as i32;
                let observed_seq = input.seq();
                let ttl_seconds = input.u32();
                check_record_absent(
                    &gate,
                    &config,
                    &namespace,
                    key,
                    kind,
                    observed_seq,
                    ttl_seconds,
                );
            }
            4 => {
                let namespace = input.namespace();
                let after_seq = input.seq();
                check_subscribe(&gate, &namespace, after_seq);
            }
            5 => clock.advance(u64::from(input.u32())),
            6 => {
                clock.set(START_MS.saturating_sub(u64::from(input.u32())) + u64::from(input.u16()))
            }
            7 => {
                if let Ok(request) =
                    proto::MayExistRequest::decode(input.bytes(512)).map(|mut r| {
                        resolve_namespace(&mut r.namespace);
                        r
                    })
                {
                    check_may_exist(&gate, &request.namespace, &request.key);
                }
            }
            8 => {
                if let Ok(request) =
                    proto::BatchMayExistRequest::decode(input.bytes(512)).map(|mut r| {
                        resolve_namespace(&mut r.namespace);
                        r
                    })
                {
                    check_batch(&gate, &request.namespace, &request.keys);
                }
            }
            9 => {
                if let Ok(request) = proto::AddRequest::decode(input.bytes(512)).map(|mut r| {
                    resolve_namespace(&mut r.namespace);
                    r
                }) {
                    check_add(&gate, &request.namespace, request.keys);
                }
            }
            10 => {
                if let Ok(request) =
                    proto::RecordAbsentRequest::decode(input.bytes(512)).map(|mut r| {
                        resolve_namespace(&mut r.namespace);
                        r
                    })
                {
                    check_record_absent(
                        &gate,
                        &config,
                        &request.namespace,
                        request.key,
                        request.kind,
                        request.observed_seq,
                        request.ttl_seconds,
                    );
                }
            }
            11 => {
                if let Ok(request) = proto::SubscribeInvalidationsRequest::decode(input.bytes(512))
                    .map(|mut r| {
                        resolve_namespace(&mut r.namespace);
                        r
                    })
                {
                    check_subscribe(&gate, &request.namespace, request.after_seq);
                }
            }
            12 => {
                let finish = input.u8() % 3 == 0;
                if let Ok(request) = proto::RebuildRequest::decode(input.bytes(512)).map(|mut r| {
                    resolve_namespace(&mut r.namespace);
                    r
                }) {
                    check_rebuild(&gate, &mut rebuild, request, finish);
                }
            }
            13 => {
                if let Ok(request) =
                    proto::BatchMayExistRequest::decode(input.bytes(512)).map(|mut r| {
                        resolve_namespace(&mut r.namespace);
                        r
                    })
                {
                    check_batch_request(&gate, request);
                }
            }
            14 => {
                let max_keys = usize::from(input.u8());
                let _ = check_unpack(input.bytes(512), max_keys);
            }
            15 => {
                let header = input.authorization();
                let role = input.u8();
                let namespace = input.namespace();
                check_authorization(&config, header.as_deref(), role, &namespace);
            }
            _ => {
                gate.maintain();
                let _ = gate.stats();
                gate.export_gauges();
            }
        }
    }
    if let Some((_, rebuild)) = rebuild {
        let _ = rebuild.finish();
    }
    exercise(&gate);
}

/// What the gRPC layer does to every request's namespace before anything else sees it.
fn resolve_namespace(namespace: &mut String) {
    existence_gate::service::grpc::resolve_namespace(namespace);
}

/// `BatchMayExist` as the gRPC layer serves it: `keys`, or `packed_keys` unpacked, never both.
fn check_batch_request(gate: &Gate, request: proto::BatchMayExistRequest) {
    if request.packed_keys.is_empty() {
        return check_batch(gate, &request.namespace, &request.keys);
    }
    if !request.keys.is_empty() {
        return;
    }
    let max = gate.limits().max_batch_keys;
    if let Ok(keys) = check_unpack(&request.packed_keys, max) {
        let keys: Vec<Bytes> = keys.into_iter().map(Bytes::copy_from_slice).collect();
        check_batch(gate, &request.namespace, &keys);
    }
}

/// `grpc::unpack_keys`: what it returns lies within the input, in order, and within the limit.
fn check_unpack(packed: &[u8], max_keys: usize) -> Result<Vec<&[u8]>, ()> {
    match existence_gate::service::grpc::unpack_keys(packed, max_keys) {
        Ok(keys) => {
            assert!(keys.len() <= max_keys, "more keys than the limit");
            let mut rest = packed;
            for key in &keys {
                let length = prost::encoding::decode_varint(&mut rest).expect("a length");
                assert_eq!(length as usize, key.len());
                assert_eq!(
                    &rest[..key.len()],
                    *key,
                    "a key is not where its length says"
                );
                rest = &rest[key.len()..];
            }
            assert!(rest.is_empty(), "bytes left over after the last key");
            Ok(keys)
        }
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            Err(())
        }
    }
}

/// Bearer tokens: a check passes only for a configured token with the role on the namespace.
fn check_authorization(config: &GateConfig, header: Option<&str>, role: u8, namespace: &str) {
    use existence_gate::service::auth::{Authorizer, Role, Scope};
    let authorizer = Authorizer::new(&config.tokens).expect("validated with the configuration");
    let role = match role % 3 {
        0 => Role::Read,
        1 => Role::Write,
        _ => Role::Admin,
    };
    let scope = match namespace.len() % 5 {
        3 => Scope::All,
        4 => Scope::Any,
        _ => Scope::Namespace(namespace),
    };
    let allowed = authorizer.check(header, role, scope).is_ok();
    if !authorizer.is_enabled() {
        assert!(allowed, "a gate without tokens refused a call");
        return;
    }
    let token = header
        .and_then(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
        })
        .map(str::trim);
    let known = token.is_some_and(|t| {
        let digest = existence_gate::service::auth::hash_token(t);
        config
            .tokens
            .iter()
            .any(|c| c.sha256.trim().eq_ignore_ascii_case(&digest))
    });
    if allowed {
        assert!(known, "a call without a configured token was admitted");
    }
    if matches!(scope, Scope::Namespace(_)) {
        assert_eq!(
            authorizer.allows(header, role, namespace),
            allowed,
            "allows and check disagree"
        );
    }
}

/// The namespace `name` resolves to ("" is `default`), if configured.
fn resolve(gate: &Gate, name: &str) -> Option<String> {
    gate.namespace(name).ok().map(|n| n.name().to_string())
}

/// What validation must say about a namespace and keys: `Some(error kind)` or `None` for valid.
fn expected_refusal(
    gate: &Gate,
    namespace: &str,
    keys: &[&[u8]],
    batch: bool,
) -> Option<&'static str> {
    let limits = gate.limits();
    if resolve(gate, namespace).is_none() {
        return Some("unknown namespace");
    }
    if batch && keys.len() > limits.max_batch_keys {
        return Some("invalid");
    }
    if keys
        .iter()
        .any(|k| k.is_empty() || k.len() > limits.max_key_bytes)
    {
        return Some("invalid");
    }
    None
}

#[allow(unreachable_patterns)]
fn kind_of(error: &GateError) -> &'static str {
    match error {
        GateError::UnknownNamespace(_) => "unknown namespace",
        GateError::InvalidArgument(_) => "invalid",
        GateError::Unavailable(_) => "unavailable",
        GateError::Conflict(_) => "conflict",
        _ => "other",
    }
}

fn check_may_exist(gate: &Gate, namespace: &str, key: &[u8]) {
    let expected = expected_refusal(gate, namespace, &[key], false);
    match gate.may_exist(namespace, key) {
        Ok((lookup, seq)) => {
            assert_eq!(expected, None, "an invalid lookup was answered");
            assert_eq!(
                seq,
                gate.namespace(namespace).expect("resolves").latest_seq()
            );
            let _ = lookup;
        }
        Err(error) => assert_eq!(Some(kind_of(&error)), expected, "{error}"),
    }
}

fn check_batch(gate: &Gate, namespace: &str, keys: &[Bytes]) {
    let slices: Vec<&[u8]> = keys.iter().map(|k| k.as_ref()).collect();
    let expected = expected_refusal(gate, namespace, &slices, true);
    let mut answers = Vec::new();
    match gate.batch_may_exist(namespace, keys, &mut answers) {
        Ok(_) => {
            assert_eq!(expected, None, "an invalid batch was answered");
            assert_eq!(answers.len(), keys.len());
            for (key, answer) in keys.iter().zip(&answers) {
                let (single, _) = gate.may_exist(namespace, key).expect("valid");
                assert_eq!(
                    single.answer, answer.answer,
                    "batch and single lookups disagree"
                );
            }
        }
        Err(error) => assert_eq!(Some(kind_of(&error)), expected, "{error}"),
    }
}

fn check_add(gate: &Gate, namespace: &str, keys: Vec<Bytes>) {
    let slices: Vec<&[u8]> = keys.iter().map(|k| k.as_ref()).collect();
    let mut expected = expected_refusal(gate, namespace, &slices, true);
    if expected.is_none() && keys.is_empty() {
        expected = Some("invalid");
    }
    let before = gate.namespace(namespace).map(|n| n.latest_seq()).ok();
    match gate.add(namespace, keys.clone()) {
        Ok(added) => {
            assert_eq!(expected, None, "an invalid add was applied");
            assert_eq!(
                Some(added.seq),
                before.map(|s| s + 1),
                "an add skipped a seq"
            );
            let mut answers = Vec::new();
            gate.batch_may_exist(namespace, &keys, &mut answers)
                .expect("valid");
            assert!(
                answers.iter().all(|a| a.answer == Answer::MayExist),
                "a key just added answers ABSENT"
            );
        }
        Err(error) => {
            assert_eq!(Some(kind_of(&error)), expected, "{error}");
            assert_eq!(
                gate.namespace(namespace).map(|n| n.latest_seq()).ok(),
                before
            );
        }
    }
}

fn check_record_absent(
    gate: &Gate,
    config: &GateConfig,
    namespace: &str,
    key: Bytes,
    kind: i32,
    observed_seq: u64,
    ttl_seconds: u32,
) {
    // The gRPC layer's mapping of the enum: unknown values are refused before the gate sees them.
    let kind = match proto::AbsenceKind::try_from(kind) {
        Ok(proto::AbsenceKind::Unspecified | proto::AbsenceKind::Missing) => AbsenceKind::Missing,
        Ok(proto::AbsenceKind::Deleted) => AbsenceKind::Deleted,
        Err(_) => return,
    };
    let before = gate.namespace(namespace).map(|n| n.latest_seq()).ok();
    // An observation newer than anything this gate issued cannot have been made here.
    let expected = expected_refusal(gate, namespace, &[&key], false).or_else(|| {
        before
            .is_some_and(|latest| observed_seq > latest)
            .then_some("invalid")
    });
    let report = AbsenceReport {
        key: key.clone(),
        kind,
        observed_seq,
        ttl_seconds,
    };
    match gate.record_absent(namespace, report) {
        Ok(recorded) => {
            assert_eq!(expected, None, "an invalid absence was recorded");
            let canonical = resolve(gate, namespace).expect("resolves");
            let settings = &config.namespaces[&canonical];
            if recorded.outcome == RecordOutcome::Recorded {
                assert_eq!(Some(recorded.seq), before.map(|s| s + 1));
                assert!(recorded.expires_in_ms >= 1);
                assert!(u128::from(recorded.expires_in_ms) <= settings.max_ttl.as_millis());
                let (lookup, _) = gate.may_exist(namespace, &key).expect("valid");
                assert_eq!(
                    (lookup.answer, lookup.basis),
                    (Answer::Absent, Basis::Tombstone),
                    "a recorded absence does not answer"
                );
            } else {
                assert_eq!(
                    Some(recorded.seq),
                    before,
                    "a refused absence moved the seq"
                );
                assert_eq!(recorded.expires_in_ms, 0);
            }
        }
        Err(error) => assert_eq!(Some(kind_of(&error)), expected, "{error}"),
    }
}

fn check_subscribe(gate: &Gate, namespace: &str, after_seq: u64) {
    match gate.subscribe(namespace, after_seq) {
        Ok((name, mut subscription)) => {
            assert_eq!(Some(name.to_string()), resolve(gate, namespace));
            let latest = gate.namespace(namespace).expect("resolves").latest_seq();
            let mut last = None;
            for _ in 0..8 {
                match subscription.poll_ready() {
                    None => break,
                    Some(existence_gate::core::invalidations::Delivery::Added(event)) => {
                        assert!(
                            last.is_none_or(|l| event.seq > l),
                            "invalidations out of order"
                        );
                        assert!(event.seq <= latest);
                        last = Some(event.seq);
                    }
                    Some(existence_gate::core::invalidations::Delivery::Resync { seq }) => {
                        assert!(seq <= latest);
                        last = Some(seq);
                    }
                }
            }
        }
        Err(error) => {
            assert_eq!(resolve(gate, namespace), None, "{error}");
            assert!(matches!(error, GateError::UnknownNamespace(_)));
        }
    }
}

fn check_rebuild(
    gate: &Gate,
    rebuild: &mut Option<(String, Rebuild)>,
    request: proto::RebuildRequest,
    finish: bool,
) {
    if rebuild.is_none() {
        if let Ok(started) = gate.begin_rebuild(&request.namespace) {
            let name = resolve(gate, &request.namespace).expect("resolves");
            *rebuild = Some((name, started));
        } else {
            return;
        }
    }
    let (name, running) = rebuild.as_mut().expect("running");
    let name = name.clone();
    let slices: Vec<&[u8]> = request.keys.iter().map(|k| k.as_ref()).collect();
    let expected = expected_refusal(gate, &name, &slices, true);
    match gate.feed_rebuild(running, &request.keys) {
        Ok(()) => assert_eq!(expected, None, "invalid rebuild keys were taken"),
        Err(error) => assert_eq!(Some(kind_of(&error)), expected, "{error}"),
    }
    if finish {
        let (_, running) = rebuild.take().expect("running");
        running.finish().expect("no write panicked");
        let fed: Vec<Bytes> = request
            .keys
            .into_iter()
            .filter(|_| expected.is_none())
            .collect();
        let mut answers = Vec::new();
        if !fed.is_empty() {
            gate.batch_may_exist(&name, &fed, &mut answers)
                .expect("valid");
            assert!(
                answers
                    .iter()
                    .all(|a| a.answer == Answer::MayExist || a.basis == Basis::Tombstone),
                "a key fed to a rebuild answers ABSENT from the filter"
            );
        }
    }
}

/// A cursor over fuzz input: reads past the end yield zeros and empty slices.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        head
    }

    fn fixed<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let head = self.take(N);
        out[..head.len()].copy_from_slice(head);
        out
    }

    fn u8(&mut self) -> u8 {
        self.fixed::<1>()[0]
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.fixed())
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.fixed())
    }

    /// A seq: small values (near the ones the gate hands out) mostly, any u64 sometimes.
    fn seq(&mut self) -> u64 {
        match self.u8() {
            0..=199 => u64::from(self.u8()),
            200..=249 => u64::from(self.u32()),
            _ => u64::from_le_bytes(self.fixed()),
        }
    }

    /// A length byte, then that many bytes (at most `max`).
    fn bytes(&mut self, max: usize) -> &'a [u8] {
        let len = if max > 255 {
            usize::from(self.u16()) % (max + 1)
        } else {
            usize::from(self.u8()) % (max + 1)
        };
        self.take(len)
    }

    /// A namespace: one of [`NAMES`] mostly, made-up bytes sometimes.
    fn namespace(&mut self) -> String {
        let pick = self.u8();
        match NAMES.get(usize::from(pick)) {
            Some(name) => (*name).to_string(),
            None if pick >= 128 => String::from_utf8_lossy(self.bytes(140)).into_owned(),
            None => NAMES[usize::from(pick) % NAMES.len()].to_string(),
        }
    }

    /// An `authorization` value: missing, a bearer header with a known token, or made-up text.
    fn authorization(&mut self) -> Option<String> {
        let pick = self.u8();
        let token = TOKENS[usize::from(pick) % TOKENS.len()];
        match pick % 8 {
            0 => None,
            1 => Some(format!("Bearer {token}")),
            2 => Some(format!("bearer  {token} ")),
            3 => Some(format!("Basic {token}")),
            4 => Some(token.to_string()),
            _ => Some(String::from_utf8_lossy(self.bytes(80)).into_owned()),
        }
    }

    /// A count byte, then that many keys.
    fn keys(&mut self) -> Vec<Bytes> {
        let count = usize::from(self.u8() % 24);
        (0..count)
            .map(|_| Bytes::copy_from_slice(self.bytes(80)))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------------------
// Seeds: realistic inputs for each target, made by the code paths the server uses.

/// The fuzz targets, as named under `fuzz/fuzz_targets/` and `fuzz/corpus/`.
pub const TARGETS: [&str; 6] = [
    "log_record",
    "log_segment",
    "snapshot",
    "config",
    "requests",
    "resp_request",
];

/// Runs the check of `target` on `data`.
pub fn check(target: &str, data: &[u8]) {
    match target {
        "log_record" => log_record(data),
        "log_segment" => log_segment(data),
        "snapshot" => snapshot(data),
        "config" => config(data),
        "requests" => requests(data),
        "resp_request" => resp_request(data),
        other => panic!("no target {other}"),
    }
}

/// Seed inputs: `(target, file name, bytes)`.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut seeds = Vec::new();
    for (i, mutation) in sample_mutations().iter().enumerate() {
        let mut bytes = Vec::new();
        codec::encode(mutation, &mut bytes);
        seeds.push(("log_record", format!("record-{i}"), bytes));
    }
    for (i, mutation) in sample_mutations().iter().enumerate() {
        let mut bytes = Vec::new();
        codec::encode_with_seq(
            mutation,
            mutation.seq(),
            codec::KeyLengths::Uniform,
            &mut bytes,
        );
        if bytes[0] == codec::ADD_UNIFORM {
            seeds.push(("log_record", format!("record-uniform-{i}"), bytes));
        }
    }
    let mut framed = Vec::new();
    for mutation in sample_mutations().iter().take(3) {
        let mut payload = Vec::new();
        codec::encode(mutation, &mut payload);
        frame::encode(&payload, &mut framed);
    }
    seeds.push(("log_record", "frames".to_string(), framed));
    let (segment, snapshots) = data_dir_files();
    seeds.push(("log_segment", "segment".to_string(), segment.clone()));
    seeds.push((
        "log_segment",
        "segment-torn".to_string(),
        segment[..segment.len() - 5].to_vec(),
    ));
    for (i, bytes) in snapshots.into_iter().enumerate() {
        seeds.push(("snapshot", format!("snapshot-{i}"), bytes));
    }
    for (i, text) in sample_configs().iter().enumerate() {
        seeds.push(("config", format!("config-{i}"), text.as_bytes().to_vec()));
    }
    for (i, program) in sample_programs().into_iter().enumerate() {
        seeds.push(("requests", format!("program-{i}"), program));
    }
    for (i, request) in sample_resp_requests().into_iter().enumerate() {
        seeds.push(("resp_request", format!("pipeline-{i}"), request));
    }
    seeds
}

/// What Redis clients send: a pipeline of arrays (what redis-py, node-redis and redis-benchmark write)
/// and inline commands (what a person types into telnet).
fn sample_resp_requests() -> Vec<Vec<u8>> {
    vec![
        b"*3\r\n$9\r\nBF.EXISTS\r\n$5\r\nusers\r\n$6\r\nuser:1\r\n\
          *4\r\n$7\r\nBF.MADD\r\n$5\r\nusers\r\n$1\r\na\r\n$1\r\nb\r\n\
          *2\r\n$4\r\nAUTH\r\n$5\r\ntoken\r\n"
            .to_vec(),
        b"PING\r\nHELLO 3\r\nBF.EXISTS users  key\n*1\r\n$4\r\nQUIT\r\n".to_vec(),
    ]
}

/// The RESP port's request limits in the checks: small, so that inputs reach them.
const RESP_LIMITS: existence_gate::service::resp::RequestLimits =
    existence_gate::service::resp::RequestLimits {
        max_args: 16,
        max_arg_bytes: 64,
        max_inline_bytes: 128,
        unauthenticated: false,
    };

/// The RESP request reader on arbitrary bytes, as a connection reads them: each command taken is within the
/// limits and consumed its bytes; an array command written back out reads back the same; a prefix of the
/// input yields a prefix of its commands (bytes arriving in two reads change nothing).
pub fn resp_request(data: &[u8]) {
    use existence_gate::service::resp::request::take_command;
    let read_all = |bytes: &[u8]| {
        let mut buffer = bytes::BytesMut::from(bytes);
        let mut commands = Vec::new();
        while let Ok(Some(command)) = take_command(&mut buffer, &RESP_LIMITS) {
            assert!(command.len() <= RESP_LIMITS.max_args);
            commands.push(command);
            if commands.len() > bytes.len() {
                panic!("more commands than bytes: the reader consumed nothing");
            }
        }
        commands
    };
    let commands = read_all(data);
    for command in &commands {
        let mut encoded = format!("*{}\r\n", command.len()).into_bytes();
        for arg in command {
            assert!(arg.len() <= RESP_LIMITS.max_arg_bytes);
            encoded.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            encoded.extend_from_slice(arg);
            encoded.extend_from_slice(b"\r\n");
        }
        let mut buffer = bytes::BytesMut::from(&encoded[..]);
        let again = take_command(&mut buffer, &RESP_LIMITS).expect("a written command reads back");
        assert_eq!(again.as_ref(), Some(command));
    }
    let half = read_all(&data[..data.len() / 2]);
    assert!(half.len() <= commands.len());
    assert_eq!(&commands[..half.len()], &half[..]);
}

fn sample_mutations() -> Vec<Mutation> {
    let key = |k: &str| Bytes::copy_from_slice(k.as_bytes());
    vec![
        Mutation::Add {
            namespace: Arc::from("default"),
            seq: 1,
            at_ms: START_MS,
            keys: vec![key("user:1"), key("user:2")].into(),
        },
        Mutation::Add {
            namespace: Arc::from("users"),
            seq: 42,
            at_ms: START_MS + 3_600_000,
            keys: vec![].into(),
        },
        Mutation::RecordAbsent {
            namespace: Arc::from("users"),
            seq: 43,
            at_ms: START_MS,
            key: key("user:3"),
            kind: AbsenceKind::Missing,
            expires_at_ms: START_MS + 60_000,
            observed_seq: 42,
        },
        Mutation::RecordAbsent {
            namespace: Arc::from("default"),
            seq: u64::MAX,
            at_ms: u64::MAX,
            key: key("k"),
            kind: AbsenceKind::Deleted,
            expires_at_ms: 0,
            observed_seq: 0,
        },
        Mutation::Rebuild {
            namespace: Arc::from("default"),
            seq: 44,
            at_ms: START_MS,
            step: RebuildStep::Begin,
        },
        Mutation::Rebuild {
            namespace: Arc::from("default"),
            seq: 45,
            at_ms: START_MS,
            step: RebuildStep::Keys {
                began: 44,
                keys: vec![key("user:1")],
            },
        },
        Mutation::Rebuild {
            namespace: Arc::from("default"),
            seq: 46,
            at_ms: START_MS,
            step: RebuildStep::Commit { began: 44 },
        },
        Mutation::Rebuild {
            namespace: Arc::from("default"),
            seq: 47,
            at_ms: START_MS,
            step: RebuildStep::Abort { began: 44 },
        },
    ]
}

/// A data directory driven through the server's code path (`DataDir`, `recover`, the write-ahead log,
/// `Snapshotter`): the log segment its writes produced, and the snapshots it took.
fn data_dir_files() -> (Vec<u8>, Vec<Vec<u8>>) {
    let dir = scratch();
    let path: PathBuf = dir.path().join("data");
    std::fs::create_dir_all(&path).expect("create");
    let mut identity = Vec::new();
    frame::encode(&[&b"EXGID001"[..], &SEED[..]].concat(), &mut identity);
    std::fs::write(path.join("identity"), identity).expect("write identity");
    let data_dir = DataDir::open(&path).expect("open the data directory");
    let config = GateConfig::from_toml(CONFIG).expect("valid");
    let clock = Arc::new(ManualClock::new(START_MS));
    let gate = Gate::new(
        &config,
        KeyHasher::from_seed(data_dir.seed()),
        clock.clone(),
    );
    let (wal, _) = existence_gate::storage::recover(&data_dir, &gate, SyncMode::Never)
        .expect("recover an empty directory");
    let wal = Arc::new(wal);
    gate.open(wal.clone());
    let snapshots = Snapshotter::new(Arc::new(data_dir), wal.clone());
    let mut taken =
        vec![std::fs::read(snapshots.take(&gate).expect("snapshot").path).expect("read")];
    let keys = |range: std::ops::Range<u32>| -> Vec<Bytes> {
        range.map(|i| Bytes::from(format!("key-{i}"))).collect()
    };
    for (round, namespace) in ["default", "users", "default", "users"]
        .into_iter()
        .enumerate()
    {
        // Past a window of `users` (a span of 20 min) each round, so its snapshot holds several windows.
        if round > 0 {
            clock.advance(25 * 60_000);
        }
        let start = round as u32 * 10;
        gate.add(namespace, keys(start..start + 10)).expect("add");
        for (i, kind) in [AbsenceKind::Missing, AbsenceKind::Deleted]
            .into_iter()
            .enumerate()
        {
            let report = AbsenceReport {
                key: Bytes::from(format!("key-{}", start + i as u32)),
                kind,
                observed_seq: 0,
                ttl_seconds: 600,
            };
            gate.record_absent(namespace, report).expect("record");
        }
    }
    wal.sync_now().expect("sync");
    let segment_numbers = wal::segments(&path).expect("list");
    let last = *segment_numbers.last().expect("a segment");
    let segment = std::fs::read(wal::segment_path(&path, last)).expect("read the segment");
    taken.push(std::fs::read(snapshots.take(&gate).expect("snapshot").path).expect("read"));
    (segment, taken)
}

fn sample_configs() -> Vec<&'static str> {
    vec![
        "",
        CONFIG,
        EDGE_CONFIG,
        r#"
[limits]
max_batch_keys = 10000          # keys per BatchMayExist / Add
max_key_bytes = 1024
replay_buffer_bytes = 16777216

[namespaces.users]
expected_keys = 10000000
false_positive_rate = 0.01
retention = "forever"
windows = 8
missing_ttl = "60s"
deleted_ttl = "10m"
max_ttl = "1h"
ttl_jitter = 0.1
max_tombstones = 1000000
max_tombstone_rate = 10000
"#,
        "[namespaces.orders]\nretention = \"30d\"\nwindows = 31\nexpected_keys = 5000\nmax_filter_bytes = 1048576\n",
        "[namespaces.\"a.b-c_1\"]\nmissing_ttl = \"1500ms\"\nmax_ttl = \"1w\"\n",
        "90s",
        r#"
[limits]
max_in_flight = 64
max_concurrent_streams = 8
max_subscribers_per_namespace = 2
request_timeout = "2s"
keepalive_interval = "100ms"
keepalive_timeout = "1m"

[[tokens]]
name = "admin"
sha256 = " 10A4C7C9FC5206D6F36DC6944A81BB6F4A3CB0E25014AE3B12E6C3E52712292A "
roles = ["admin", "read"]
namespaces = ["default", "*"]
"#,
    ]
}

/// Request programs in the format [`requests`] reads: each op byte, then its operands.
#[allow(clippy::needless_update)]
fn sample_programs() -> Vec<Vec<u8>> {
    fn op_bytes(out: &mut Vec<u8>, op: u8, namespace: u8, keys: &[&[u8]]) {
        out.extend([op, namespace, keys.len() as u8]);
        for key in keys {
            out.push(key.len() as u8);
            out.extend_from_slice(key);
        }
    }
    fn message(out: &mut Vec<u8>, op: u8, encoded: Vec<u8>) {
        out.push(op);
        out.extend((encoded.len() as u16).to_le_bytes());
        out.extend(encoded);
    }
    let mut typed = vec![0u8];
    op_bytes(&mut typed, 2, 2, &[b"user:1", b"user:2"]);
    op_bytes(&mut typed, 1, 2, &[b"user:1", b"user:3"]);
    typed.extend([0, 1, 4]);
    typed.extend(b"user");
    typed.extend([3, 0, 6]);
    typed.extend(b"user:1");
    typed.extend(2u32.to_le_bytes());
    typed.extend([0, 1]);
    typed.extend(60u32.to_le_bytes());
    typed.extend([4, 2, 0, 0, 5]);
    typed.extend(1_000u32.to_le_bytes());
    typed.extend([13]);

    let mut encoded = vec![0u8];
    message(
        &mut encoded,
        9,
        proto::AddRequest {
            namespace: "users".into(),
            keys: vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")],
            ..Default::default()
        }
        .encode_to_vec(),
    );
    message(
        &mut encoded,
        7,
        proto::MayExistRequest {
            namespace: String::new(),
            key: Bytes::from_static(b"a"),
            ..Default::default()
        }
        .encode_to_vec(),
    );
    message(
        &mut encoded,
        8,
        proto::BatchMayExistRequest {
            namespace: "users".into(),
            keys: vec![Bytes::from_static(b"a"), Bytes::from_static(b"zz")],
            ..Default::default()
        }
        .encode_to_vec(),
    );
    message(
        &mut encoded,
        10,
        proto::RecordAbsentRequest {
            namespace: "users".into(),
            key: Bytes::from_static(b"a"),
            kind: proto::AbsenceKind::Deleted as i32,
            observed_seq: 1,
            ttl_seconds: 30,
            ..Default::default()
        }
        .encode_to_vec(),
    );
    message(
        &mut encoded,
        11,
        proto::SubscribeInvalidationsRequest {
            namespace: "users".into(),
            after_seq: 1,
            ..Default::default()
        }
        .encode_to_vec(),
    );
    encoded.push(12);
    encoded.push(0);
    let rebuild = proto::RebuildRequest {
        namespace: "users".into(),
        keys: vec![Bytes::from_static(b"a"), Bytes::from_static(b"c")],
        ..Default::default()
    }
    .encode_to_vec();
    encoded.extend((rebuild.len() as u16).to_le_bytes());
    encoded.extend(rebuild);

    let mut edge = vec![3u8];
    op_bytes(&mut edge, 2, 0, &[b"x"]);
    op_bytes(&mut edge, 2, 0, &[b"xy"]);
    op_bytes(&mut edge, 1, 3, &[b"x", b"y"]);
    edge.extend([5]);
    edge.extend(2_000u32.to_le_bytes());
    edge.extend([3, 0, 1, b'x', 0, 0, 0, 0, 0, 0, 0, 0]);
    let mut packed = vec![0u8];
    let mut keys = Vec::new();
    for key in [&b"user:1"[..], b"", b"user:2"] {
        prost::encoding::encode_varint(key.len() as u64, &mut keys);
        keys.extend_from_slice(key);
    }
    message(
        &mut packed,
        13,
        proto::BatchMayExistRequest {
            namespace: "users".into(),
            packed_keys: keys.clone().into(),
            ..Default::default()
        }
        .encode_to_vec(),
    );
    packed.extend([14, 16]);
    packed.extend((keys.len() as u16).to_le_bytes());
    packed.extend(&keys);
    packed.extend([15, 1, 1, 2, 15, 0, 0, 0, 15, 9, 0, 3, 15, 6, 12]);
    packed.extend(b"Bearer ");
    packed.extend([1]);
    vec![typed, encoded, edge, packed]
}
