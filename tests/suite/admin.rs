//! The Admin service over real gRPC: stats, snapshots, and rebuilds that lose no concurrent Add.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use existence_gate::core::clock::SystemClock;
use existence_gate::core::config::GateConfig;
use existence_gate::proto::admin_client::AdminClient;
use existence_gate::proto::{
    AddRequest, Answer, BatchMayExistRequest, RebuildRequest, SnapshotRequest, StatsRequest,
};
use existence_gate::server::{self, DurabilityOptions, ServeOptions};
use existence_gate::storage::SyncMode;
use tokio_stream::wrappers::ReceiverStream;

fn keys(prefix: &str, range: std::ops::Range<u32>) -> Vec<Bytes> {
    range
        .map(|i| Bytes::from(format!("{prefix}-{i}")))
        .collect()
}

async fn answers(server: &server::RunningServer, keys: Vec<Bytes>) -> Vec<Answer> {
    let mut client = client(server).await;
    let reply = client
        .batch_may_exist(BatchMayExistRequest {
            namespace: String::new(),
            keys,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    reply.answers().collect()
}

const CONFIG: &str =
    "[namespaces.default]\nexpected_keys = 100000\n[namespaces.other]\nexpected_keys = 1000";

#[tokio::test]
async fn stats_report_each_namespace() {
    let server = start(CONFIG).await;
    let mut gate = client(&server).await;
    gate.add(AddRequest {
        namespace: String::new(),
        keys: keys("k", 0..500),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut admin = AdminClient::new(channel(&server).await);
    let all = admin
        .stats(StatsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let names: Vec<&str> = all
        .namespaces
        .iter()
        .map(|n| n.namespace.as_str())
        .collect();
    assert_eq!(names, ["default", "other"]);
    let default = &all.namespaces[0];
    assert_eq!(
        (
            default.keys_added,
            default.seq,
            default.windows,
            default.layers
        ),
        (500, 2, 1, 1)
    );
    assert!(
        default.estimated_keys >= 490 && default.estimated_keys <= 500,
        "{default:?}"
    );
    assert!(
        default.filter_bytes > 100_000 && default.fill_ratio > 0.0,
        "{default:?}"
    );
    assert!(default.estimated_false_positive_rate < 1e-6, "{default:?}");
    assert_eq!(default.last_snapshot_unix_ms, 0);

    let one = admin
        .stats(StatsRequest {
            namespace: "other".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(one.namespaces.len(), 1);
    let missing = admin
        .stats(StatsRequest {
            namespace: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);

    let no_dir = admin.snapshot(SnapshotRequest {}).await.unwrap_err();
    assert_eq!(no_dir.code(), tonic::Code::FailedPrecondition, "{no_dir:?}");
}

#[tokio::test]
async fn snapshot_on_demand_is_published_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let options = ServeOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        http_listen: "127.0.0.1:0".parse().unwrap(),
        config: GateConfig::from_toml(CONFIG).unwrap(),
        max_message_bytes: 16 << 20,
        drain_timeout: Duration::from_secs(5),
        durability: Some(DurabilityOptions {
            sync: SyncMode::Never,
            snapshot_interval: Duration::from_secs(3_600),
            snapshot_log_bytes: u64::MAX,
            ..DurabilityOptions::new(dir.path().to_path_buf())
        }),
        tls: None,
        replication: None,
        resp: None,
    };
    let server = server::start(options, Arc::new(SystemClock)).await.unwrap();
    server.loaded().await.unwrap();
    let mut admin = AdminClient::new(channel(&server).await);
    let taken = admin
        .snapshot(SnapshotRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(std::path::Path::new(&taken.path).exists(), "{taken:?}");
    assert!(taken.bytes > 0);
    let stats = admin
        .stats(StatsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(stats.namespaces[0].last_snapshot_unix_ms > 0);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn rebuild_replaces_the_filter_and_loses_no_concurrent_add() {
    let server = start(CONFIG).await;
    let mut gate = client(&server).await;
    // Keys that once existed but were deleted at the source, and keys that still exist.
    for batch in [keys("stale", 0..5_000), keys("live", 0..5_000)] {
        gate.add(AddRequest {
            namespace: String::new(),
            keys: batch,
            ..Default::default()
        })
        .await
        .unwrap();
    }

    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    let mut admin = AdminClient::new(channel(&server).await);
    let rebuild = tokio::spawn(async move { admin.rebuild(ReceiverStream::new(receiver)).await });
    sender
        .send(RebuildRequest {
            namespace: "default".into(),
            keys: vec![],
            commit: false,
            ..Default::default()
        })
        .await
        .unwrap();
    // Adds keep arriving while the source streams its keys.
    let adder = {
        let mut gate = gate.clone();
        tokio::spawn(async move {
            for batch in 0..50u32 {
                gate.add(AddRequest {
                    namespace: String::new(),
                    keys: keys("new", batch * 20..batch * 20 + 20),
                    ..Default::default()
                })
                .await
                .unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    for chunk in keys("live", 0..5_000).chunks(500) {
        sender
            .send(RebuildRequest {
                namespace: String::new(),
                keys: chunk.to_vec(),
                commit: false,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    adder.await.unwrap();
    sender
        .send(RebuildRequest {
            commit: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let rebuilt = rebuild.await.unwrap().unwrap().into_inner();
    assert_eq!(rebuilt.keys, 5_000);
    assert!(rebuilt.seq >= 52, "{rebuilt:?}");

    let live = answers(&server, keys("live", 0..5_000)).await;
    assert!(
        live.iter().all(|a| *a == Answer::MayExist),
        "a streamed key was lost"
    );
    let new = answers(&server, keys("new", 0..1_000)).await;
    assert!(
        new.iter().all(|a| *a == Answer::MayExist),
        "an Add made during the rebuild was lost"
    );
    let stale = answers(&server, keys("stale", 0..5_000)).await;
    let still_passing = stale.iter().filter(|a| **a == Answer::MayExist).count();
    assert!(
        still_passing < 250,
        "{still_passing} of 5000 deleted keys still pass the rebuilt filter"
    );
}

/// A Rebuild that streamed no keys would swap in an empty filter, answering ABSENT for every key the
/// namespace holds: the gate refuses it unless the request says it means it.
#[tokio::test]
async fn a_rebuild_with_no_keys_is_refused_unless_allowed() {
    let server = start(CONFIG).await;
    let live = keys("live", 0..1_000);
    client(&server)
        .await
        .add(AddRequest {
            namespace: String::new(),
            keys: live.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut admin = AdminClient::new(channel(&server).await);
    let only_commit = RebuildRequest {
        namespace: "default".into(),
        commit: true,
        ..Default::default()
    };
    let empty_messages = vec![
        RebuildRequest {
            namespace: "default".into(),
            ..Default::default()
        },
        RebuildRequest::default(),
        RebuildRequest {
            commit: true,
            ..Default::default()
        },
    ];
    for stream in [vec![only_commit.clone()], empty_messages] {
        let refused = admin.rebuild(tokio_stream::iter(stream)).await.unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert!(
            refused.message().contains("streamed no keys")
                && refused.message().contains("allow_empty"),
            "{refused:?}"
        );
        assert!(
            answers(&server, live.clone())
                .await
                .iter()
                .all(|a| *a == Answer::MayExist),
            "a refused empty rebuild changed the filter"
        );
    }

    let allowed = RebuildRequest {
        allow_empty: true,
        ..only_commit
    };
    let rebuilt = admin
        .rebuild(tokio_stream::iter([allowed]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rebuilt.keys, 0);
    let after = answers(&server, live).await;
    assert!(
        after.iter().filter(|a| **a == Answer::MayExist).count() < 50,
        "an allowed empty rebuild left the old filter"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn an_abandoned_rebuild_leaves_the_live_filter_and_only_one_runs_at_a_time() {
    let server = start(CONFIG).await;
    let mut gate = client(&server).await;
    gate.add(AddRequest {
        namespace: String::new(),
        keys: keys("old", 0..100),
        ..Default::default()
    })
    .await
    .unwrap();

    // Two rebuilds of the namespace (named "" and "default"), both left open: whichever the server starts
    // first runs, and the other must be refused while it does. Neither can end on its own, so the first answer
    // is the refusal, and no guess is needed about when a rebuild has started.
    let open_rebuild = async |namespace: &str| {
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        sender
            .send(RebuildRequest {
                namespace: namespace.to_string(),
                keys: keys("x", 0..10),
                commit: false,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut admin = AdminClient::new(channel(&server).await);
        let call = tokio::spawn(async move { admin.rebuild(ReceiverStream::new(receiver)).await });
        (sender, call)
    };
    let mut rebuilds = [open_rebuild("").await, open_rebuild("default").await];
    let (refused, answered) = tokio::time::timeout(PATIENCE, async {
        let [(_, a), (_, b)] = &mut rebuilds;
        tokio::select! {
            answer = a => (answer, 0),
            answer = b => (answer, 1),
        }
    })
    .await
    .expect("one of two concurrent rebuilds is refused");
    let refused = refused.unwrap().unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    let [one, other] = rebuilds;
    let (sender, running) = if answered == 0 { other } else { one };

    // A bad key aborts the running rebuild.
    sender
        .send(RebuildRequest {
            namespace: String::new(),
            keys: vec![Bytes::new()],
            commit: false,
            ..Default::default()
        })
        .await
        .unwrap();
    let status = running.await.unwrap().unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let old = answers(&server, keys("old", 0..100)).await;
    assert!(
        old.iter().all(|a| *a == Answer::MayExist),
        "the live filter changed"
    );

    // A stream that ends without its commit, and a call cancelled half-way (which an HTTP/2 server may
    // see as a clean end of the stream), are abandoned too.
    let (sender, ended) = open_rebuild("").await;
    drop(sender);
    let status = ended.await.unwrap().unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("commit"), "{status:?}");
    for _ in 0..5 {
        let (sender, cancelled) = open_rebuild("").await;
        cancelled.abort();
        let _ = cancelled.await;
        drop(sender);
    }
    let old = answers(&server, keys("old", 0..100)).await;
    assert!(
        old.iter().all(|a| *a == Answer::MayExist),
        "an uncommitted rebuild was swapped in"
    );

    // And the namespace can be rebuilt again afterwards (once the server has seen the last cancelled call
    // go, which it learns on its own time).
    let mut admin = AdminClient::new(channel(&server).await);
    let again = common::wait_until(PATIENCE, "a new rebuild to be accepted", async || {
        let rebuild = tokio_stream::iter([RebuildRequest {
            namespace: String::new(),
            keys: keys("old", 0..100),
            commit: true,
            ..Default::default()
        }]);
        match admin.rebuild(rebuild).await {
            Ok(reply) => Some(reply.into_inner()),
            Err(status) if status.code() == tonic::Code::FailedPrecondition => None,
            Err(status) => panic!("{status:?}"),
        }
    })
    .await;
    assert_eq!(again.keys, 100);
}

/// `Stats` breaks the process's memory down so that the parts sum to its resident set within 10% once the
/// filter is written: the binary runs as its own process here, so the figures are its alone (an in-process
/// server would share this test binary's heap with every other test).
#[tokio::test]
async fn the_memory_breakdown_sums_to_the_resident_set() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr) = common::binary::spawn(dir.path(), "").await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut gate =
        existence_gate::proto::existence_gate_client::ExistenceGateClient::new(channel.clone());
    // 200,000 keys in the default namespace (10M expected keys: a 12 MB filter): ~66 keys per 4 KiB page
    // of filter, so every page has been written and is resident.
    for batch in 0..20 {
        gate.add(AddRequest {
            keys: keys("k", batch * 10_000..(batch + 1) * 10_000),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let stats = AdminClient::new(channel)
        .stats(StatsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let m = stats
        .memory
        .expect("the memory of a Stats of every namespace");
    assert!(m.heap_measured, "{m:?}");
    let sum_of = |part: fn(&existence_gate::proto::NamespaceStats) -> u64| {
        stats.namespaces.iter().map(part).sum::<u64>()
    };
    assert_eq!(m.filter_bytes, sum_of(|n| n.filter_bytes));
    assert_eq!(m.tombstone_bytes, sum_of(|n| n.tombstone_bytes));
    assert_eq!(m.replay_buffer_bytes, sum_of(|n| n.replay_buffer_bytes));
    assert_eq!(m.recent_adds_bytes, sum_of(|n| n.recent_adds_bytes));
    assert!(
        m.filter_bytes > 12_000_000 && m.replay_buffer_bytes > 0,
        "{m:?}"
    );
    // The runtime, the connection and its buffers are always on the heap: 0 would mean that a part the
    // allocator does not hold (a filter layer in a mapping of its own) was taken off its count.
    assert!(m.other_heap_bytes > 0, "{m:?}");
    let held = m.filter_bytes
        + m.tombstone_bytes
        + m.recent_adds_bytes
        + m.replay_buffer_bytes
        + m.other_heap_bytes
        + m.program_bytes;
    // The allocator's free bytes are an upper bound on their resident share (a free chunk whose pages were
    // never touched or were given back still counts), so the resident set lies between the parts without
    // them and the parts with them: within 10% of that range.
    let (low, high) = (held, held + m.allocator_free_bytes);
    assert!(
        low * 9 <= m.resident_bytes * 10 && m.resident_bytes * 9 <= high * 10,
        "the parts sum to {low} bytes, {high} with the allocator's free bytes, resident {}: {m:?}",
        m.resident_bytes
    );
}
