//! Test 6 of the replicated mode: the NATS server leading the stream is killed under `Add` load in a
//! three-server cluster with an R3 stream. No acknowledged `Add` is lost, writes resume once another server
//! leads, and meanwhile clients see nothing worse than `UNAVAILABLE`.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::nats::Cluster;
use common::replicas::{config_file, start_serving, Replica};
use common::{wait_until, PATIENCE};
use existence_gate::proto::{AddRequest, Answer};

/// The server leading the stream's Raft group, by name.
async fn stream_leader(urls: &str) -> String {
    wait_until(PATIENCE, "the stream to have a leader", async || {
        let url = urls.split(',').next().unwrap();
        let client = async_nats::connect(url).await.ok()?;
        let mut stream = async_nats::jetstream::new(client)
            .get_stream("existence")
            .await
            .ok()?;
        let info = stream.info().await.ok()?;
        info.cluster.as_ref()?.leader.clone()
    })
    .await
}

/// Adds one key at a time through the replicas in turn until `stop`: the keys acknowledged, and the
/// failures (each must be `UNAVAILABLE`).
async fn add_until(
    replicas: &[Replica],
    stop: Arc<AtomicBool>,
    acked: Arc<std::sync::Mutex<Vec<String>>>,
) -> usize {
    let mut clients: Vec<_> = replicas.iter().map(Replica::client).collect();
    let mut unavailable = 0;
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let key = format!("failover-{i}");
        let request = AddRequest {
            namespace: "users".to_string(),
            keys: vec![key.clone().into_bytes().into()],
        };
        let n = clients.len();
        match clients[i % n].add(request).await {
            Ok(_) => acked.lock().unwrap().push(key),
            Err(status) if status.code() == tonic::Code::Unavailable => unavailable += 1,
            Err(status) => panic!("an Add failed with {status:?}, not UNAVAILABLE"),
        }
    }
    unavailable
}

#[tokio::test]
async fn losing_the_stream_leader_loses_no_acknowledged_add() {
    let Some(mut cluster) = Cluster::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "[namespaces.users]\nexpected_keys = 100000\n");
    let replicas = start_serving_r3(&cluster.urls, &config).await;
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let load = {
        let (replicas, stop, acked) = (&replicas, Arc::clone(&stop), Arc::clone(&acked));
        add_until(replicas, stop, acked)
    };
    let failover = async {
        let count = || acked.lock().unwrap().len();
        wait_until(PATIENCE, "adds before the failover", async || {
            (count() >= 50).then_some(())
        })
        .await;
        let leader = stream_leader(&cluster.urls).await;
        cluster.kill(&leader);
        let killed_at = count();
        // A new stream leader, consumers recreated on it, publishes retried: seconds, more on a busy machine.
        wait_until(
            PATIENCE * 3,
            "adds acknowledged after the failover",
            async || (count() >= killed_at + 50).then_some(()),
        )
        .await;
        stop.store(true, Ordering::Relaxed);
        leader
    };
    let (_unavailable, _killed) = tokio::join!(load, failover);
    let acked = acked.lock().unwrap().clone();
    for replica in &replicas {
        for key in &acked {
            let (answer, _, _) = replica.lookup("users", key.as_bytes()).await;
            assert_eq!(
                answer,
                Answer::MayExist,
                "acknowledged {key} on {}",
                replica.id
            );
        }
    }
}

/// Three replicas of an R3 stream on the cluster at `urls`, serving.
async fn start_serving_r3(urls: &str, config: &std::path::Path) -> Vec<Replica> {
    start_serving(urls, config, 3, &["--nats-replicas", "3"]).await
}
