//! Seeds: realistic inputs for each target, made by the code paths the server uses (the codec, a data
//! directory driven through recovery, the write-ahead log and the snapshotter), so that fuzzing starts from
//! what the gate really reads. `EXISTENCE_GATE_WRITE_SEEDS=1 cargo test --test suite seed_corpora` writes
//! them into `fuzz/corpus/`, and every `cargo test` checks that the committed ones are still these.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use existence_gate::core::clock::ManualClock;
use existence_gate::core::config::GateConfig;
use existence_gate::core::gate::Gate;
use existence_gate::core::hashing::KeyHasher;
use existence_gate::core::log::{Mutation, RebuildStep};
use existence_gate::core::namespace::AbsenceReport;
use existence_gate::core::tombstones::AbsenceKind;
use existence_gate::proto;
use existence_gate::storage::{codec, frame, wal, DataDir, Snapshotter, SyncMode};
use prost::Message;

use crate::shared::{scratch, CONFIG, EDGE_CONFIG, SEED, START_MS};

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
    for (i, program) in sample_resp_sessions().into_iter().enumerate() {
        seeds.push(("resp_session", format!("session-{i}"), program));
    }
    seeds
}

/// Sessions (programs of [`crate::resp_session`]): a writer that authenticates, adds and looks up in a
/// pipeline; a reader that subscribes, is refused an add and resets; a client that never authenticates and
/// sends junk in pieces.
fn sample_resp_sessions() -> Vec<Vec<u8>> {
    vec![
        vec![1, 0, 3, 1, 4, 2, 5, 4, 0x89, 0, 11, 3, 13, 0],
        vec![0, 0, 6, 0, 0x83, 5, 7, 0, 8, 0, 6, 1, 9, 0, 10, 0],
        vec![
            3, 1, 0x8c, 0, 5, b'*', b'9', b'\r', b'\n', b'$', 12, 0, 2, 0, 9, 0,
        ],
    ]
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

/// Request programs in the format [`requests`](crate::requests()) reads: each op byte, then its operands.
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
