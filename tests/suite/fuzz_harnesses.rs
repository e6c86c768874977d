//! The fuzz targets' checks (`fuzz/src`, the `existence-gate-fuzz` library) on every `cargo test`: arbitrary
//! bytes and mutated valid inputs through the log record decoder, log segment replay, the snapshot reader and
//! restore, the configuration parser, the request paths and whole RESP sessions; every committed fuzz corpus file as a regression
//! test; and the properties that valid inputs still decode to what was encoded.
//!
//! The seed files of `fuzz/corpus/` must be what the code paths the server uses make now;
//! `EXISTENCE_GATE_WRITE_SEEDS=1 cargo test --test suite seed_corpora` regenerates them.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use existence_gate::core::config::GateConfig;
use existence_gate::core::log::{Mutation, RebuildStep};
use existence_gate::core::tombstones::AbsenceKind;
use existence_gate::storage::{codec, frame, snapshot};
use existence_gate_fuzz as harness;
use proptest::prelude::*;

fn seeds() -> &'static [(&'static str, String, Vec<u8>)] {
    static SEEDS: OnceLock<Vec<(&'static str, String, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(harness::seeds)
}

fn seeds_of(target: &str) -> Vec<Vec<u8>> {
    seeds()
        .iter()
        .filter(|(t, _, _)| *t == target)
        .map(|(_, _, bytes)| bytes.clone())
        .collect()
}

fn corpus_dir() -> PathBuf {
    // Resolved at run time: a test binary reused from a shared target folder may have been built in
    // another checkout, and must read this checkout's corpora.
    let root = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    root.join("fuzz/corpus")
}

/// One change to a valid input.
#[derive(Debug, Clone)]
enum Edit {
    FlipBit(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
    /// Overwrites four bytes with a boundary value (lengths and counts are u32s).
    Boundary(usize, u32),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Edit::FlipBit(at, bit)),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Edit::Insert(at, bytes)),
        (any::<usize>(), 1usize..32).prop_map(|(at, n)| Edit::Remove(at, n)),
        (
            any::<usize>(),
            prop_oneof![
                Just(0u32),
                Just(1),
                Just(u32::MAX),
                Just(u32::MAX / 2),
                Just(1 << 30),
                any::<u32>()
            ]
        )
            .prop_map(|(at, value)| Edit::Boundary(at, value)),
    ]
}

fn apply(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for edit in edits {
        let len = bytes.len();
        match edit {
            Edit::FlipBit(at, bit) if len > 0 => bytes[at % len] ^= 1 << bit,
            Edit::Truncate(at) => bytes.truncate(at % (len + 1)),
            Edit::Insert(at, new) => {
                let at = at % (len + 1);
                bytes.splice(at..at, new.iter().copied());
            }
            Edit::Remove(at, n) if len > 0 => {
                let at = at % len;
                bytes.drain(at..(at + n).min(len));
            }
            Edit::Boundary(at, value) if len >= 4 => {
                let at = at % (len - 3);
                bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
            }
            _ => {}
        }
    }
    bytes
}

/// A valid seed of `target` with a few edits.
fn mutated(target: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = seeds_of(target);
    (0..seeds.len(), prop::collection::vec(edit(), 1..4))
        .prop_map(move |(i, edits)| apply(seeds[i].clone(), &edits))
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let name = "[a-z._-]{0,12}|\\PC{0,6}".prop_map(|n| Arc::<str>::from(n.as_str()));
    let key = prop::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from);
    prop_oneof![
        (
            name.clone(),
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec(key.clone(), 0..6)
        )
            .prop_map(|(namespace, seq, at_ms, keys)| Mutation::Add {
                namespace,
                seq,
                at_ms,
                keys: keys.into()
            }),
        (
            name.clone(),
            any::<u64>(),
            any::<u64>(),
            key.clone(),
            any::<bool>(),
            any::<u64>(),
            any::<u64>()
        )
            .prop_map(
                |(namespace, seq, at_ms, key, deleted, expires_at_ms, observed_seq)| {
                    Mutation::RecordAbsent {
                        namespace,
                        seq,
                        at_ms,
                        key,
                        kind: if deleted {
                            AbsenceKind::Deleted
                        } else {
                            AbsenceKind::Missing
                        },
                        expires_at_ms,
                        observed_seq,
                    }
                }
            ),
        (name, any::<u64>(), any::<u64>(), rebuild_step(key)).prop_map(
            |(namespace, seq, at_ms, step)| Mutation::Rebuild {
                namespace,
                seq,
                at_ms,
                step
            }
        ),
    ]
}

fn rebuild_step(key: impl Strategy<Value = Bytes>) -> impl Strategy<Value = RebuildStep> {
    prop_oneof![
        Just(RebuildStep::Begin),
        (any::<u64>(), prop::collection::vec(key, 0..6))
            .prop_map(|(began, keys)| RebuildStep::Keys { began, keys }),
        any::<u64>().prop_map(|began| RebuildStep::Commit { began }),
        any::<u64>().prop_map(|began| RebuildStep::Abort { began }),
    ]
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn log_records_from_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        harness::log_record(&bytes);
    }

    #[test]
    fn log_records_from_mutated_records(bytes in mutated("log_record")) {
        harness::log_record(&bytes);
    }

    /// A valid record decodes to what was encoded, alone and inside a frame.
    #[test]
    fn log_records_round_trip(mutation in mutation()) {
        let mut bytes = Vec::new();
        codec::encode(&mutation, &mut bytes);
        prop_assert_eq!(codec::decode(&bytes).unwrap(), mutation.clone());
        let mut framed = Vec::new();
        frame::encode(&bytes, &mut framed);
        let mut reader = frame::Reader::new(&framed[..], framed.len() as u64);
        match reader.next_frame().unwrap() {
            frame::Next::Frame(0, payload) => prop_assert_eq!(codec::decode(payload).unwrap(), mutation),
            other => prop_assert!(false, "{other:?}"),
        }
        harness::log_record(&framed);
    }

    #[test]
    fn configs_from_arbitrary_text(text in "(\\[[a-z.\"]{0,20}\\]\n)?([a-z_]{1,22} = (\"[0-9a-z]{0,12}\"|[0-9.e+-]{1,22})\n){0,4}") {
        harness::config(text.as_bytes());
    }

    #[test]
    fn configs_from_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        harness::config(&bytes);
    }

    #[test]
    fn durations_from_arbitrary_text(text in "[0-9]{0,22}[a-zµ ]{0,3}|\\PC{0,8}") {
        let _ = existence_gate::core::config::parse_duration(&text);
    }

    #[test]
    fn requests_from_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        harness::requests(&bytes);
    }

    #[test]
    fn resp_requests_from_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        harness::resp_request(&bytes);
    }

    #[test]
    fn resp_sessions_from_arbitrary_programs(bytes in prop::collection::vec(any::<u8>(), 0..160)) {
        harness::resp_session(&bytes);
    }
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn configs_from_mutated_configs(bytes in mutated("config")) {
        harness::config(&bytes);
    }

    #[test]
    fn requests_from_mutated_programs(bytes in mutated("requests")) {
        harness::requests(&bytes);
    }

    #[test]
    fn resp_requests_from_mutated_pipelines(bytes in mutated("resp_request")) {
        harness::resp_request(&bytes);
    }

    #[test]
    fn resp_sessions_from_mutated_programs(bytes in mutated("resp_session")) {
        harness::resp_session(&bytes);
    }

    #[test]
    fn log_segments_from_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        harness::log_segment(&bytes);
    }

    #[test]
    fn log_segments_from_mutated_segments(bytes in mutated("log_segment")) {
        harness::log_segment(&bytes);
    }

    /// Frames of valid records replay in order, whatever the records say.
    #[test]
    fn log_segments_of_framed_records(mutations in prop::collection::vec(mutation(), 0..6)) {
        let mut bytes = Vec::new();
        for mutation in &mutations {
            let mut payload = Vec::new();
            codec::encode(mutation, &mut payload);
            frame::encode(&payload, &mut bytes);
        }
        harness::log_segment(&bytes);
    }

    #[test]
    fn snapshots_from_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        harness::snapshot(&bytes);
    }

    #[test]
    fn snapshots_from_mutated_snapshots(bytes in mutated("snapshot")) {
        harness::snapshot(&bytes);
    }
}

/// Valid seeds still decode to what was encoded: records re-encode to their bytes, snapshots restore and
/// write back to the same image, the configurations parse, the programs run clean.
#[test]
fn valid_seeds_decode_to_what_was_encoded() {
    let mut counts = std::collections::BTreeMap::new();
    for (target, name, bytes) in seeds() {
        *counts.entry(*target).or_insert(0) += 1;
        match *target {
            "log_record" if name.starts_with("record-") => {
                let mutation = codec::decode(bytes).unwrap_or_else(|e| panic!("{name}: {e:?}"));
                let lengths = if name.starts_with("record-uniform-") {
                    codec::KeyLengths::Uniform
                } else {
                    codec::KeyLengths::Varint
                };
                let mut again = Vec::new();
                codec::encode_with_seq(&mutation, mutation.seq(), lengths, &mut again);
                assert_eq!(&again, bytes, "{name}");
            }
            "snapshot" => {
                let dir = harness::scratch();
                let path = snapshot::snapshot_path(dir.path(), 1);
                std::fs::write(&path, bytes).unwrap();
                let image = snapshot::read(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
                let names: Vec<&str> = image.namespaces.iter().map(|n| n.name.as_str()).collect();
                assert_eq!(names, ["default", "users"], "{name}");
                let (gate, _clock) = harness::new_gate(harness::CONFIG);
                let summary = harness::ImageSummary::of(&image);
                for namespace in image.namespaces {
                    snapshot::restore(&gate, namespace).unwrap();
                }
                let out = harness::scratch();
                let written =
                    snapshot::write(out.path(), image.covered, &gate, image.seed).unwrap();
                let back = snapshot::read(&written.path).unwrap();
                assert_eq!(harness::ImageSummary::of(&back), summary, "{name}");
            }
            "log_segment" if name == "segment" => {
                let dir = harness::scratch();
                std::fs::write(
                    existence_gate::storage::wal::segment_path(dir.path(), 1),
                    bytes,
                )
                .unwrap();
                let mut records = Vec::new();
                let replayed = existence_gate::storage::wal::replay(
                    dir.path(),
                    0,
                    harness::seed_fingerprint(),
                    |m| {
                        records.push(m);
                        Ok(())
                    },
                )
                .unwrap();
                assert_eq!(replayed.truncated, None);
                // Four rounds of one Add and two recorded absences.
                assert_eq!(records.len(), 12, "{name}");
            }
            "config" if name != "config-6" => {
                let text = std::str::from_utf8(bytes).unwrap();
                GateConfig::from_toml(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            _ => {}
        }
        harness::check(target, bytes);
    }
    for target in harness::TARGETS {
        assert!(
            counts.get(target).copied().unwrap_or(0) >= 2,
            "few seeds for {target}"
        );
    }
}

/// Every file of the committed corpora (`fuzz/corpus/<target>/`) through its target's check.
#[test]
fn fuzz_corpora_replay_clean() {
    let mut total = 0;
    for target in harness::TARGETS {
        let dir = corpus_dir().join(target);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut files = 0;
        for entry in entries {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| harness::check(target, &bytes));
            assert!(outcome.is_ok(), "{} fails its check", path.display());
            files += 1;
        }
        assert!(files > 0, "{} is empty", dir.display());
        total += files;
    }
    assert!(total >= 10);
}

/// The committed seed files (`fuzz/corpus/<target>/seed-<name>`) are what the server's code paths make today,
/// so a format change cannot leave the fuzzers starting from stale inputs; with `EXISTENCE_GATE_WRITE_SEEDS=1`
/// the test writes them instead (run it before fuzzing after a format change, and commit the files).
#[test]
fn seed_corpora_are_what_the_code_makes() {
    let write = std::env::var_os("EXISTENCE_GATE_WRITE_SEEDS").is_some();
    for (target, name, bytes) in seeds() {
        let dir = corpus_dir().join(target);
        let path = dir.join(format!("seed-{name}"));
        if write {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, bytes).unwrap();
            continue;
        }
        let committed = std::fs::read(&path).unwrap_or_default();
        assert!(
            committed == *bytes,
            "{} is not what the code makes now ({} bytes committed, {} made): regenerate the seeds with \
             `EXISTENCE_GATE_WRITE_SEEDS=1 cargo test --test suite seed_corpora` and commit them",
            path.display(),
            committed.len(),
            bytes.len()
        );
    }
}

/// Inputs that once passed the decoders and then panicked, overflowed or hung the gate (found while
/// building these targets; see `fuzz/README.md`). Each must now be refused where it is read, and must not
/// harm the gate whatever happens.
mod regressions {
    use super::*;

    /// A layer to craft: `(blocks, probes, capacity, inserted, fill word)`.
    type CraftedLayer = (u64, u32, u64, u64, u64);

    /// A snapshot of the `default` namespace of `harness::CONFIG` holding `windows`: `(id, layers)` with
    /// layers as `(blocks, probes, capacity, inserted, fill word)`, at `seq`.
    pub fn crafted_snapshot(seq: u64, windows: &[(u64, Vec<CraftedLayer>)]) -> Vec<u8> {
        let config = GateConfig::from_toml(harness::CONFIG).unwrap();
        let fingerprint = config.namespaces["default"].filter_spec().fingerprint();
        let (gate, _clock) = harness::new_gate(harness::CONFIG);
        let mut out = Vec::new();
        let mut put = |payload: Vec<u8>| frame::encode(&payload, &mut out);
        let mut header = b"EXGSNAP1".to_vec();
        header.extend(1u32.to_le_bytes());
        header.extend(harness::SEED);
        header.extend(gate.hash_check().to_le_bytes());
        header.extend(1u64.to_le_bytes());
        header.extend(1u32.to_le_bytes());
        put(header);
        let mut namespace = Vec::new();
        frame::put_string(&mut namespace, "default");
        namespace.extend(fingerprint.to_le_bytes());
        namespace.extend(seq.to_le_bytes());
        namespace.extend(0u64.to_le_bytes());
        namespace.extend((windows.len() as u32).to_le_bytes());
        put(namespace);
        for (id, layers) in windows {
            let mut window = id.to_le_bytes().to_vec();
            window.extend((layers.len() as u32).to_le_bytes());
            put(window);
            for &(blocks, probes, capacity, inserted, fill) in layers {
                let mut layer = blocks.to_le_bytes().to_vec();
                layer.extend(probes.to_le_bytes());
                layer.extend(capacity.to_le_bytes());
                layer.extend(inserted.to_le_bytes());
                put(layer);
                if blocks > 0 {
                    put((0..blocks * 8).flat_map(|_| fill.to_le_bytes()).collect());
                }
            }
        }
        put(0u32.to_le_bytes().to_vec());
        let mut footer = b"EXGSNEND".to_vec();
        footer.extend(1u32.to_le_bytes());
        put(footer);
        out
    }

    /// `bytes` as a snapshot is refused by `snapshot::read`, and reading, restoring and serving it (the
    /// `snapshot` target's check) finishes promptly without panicking.
    fn refused_and_harmless(bytes: Vec<u8>) {
        let dir = harness::scratch();
        let path = snapshot::snapshot_path(dir.path(), 1);
        std::fs::write(&path, &bytes).unwrap();
        assert!(snapshot::read(&path).is_err(), "the snapshot was accepted");
        let (done, wait) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            harness::snapshot(&bytes);
            let _ = done.send(());
        });
        wait.recv_timeout(std::time::Duration::from_secs(5))
            .expect("the check panicked or hung");
    }

    /// An insert into the restored window panicked (`a window has a layer`).
    #[test]
    fn a_snapshot_window_without_layers() {
        refused_and_harmless(crafted_snapshot(1, &[(0, vec![])]));
    }

    /// A lookup in the restored layer indexed an empty slice.
    #[test]
    fn a_snapshot_layer_of_zero_blocks() {
        refused_and_harmless(crafted_snapshot(1, &[(0, vec![(0, 7, 1000, 0, 0)])]));
    }

    /// Each call on the restored layer looped for seconds.
    #[test]
    fn a_snapshot_layer_with_billions_of_probes() {
        refused_and_harmless(crafted_snapshot(
            1,
            &[(0, vec![(4, u32::MAX, 1000, 0, u64::MAX)])],
        ));
    }

    /// `Stats` and the gauges export looped for seconds over the restored layer (found by the `snapshot`
    /// target).
    #[test]
    fn a_snapshot_layer_counting_more_keys_than_bits() {
        refused_and_harmless(crafted_snapshot(1, &[(0, vec![(20, 7, 1000, 1 << 36, 0)])]));
    }

    /// The next `Add` overflowed `seq + 1`.
    #[test]
    fn a_snapshot_seq_of_u64_max() {
        refused_and_harmless(crafted_snapshot(
            u64::MAX,
            &[(0, vec![(20, 7, 1000, 0, 0)])],
        ));
    }

    /// `RecordAbsent` overflowed `now + ttl`.
    #[test]
    fn a_tombstone_ttl_near_u64_max_milliseconds() {
        let config = "[namespaces.default]\nexpected_keys = 100\nmissing_ttl = \"18446744073709551615ms\"\nmax_ttl = \"18446744073709551615ms\"\nttl_jitter = 0.0\n";
        let error = GateConfig::from_toml(config).unwrap_err().to_string();
        assert!(error.contains("_ttl"), "{error}");
        harness::config(config.as_bytes());
    }

    /// The store kept nothing, yet `RecordAbsent` answered `RECORDED`.
    #[test]
    fn max_tombstones_zero() {
        let config = "[namespaces.default]\nexpected_keys = 100\nmax_tombstones = 0\n";
        let error = GateConfig::from_toml(config).unwrap_err().to_string();
        assert!(error.contains("max_tombstones"), "{error}");
    }
}
