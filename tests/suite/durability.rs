//! Durability end to end: restarts keep every acknowledged mutation; a crash (SIGKILL) mid-load loses
//! nothing acknowledged under `--sync always`; a torn log tail is truncated; damage anywhere else, a truncated
//! snapshot or a changed sizing stop startup with a message naming the file, the offset and the remedy.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use existence_gate::core::clock::SystemClock;
use existence_gate::core::config::GateConfig;
use existence_gate::proto::admin_client::AdminClient;
use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use existence_gate::proto::{
    AbsenceKind, AddRequest, Answer, Basis, MayExistRequest, RecordAbsentRequest, RecordOutcome,
    StatsRequest,
};
use existence_gate::server::{self, DurabilityOptions, RunningServer, ServeOptions};
use existence_gate::storage::faulty_files::FaultyFiles;
use existence_gate::storage::SyncMode;

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

fn options(dir: &Path, config: &str) -> ServeOptions {
    ServeOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        http_listen: "127.0.0.1:0".parse().unwrap(),
        config: GateConfig::from_toml(config).unwrap(),
        max_message_bytes: 16 << 20,
        drain_timeout: Duration::from_secs(5),
        durability: Some(DurabilityOptions {
            snapshot_interval: Duration::from_secs(3_600),
            snapshot_log_bytes: u64::MAX,
            ..DurabilityOptions::new(dir.to_path_buf())
        }),
        tls: None,
        replication: None,
        resp: None,
    }
}

async fn start_durable(dir: &Path, config: &str) -> Result<RunningServer, String> {
    let server = server::start(options(dir, config), Arc::new(SystemClock))
        .await
        .map_err(|e| e.to_string())?;
    match server.loaded().await {
        Ok(()) => Ok(server),
        Err(reason) => {
            let _ = server.run_until_shutdown().await;
            Err(reason)
        }
    }
}

fn key(i: u32) -> Bytes {
    Bytes::from(format!("key-{i}"))
}

async fn answer(
    client: &mut ExistenceGateClient<tonic::transport::Channel>,
    k: Bytes,
) -> (Answer, Basis, u64) {
    let reply = client
        .may_exist(MayExistRequest {
            namespace: String::new(),
            key: k,
        })
        .await
        .unwrap()
        .into_inner();
    (reply.answer(), reply.basis(), reply.observed_seq)
}

/// Adds keys 0..n in batches of 100 and records a DELETED tombstone for key 0.
async fn populate(server: &RunningServer, n: u32) -> u64 {
    let mut client = common::client(server).await;
    for start in (0..n).step_by(100) {
        client
            .add(AddRequest {
                namespace: String::new(),
                keys: (start..(start + 100).min(n)).map(key).collect(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let recorded = client
        .record_absent(RecordAbsentRequest {
            namespace: String::new(),
            key: key(0),
            kind: AbsenceKind::Deleted as i32,
            observed_seq: 0,
            ttl_seconds: 3_600,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(recorded.outcome(), RecordOutcome::Recorded);
    recorded.seq
}

/// The default namespace's `(state_digest_seq, state_digest)` from `Admin.Stats`.
async fn state_digest(server: &RunningServer) -> (u64, u64) {
    let mut admin = AdminClient::new(common::channel(server).await);
    let stats = admin
        .stats(StatsRequest {
            namespace: "default".to_string(),
        })
        .await
        .unwrap()
        .into_inner();
    let stats = &stats.namespaces[0];
    (stats.state_digest_seq, stats.state_digest)
}

/// Checks the restored state against what was written — every key's answer, the digest the server
/// reported before it went down (the same bits and tombstones, not only the same answers), and seqs that
/// continue.
async fn assert_restored(server: &RunningServer, n: u32, seq: u64, digest: (u64, u64)) {
    assert_eq!(state_digest(server).await, digest);
    let mut client = common::client(server).await;
    assert_eq!(
        answer(&mut client, key(0)).await,
        (Answer::Absent, Basis::Tombstone, seq)
    );
    for i in 1..n {
        assert_eq!(
            answer(&mut client, key(i)).await.0,
            Answer::MayExist,
            "key {i} lost"
        );
    }
    let next = client
        .add(AddRequest {
            namespace: String::new(),
            keys: vec![key(n)],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.seq, seq + 1, "seqs continue after a restart");
}

#[tokio::test]
async fn a_graceful_restart_keeps_everything_via_the_final_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_durable(dir.path(), "").await.unwrap();
    let seq = populate(&server, 1_000).await;
    let digest = state_digest(&server).await;
    server.stop().await.unwrap();
    let names = files(dir.path());
    assert!(
        names.iter().any(|n| n.starts_with("snapshot-")),
        "{names:?}"
    );

    let server = start_durable(dir.path(), "").await.unwrap();
    assert_restored(&server, 1_000, seq, digest).await;
    server.stop().await.unwrap();
}

/// With `--require-existing-data`, a single server refuses to start on a data directory that holds no state
/// (never started on, or deleted under it) rather than start empty and answer ABSENT for every key added
/// before (after an `rm -rf`, a restart once started empty without a word); with state it starts.
#[tokio::test]
async fn a_server_required_to_find_its_state_refuses_an_empty_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let required = || {
        let mut options = options(&data, "");
        options.durability.as_mut().unwrap().require_existing = true;
        options
    };
    let refused = |error: Result<RunningServer, server::ServerError>| {
        let error = error.expect_err("refused").to_string();
        assert!(
            error.contains("holds no state") && error.contains("--require-existing-data"),
            "{error}"
        );
        assert!(!error.contains("  "), "one space between words: {error:?}");
    };
    refused(server::start(required(), Arc::new(SystemClock)).await);
    assert!(!data.exists(), "a refused start creates nothing");

    let server = start_durable(&data, "").await.unwrap();
    let seq = populate(&server, 100).await;
    let digest = state_digest(&server).await;
    server.stop().await.unwrap();
    let server = server::start(required(), Arc::new(SystemClock))
        .await
        .unwrap();
    server.loaded().await.unwrap();
    assert_restored(&server, 100, seq, digest).await;
    server.stop().await.unwrap();

    std::fs::remove_dir_all(&data).unwrap();
    refused(server::start(required(), Arc::new(SystemClock)).await);
}

#[tokio::test]
async fn the_log_alone_restores_state_and_snapshots_remove_covered_log() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_durable(dir.path(), "").await.unwrap();
    let seq = populate(&server, 500).await;
    let taken = server.snapshot().await.unwrap();
    assert!(taken.segments_removed >= 1);
    let more = populate(&server, 700).await;
    assert!(more > seq);
    let digest = state_digest(&server).await;
    // Leave without a final snapshot, as a crash would: the snapshot plus the log after it must do.
    server.shutdown_handle().trigger();
    drop(server);
    let server = start_durable_after_crash(dir.path()).await;
    assert_restored(&server, 700, more, digest).await;
    server.stop().await.unwrap();
}

/// An `Add` of more than 32 KiB of keys, which is applied on the blocking pool rather than a request thread,
/// is acknowledged, answered and in the log like any other: a restart from the log alone holds it.
#[tokio::test]
async fn a_large_add_is_acknowledged_and_kept_by_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_durable(dir.path(), "").await.unwrap();
    let keys: Vec<Bytes> = (0..2_000)
        .map(|i| Bytes::from(format!("large-{i:032}")))
        .collect();
    assert!(keys.iter().map(Bytes::len).sum::<usize>() > 32 * 1024);
    let mut client = common::client(&server).await;
    let added = client
        .add(AddRequest {
            namespace: String::new(),
            keys: keys.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(added.seq > 0, "{added:?}");
    server.shutdown_handle().trigger();
    drop((client, server));
    let server = start_durable_after_crash(dir.path()).await;
    let mut client = common::client(&server).await;
    for key in keys {
        assert_eq!(answer(&mut client, key).await.0, Answer::MayExist);
    }
    server.stop().await.unwrap();
}

/// A crashed process leaves the LOCK file behind but releases the lock; reopening must work. An in-process
/// "crash" keeps the lock until its tasks end, so wait for that.
async fn start_durable_after_crash(dir: &Path) -> RunningServer {
    released(dir).await;
    start_durable(dir, "").await.unwrap()
}

/// Waits until nothing holds `dir`'s lock: every task of a server "crashed" in this process has ended, so
/// none can write to the directory any more.
async fn released(dir: &Path) {
    let lock = dir.join("LOCK");
    common::wait_until(
        common::PATIENCE,
        "the data directory's lock to be released",
        async || {
            let file = std::fs::File::open(&lock).unwrap();
            // Taken and, as `file` drops, released again at once.
            file.try_lock().ok()
        },
    )
    .await;
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn newest(dir: &Path, prefix: &str) -> PathBuf {
    let name = files(dir)
        .into_iter()
        .rfind(|n| n.starts_with(prefix) && !n.ends_with(".tmp"))
        .unwrap();
    dir.join(name)
}

/// A data dir whose state lives only in the log (no snapshot): populated, then the process "crashes".
/// Returns the seq and state digest it had.
async fn log_only_dir() -> (tempfile::TempDir, u64, (u64, u64)) {
    let dir = tempfile::tempdir().unwrap();
    let server = start_durable(dir.path(), "").await.unwrap();
    let seq = populate(&server, 300).await;
    let digest = state_digest(&server).await;
    server.shutdown_handle().trigger();
    drop(server);
    // The final snapshot is what a graceful stop writes; a crash would not: remove any, once no task of the
    // server is left to write one.
    released(dir.path()).await;
    for name in files(dir.path()) {
        if name.starts_with("snapshot-") {
            std::fs::remove_file(dir.path().join(name)).unwrap();
        }
    }
    (dir, seq, digest)
}

#[tokio::test]
async fn a_torn_tail_is_truncated_with_a_warning() {
    let (dir, seq, digest) = log_only_dir().await;
    let log = largest_log(dir.path());
    let mut bytes = std::fs::read(&log).unwrap();
    let full = bytes.len();
    // Half a record: a header promising 200 bytes, and only 10 of them.
    bytes.extend_from_slice(&200u32.to_le_bytes());
    bytes.extend_from_slice(&[0xAB; 14]);
    std::fs::write(&log, &bytes).unwrap();
    let server = start_durable_after_crash(dir.path()).await;
    assert_restored(&server, 300, seq, digest).await;
    assert_eq!(
        std::fs::metadata(&log).unwrap().len() as usize,
        full,
        "the torn record was cut off"
    );
    server.stop().await.unwrap();
}

fn largest_log(dir: &Path) -> PathBuf {
    files(dir)
        .into_iter()
        .filter(|n| n.starts_with("wal-"))
        .map(|n| dir.join(n))
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap()
}

#[tokio::test]
async fn a_flipped_bit_inside_the_log_stops_startup_naming_file_and_offset() {
    let (dir, _, _) = log_only_dir().await;
    let log = largest_log(dir.path());
    let original = std::fs::read(&log).unwrap();
    // A payload byte in the middle, then the length field of the first record (which makes it look like
    // it runs past the end of the file, as a torn tail would — but valid records follow it).
    for position in [original.len() / 2, 0] {
        let mut bytes = original.clone();
        bytes[position + 3] ^= 0x40;
        std::fs::write(&log, &bytes).unwrap();
        let Err(error) = start_durable(dir.path(), "").await else {
            panic!("a damaged length field is refused");
        };
        assert!(error.contains(&log.display().to_string()), "{error}");
        assert!(error.contains("byte offset"), "{error}");
        assert!(
            error.contains("restore the data directory from a backup"),
            "{error}"
        );
        assert_eq!(std::fs::read(&log).unwrap(), bytes, "nothing truncated");
    }
}

async fn snapshot_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let server = start_durable(dir.path(), "[namespaces.default]\nexpected_keys = 20000")
        .await
        .unwrap();
    populate(&server, 300).await;
    server.stop().await.unwrap();
    let snapshot = newest(dir.path(), "snapshot-");
    (dir, snapshot)
}

#[tokio::test]
async fn a_damaged_or_truncated_snapshot_stops_startup() {
    let config = "[namespaces.default]\nexpected_keys = 20000";
    let (dir, snapshot) = snapshot_dir().await;
    let original = std::fs::read(&snapshot).unwrap();

    let mut flipped = original.clone();
    flipped[original.len() / 2] ^= 0x01;
    std::fs::write(&snapshot, &flipped).unwrap();
    let error = start_durable(dir.path(), config)
        .await
        .map(drop)
        .expect_err("refused");
    assert!(
        error.contains(&snapshot.display().to_string()) && error.contains("byte offset"),
        "{error}"
    );

    std::fs::write(&snapshot, &original[..original.len() - 100]).unwrap();
    let error = start_durable(dir.path(), config)
        .await
        .map(drop)
        .expect_err("refused");
    assert!(error.contains("snapshot"), "{error}");

    std::fs::write(&snapshot, &original).unwrap();
    let server = start_durable(dir.path(), config)
        .await
        .expect("the intact snapshot loads");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_snapshot_under_another_sizing_is_refused() {
    let (dir, _) = snapshot_dir().await;
    let error = start_durable(dir.path(), "[namespaces.default]\nexpected_keys = 50000")
        .await
        .map(drop)
        .expect_err("refused");
    assert!(
        error.contains("another filter sizing") && error.contains("Rebuild"),
        "{error}"
    );
    let error = start_durable(
        dir.path(),
        "[namespaces.default]\nexpected_keys = 20000\n[namespaces.other]\n",
    )
    .await
    .map(|_| ())
    .err();
    assert_eq!(error, None, "adding a namespace is fine");
}

#[tokio::test]
async fn a_second_server_cannot_share_a_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let first = start_durable(dir.path(), "").await.unwrap();
    let error = start_durable(dir.path(), "")
        .await
        .map(drop)
        .expect_err("refused");
    assert!(error.contains("in use"), "{error}");
    first.stop().await.unwrap();
}

/// The real binary under `--sync always`, killed with SIGKILL while clients add: every Add that was
/// acknowledged before the kill answers MAY_EXIST after the restart.
#[tokio::test]
async fn sigkill_mid_load_loses_no_acknowledged_add() {
    let dir = tempfile::tempdir().unwrap();
    let (child, addr) = common::binary::spawn(dir.path(), "").await;
    let acknowledged = Arc::new(std::sync::Mutex::new(Vec::new()));
    let writers = spawn_writers(&addr, "", &acknowledged).await;
    // Kill mid-load once 500 keys were acknowledged, however fast the disk syncs: the writers keep adding.
    wait_for_acknowledged(&acknowledged, 500, &writers).await;
    kill_mid_load(child, writers).await;
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert_every_key_may_exist(dir.path(), &acknowledged).await;
}

/// The binary killed right after `Admin.Snapshot` returns, while Adds run concurrently, three times over:
/// the roll a snapshot starts with must not acknowledge records it has not written (it once marked
/// everything appended as synced while a record appended mid-roll sat in memory).
#[tokio::test]
async fn a_kill_right_after_a_snapshot_loses_no_acknowledged_add() {
    let dir = tempfile::tempdir().unwrap();
    let acknowledged = Arc::new(std::sync::Mutex::new(Vec::new()));
    for round in 0..3 {
        let (child, addr) = common::binary::spawn(dir.path(), "").await;
        let writers = spawn_writers(&addr, &format!("r{round}-"), &acknowledged).await;
        let mut admin =
            existence_gate::proto::admin_client::AdminClient::connect(format!("http://{addr}"))
                .await
                .unwrap();
        let before = acknowledged.lock().unwrap().len();
        for snapshot in 0.. {
            admin
                .snapshot(existence_gate::proto::SnapshotRequest::default())
                .await
                .unwrap();
            if snapshot >= 3 && acknowledged.lock().unwrap().len() > before + 200 {
                break;
            }
        }
        kill_mid_load(child, writers).await;
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert_every_key_may_exist(dir.path(), &acknowledged).await;
}

type Acknowledged = Arc<std::sync::Mutex<Vec<Bytes>>>;

/// SIGKILLs `child` while `writers` add, then waits for each writer to see its call fail.
async fn kill_mid_load(
    mut child: tokio::process::Child,
    writers: Vec<tokio::task::JoinHandle<tonic::Status>>,
) {
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    for writer in writers {
        writer.await.unwrap();
    }
}

/// Four clients adding batches of 50 keys (named with `prefix`) to the server at `addr` until one fails;
/// the keys of every acknowledged batch go to `acknowledged`. Each returns the status that stopped it.
async fn spawn_writers(
    addr: &str,
    prefix: &str,
    acknowledged: &Acknowledged,
) -> Vec<tokio::task::JoinHandle<tonic::Status>> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (0..4u32)
        .map(|w| {
            let (mut client, acknowledged) = (
                ExistenceGateClient::new(channel.clone()),
                acknowledged.clone(),
            );
            let prefix = prefix.to_string();
            tokio::spawn(async move {
                for batch in 0u32.. {
                    let keys: Vec<Bytes> = (0..50)
                        .map(|i| Bytes::from(format!("{prefix}w{w}-b{batch}-{i}")))
                        .collect();
                    let request = AddRequest {
                        namespace: String::new(),
                        keys: keys.clone(),
                        ..Default::default()
                    };
                    match client.add(request).await {
                        Ok(_) => acknowledged.lock().unwrap().extend(keys),
                        Err(status) => return status,
                    }
                }
                unreachable!("2^32 batches")
            })
        })
        .collect()
}

/// Waits until `count` keys were acknowledged; fails with the writers' statuses if they all stopped first.
async fn wait_for_acknowledged(
    acknowledged: &Acknowledged,
    count: usize,
    writers: &[tokio::task::JoinHandle<tonic::Status>],
) {
    let loading = common::wait_until(common::PATIENCE, "acknowledged keys", async || {
        if acknowledged.lock().unwrap().len() >= count {
            Some(true)
        } else {
            writers.iter().all(|w| w.is_finished()).then_some(false)
        }
    })
    .await;
    assert!(
        loading,
        "every writer failed before {count} keys were acknowledged"
    );
}

/// Restarts the binary on `dir` and checks that every key of `acknowledged` answers MAY_EXIST.
async fn assert_every_key_may_exist(dir: &Path, acknowledged: &[Bytes]) {
    let (mut child, addr) = common::binary::spawn(dir, "").await;
    let mut client = ExistenceGateClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let mut answers = Vec::new();
    for chunk in acknowledged.chunks(5_000) {
        let reply = client
            .batch_may_exist(existence_gate::proto::BatchMayExistRequest {
                namespace: String::new(),
                keys: chunk.to_vec(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        answers.extend(reply.answers().collect::<Vec<_>>());
    }
    let lost = answers.iter().filter(|a| **a != Answer::MayExist).count();
    assert_eq!(
        lost,
        0,
        "{lost} of {} acknowledged keys lost",
        acknowledged.len()
    );
    child.start_kill().unwrap();
    child.wait().await.unwrap();
}

/// A disk whose fsync hangs (here: the interval syncer's, with writes queued behind its group commit) must
/// not stall the server: writes wait, while health checks and lookups keep answering. The server runs on a
/// runtime of its own with two request threads (this machine's core count), so the test's own clock and
/// client keep working even if the server's threads were all blocked.
#[test]
fn a_stalled_fsync_holds_writes_but_never_reads_or_health() {
    let dir = tempfile::tempdir().unwrap();
    let files = FaultyFiles::new();
    let options = ServeOptions {
        durability: Some(DurabilityOptions {
            sync: SyncMode::Interval(Duration::from_millis(10)),
            snapshot_interval: Duration::from_secs(3_600),
            snapshot_log_bytes: u64::MAX,
            segment_files: files.clone(),
            ..DurabilityOptions::new(dir.path().to_path_buf())
        }),
        ..options(dir.path(), "")
    };
    let server_runtime = common::runtime_of_its_own();
    let server = server_runtime.block_on(async {
        let server = server::start(options, Arc::new(SystemClock)).await.unwrap();
        server.loaded().await.unwrap();
        server
    });
    let client_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    client_runtime.block_on(async {
        let channel = common::channel(&server).await;
        let mut client = ExistenceGateClient::new(channel.clone());
        let mut health = HealthClient::new(channel);
        // Acknowledged before the stall: the key every lookup below must find.
        client
            .add(AddRequest {
                namespace: String::new(),
                keys: vec![Bytes::from_static(b"before the stall")],
                ..Default::default()
            })
            .await
            .unwrap();
        files.stall_syncs();
        // Released however this block ends: a failed assertion must not leave the server's threads blocked
        // (dropping its runtime would then wait for them forever).
        let _release = common::ReleaseSyncs(files.clone());
        let write = |key: String| {
            let mut client = client.clone();
            tokio::spawn(async move {
                client
                    .add(AddRequest {
                        namespace: String::new(),
                        keys: vec![Bytes::from(key)],
                        ..Default::default()
                    })
                    .await
            })
        };
        // Its record is what the syncer then fsyncs (and stalls on).
        let first = write("stalls the syncer".to_string());
        common::wait_until(
            common::PATIENCE,
            "the syncer's fsync to stall",
            async || (files.stalled_syncs() == 1).then_some(()),
        )
        .await;
        let writes: Vec<_> = (0..8).map(|i| write(format!("stalled-{i}"))).collect();
        for round in 0..20 {
            let served = tokio::time::timeout(common::PATIENCE, async {
                let status = health
                    .check(HealthCheckRequest::default())
                    .await
                    .unwrap()
                    .into_inner()
                    .status();
                let (lookup, ..) =
                    answer(&mut client, Bytes::from_static(b"before the stall")).await;
                (status, lookup)
            })
            .await
            .unwrap_or_else(|_| panic!("round {round}: no answer while the fsync stalled"));
            assert_eq!(served, (ServingStatus::Serving, Answer::MayExist));
        }
        assert!(
            writes.iter().all(|w| !w.is_finished()),
            "writes waited for the stalled group commit"
        );
        files.release_syncs();
        for write in writes.into_iter().chain([first]) {
            write
                .await
                .unwrap()
                .expect("the write completes once the disk answers");
        }
    });
    server_runtime.block_on(server.stop()).unwrap();
}

/// A disk that stalls for good at shutdown (an fsync that never returns) does not keep the server from
/// stopping: serving is cut off at the drain deadline with the write still waiting, and the final snapshot,
/// which must sync the log first, is given up after the same deadline.
#[test]
fn a_stalled_disk_does_not_hold_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let files = FaultyFiles::new();
    let options = ServeOptions {
        drain_timeout: Duration::from_millis(300),
        durability: Some(DurabilityOptions {
            segment_files: files.clone(),
            ..DurabilityOptions::new(dir.path().to_path_buf())
        }),
        ..options(dir.path(), "")
    };
    // Dropped only after the stall is released: the stuck fsync holds one of its blocking threads.
    let runtime = common::runtime_of_its_own();
    // Declared after the runtime, so dropped (the stall released) before it, however the test ends.
    let _release = common::ReleaseSyncs(files.clone());
    runtime.block_on(async {
        let server = server::start(options, Arc::new(SystemClock)).await.unwrap();
        server.loaded().await.unwrap();
        let mut client = common::client(&server).await;
        files.stall_syncs();
        let stuck = tokio::spawn(async move {
            client
                .add(AddRequest {
                    namespace: String::new(),
                    keys: vec![Bytes::from_static(b"never synced")],
                    ..Default::default()
                })
                .await
        });
        common::wait_until(common::PATIENCE, "the write's fsync to stall", async || {
            (files.stalled_syncs() == 1).then_some(())
        })
        .await;
        let stopped = tokio::time::timeout(common::PATIENCE, server.stop()).await;
        assert!(
            matches!(stopped, Ok(Ok(()))),
            "shutdown did not end on its own: {stopped:?}"
        );
        // Its connection lingers until the stall ends (the server's per-connection tasks are not aborted,
        // only its accept loop): the client gives up on it here.
        stuck.abort();
    });
}

/// A server whose log cannot write says so: `/readyz` turns 503 with the reason (a full disk, or a data
/// directory deleted under it) while lookups go on; a full disk heals on its own once space returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_reports_writes_refused_and_a_full_disk_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let files = FaultyFiles::new();
    let options = ServeOptions {
        durability: Some(DurabilityOptions {
            snapshot_interval: Duration::from_secs(3_600),
            snapshot_log_bytes: u64::MAX,
            segment_files: files.clone(),
            ..DurabilityOptions::new(dir.path().to_path_buf())
        }),
        ..options(dir.path(), "")
    };
    let server = common::start_options(options, Arc::new(SystemClock)).await;
    let mut client = common::client(&server).await;
    let add = |key: &'static str| AddRequest {
        namespace: String::new(),
        keys: vec![Bytes::from_static(key.as_bytes())],
        ..Default::default()
    };
    client.add(add("before")).await.unwrap();
    assert_eq!(common::http_get(&server, "/readyz").await.0, 200);

    files.fail_writes(28);
    let refused = client.add(add("held back")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("out of disk space"),
        "{refused:?}"
    );
    let (status, body) = common::http_get(&server, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("degraded") && body.contains("out of disk space"),
        "{body}"
    );
    let (lookup, ..) = answer(&mut client, Bytes::from_static(b"before")).await;
    assert_eq!(lookup, Answer::MayExist);
    common::wait_until(
        common::PATIENCE,
        "the gauge to say writes are refused",
        async || {
            let (_, metrics) = common::http_get(&server, "/metrics").await;
            metrics.contains("existence_writes_refused 1").then_some(())
        },
    )
    .await;

    files.fail_writes(0);
    common::wait_until(
        common::PATIENCE,
        "readiness once space returns",
        async || (common::http_get(&server, "/readyz").await.0 == 200).then_some(()),
    )
    .await;
    client.add(add("after")).await.unwrap();

    // The data directory deleted under the server: the very next write is refused, naming the file (not
    // only after the once-a-second watch), and readiness says why.
    for entry in std::fs::read_dir(dir.path()).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with("wal-") {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
    let refused = client.add(add("into the void")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("removed or replaced")
            && refused
                .message()
                .contains(&dir.path().display().to_string()),
        "{refused:?}"
    );
    let body = common::wait_until(common::PATIENCE, "readiness to notice", async || {
        let (status, body) = common::http_get(&server, "/readyz").await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(body.contains("removed or replaced"), "{body}");
    server.stop().await.unwrap();
}

/// The frames of a format-4 snapshot of one namespace without a rebuild as format 1, 2 or 3 wrote them:
/// without the rebuild header (all zeros, after the empty recent-adds chunk), before format 3 also without
/// the recent-adds frames, which follow the empty tombstone chunk (the first 4-byte frame of zeros) up to
/// and including the empty recent-adds chunk (the next one); and with `version` in the header.
fn as_older_snapshot(bytes: &[u8], version: u32) -> Vec<u8> {
    use existence_gate::storage::frame::{self, Next};
    let mut reader = frame::Reader::new(bytes, bytes.len() as u64);
    let (mut out, mut empty_chunks) = (Vec::new(), 0);
    while let Next::Frame(_, payload) = reader.next_frame().unwrap() {
        let mut payload = payload.to_vec();
        if out.is_empty() {
            payload[8..12].copy_from_slice(&version.to_le_bytes());
        }
        let recent_adds = empty_chunks == 1;
        let rebuild = empty_chunks == 2 && payload == [0; 28];
        if payload == [0; 4] {
            empty_chunks += 1;
        }
        if !(recent_adds && version < 3 || rebuild) {
            frame::encode(&payload, &mut out);
        }
    }
    out
}

/// Snapshots of format 1 (seqs counted from 0), 2 (no memory of recent adds) and 3 (no rebuild) still
/// load: a format-1 namespace's seq is read one higher, so that it lines up with the format-1 log records
/// replayed after it, and formats 1 and 2 bring a floor at its seq for `SUPERSEDED`. A newer format is
/// refused by name, not as damage.
#[test]
fn snapshots_of_formats_1_to_3_load_and_a_newer_one_is_refused_by_name() {
    use existence_gate::storage::snapshot;
    let temp = tempfile::tempdir().unwrap();
    let config = GateConfig::from_toml("[namespaces.default]\nexpected_keys = 1000").unwrap();
    let gate = existence_gate::core::gate::Gate::new(
        &config,
        existence_gate::core::hashing::KeyHasher::from_seed([3; 32]),
        Arc::new(SystemClock),
    );
    gate.open(Arc::new(existence_gate::core::log::VolatileLog));
    gate.add("default", vec![Bytes::from_static(b"k")]).unwrap();
    let written = snapshot::write(temp.path(), 1, &gate, [3; 32]).unwrap();
    let current = snapshot::read(&written.path).unwrap().namespaces.remove(0);
    assert!(
        !current.recent_adds.cells.is_empty(),
        "format 3 keeps the recent add"
    );
    let bytes = std::fs::read(&written.path).unwrap();
    let read_as = |version: u32| {
        let path = temp.path().join(format!("v{version}.snap"));
        std::fs::write(&path, as_older_snapshot(&bytes, version)).unwrap();
        snapshot::read(&path).map(|mut image| image.namespaces.remove(0))
    };
    for (version, seq) in [(1, current.seq + 1), (2, current.seq)] {
        let older = read_as(version).unwrap();
        assert_eq!(older.seq, seq, "format {version}");
        assert_eq!(
            (older.recent_adds.floor, older.recent_adds.cells.len()),
            (seq, 0)
        );
        assert_eq!(older.tombstones, current.tombstones);
    }
    let format_3 = read_as(3).unwrap();
    assert_eq!(format_3.recent_adds, current.recent_adds);
    assert!(format_3.rebuild.is_none() && current.rebuild.is_none());
    let path = temp.path().join("newer.snap");
    let mut newer = bytes.clone();
    let length = u32::from_le_bytes(newer[..4].try_into().unwrap()) as usize;
    newer[16..20].copy_from_slice(&5u32.to_le_bytes());
    let mut header = Vec::new();
    existence_gate::storage::frame::encode(&newer[8..8 + length], &mut header);
    newer[..8 + length].copy_from_slice(&header);
    std::fs::write(&path, newer).unwrap();
    let refused = snapshot::read(&path)
        .err()
        .expect("a newer format is refused")
        .to_string();
    assert!(
        refused.contains("written by a newer existence-gate (snapshot format 5")
            && !refused.contains("damaged"),
        "{refused}"
    );
}

/// A replica's snapshot taken half-way through a rebuild carried by its stream holds the filter being
/// rebuilt: a gate restored from it applies the rest of the rebuild and ends in the same state as the gate
/// that took it.
#[test]
fn a_snapshot_carries_a_logged_rebuild_in_progress() {
    use existence_gate::core::answer::Answer;
    use existence_gate::core::gate::Gate;
    use existence_gate::core::hashing::KeyHasher;
    use existence_gate::core::log::{Mutation, RebuildStep, VolatileLog};
    use existence_gate::storage::snapshot;
    let config = GateConfig::from_toml("[namespaces.default]\nexpected_keys = 1000").unwrap();
    let gate = || {
        let gate = Gate::new(
            &config,
            KeyHasher::from_seed([3; 32]),
            Arc::new(SystemClock),
        );
        gate.open(Arc::new(VolatileLog));
        gate
    };
    let step = |seq, step| Mutation::Rebuild {
        namespace: Arc::from("default"),
        seq,
        at_ms: 1_000_000,
        step,
    };
    let keys = |prefix: &str| -> Vec<Bytes> {
        (0..100)
            .map(|i| Bytes::from(format!("{prefix}-{i}")))
            .collect()
    };
    let taker = gate();
    taker.add("default", keys("deleted")).unwrap();
    taker.replay_one(step(3, RebuildStep::Begin)).unwrap();
    let first = RebuildStep::Keys {
        began: 3,
        keys: keys("kept"),
    };
    taker.replay_one(step(4, first)).unwrap();

    let temp = tempfile::tempdir().unwrap();
    let written = snapshot::write(temp.path(), 1, &taker, [3; 32]).unwrap();
    let mut image = snapshot::read(&written.path).unwrap();
    let namespace = image.namespaces.remove(0);
    let rebuild = namespace
        .rebuild
        .as_ref()
        .expect("the rebuild is in the snapshot");
    assert_eq!((rebuild.began, rebuild.keys), (3, 100));
    let restored = gate();
    snapshot::restore(&restored, namespace).unwrap();

    let rest = [
        step(
            5,
            RebuildStep::Keys {
                began: 3,
                keys: keys("late"),
            },
        ),
        step(6, RebuildStep::Commit { began: 3 }),
    ];
    for gate in [&taker, &restored] {
        gate.replay(rest.clone()).unwrap();
    }
    let digest = |gate: &Gate| {
        gate.namespace("default")
            .unwrap()
            .state_digest(2_000_000)
            .unwrap()
    };
    assert_eq!(digest(&taker), digest(&restored));
    let passing = |gate: &Gate, prefix| {
        keys(prefix)
            .iter()
            .filter(|k| gate.may_exist("default", k).unwrap().0.answer == Answer::MayExist)
            .count()
    };
    assert_eq!(
        (passing(&restored, "kept"), passing(&restored, "late")),
        (100, 100)
    );
    assert!(
        passing(&restored, "deleted") < 10,
        "the commit swapped the rebuilt filter in"
    );
}
