//! Fault points (docs/development.md, "Fault points"): a failure injected where state is written or a peer
//! is waited on, in the real binary (`FAILPOINTS`, one process per test so no other test sees the fault), and
//! what that page promises then: an error that names the file or the stream and the remedy, nothing
//! acknowledged lost, and a restart (or the next attempt) that recovers. The WAL's own writes and fsyncs are
//! covered by `storage::faulty_files` in the durability tests.

use crate::common;

use std::path::Path;

use bytes::Bytes;
use common::nats::Nats;
use common::replicas::{config_file, shared_snapshots, Launch, Replica};
use common::{wait_until, PATIENCE};
use existence_gate::proto::admin_client::AdminClient;
use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use existence_gate::proto::{AddRequest, Answer, BatchMayExistRequest, SnapshotRequest};
use futures_util::StreamExt;
use tonic::transport::Channel;

fn key(i: u32) -> Bytes {
    Bytes::from(format!("fault-key-{i}"))
}

async fn connect(addr: &str) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Adds keys `range` in one acknowledged `Add`.
async fn add(channel: &Channel, range: std::ops::Range<u32>) {
    ExistenceGateClient::new(channel.clone())
        .add(AddRequest {
            namespace: String::new(),
            keys: range.map(key).collect(),
            ..Default::default()
        })
        .await
        .expect("the Add is acknowledged");
}

/// How many keys of `range` do not answer MAY_EXIST.
async fn lost(channel: &Channel, range: std::ops::Range<u32>) -> usize {
    let reply = ExistenceGateClient::new(channel.clone())
        .batch_may_exist(BatchMayExistRequest {
            namespace: String::new(),
            keys: range.map(key).collect(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    reply.answers().filter(|a| *a != Answer::MayExist).count()
}

/// Restarts the binary on `dir` without faults (after a SIGKILL: no final snapshot) and checks every key of
/// `range` is there.
async fn assert_kept_after_a_crash(dir: &Path, range: std::ops::Range<u32>) {
    let (mut child, addr) = common::binary::spawn(dir, "").await;
    let lost = lost(&connect(&addr).await, range.clone()).await;
    assert_eq!(lost, 0, "{lost} of {} acknowledged keys lost", range.len());
    child.start_kill().unwrap();
    child.wait().await.unwrap();
}

/// Each step of a snapshot failing once (writing the temporary file, renaming it into place, fsyncing the
/// directory): `Admin.Snapshot` answers INTERNAL naming the file and the step, the server keeps serving and
/// acknowledging, the next snapshot succeeds, and after a crash nothing acknowledged is missing.
#[tokio::test]
async fn a_failed_snapshot_says_which_file_and_step_and_loses_nothing() {
    for (point, names) in [
        ("snapshot-write", "cannot write"),
        ("snapshot-rename", "cannot publish"),
        ("snapshot-dir-fsync", "cannot fsync"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (mut child, addr) =
            common::binary::spawn(dir.path(), &format!("{point}=1*return")).await;
        let channel = connect(&addr).await;
        add(&channel, 0..100).await;
        let mut admin = AdminClient::new(channel.clone());
        let failed = admin.snapshot(SnapshotRequest {}).await.unwrap_err();
        assert_eq!(failed.code(), tonic::Code::Internal, "{point}: {failed:?}");
        for expected in [names, "snapshot", point] {
            assert!(
                failed.message().contains(expected),
                "{point}: the error names {expected:?}: {}",
                failed.message()
            );
        }
        add(&channel, 100..200).await;
        admin
            .snapshot(SnapshotRequest {})
            .await
            .unwrap_or_else(|e| panic!("{point}: the next snapshot succeeds: {e:?}"));
        add(&channel, 200..300).await;
        assert_eq!(
            lost(&channel, 0..300).await,
            0,
            "{point}: served before the crash"
        );
        child.start_kill().unwrap();
        child.wait().await.unwrap();
        assert_kept_after_a_crash(dir.path(), 0..300).await;
    }
}

/// A new data directory whose identity file cannot be written: the binary refuses to start, naming the file
/// and the step; the next start writes it and serves.
#[tokio::test]
async fn a_failed_identity_write_refuses_to_start_and_the_next_start_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let refusal = common::binary::refused(dir.path(), "identity-write=return").await;
    assert!(
        refusal.contains("cannot write") && refusal.contains("identity.tmp"),
        "the refusal names the file and the step: {refusal}"
    );
    assert!(
        !dir.path().join("identity").exists(),
        "no identity was published"
    );
    let (mut child, addr) = common::binary::spawn(dir.path(), "").await;
    let channel = connect(&addr).await;
    add(&channel, 0..10).await;
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    assert_kept_after_a_crash(dir.path(), 0..10).await;
}

/// A log with a torn tail (a crash mid-write) whose truncation fails: the binary refuses to start, naming
/// the log file; the next start truncates it and serves everything acknowledged before the crash.
#[tokio::test]
async fn a_failed_log_truncation_refuses_to_start_and_the_next_start_repairs() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr) = common::binary::spawn(dir.path(), "").await;
    add(&connect(&addr).await, 0..300).await;
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let log = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "log"))
        .max_by_key(|path| std::fs::metadata(path).unwrap().len())
        .expect("a log segment");
    let mut bytes = std::fs::read(&log).unwrap();
    let full = bytes.len() as u64;
    // Half a record: a header promising 200 bytes, and only 10 of them.
    bytes.extend_from_slice(&200u32.to_le_bytes());
    bytes.extend_from_slice(&[0xAB; 14]);
    std::fs::write(&log, &bytes).unwrap();

    let refusal = common::binary::refused(dir.path(), "log-truncate=return").await;
    assert!(
        refusal.contains("cannot truncate") && refusal.contains(&log.display().to_string()),
        "the refusal names the log file and the step: {refusal}"
    );
    assert_kept_after_a_crash(dir.path(), 0..300).await;
    assert_eq!(
        std::fs::metadata(&log).unwrap().len(),
        full,
        "the torn record was cut off"
    );
}

// The replicated mode: the stream's publish acknowledgement, its consumer, and the object store.

const REPLICATED: &str = r#"
[namespaces.users]
expected_keys = 100000
"#;

/// The stream `existence` on `nats`.
async fn stream(nats: &Nats) -> async_nats::jetstream::stream::Stream {
    let client = async_nats::connect(nats.url.as_str()).await.unwrap();
    async_nats::jetstream::new(client)
        .get_stream("existence")
        .await
        .unwrap()
}

/// How many messages the stream holds on `subject`.
async fn stored_on(nats: &Nats, subject: &str) -> usize {
    let mut subjects = stream(nats)
        .await
        .info_with_subjects(subject)
        .await
        .unwrap();
    let mut count = 0;
    while let Some(entry) = subjects.next().await {
        let (name, messages) = entry.unwrap();
        if name == subject {
            count += messages;
        }
    }
    count
}

/// `keys` answer MAY_EXIST on `replica` under its read lease (the answer its state gives, not a fail-open).
async fn assert_present(replica: &Replica, keys: &[String]) {
    for key in keys {
        let (answer, basis, seq) = replica.leased_lookup("users", key.as_bytes()).await;
        assert_eq!(
            answer,
            Answer::MayExist,
            "{key} on {} ({basis:?}, observed seq {seq})",
            replica.id
        );
    }
}

/// Replicas r0, with fault points `faults`, and r1 of `users` on `nats` (their files in `dir`), both serving.
async fn faulty_writer_and_reader(nats: &Nats, dir: &Path, faults: &str) -> (Replica, Replica) {
    let config = config_file(dir, REPLICATED);
    let mut writer = Launch::new(&nats.url, &config, "r0");
    writer.faults = faults.to_string();
    let (writer, reader) = (
        writer.start().await,
        Launch::new(&nats.url, &config, "r1").start().await,
    );
    writer.serving().await;
    reader.serving().await;
    (writer, reader)
}

async fn add_key(replica: &Replica, key: &str) {
    replica
        .client()
        .add(AddRequest {
            namespace: "users".to_string(),
            keys: vec![Bytes::from(key.to_string())],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("Add of {key} through {}: {status:?}", replica.id));
}

/// The stream stores a mutation but its acknowledgement is lost on the way back: the writer cannot tell
/// this from a publish that never arrived, retries under the same message id, and the stream drops the
/// retry as a duplicate. The `Add` is acknowledged once, every replica has the key, and the stream holds it
/// once.
#[tokio::test]
async fn a_lost_publish_acknowledgement_is_retried_and_stored_once() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (writer, reader) =
        faulty_writer_and_reader(&nats, dir.path(), "stream-publish-ack=1*return").await;

    add_key(&writer, "ack-lost").await;
    assert_eq!(
        writer
            .metric("existence_replica_publish_retries_total")
            .await,
        1.0,
        "the lost acknowledgement was retried"
    );
    let keys = ["ack-lost".to_string()];
    assert_present(&writer, &keys).await;
    assert_present(&reader, &keys).await;
    assert_eq!(
        stored_on(&nats, "existence.users").await,
        1,
        "the retry was dropped as a duplicate"
    );
}

/// `Add`s reaching a replica while its publish is in progress (held here: the stream's acknowledgement of
/// the first is delayed) leave together as one message when the publish is over: they share its seq, each
/// caller is told of the tombstones of its own keys only, and every replica has every key.
#[tokio::test]
async fn adds_arriving_during_a_publish_share_the_next_message_and_each_is_answered_alone() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Three publishes of the setup pass; the fourth (the first of the concurrent Adds) is held 5 s.
    let faults = "stream-publish-ack=3*off->1*sleep(5000)";
    let (writer, reader) = faulty_writer_and_reader(&nats, dir.path(), faults).await;
    let add_keys = |keys: &[&str]| {
        let mut client = writer.client();
        let keys: Vec<Bytes> = keys.iter().map(|k| Bytes::from(k.to_string())).collect();
        async move {
            client
                .add(AddRequest {
                    namespace: "users".to_string(),
                    keys,
                    ..Default::default()
                })
                .await
                .expect("the Add is acknowledged")
                .into_inner()
        }
    };
    // Tombstones for one key of the second call and the key of the third.
    add_keys(&["held-b1", "held-c0"]).await;
    for key in ["held-b1", "held-c0"] {
        writer
            .client()
            .record_absent(existence_gate::proto::RecordAbsentRequest {
                namespace: "users".to_string(),
                key: Bytes::from(key),
                ..Default::default()
            })
            .await
            .expect("the tombstone is recorded");
    }

    let calls = [
        vec!["held-a0"],
        vec!["held-b0", "held-b1"],
        vec!["held-c0"],
        vec!["held-d0", "held-d1", "held-d2"],
    ];
    let answers = futures_util::future::join(
        futures_util::future::join_all(calls.iter().map(|keys| add_keys(keys))),
        // The first to arrive holds the publish; the other three wait for it.
        wait_until(
            PATIENCE,
            "three Adds waiting for the held publish",
            async || (writer.metric("existence_replica_adds_waiting").await == 3.0).then_some(()),
        ),
    )
    .await
    .0;

    let cleared: Vec<u32> = answers.iter().map(|a| a.tombstones_cleared).collect();
    assert_eq!(
        cleared,
        [0, 1, 1, 0],
        "each call is told of its own keys' tombstones"
    );
    let mut seqs: Vec<u64> = answers.iter().map(|a| a.seq).collect();
    seqs.sort_unstable();
    assert_eq!(
        seqs[1..],
        [seqs[3]; 3],
        "the three that waited share a seq: {seqs:?}"
    );
    assert!(
        seqs[0] < seqs[1],
        "and leave after the one that held the publish: {seqs:?}"
    );
    assert_eq!(
        (
            writer
                .metric("existence_replica_adds_per_message_sum")
                .await,
            writer
                .metric("existence_replica_adds_per_message_count")
                .await
        ),
        (5.0, 3.0),
        "the setup's Add alone, the held one alone, then three in one message"
    );
    let keys: Vec<String> = calls.iter().flatten().map(|k| k.to_string()).collect();
    assert_present(&writer, &keys).await;
    assert_present(&reader, &keys).await;
}

/// A replica whose consumer fails three times while the stream is written: each time it follows the
/// stream again from what it has applied, so it skips nothing and applies nothing twice — every key
/// acknowledged through the other replica is there, and both reach the same state digest.
///
/// The failures are more messages apart than the applier takes at once (`APPLY_BATCH`, 256): the messages
/// of a batch after a failed one are dropped (and followed again), so two failures within one batch would
/// make one re-follow, and the test would hang on the stream's layout rather than on the behaviour.
#[tokio::test]
async fn a_failing_consumer_is_followed_again_and_skips_nothing() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), REPLICATED);
    let mut follower = Launch::new(&nats.url, &config, "r1");
    follower.faults =
        "stream-consumer=5*off->1*return->300*off->1*return->300*off->1*return".to_string();
    let (writer, follower) = (
        Launch::new(&nats.url, &config, "r0").start().await,
        follower.start().await,
    );
    writer.serving().await;
    follower.serving().await;

    let mut keys: Vec<String> = Vec::new();
    // About 600 `Add`s, one at a time: seconds here, so more than one PATIENCE is allowed on a loaded machine.
    wait_until(
        PATIENCE * 4,
        "three injected consumer failures, each followed by reading the stream again",
        async || {
            let key = format!("followed-{}", keys.len());
            add_key(&writer, &key).await;
            keys.push(key);
            let failures = follower
                .metric("existence_replica_stream_read_failures_total")
                .await;
            (failures >= 3.0).then_some(())
        },
    )
    .await;
    assert_present(&follower, &keys).await;
    wait_until(PATIENCE, "both replicas at one state digest", async || {
        let (a, b) = (writer.digests().await, follower.digests().await);
        (a == b).then_some(())
    })
    .await;
}

/// The object store failing: a replica whose uploads fail shares nothing and so purges nothing (a new
/// replica can still start from the stream's first message); once it is gone another replica shares; a new
/// replica whose first download fails downloads again and starts from the shared snapshot with every
/// acknowledged key.
#[tokio::test]
async fn a_failed_upload_purges_nothing_and_a_failed_download_is_tried_again() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), REPLICATED);
    let launch = |id: &str, faults: &str| {
        let mut launch = Launch::new(&nats.url, &config, id);
        launch.args = vec!["--snapshot-interval".to_string(), "300ms".to_string()];
        launch.faults = faults.to_string();
        launch
    };
    // r0 sorts first, so it is the one that shares while it runs.
    let sharer = launch("r0", "object-store-put=return").start().await;
    let other = launch("r1", "").start().await;
    sharer.serving().await;
    other.serving().await;

    let mut keys = Vec::new();
    wait_until(PATIENCE, "the sharer to take snapshots", async || {
        let key = format!("stored-{}", keys.len());
        add_key(&sharer, &key).await;
        keys.push(key);
        (sharer.metric("existence_replica_snapshot_seq").await >= 10.0).then_some(())
    })
    .await;
    assert!(
        shared_snapshots(&nats.url).await.is_empty(),
        "no upload succeeded"
    );
    assert_eq!(
        stream(&nats)
            .await
            .info()
            .await
            .unwrap()
            .state
            .first_sequence,
        1,
        "a snapshot that was not shared purged nothing"
    );

    sharer.kill().await;
    for i in 0..20 {
        let key = format!("after-{i}");
        add_key(&other, &key).await;
        keys.push(key);
    }
    let shared = wait_until(PATIENCE, "the other replica to share", async || {
        shared_snapshots(&nats.url).await.last().copied()
    })
    .await;

    let newcomer = launch("r2", "object-store-get=1*return").start().await;
    newcomer.serving().await;
    assert!(
        newcomer.metric("existence_replica_start_seq").await >= shared as f64,
        "started from the shared snapshot after downloading it again"
    );
    assert_present(&newcomer, &keys).await;
}
