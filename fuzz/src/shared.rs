//! What every check shares: the configurations its gates run (and the seeds are made under), the hash seed
//! and start time, scratch directories, the frame layer's checksums recomputed so that mutations reach the
//! decoders behind it, and the calls a restored or replayed gate must serve.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use existence_gate::core::clock::ManualClock;
use existence_gate::core::config::GateConfig;
use existence_gate::core::gate::Gate;
use existence_gate::core::hashing::KeyHasher;
use existence_gate::core::log::VolatileLog;
use existence_gate::core::namespace::AbsenceReport;
use existence_gate::core::tombstones::AbsenceKind;
use existence_gate::storage::frame;

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
pub(crate) fn frame_ends(bytes: &[u8]) -> Vec<usize> {
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

/// Lookups, writes, upkeep and stats on every namespace of `gate`: state restored from a snapshot or a log
/// must serve whatever it holds.
pub(crate) fn exercise(gate: &Gate) {
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
