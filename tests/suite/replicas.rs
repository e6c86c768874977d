//! Replicas sharing one JetStream stream, as real processes against a real nats-server: an acknowledged
//! `Add` is never answered `ABSENT` by any replica (a stalled one included), `SUPERSEDED` is decided alike
//! everywhere, replicas agree bit for bit, subscriptions move between replicas exactly, `REDUNDANT` floods
//! never reach the stream, a rebuild reaches every replica, and a setup that cannot work says why.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::nats::Nats;
use common::proxy::Proxy;
use common::replicas::{
    agreed_digests, config_file, shared_snapshots, start_in_turn, start_serving, Launch, Replica,
};
use common::{wait_until, PATIENCE};
use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use existence_gate::proto::{
    AbsenceKind, AddRequest, Answer, Basis, BatchMayExistRequest, InvalidationCause,
    ListReplicasRequest, MayExistRequest, RebuildRequest, RebuildResponse, RecordAbsentRequest,
    RecordOutcome, RemoveReplicaRequest, SubscribeInvalidationsRequest,
};
use tonic::transport::Channel;

const CONFIG: &str = r#"
[namespaces.users]
expected_keys = 100000
[namespaces.orders]
expected_keys = 100000
"#;

/// A stream on a fresh JetStream server, a configuration file, and `n` replicas serving.
async fn deployment(n: usize) -> Option<(Nats, tempfile::TempDir, Vec<Replica>)> {
    deployment_with(n, &[]).await
}

/// [`deployment`] with more flags for every replica.
async fn deployment_with(
    n: usize,
    args: &[&str],
) -> Option<(Nats, tempfile::TempDir, Vec<Replica>)> {
    let nats = Nats::start().await?;
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), CONFIG);
    let replicas = start_serving(&nats.url, &config, n, args).await;
    Some((nats, dir, replicas))
}

async fn add(replica: &Replica, namespace: &str, keys: &[impl AsRef<str>]) -> u64 {
    replica
        .client()
        .add(AddRequest {
            namespace: namespace.to_string(),
            keys: keys
                .iter()
                .map(|k| k.as_ref().as_bytes().to_vec().into())
                .collect(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("Add through {}: {status:?}", replica.id))
        .into_inner()
        .seq
}

async fn record_absent(
    replica: &Replica,
    namespace: &str,
    key: &str,
    observed_seq: u64,
) -> (RecordOutcome, u64) {
    let reply = replica
        .client()
        .record_absent(RecordAbsentRequest {
            namespace: namespace.to_string(),
            key: key.as_bytes().to_vec().into(),
            kind: AbsenceKind::Missing as i32,
            observed_seq,
            ttl_seconds: 0,
        })
        .await
        .unwrap_or_else(|status| panic!("RecordAbsent through {}: {status:?}", replica.id))
        .into_inner();
    (reply.outcome(), reply.seq)
}

/// Keys absent from every filter answer `ABSENT` on a serving replica: answers of `MAY_EXIST` elsewhere in
/// these tests are not a replica failing open everywhere.
async fn assert_answers_absent(replica: &Replica) {
    let (answer, basis, _) = replica.leased_lookup("users", b"never-added").await;
    assert_eq!(
        (answer, basis),
        (Answer::Absent, Basis::Filter),
        "{}",
        replica.id
    );
}

/// Test 1: keys added through any replica answer `MAY_EXIST` on all three right after the acknowledgement;
/// and each member reported applying another's `Add` to its writer alone.
#[tokio::test]
async fn an_acknowledged_add_is_seen_by_every_replica_at_once() {
    let Some((_nats, _dir, replicas)) = deployment(3).await else {
        return;
    };
    for replica in &replicas {
        assert_answers_absent(replica).await;
    }
    const TO_WRITER: &str = "existence_replica_reports_total{to=\"writer\"}";
    let mut to_writer_before = Vec::new();
    for replica in &replicas {
        to_writer_before.push(replica.metric(TO_WRITER).await);
    }
    for round in 0..30 {
        let writer = &replicas[round % 3];
        let key = format!("user-{round}");
        add(writer, "users", &[&key]).await;
        for reader in &replicas {
            let (answer, _, _) = reader.lookup("users", key.as_bytes()).await;
            assert_eq!(
                answer,
                Answer::MayExist,
                "{key} added through {} read on {}",
                writer.id,
                reader.id
            );
        }
    }
    // One at a time, each of the 30 Adds was acknowledged only once both other members had applied it: a
    // batch holding one writer's Add, which its members report to that writer alone.
    for (replica, before) in replicas.iter().zip(to_writer_before) {
        let sent = replica.metric(TO_WRITER).await - before;
        assert!(
            sent >= 20.0,
            "{} reported {sent} Adds to their writer",
            replica.id
        );
    }
}

/// Test 2: a stalled replica (SIGSTOP) does not hold writes past the lease, and once continued its first
/// answers for keys added meanwhile are never `ABSENT`.
#[tokio::test]
async fn a_stalled_replica_never_answers_absent_for_adds_it_missed() {
    let Some((_nats, _dir, replicas)) = deployment(3).await else {
        return;
    };
    let (a, b) = (&replicas[0], &replicas[1]);
    assert_answers_absent(b).await;
    let by_lease_before = a.metric("existence_replica_acked_by_lease_total").await;
    const MEMBERS_WAITED: &str = "existence_replica_members_wait_duration_seconds_sum";
    const MEMBERS_WAITS: &str = "existence_replica_members_wait_duration_seconds_count";
    const APPLY_WAITS: &str = "existence_replica_apply_wait_duration_seconds_count";
    let members_waited_before = a.metric(MEMBERS_WAITED).await;
    let (members_waits_before, apply_waits_before) =
        (a.metric(MEMBERS_WAITS).await, a.metric(APPLY_WAITS).await);
    let proxy = Proxy::start(b.grpc_addr).await;
    let channel = ExistenceGateClient::new(
        Channel::from_shared(format!("http://{}", proxy.addr))
            .unwrap()
            .connect_lazy(),
    );
    let warm = MayExistRequest {
        namespace: "users".to_string(),
        key: b"before-the-stop".to_vec().into(),
    };
    channel.clone().may_exist(warm).await.unwrap();
    b.signal("STOP");
    let keys: Vec<String> = (0..20).map(|i| format!("while-stopped-{i}")).collect();
    for key in &keys {
        add(a, "users", &[key]).await;
    }
    assert!(
        a.metric("existence_replica_acked_by_lease_total").await > by_lease_before,
        "with B stalled, A acknowledged by the lease rule, not by waiting for B"
    );
    // Each of the 20 waited out the fallback (the 100 ms default lease, from the publish acknowledgement),
    // after applying: the histogram of that wait shows where these Adds spent their time.
    let members_waited = a.metric(MEMBERS_WAITED).await - members_waited_before;
    assert!(
        members_waited >= 20.0 * 0.05,
        "A's members-wait histogram grew by {members_waited} s over 20 Adds held by the fallback"
    );
    for (series, before) in [
        (MEMBERS_WAITS, members_waits_before),
        (APPLY_WAITS, apply_waits_before),
    ] {
        assert_eq!(
            a.metric(series).await - before,
            20.0,
            "{series}: one per Add"
        );
    }
    // The lookups are sent while B is still stopped, through a proxy (connected before the stop) that says
    // when each is in B's socket, so that they wait there beside the stream's messages: B's very first
    // answers, before it has applied anything.
    let first_answers = tokio::spawn(futures_util::future::join_all(
        keys.clone().into_iter().map(move |key| {
            let mut client = channel.clone();
            async move {
                let request = MayExistRequest {
                    namespace: "users".to_string(),
                    key: key.clone().into_bytes().into(),
                };
                let reply = client.may_exist(request).await.unwrap().into_inner();
                (key, reply.answer(), reply.basis())
            }
        }),
    ));
    for key in &keys {
        // The key as its request encodes it, behind its length: `while-stopped-1` alone is also the start
        // of `while-stopped-10`.
        let encoded = [&[key.len() as u8][..], key.as_bytes()].concat();
        wait_until(
            PATIENCE,
            &format!("the lookup of {key} in B's socket"),
            async || proxy.wrote_upstream(&encoded).then_some(()),
        )
        .await;
    }
    b.signal("CONT");
    for (key, answer, basis) in first_answers.await.unwrap() {
        assert_eq!(
            answer,
            Answer::MayExist,
            "{key} on B after SIGCONT ({basis:?})"
        );
    }
    b.serving().await;
    for key in &keys {
        let (answer, basis, _) = b.leased_lookup("users", key.as_bytes()).await;
        assert_eq!((answer, basis), (Answer::MayExist, Basis::Filter), "{key}");
    }
}

/// Test 3: a `RecordAbsent` on A observed before a concurrent `Add` of the same key on B stores nothing on
/// any replica, whichever reached the stream first.
#[tokio::test]
async fn an_absence_racing_an_add_of_its_key_is_superseded_everywhere() {
    let Some((_nats, _dir, replicas)) = deployment(3).await else {
        return;
    };
    let (a, b) = (&replicas[0], &replicas[1]);
    let keys: Vec<String> = (0..40).map(|i| format!("raced-{i}")).collect();
    for key in &keys {
        // In the filter already (so A's check cannot answer REDUNDANT), observed, then raced.
        add(&replicas[2], "users", &[key]).await;
        let (_, _, observed) = a.lookup("users", key.as_bytes()).await;
        // Whichever is stored first: SUPERSEDED when the Add is, or RECORDED and then cleared by it.
        let raced = [key.as_str()];
        let (added, _) = tokio::join!(
            add(b, "users", &raced),
            record_absent(a, "users", key, observed)
        );
        assert!(added > observed);
    }
    for replica in &replicas {
        for key in &keys {
            let (answer, basis, _) = replica.leased_lookup("users", key.as_bytes()).await;
            assert_eq!(
                (answer, basis),
                (Answer::MayExist, Basis::Filter),
                "{key} on {}",
                replica.id
            );
        }
    }
}

fn named(prefix: &str, n: u32) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn bytes(keys: &[String]) -> Vec<bytes::Bytes> {
    keys.iter().map(|k| k.as_bytes().to_vec().into()).collect()
}

/// How many of `keys` answer `MAY_EXIST` on `replica`.
async fn passing(replica: &Replica, keys: &[String]) -> usize {
    replica.passing("users", keys).await.0
}

/// Sends `keys` to an open rebuild in chunks.
async fn feed(sender: &tokio::sync::mpsc::Sender<RebuildRequest>, keys: &[String]) {
    for chunk in keys.chunks(500) {
        let message = RebuildRequest {
            namespace: String::new(),
            keys: bytes(chunk),
            commit: false,
            ..Default::default()
        };
        sender.send(message).await.unwrap();
    }
}

/// Starts `Admin.Rebuild` of `users` through `replica`; returns the sender of its keys and the call. Returns
/// once the rebuild has begun (`users`'s seq on `replica` moved past `seq`, the namespace's last seq before).
async fn begin_rebuild(
    replica: &Replica,
    seq: u64,
) -> (
    tokio::sync::mpsc::Sender<RebuildRequest>,
    tokio::task::JoinHandle<Result<tonic::Response<RebuildResponse>, tonic::Status>>,
) {
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    let first = RebuildRequest {
        namespace: "users".to_string(),
        keys: Vec::new(),
        commit: false,
        ..Default::default()
    };
    sender.send(first).await.unwrap();
    let mut admin = replica.admin();
    let call = tokio::spawn(async move {
        let keys = tokio_stream::wrappers::ReceiverStream::new(receiver);
        admin.rebuild(keys).await
    });
    wait_until(PATIENCE, "the rebuild to begin", async || {
        (replica.lookup("users", b"probe").await.2 > seq).then_some(())
    })
    .await;
    (sender, call)
}

/// Rebuilds `users` from `keys` in one message through `replica`, retrying while another rebuild is running
/// (`FAILED_PRECONDITION`): an abandoned one must be aborted well within [`PATIENCE`], not after the two
/// minutes that end a rebuild whose replica died.
async fn rebuild_once_accepted(replica: &Replica, keys: &[String]) -> RebuildResponse {
    wait_until(PATIENCE, "the next rebuild to be accepted", async || {
        let keys = RebuildRequest {
            namespace: "users".to_string(),
            keys: bytes(keys),
            commit: true,
            ..Default::default()
        };
        match replica.admin().rebuild(tokio_stream::iter([keys])).await {
            Ok(reply) => Some(reply.into_inner()),
            Err(refused) if refused.code() == tonic::Code::FailedPrecondition => None,
            Err(refused) => panic!("{refused:?}"),
        }
    })
    .await
}

/// `Admin.Rebuild` through one replica swaps the filter on every replica at the same seq: keys streamed and
/// keys added meanwhile (through another replica) stay, deleted ones go, digests agree. A rebuild whose
/// caller goes away is aborted everywhere, so the next one starts at once instead of after the idle time.
#[tokio::test]
async fn a_rebuild_through_one_replica_reaches_every_replica() {
    let Some((_nats, _dir, replicas)) = deployment(3).await else {
        return;
    };
    let (deleted, live) = (named("deleted", 3_000), named("live", 3_000));
    for chunk in deleted.chunks(1_000).chain(live.chunks(1_000)) {
        add(&replicas[0], "users", chunk).await;
    }
    let seq = replicas[1].lookup("users", b"probe").await.2;

    let (sender, call) = begin_rebuild(&replicas[1], seq).await;
    let mut added_meanwhile = Vec::new();
    for batch in 0..20 {
        let keys = named(&format!("new{batch}"), 10);
        add(&replicas[2], "users", &keys).await;
        added_meanwhile.extend(keys);
        feed(&sender, &live[batch * 150..(batch + 1) * 150]).await;
    }
    let commit = RebuildRequest {
        commit: true,
        ..Default::default()
    };
    sender.send(commit).await.unwrap();
    let rebuilt = call.await.unwrap().unwrap().into_inner();
    assert_eq!(rebuilt.keys, 3_000, "{rebuilt:?}");
    agreed_digests(&replicas).await;
    for replica in &replicas {
        assert_eq!(passing(replica, &live).await, 3_000, "{}", replica.id);
        assert_eq!(
            passing(replica, &added_meanwhile).await,
            200,
            "{}",
            replica.id
        );
        let still = replica.passing_under_lease("users", &deleted).await;
        assert!(still < 150, "{still} deleted keys pass on {}", replica.id);
    }

    let seq = replicas[0].lookup("users", b"probe").await.2;
    let (sender, abandoned) = begin_rebuild(&replicas[0], seq).await;
    feed(&sender, &named("unseen", 100)).await;
    abandoned.abort();
    let all: Vec<String> = live.iter().chain(&added_meanwhile).cloned().collect();
    let again = rebuild_once_accepted(&replicas[2], &all).await;
    assert_eq!(again.keys, 3_200);
    agreed_digests(&replicas).await;
    for replica in &replicas {
        assert_eq!(passing(replica, &all).await, 3_200, "{}", replica.id);
    }

    // Replicas snapshot on their own: an operator asking for one is told so.
    let refused = replicas[0]
        .admin()
        .snapshot(existence_gate::proto::SnapshotRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("--snapshot-interval"),
        "{refused:?}"
    );
}

/// A rebuild's caller that goes away while the rebuild's start is still being confirmed — stored and applied
/// where it was called, waiting for a stalled replica (SIGSTOP) to apply it too — still gets the rebuild
/// aborted everywhere: the next one is accepted once that wait ends, not two minutes later.
#[tokio::test]
async fn a_rebuild_abandoned_before_its_start_is_confirmed_is_aborted() {
    let Some((_nats, _dir, replicas)) = deployment_with(2, &["--read-lease", "3s"]).await else {
        return;
    };
    let (caller, stalled) = (&replicas[0], &replicas[1]);
    add(caller, "users", &named("kept", 10)).await;
    let seq = caller.lookup("users", b"probe").await.2;

    stalled.signal("STOP");
    let (_sender, abandoned) = begin_rebuild(caller, seq).await;
    abandoned.abort();
    stalled.signal("CONT");

    let rebuilt = rebuild_once_accepted(stalled, &named("kept", 10)).await;
    assert_eq!(rebuilt.keys, 10);
    agreed_digests(&replicas).await;
}

/// NATS down altogether (its only server killed): every replica fails open once its lease ends (`MAY_EXIST`
/// + `WARMING` for a key it would answer `ABSENT`) and stays so, refuses writes with `UNAVAILABLE` and reports itself
/// lagging; with NATS back on its store, every replica serves again, no acknowledged `Add` is lost, writes
/// go through, and the replicas agree bit for bit.
#[tokio::test]
async fn a_whole_nats_outage_fails_open_and_loses_nothing() {
    let Some((mut nats, _dir, replicas)) = deployment(3).await else {
        return;
    };
    let before = named("before", 500);
    add(&replicas[0], "users", &before).await;
    nats.kill();

    for replica in &replicas {
        // Its lease outlives NATS by at most one lease length (no write can be acknowledged meanwhile).
        wait_until(PATIENCE, "the replica to fail open", async || {
            let (answer, basis, _) = replica.lookup("users", b"never-added").await;
            (answer == Answer::MayExist && basis == Basis::Warming).then_some(())
        })
        .await;
        assert_eq!(passing(replica, &before).await, 500, "{}", replica.id);
        let (status, body) = wait_until(PATIENCE, "the replica to report lagging", async || {
            let (status, body) = replica.readiness().await;
            (status == 503).then_some((status, body))
        })
        .await;
        assert!(body.contains("lagging"), "{status} {body}");
        let (answer, basis, _) = replica.lookup("users", b"never-added").await;
        assert_eq!(
            (answer, basis),
            (Answer::MayExist, Basis::Warming),
            "{}",
            replica.id
        );
        // A batch says so too: it carries no basis per key, so a coalescing client learns it here.
        let batch = replica
            .client()
            .batch_may_exist(BatchMayExistRequest {
                namespace: "users".to_string(),
                keys: bytes(&named("never-added", 3)),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(batch.warming, "{}: {batch:?}", replica.id);
        assert!(batch.answers().all(|a| a == Answer::MayExist), "{batch:?}");
    }
    let refused = replicas[1]
        .client()
        .add(AddRequest {
            namespace: "users".to_string(),
            keys: bytes(&named("during", 1)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("NATS"), "{refused:?}");

    nats.restart().await;
    for replica in &replicas {
        replica.serving().await;
        assert_answers_absent(replica).await;
        assert_eq!(passing(replica, &before).await, 500, "{}", replica.id);
    }
    let after = named("after", 500);
    add(&replicas[2], "users", &after).await;
    for replica in &replicas {
        assert_eq!(passing(replica, &after).await, 500, "{}", replica.id);
    }
    agreed_digests(&replicas).await;
}

/// Test 4: after mixed load through every replica, each namespace's state digest is equal on all of them.
#[tokio::test]
async fn replicas_under_load_agree_bit_for_bit() {
    let Some((_nats, _dir, replicas)) = deployment(3).await else {
        return;
    };
    let load = replicas.iter().enumerate().map(|(r, replica)| async move {
        for i in 0..40 {
            let namespace = if i % 2 == 0 { "users" } else { "orders" };
            let keys: Vec<String> = (0..10).map(|k| format!("{r}-{i}-{k}")).collect();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let seq = add(replica, namespace, &keys).await;
            // Absences of added keys (stored unless superseded) and of others (redundant or stored).
            record_absent(replica, namespace, keys[0], seq).await;
            record_absent(replica, namespace, &format!("gone-{r}-{i}"), 0).await;
        }
    });
    futures_util::future::join_all(load).await;
    let digests = agreed_digests(&replicas).await;
    let seqs: BTreeMap<_, _> = digests.iter().map(|(n, s, _)| (n.as_str(), *s)).collect();
    assert!(seqs["users"] > 1 && seqs["orders"] > 1, "{digests:?}");
}

/// Test 7: a subscriber that moves to another replica with its last seq misses nothing and sees nothing
/// twice.
#[tokio::test]
async fn a_subscription_moves_between_replicas_without_gap_or_duplicate() {
    let Some((_nats, _dir, replicas)) = deployment(2).await else {
        return;
    };
    let (a, b) = (&replicas[0], &replicas[1]);
    let subscribe = |replica: &Replica, after_seq: u64| {
        let mut client = replica.client();
        async move {
            client
                .subscribe_invalidations(SubscribeInvalidationsRequest {
                    namespace: "users".to_string(),
                    after_seq,
                })
                .await
                .unwrap()
                .into_inner()
        }
    };
    let first_seq = add(a, "users", &["k0"]).await;
    let mut on_a = subscribe(a, first_seq - 1).await;
    let mut seqs = Vec::new();
    for i in 1..10 {
        add(&replicas[i % 2], "users", &[&format!("k{i}")]).await;
    }
    let mut last = 0;
    for _ in 0..5 {
        let event = on_a.message().await.unwrap().unwrap();
        assert_eq!(event.cause(), InvalidationCause::Added);
        seqs.push(event.seq);
        last = event.seq;
    }
    drop(on_a);
    let mut on_b = subscribe(b, last).await;
    for i in 10..15 {
        add(&replicas[i % 2], "users", &[&format!("k{i}")]).await;
    }
    while seqs.len() < 15 {
        let event = on_b.message().await.unwrap().unwrap();
        assert_eq!(event.cause(), InvalidationCause::Added, "{event:?}");
        seqs.push(event.seq);
    }
    let mut expected = seqs.clone();
    expected.sort_unstable();
    expected.dedup();
    assert_eq!(seqs, expected, "in order, no duplicate");
    assert_eq!(seqs[0], first_seq, "nothing missed at the start");
}

/// The stream's state, read by a plain NATS client.
async fn stream_state(nats: &Nats) -> async_nats::jetstream::stream::State {
    let client = async_nats::connect(nats.url.as_str()).await.unwrap();
    let mut stream = async_nats::jetstream::new(client)
        .get_stream("existence")
        .await
        .unwrap();
    stream.info().await.unwrap().state.clone()
}

/// The stream's last sequence.
async fn stream_last_seq(nats: &Nats) -> u64 {
    stream_state(nats).await.last_sequence
}

/// The messages stored on `subject` (a namespace's mutations, without the replicas' lease barriers and
/// membership records, which a run slower than a lease publishes in between).
async fn messages_on(nats: &Nats, subject: &str) -> u64 {
    use futures_util::TryStreamExt;
    let client = async_nats::connect(nats.url.as_str()).await.unwrap();
    let stream = async_nats::jetstream::new(client)
        .get_stream("existence")
        .await
        .unwrap();
    let mut subjects = stream.info_with_subjects(subject).await.unwrap();
    let mut messages = 0;
    while let Some((_, count)) = subjects.try_next().await.unwrap() {
        messages += count as u64;
    }
    messages
}

/// Test 8: a flood of `RecordAbsent` for random keys adds no stream message for the `REDUNDANT` ones.
#[tokio::test]
async fn a_flood_of_redundant_absences_never_reaches_the_stream() {
    let Some((nats, _dir, replicas)) = deployment(3).await else {
        return;
    };
    add(&replicas[0], "users", &["exists"]).await;
    let before = messages_on(&nats, "existence.users").await;
    let flood = replicas.iter().map(|replica| async move {
        let mut outcomes = BTreeMap::new();
        for _ in 0..200 {
            let key = format!("random-{:016x}", rand::random::<u64>());
            let (outcome, _) = record_absent(replica, "users", &key, 0).await;
            *outcomes.entry(outcome as i32).or_insert(0) += 1;
        }
        outcomes
    });
    let outcomes = futures_util::future::join_all(flood).await;
    let redundant: i32 = outcomes
        .iter()
        .map(|o| {
            o.get(&(RecordOutcome::Redundant as i32))
                .copied()
                .unwrap_or(0)
        })
        .sum();
    let stored: i32 = outcomes
        .iter()
        .map(|o| {
            o.get(&(RecordOutcome::Recorded as i32))
                .copied()
                .unwrap_or(0)
        })
        .sum();
    assert!(
        redundant > 550,
        "random keys are nearly all REDUNDANT: {outcomes:?}"
    );
    assert_eq!(
        messages_on(&nats, "existence.users").await - before,
        stored as u64,
        "only the recorded ones (filter false positives) were published"
    );
}

/// Test 9: NATS unreachable, a stream of that name with other subjects, a namespace sized otherwise than
/// the stream records, another read lease than the stream records — each refused at start with what to fix.
#[tokio::test]
async fn a_setup_that_cannot_work_is_refused_with_the_reason() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), CONFIG);

    let unreachable = Launch::new("nats://127.0.0.1:1", &config, "lonely")
        .refused()
        .await;
    assert!(
        unreachable.contains("cannot reach NATS at nats://127.0.0.1:1"),
        "{unreachable}"
    );

    let client = async_nats::connect(nats.url.as_str()).await.unwrap();
    async_nats::jetstream::new(client)
        .create_stream(async_nats::jetstream::stream::Config {
            name: "taken".to_string(),
            subjects: vec!["orders.>".to_string()],
            ..Default::default()
        })
        .await
        .unwrap();
    let mut taken = Launch::new(&nats.url, &config, "intruder");
    taken.args = vec!["--nats-stream".to_string(), "taken".to_string()];
    let refused = taken.refused().await;
    assert!(
        refused.contains("\"taken\" exists with subjects") && refused.contains("--nats-stream"),
        "{refused}"
    );

    let first = Launch::new(&nats.url, &config, "first").start().await;
    first.serving().await;
    let resized = config_file(
        dir.path(),
        "[namespaces.users]\nexpected_keys = 5000\n[namespaces.orders]\nexpected_keys = 100000\n",
    );
    let refused = Launch::new(&nats.url, &resized, "resized").refused().await;
    assert!(
        refused.contains("namespace \"users\" is sized differently here"),
        "{refused}"
    );

    // Another read lease than the stream's: its writers would wait out the others' leases by its own.
    let config = config_file(dir.path(), CONFIG);
    let mut longer = Launch::new(&nats.url, &config, "longer");
    longer.args = vec!["--read-lease".to_string(), "5s".to_string()];
    let refused = longer.refused().await;
    assert!(
        refused.contains("runs --read-lease 5s --max-clock-drift 10000ppm")
            && refused.contains("records --read-lease 100ms --max-clock-drift 10000ppm"),
        "{refused}"
    );
}

/// Three replicas taking (and sharing) a snapshot every 300 ms, serving: how each was launched, and each.
async fn snapshotting(nats: &Nats, dir: &std::path::Path) -> (Vec<Launch>, Vec<Replica>) {
    let config = config_file(dir, CONFIG);
    let launches: Vec<Launch> = (0..3)
        .map(|i| {
            let mut launch = Launch::new(&nats.url, &config, &format!("r{i}"));
            launch.args = vec!["--snapshot-interval".to_string(), "300ms".to_string()];
            launch
        })
        .collect();
    let replicas = start_in_turn(&launches).await;
    (launches, replicas)
}

/// A replica stopped while the stream was purged past what it had applied stops applying when it resumes
/// (it would otherwise answer from a state missing the purged mutations), fails open and reports why;
/// restarted, it starts from the shared snapshot.
#[tokio::test]
async fn a_replica_that_missed_purged_mutations_stops_and_restarts_from_the_shared_snapshot() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (launches, mut replicas) = snapshotting(&nats, dir.path()).await;
    let stale = replicas.pop().unwrap();
    let applied = stale.metric("existence_replica_applied_seq").await as u64;
    stale.signal("STOP");
    // More mutations than the stopped replica's client can hold already delivered (an ordered consumer
    // pulls 500 at a time), so that some of those it has not received are purged. Each `Add` padded past
    // 8 KiB (`ALONE_BYTES` in `replica/add_queue.rs`) so that it is a message of its own: smaller ones
    // reaching a replica during a publish would share the next.
    let padding: Vec<String> = (0..9)
        .map(|j| format!("{j}{}", "p".repeat(1_000)))
        .collect();
    let mut added: Vec<String> = Vec::new();
    wait_until(
        PATIENCE,
        "the stream purged past the stopped replica",
        async || {
            let keys: Vec<String> = (added.len()..added.len() + 100)
                .map(|i| format!("missed-{i}"))
                .collect();
            let adds = keys.iter().enumerate().map(|(i, key)| {
                let padded: Vec<String> = std::iter::once(key.clone())
                    .chain(padding.iter().map(|pad| format!("{key}-{pad}")))
                    .collect();
                let replica = &replicas[i % 2];
                async move { add(replica, "users", &padded).await }
            });
            futures_util::future::join_all(adds).await;
            added.extend(keys);
            let shared = shared_snapshots(&nats.url).await;
            (shared.len() == 2 && shared[0] > applied + 2_000).then_some(())
        },
    )
    .await;
    stale.signal("CONT");
    let (status, why) = wait_until(PATIENCE, "the stale replica to stop applying", async || {
        let (status, why) = stale.readiness().await;
        why.contains("purged").then_some((status, why))
    })
    .await;
    assert_eq!(status, 503, "{why}");
    // What it applied before the gap answers from its filter; the rest fails open (it holds no lease).
    let mut failed_open = 0;
    for key in &added {
        let (answer, basis, _) = stale.lookup("users", key.as_bytes()).await;
        assert_eq!(answer, Answer::MayExist, "{key} ({basis:?})");
        failed_open += usize::from(basis == Basis::Warming);
    }
    assert!(
        failed_open > 0,
        "the purged keys are answered by failing open"
    );
    stale.kill().await;
    let restarted = launches[2].start().await;
    restarted.serving().await;
    for key in &added {
        let (answer, basis, _) = restarted.leased_lookup("users", key.as_bytes()).await;
        assert_eq!((answer, basis), (Answer::MayExist, Basis::Filter), "{key}");
    }
    replicas.push(restarted);
    agreed_digests(&replicas).await;
    // Its history digest came with the shared snapshot, and one restarted on its own data from the local
    // one: each goes on with the chain, and the other two agree with it.
    let own_data = replicas.remove(0);
    own_data.kill().await;
    replicas.insert(0, launches[0].start().await);
    for replica in [&replicas[0], &replicas[2]] {
        wait_until(
            PATIENCE,
            "the other two to agree with its history",
            async || {
                let same = replica.metric("existence_replica_histories_same").await;
                (same == 2.0).then_some(())
            },
        )
        .await;
    }
}

/// Test 5: a replica killed under load and wiped starts from the shared snapshot and the stream after it,
/// reports `SERVING` only once caught up, and then holds what the others hold.
#[tokio::test]
async fn a_wiped_replica_bootstraps_from_the_shared_snapshot_and_the_stream_tail() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (launches, mut replicas) = snapshotting(&nats, dir.path()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writers = [replicas[0].client(), replicas[1].client()];
    let load = tokio::spawn({
        let (stop, counted) = (Arc::clone(&stop), Arc::clone(&counted));
        async move {
            let mut acknowledged = Vec::new();
            for i in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let key = format!("loaded-{i}");
                let request = AddRequest {
                    namespace: if i % 2 == 0 { "users" } else { "orders" }.to_string(),
                    keys: vec![key.clone().into_bytes().into()],
                    ..Default::default()
                };
                if writers[i % 2].clone().add(request).await.is_ok() {
                    acknowledged.push(key);
                    counted.fetch_add(1, Ordering::Relaxed);
                }
            }
            acknowledged
        }
    });
    wait_until(
        PATIENCE,
        "a shared snapshot and a purged stream",
        async || {
            let state = stream_state(&nats).await;
            (state.messages < state.last_sequence).then_some(())
        },
    )
    .await;
    let wiped = replicas.pop().unwrap();
    wiped.kill().await;
    std::fs::remove_dir_all(&launches[2].data_dir).unwrap();
    let stream_before_restart = stream_last_seq(&nats).await;
    let restarted = launches[2].start().await;
    restarted.serving().await;
    assert!(
        restarted.metric("existence_replica_start_seq").await > 0.0,
        "started from the shared snapshot"
    );
    assert!(
        restarted.metric("existence_replica_applied_seq").await >= stream_before_restart as f64,
        "SERVING only once caught up with the stream"
    );
    // Writers wait out the killed replica's fallback for each Add until its restart joins: on a loaded
    // machine few were acknowledged by now, so the load goes on until there are some to check.
    wait_until(PATIENCE, "more than ten acknowledged Adds", async || {
        (counted.load(Ordering::Relaxed) > 10).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let acknowledged = load.await.unwrap();
    for (i, key) in acknowledged.iter().enumerate() {
        let namespace = if key.trim_start_matches("loaded-").parse::<usize>().unwrap() % 2 == 0 {
            "users"
        } else {
            "orders"
        };
        let (answer, _, _) = restarted.lookup(namespace, key.as_bytes()).await;
        assert_eq!(answer, Answer::MayExist, "acknowledged add {i} ({key})");
    }
    replicas.push(restarted);
    agreed_digests(&replicas).await;
}

/// Issue scenario 4: a second process started with a replica's `--replica-id` (identically named
/// containers). The first learns of it from its join, says on `/readyz` which process took its id, and answers
/// no `ABSENT` from then on; the writer waits for the newcomer's reports, never taking them for the first's.
/// Rounds of stalling the first process (SIGSTOP) around each `Add` — how the old rule, which knew replicas
/// by id, answered `ABSENT` for acknowledged keys (458 in 300 rounds) — find no false `ABSENT`.
#[tokio::test]
async fn a_second_process_with_a_replica_id_displaces_the_first_without_a_false_absent() {
    let Some((nats, dir, replicas)) = deployment(2).await else {
        return;
    };
    let (a, b) = (&replicas[0], &replicas[1]);
    assert_answers_absent(b).await;
    let mut launch = Launch::new(&nats.url, &dir.path().join("config.toml"), &b.id);
    launch.data_dir = dir.path().join("data-twin");
    let twin = launch.start().await;
    twin.serving().await;
    let twin_addr = twin.grpc_addr.to_string();
    let why = wait_until(
        PATIENCE,
        "the displaced process to name the other",
        async || {
            let (code, text) = b.readiness().await;
            (code == 503 && text.contains(&twin_addr)).then_some(text)
        },
    )
    .await;
    assert!(why.contains("another process joined as replica"), "{why}");
    for round in 0..100 {
        let key = format!("added-beside-a-twin-{round}");
        b.signal("STOP");
        add(a, "users", &[&key]).await;
        b.signal("CONT");
        let (answer, basis, _) = b.lookup("users", key.as_bytes()).await;
        assert_ne!(
            answer,
            Answer::Absent,
            "{key} on the displaced process ({basis:?})"
        );
        let (answer, _, _) = twin.lookup("users", key.as_bytes()).await;
        assert_eq!(
            answer,
            Answer::MayExist,
            "{key} on the process that took the id"
        );
    }
    let (answer, basis, _) = b.lookup("users", b"never-added").await;
    assert_eq!(
        (answer, basis),
        (Answer::MayExist, Basis::Warming),
        "displaced: no ABSENT at all"
    );
    assert_answers_absent(&twin).await;
}

/// Issue scenario 5: junk published to the stream's subjects by anything with publish rights is passed over
/// by every replica alike (counted, logged with its seq and subject): writes go on, every replica stays
/// ready, and the replicas still agree bit for bit — also for a replica that starts afterwards, once a junk
/// message was deleted and more junk landed on the records it reads at start (hash seed, sizing, index).
#[tokio::test]
async fn junk_on_the_stream_is_passed_over_alike_and_writes_go_on() {
    let Some((nats, dir, replicas)) = deployment(2).await else {
        return;
    };
    let (a, b) = (&replicas[0], &replicas[1]);
    add(a, "users", &["before-the-junk"]).await;
    let jetstream =
        async_nats::jetstream::new(async_nats::connect(nats.url.as_str()).await.unwrap());
    let mut junk = Vec::new();
    for subject in ["existence.users", "existence.$member", "existence.orders"] {
        let ack = jetstream
            .publish(subject, bytes::Bytes::from_static(&[0xA5; 32]))
            .await
            .unwrap()
            .await
            .unwrap();
        junk.push(ack.sequence);
    }
    let seq = add(b, "users", &["after-the-junk"]).await;
    for replica in &replicas {
        wait_until(PATIENCE, "the junk to be counted", async || {
            (replica
                .metric("existence_replica_skipped_messages_total")
                .await
                == 3.0)
                .then_some(())
        })
        .await;
        let (answer, _) = replica
            .lookup_observing("users", b"after-the-junk", seq)
            .await;
        assert_eq!(answer, Answer::MayExist, "{}", replica.id);
        assert_eq!(replica.readiness().await.0, 200, "{}", replica.id);
    }
    agreed_digests(&replicas).await;
    // An operator deletes a junk message: a replica reading the stream afresh passes over the gap (a
    // deletion, not a purge: no retained snapshot covers it) instead of stopping as if it were purged.
    let stream = jetstream.get_stream("existence").await.unwrap();
    assert!(stream.delete_message(junk[0]).await.unwrap());
    // Junk on the records a starting replica reads: its hash seed, a sizing, the shared snapshots' index.
    for subject in [
        "existence.$identity",
        "existence.$sizing.users",
        "existence.$snapshots",
    ] {
        jetstream
            .publish(subject, bytes::Bytes::from_static(&[0xA5; 32]))
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let mut launch = Launch::new(
        &nats.url,
        &dir.path().join("config.toml"),
        "after-the-deletion",
    );
    launch.data_dir = dir.path().join("data-after-the-deletion");
    let late = launch.start().await;
    late.serving().await;
    let (answer, _, _) = late.leased_lookup("users", b"after-the-junk").await;
    assert_eq!(answer, Answer::MayExist);
    let mut all = replicas;
    all.push(late);
    // Two junk messages, the gap of the deleted one, and the junk on the three records — which is no sealed
    // record of theirs (or a second identity), so every replica passes it over as junk, alike.
    for replica in &all {
        wait_until(
            PATIENCE,
            "the junk on the records to be counted",
            async || {
                (replica
                    .metric("existence_replica_skipped_messages_total")
                    .await
                    == 6.0)
                    .then_some(())
            },
        )
        .await;
    }
    agreed_digests(&all).await;
}

/// A consumer created again may read another server's copy of the stream, so the replica follows again
/// from the message it read last and reads on only once the new consumer delivers that very message
/// (`protocol::copy`): here a sound copy lets it go on; then, with that message deleted, it cannot check the
/// copy and stops, saying why, instead of reading on from a history it cannot vouch for.
#[tokio::test]
async fn a_new_consumer_must_deliver_the_message_read_last_before_the_replica_reads_on() {
    let Some((nats, _dir, replicas)) = deployment(1).await else {
        return;
    };
    let replica = &replicas[0];
    let jetstream =
        async_nats::jetstream::new(async_nats::connect(nats.url.as_str()).await.unwrap());
    let stream = jetstream.get_stream("existence").await.unwrap();
    let junk = async || {
        jetstream
            .publish("existence.users", bytes::Bytes::from_static(&[0xA5; 32]))
            .await
            .unwrap()
            .await
            .unwrap()
            .sequence
    };
    let refollows = async || {
        replica
            .metric("existence_replica_stream_read_failures_total")
            .await
    };
    // A sound copy: the new consumer delivers the message read last, and the replica reads on.
    add(replica, "users", &["before-the-new-consumer"]).await;
    let before = refollows().await;
    delete_consumers(&stream).await;
    let next = junk().await;
    wait_until(
        PATIENCE,
        "the junk after the new consumer to be applied",
        async || {
            (replica.metric("existence_replica_applied_seq").await as u64 >= next).then_some(())
        },
    )
    .await;
    assert!(
        refollows().await > before,
        "the new consumer was followed again"
    );
    assert_eq!(replica.readiness().await.0, 200);
    let seq = add(replica, "users", &["after-the-new-consumer"]).await;
    let (answer, _) = replica
        .lookup_observing("users", b"after-the-new-consumer", seq)
        .await;
    assert_eq!(answer, Answer::MayExist);
    // The message read last deleted (with everything from what it had applied to the stream's end, while
    // it is stopped, so that whatever it read last is among them): nothing to check the copy against.
    let applied = replica.metric("existence_replica_applied_seq").await as u64;
    replica.signal("STOP");
    for seq in applied..=stream_last_seq(&nats).await {
        stream.delete_message(seq).await.unwrap();
    }
    delete_consumers(&stream).await;
    replica.signal("CONT");
    junk().await;
    let (status, why) = wait_until(PATIENCE, "the replica to stop", async || {
        let (status, why) = replica.readiness().await;
        why.contains("no longer holds seq").then_some((status, why))
    })
    .await;
    assert_eq!(status, 503, "{why}");
    let (answer, basis, _) = replica.lookup("users", b"never-added").await;
    assert_eq!((answer, basis), (Answer::MayExist, Basis::Warming));
}

/// A replica that applied another message than the others at one seq — as if its NATS server's copy of the
/// stream held one there and came back into line after (fault point `stream-read-other`: its fourth
/// mutation read as a message that changes nothing) — is noticed by comparing history digests: it gives
/// its history up (no ABSENT, not ready, saying whom it differs from), and the two that agree go on.
/// Without the comparison it serves on, answering `ABSENT` for the key it lacks.
#[tokio::test]
async fn a_replica_whose_history_differs_from_every_other_gives_it_up() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), CONFIG);
    let mut replicas = Vec::new();
    for i in 0..3 {
        let mut launch = Launch::new(&nats.url, &config, &format!("r{i}"));
        if i == 2 {
            launch.faults = "stream-read-other=3*off->1*return->off".to_string();
        }
        replicas.push(launch.start().await);
    }
    for replica in &replicas {
        replica.serving().await;
    }
    let keys = named("history", 6);
    for key in &keys {
        add(&replicas[0], "users", &[key]).await;
    }
    let (status, why) = wait_until(PATIENCE, "r2 to give up its history", async || {
        let (status, why) = replicas[2].readiness().await;
        why.contains("differs from that of every other replica")
            .then_some((status, why))
    })
    .await;
    assert_eq!(status, 503, "{why}");
    assert!(why.contains("\"r0\"") && why.contains("\"r1\""), "{why}");
    // The key it lacks (read as another message) and one never added: no ABSENT from it.
    for key in [keys[3].as_str(), "never-added"] {
        let (answer, basis, _) = replicas[2].lookup("users", key.as_bytes()).await;
        assert_eq!((answer, basis), (Answer::MayExist, Basis::Warming), "{key}");
    }
    for replica in &replicas[..2] {
        wait_until(PATIENCE, "r0 and r1 to see r2 differ", async || {
            let differing = replica
                .metric("existence_replica_histories_differing")
                .await;
            (differing == 1.0).then_some(())
        })
        .await;
        assert_eq!(replica.readiness().await.0, 200, "{}", replica.id);
        assert_answers_absent(replica).await;
    }
}

/// Deletes every consumer of `stream` (the replicas' ordered consumers): their clients create them again.
async fn delete_consumers(stream: &async_nats::jetstream::stream::Stream) {
    use futures_util::StreamExt;
    let names: Vec<String> = stream
        .consumer_names()
        .map(|name| name.unwrap())
        .collect()
        .await;
    assert!(!names.is_empty(), "the replica follows the stream");
    for name in names {
        stream.delete_consumer(&name).await.unwrap();
    }
}

/// A graceful stop delays no `Add`: the leaving replica gives up its lease, publishes its leave and goes on
/// applying and reporting until its leave is applied, so writers wait neither the fallback for the `Add`s
/// before the leave nor for its reports of those after. (Before, every `Add` in the fallback after a SIGTERM
/// waited it, ~100 ms, and was acknowledged by the fallback.)
#[tokio::test]
async fn a_graceful_stop_delays_no_add() {
    let Some((_nats, _dir, mut replicas)) = deployment(3).await else {
        return;
    };
    let leaving = replicas.pop().unwrap();
    let writer = &replicas[0];
    let waited = async || {
        writer
            .metric("existence_replica_acked_by_lease_total")
            .await
            + writer.metric("existence_replica_grace_waits_total").await
    };
    wait_until(PATIENCE, "Adds acknowledged without waiting", async || {
        let before = waited().await;
        add(writer, "users", &["warm-up"]).await;
        (waited().await == before).then_some(())
    })
    .await;
    let before = waited().await;
    let stopped = std::sync::atomic::AtomicBool::new(false);
    let adding = async {
        let mut i = 0;
        while !stopped.load(Ordering::Relaxed) || i < 20 {
            add(writer, "users", &[format!("during-stop-{i}")]).await;
            i += 1;
        }
        i
    };
    let stopping = async {
        leaving.signal("TERM");
        assert!(leaving.exited().await.success());
        stopped.store(true, Ordering::Relaxed);
    };
    let (adds, ()) = tokio::join!(adding, stopping);
    assert_eq!(
        waited().await,
        before,
        "of {adds} Adds around a graceful stop, some waited the fallback or a grace"
    );
}

/// A member that died without leaving makes every `Add` wait the fallback; an operator's removal (through any
/// replica) ends that, an unknown id is `NOT_FOUND`, and a replica stopped gracefully leaves by itself.
#[tokio::test]
async fn a_dead_member_is_removed_by_an_operator_and_a_stopped_one_leaves() {
    let Some((_nats, _dir, mut replicas)) = deployment(3).await else {
        return;
    };
    let dead = replicas.pop().unwrap();
    let dead_id = dead.id.clone();
    let (a, b) = (&replicas[0], &replicas[1]);
    let members = |reply: existence_gate::proto::ListReplicasResponse| {
        reply.replicas.into_iter().map(|m| m.id).collect::<Vec<_>>()
    };
    let listed = wait_until(PATIENCE, "every replica to have joined", async || {
        let reply = a
            .admin()
            .list_replicas(ListReplicasRequest {})
            .await
            .unwrap()
            .into_inner();
        (reply.replicas.len() == 3).then_some(members(reply))
    })
    .await;
    assert_eq!(listed, ["r0", "r1", "r2"]);
    dead.kill().await;
    let by_fallback = a.metric("existence_replica_acked_by_lease_total").await;
    add(a, "users", &["while-a-member-is-dead"]).await;
    assert!(
        a.metric("existence_replica_acked_by_lease_total").await > by_fallback,
        "a dead member's reports are waited for, up to the fallback"
    );
    let unknown = b
        .admin()
        .remove_replica(RemoveReplicaRequest {
            id: "no-such-replica".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
    assert!(
        unknown.message().contains("r0, r1, r2"),
        "{}",
        unknown.message()
    );
    b.admin()
        .remove_replica(RemoveReplicaRequest {
            id: dead_id.clone(),
        })
        .await
        .unwrap();
    wait_until(
        PATIENCE,
        "an Add acknowledged without the fallback again",
        async || {
            let before = a.metric("existence_replica_acked_by_lease_total").await;
            add(a, "users", &["after-the-removal"]).await;
            (a.metric("existence_replica_acked_by_lease_total").await == before).then_some(())
        },
    )
    .await;
    b.signal("TERM");
    wait_until(PATIENCE, "the stopped replica to leave", async || {
        let reply = a
            .admin()
            .list_replicas(ListReplicasRequest {})
            .await
            .unwrap()
            .into_inner();
        (members(reply) == ["r0"]).then_some(())
    })
    .await;
}

/// A replica restarted on a wall clock two hours ahead (libfaketime), with a one-hour retention: the `Add`
/// it stamps lands in a later window on every replica and drops none, and its own lookups go by the
/// stream's time, not its clock. (Before stream time, its one `Add` made all 200 keys added a moment earlier
/// answer ABSENT on all three replicas, for good.)
#[tokio::test]
async fn a_replica_restarted_two_hours_ahead_expires_nothing_on_any_replica() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let Some(clock) = common::faketime::SteppedClock::new(dir.path()) else {
        return;
    };
    let config = config_file(
        dir.path(),
        "[namespaces.users]\nexpected_keys = 100000\nretention = \"1h\"\nwindows = 4\n",
    );
    let mut replicas = start_serving(&nats.url, &config, 3, &[]).await;
    let mut keys = named("before", 200);
    add(&replicas[1], "users", &keys).await;
    for replica in &replicas {
        assert_eq!(
            replica.passing_under_lease("users", &keys).await,
            keys.len()
        );
    }
    replicas.remove(0).kill().await;
    clock.set("+2h");
    let mut ahead = Launch::new(&nats.url, &config, "r0");
    ahead.clock = Some(Arc::new(clock));
    let r0 = ahead.start().await;
    r0.serving().await;
    add(&r0, "users", &["ahead"]).await;
    keys.push("ahead".to_string());
    for replica in std::iter::once(&r0).chain(&replicas) {
        assert_eq!(
            replica.passing_under_lease("users", &keys).await,
            keys.len(),
            "replica {} answered ABSENT for keys added a moment ago",
            replica.id
        );
    }
}

/// Eight bytes of junk published on the snapshots' index record (`existence.$snapshots`) — read as one seq far
/// past the stream's end, they named a snapshot no bucket held, and every start failed to download it. Junk
/// is not an index: a restart with its data and a wiped replica both start, from the snapshots the index
/// really names, and hold every acknowledged key.
#[tokio::test]
async fn junk_on_the_snapshot_index_stops_no_start() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (launches, mut replicas) = snapshotting(&nats, dir.path()).await;
    let keys = named("indexed", 50);
    add(&replicas[0], "users", &keys).await;
    wait_until(PATIENCE, "a shared snapshot", async || {
        (!shared_snapshots(&nats.url).await.is_empty()).then_some(())
    })
    .await;
    // Every replica stopped: one left running would go on sharing and purging, and could purge past what a
    // stopped one's own snapshot last read (a start that then stops, whatever the junk).
    for replica in replicas.drain(..) {
        replica.kill().await;
    }
    let client = async_nats::connect(&nats.url).await.unwrap();
    async_nats::jetstream::new(client)
        .publish(
            "existence.$snapshots",
            bytes::Bytes::from_static(b"junk!!!!"),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    std::fs::remove_dir_all(&launches[2].data_dir).unwrap();
    for launch in &launches[1..] {
        // Sharing no more: the restarted r1 sharing snapshots every 300 ms could purge past the one the wiped
        // r2 is loading (under load, a start that then stops on the purge, whatever the junk).
        let mut launch = launch.clone();
        launch.args = vec!["--snapshot-interval".to_string(), "1h".to_string()];
        let replica = launch.start().await;
        replica.serving().await;
        assert_eq!(
            replica.passing_under_lease("users", &keys).await,
            keys.len(),
            "replica {}",
            replica.id
        );
        replicas.push(replica);
    }
    agreed_digests(&replicas).await;
}

/// A replica starting from a shared snapshot reads the membership up to it until its own hello comes back at
/// the seq the quorum stored it at: a copy holding another message there (fault point
/// `stream-subject-other`) may hold other records before it too, so the read is tried again and, while the
/// copy still differs, the start is refused naming it — rather than taken from a history that is not the
/// quorum's (a member missed there is one whose lease the new replica would not wait out). Once the copy is
/// sound the same replica starts.
#[tokio::test]
async fn a_membership_read_from_a_copy_holding_another_hello_is_refused() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_launches, mut replicas) = snapshotting(&nats, dir.path()).await;
    add(&replicas[0], "users", &named("before", 10)).await;
    wait_until(PATIENCE, "a shared snapshot", async || {
        (!shared_snapshots(&nats.url).await.is_empty()).then_some(())
    })
    .await;
    // Stopped, so that none shares and purges past the snapshot the new replica is loading.
    for replica in replicas.drain(..) {
        replica.kill().await;
    }
    let mut late = Launch::new(&nats.url, &dir.path().join("config.toml"), "late");
    late.faults = "stream-subject-other=return".to_string();
    let refused = late.refused().await;
    assert!(
        refused.contains("holds another message at seq"),
        "{refused}"
    );
    late.faults.clear();
    let started = late.start().await;
    started.serving().await;
    let keys = named("before", 10);
    assert_eq!(
        started.passing_under_lease("users", &keys).await,
        keys.len()
    );
}

/// The newest shared snapshot's object missing from the bucket (deleted by hand, lost with a server): a
/// wiped replica falls back to the older snapshot the index names — the stream is purged only below the
/// oldest retained — and serves every key, instead of failing to start.
#[tokio::test]
async fn a_missing_snapshot_object_falls_back_to_the_older_one() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (launches, mut replicas) = snapshotting(&nats, dir.path()).await;
    let mut keys = Vec::new();
    wait_until(PATIENCE, "two shared snapshots", async || {
        let more = named(&format!("before-{}", keys.len()), 20);
        add(&replicas[0], "users", &more).await;
        keys.extend(more);
        (shared_snapshots(&nats.url).await.len() == 2).then_some(())
    })
    .await;
    // Every replica stopped, so that no newer snapshot is shared meanwhile; the one to start again wiped.
    for replica in replicas.drain(..) {
        replica.kill().await;
    }
    std::fs::remove_dir_all(&launches[2].data_dir).unwrap();
    let shared = shared_snapshots(&nats.url).await;
    let client = async_nats::connect(&nats.url).await.unwrap();
    let bucket = async_nats::jetstream::new(client)
        .get_object_store("existence-snapshots")
        .await
        .unwrap();
    bucket
        .delete(format!("snapshot-{:020}", shared[1]))
        .await
        .unwrap();
    let restarted = launches[2].start().await;
    restarted.serving().await;
    assert_eq!(
        restarted.passing_under_lease("users", &keys).await,
        keys.len(),
        "every key, from the older snapshot and the stream after it"
    );
    assert_eq!(
        restarted.metric("existence_replica_start_seq").await as u64,
        shared[0],
        "started from the older snapshot"
    );
}
