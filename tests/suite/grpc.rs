//! The contract end to end: a real server on loopback, a tonic client generated from the proto.

use crate::common;

use bytes::Bytes;
use common::*;
use existence_gate::core::log::GENESIS_SEQ;
use existence_gate::proto::{
    AbsenceKind, AddRequest, Answer, Basis, BatchMayExistRequest, InvalidationCause,
    MayExistRequest, RecordAbsentRequest, RecordOutcome, SubscribeInvalidationsRequest,
};
use tonic::Code;

fn key(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

fn keys(texts: &[&str]) -> Vec<Bytes> {
    texts.iter().map(|t| key(t)).collect()
}

fn may_exist(namespace: &str, k: &str) -> MayExistRequest {
    MayExistRequest {
        namespace: namespace.to_string(),
        key: key(k),
    }
}

fn add(namespace: &str, ks: &[&str]) -> AddRequest {
    AddRequest {
        namespace: namespace.to_string(),
        keys: keys(ks),
        ..Default::default()
    }
}

fn absent(namespace: &str, k: &str, kind: AbsenceKind, observed_seq: u64) -> RecordAbsentRequest {
    RecordAbsentRequest {
        namespace: namespace.to_string(),
        key: key(k),
        kind: kind as i32,
        observed_seq,
        ttl_seconds: 0,
    }
}

const SMALL: &str = r#"
[namespaces.default]
expected_keys = 100000
[namespaces.users]
expected_keys = 100000
missing_ttl = "60s"
deleted_ttl = "10m"
max_ttl = "1h"
[namespaces.tiny]
expected_keys = 1000
max_tombstone_rate = 2
"#;

#[tokio::test]
async fn added_keys_may_exist_and_others_are_absent() {
    let server = start(SMALL).await;
    let mut client = client(&server).await;
    let before = client
        .may_exist(may_exist("", "user:1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(before.answer(), Answer::Absent);
    assert_eq!(before.basis(), Basis::Filter);
    assert_eq!(
        before.observed_seq, GENESIS_SEQ,
        "never 0: 0 means \"not observed\""
    );

    let added = client
        .add(add("", &["user:1", "user:2"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(added.seq, GENESIS_SEQ + 1);
    assert_eq!(added.tombstones_cleared, 0);
    let after = client
        .may_exist(may_exist("default", "user:1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after.answer(), Answer::MayExist);
    assert_eq!(after.basis(), Basis::Filter);
    assert_eq!(after.observed_seq, GENESIS_SEQ + 1);

    // Namespaces are independent key spaces with their own seqs.
    let other = client
        .may_exist(may_exist("users", "user:1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(other.answer(), Answer::Absent);
    assert_eq!(
        client
            .add(add("users", &["x"]))
            .await
            .unwrap()
            .into_inner()
            .seq,
        GENESIS_SEQ + 1
    );
    assert_eq!(
        client.add(add("", &["y"])).await.unwrap().into_inner().seq,
        GENESIS_SEQ + 2
    );
}

#[tokio::test]
async fn batches_answer_in_order_with_duplicates_and_up_to_the_limit() {
    let server = start(SMALL).await;
    let mut client = client(&server).await;
    client.add(add("", &["a", "c"])).await.unwrap();
    let reply = client
        .batch_may_exist(BatchMayExistRequest {
            namespace: String::new(),
            keys: keys(&["a", "b", "c", "a", "zzz"]),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let answers: Vec<Answer> = reply.answers().collect();
    assert_eq!(
        answers,
        [
            Answer::MayExist,
            Answer::Absent,
            Answer::MayExist,
            Answer::MayExist,
            Answer::Absent
        ]
    );
    assert_eq!(reply.observed_seq, GENESIS_SEQ + 1);

    let empty = client
        .batch_may_exist(BatchMayExistRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(empty.answers.is_empty());

    let full: Vec<Bytes> = (0..10_000u32)
        .map(|i| Bytes::from(i.to_be_bytes().to_vec()))
        .collect();
    client
        .add(AddRequest {
            namespace: String::new(),
            keys: full[..5_000].to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    let reply = client
        .batch_may_exist(BatchMayExistRequest {
            namespace: String::new(),
            keys: full,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.answers.len(), 10_000);
    let answers: Vec<Answer> = reply.answers().collect();
    assert!(answers[..5_000].iter().all(|a| *a == Answer::MayExist));
    let false_positives = answers[5_000..]
        .iter()
        .filter(|a| **a == Answer::MayExist)
        .count();
    assert!(
        false_positives < 200,
        "{false_positives} false positives in 5000"
    );
}

#[tokio::test]
async fn record_absent_outcomes_and_tombstones() {
    let server = start(SMALL).await;
    let mut client = client(&server).await;

    // A key the filter already rules out costs nothing.
    let redundant = client
        .record_absent(absent("users", "ghost", AbsenceKind::Missing, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(redundant.outcome(), RecordOutcome::Redundant);
    assert_eq!(redundant.expires_in_ms, 0);

    // A deleted entity: the filter still passes it, a tombstone answers absent.
    let added = client
        .add(add("users", &["u1", "u2"]))
        .await
        .unwrap()
        .into_inner();
    let looked = client
        .may_exist(may_exist("users", "u1"))
        .await
        .unwrap()
        .into_inner();
    let recorded = client
        .record_absent(absent(
            "users",
            "u1",
            AbsenceKind::Deleted,
            looked.observed_seq,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(recorded.outcome(), RecordOutcome::Recorded);
    assert_eq!(recorded.seq, added.seq + 1);
    let ten_minutes = 600_000.0;
    assert!(
        (recorded.expires_in_ms as f64 - ten_minutes).abs() <= ten_minutes * 0.1 + 1.0,
        "{recorded:?}"
    );
    let tombstoned = client
        .may_exist(may_exist("users", "u1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (tombstoned.answer(), tombstoned.basis()),
        (Answer::Absent, Basis::Tombstone)
    );
    assert_eq!(tombstoned.observed_seq, recorded.seq);

    // Unspecified kind means MISSING (60 s default); requested TTLs are clamped to max_ttl (1 h).
    let mut long = absent("users", "u2", AbsenceKind::Unspecified, 0);
    long.ttl_seconds = 1_000_000;
    let clamped = client.record_absent(long).await.unwrap().into_inner();
    assert_eq!(clamped.outcome(), RecordOutcome::Recorded);
    assert!(
        clamped.expires_in_ms <= 3_600_000 && clamped.expires_in_ms >= 3_240_000,
        "{clamped:?}"
    );

    // Re-adding clears the tombstone.
    let readded = client
        .add(add("users", &["u1"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(readded.tombstones_cleared, 1);
    let back = client
        .may_exist(may_exist("users", "u1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (back.answer(), back.basis()),
        (Answer::MayExist, Basis::Filter)
    );

    // An absence observed before that Add is stale.
    let stale = client
        .record_absent(absent(
            "users",
            "u1",
            AbsenceKind::Missing,
            looked.observed_seq,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stale.outcome(), RecordOutcome::Superseded);
    assert_eq!(
        stale.seq, readded.seq,
        "non-recorded replies carry the latest seq unchanged"
    );
    assert_eq!(stale.expires_in_ms, 0);
    let still = client
        .may_exist(may_exist("users", "u1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(still.answer(), Answer::MayExist);
}

#[tokio::test]
async fn tombstone_admission_is_rate_limited() {
    // `tiny` admits 2 tombstones a second, with bursts of up to a second's worth. The clock moves only when
    // the test moves it, so every count is exact.
    let (server, clock) = start_manual(SMALL).await;
    let mut client = client(&server).await;
    let names: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    client.add(add("tiny", &refs)).await.unwrap();
    let mut names = names.iter();
    let mut record = async |count: usize| {
        let mut outcomes = Vec::new();
        for name in names.by_ref().take(count) {
            let reply = client
                .record_absent(absent("tiny", name, AbsenceKind::Missing, 0))
                .await
                .unwrap()
                .into_inner();
            outcomes.push(reply.outcome());
        }
        outcomes
    };
    use RecordOutcome::{Recorded, Throttled};
    assert_eq!(
        record(5).await,
        [Recorded, Recorded, Throttled, Throttled, Throttled],
        "a burst of a second's worth, then nothing while no time passes"
    );
    clock.advance(400);
    assert_eq!(record(1).await, [Throttled], "0.8 tokens after 400 ms");
    clock.advance(200);
    assert_eq!(
        record(2).await,
        [Recorded, Throttled],
        "1.2 tokens after 600 ms"
    );
    clock.advance(60_000);
    assert_eq!(
        record(4).await,
        [Recorded, Recorded, Throttled, Throttled],
        "an idle minute refills one second's burst, no more"
    );
    let (_, metrics) = http_get(&server, "/metrics").await;
    let throttled: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("existence_tombstones_throttled_total{namespace=\"tiny\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("the throttled counter is exported:\n{metrics}"));
    // The registry is shared by the tests in this process; others may count `tiny` too.
    assert!(throttled >= 7, "{throttled} throttled counted");
}

#[tokio::test]
async fn tombstones_expire_after_their_ttl() {
    let (server, clock) = start_manual(SMALL).await;
    let mut client = client(&server).await;
    client.add(add("users", &["gone"])).await.unwrap();
    let mut request = absent("users", "gone", AbsenceKind::Missing, 0);
    request.ttl_seconds = 30;
    let recorded = client.record_absent(request).await.unwrap().into_inner();
    assert_eq!(recorded.outcome(), RecordOutcome::Recorded);
    assert!(
        (27_000..=33_000).contains(&recorded.expires_in_ms),
        "{recorded:?}"
    );
    clock.advance(recorded.expires_in_ms - 1);
    let live = client
        .may_exist(may_exist("users", "gone"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(live.basis(), Basis::Tombstone);
    clock.advance(1);
    let expired = client
        .may_exist(may_exist("users", "gone"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (expired.answer(), expired.basis()),
        (Answer::MayExist, Basis::Filter)
    );
}

#[tokio::test]
async fn bad_requests_get_precise_statuses_and_change_nothing() {
    let server = start_with(
        SMALL,
        std::sync::Arc::new(existence_gate::core::clock::SystemClock),
        64 << 10,
    )
    .await;
    let mut client = client(&server).await;
    let expect = |result: Result<_, tonic::Status>, code: Code, needle: &str| {
        let status = result.expect_err("must be refused");
        assert_eq!(status.code(), code, "{status:?}");
        assert!(
            status.message().contains(needle),
            "{:?} lacks {needle:?}",
            status.message()
        );
    };
    expect(
        client.may_exist(may_exist("", "")).await.map(|_| ()),
        Code::InvalidArgument,
        "key is empty",
    );
    let long = "x".repeat(1_025);
    expect(
        client.may_exist(may_exist("", &long)).await.map(|_| ()),
        Code::InvalidArgument,
        "max_key_bytes = 1024",
    );
    expect(
        client.may_exist(may_exist("nope", "k")).await.map(|_| ()),
        Code::NotFound,
        "\"nope\"",
    );
    expect(
        client.add(add("", &[])).await.map(|_| ()),
        Code::InvalidArgument,
        "at least one key",
    );
    expect(
        client.add(add("", &["ok", "", "ok"])).await.map(|_| ()),
        Code::InvalidArgument,
        "keys[1] is empty",
    );
    let over: Vec<Bytes> = (0..10_001u32)
        .map(|i| Bytes::from(i.to_be_bytes().to_vec()))
        .collect();
    expect(
        client
            .batch_may_exist(BatchMayExistRequest {
                namespace: String::new(),
                keys: over,
                ..Default::default()
            })
            .await
            .map(|_| ()),
        Code::InvalidArgument,
        "max_batch_keys = 10000",
    );
    let mut bad_kind = absent("", "k", AbsenceKind::Missing, 0);
    bad_kind.kind = 9;
    expect(
        client.record_absent(bad_kind).await.map(|_| ()),
        Code::InvalidArgument,
        "kind 9",
    );
    expect(
        client
            .subscribe_invalidations(SubscribeInvalidationsRequest {
                namespace: "nope".into(),
                after_seq: 0,
            })
            .await
            .map(|_| ()),
        Code::NotFound,
        "\"nope\"",
    );
    // Larger than --max-message-bytes (64 KiB here): the framework's RESOURCE_EXHAUSTED.
    let huge = vec![Bytes::from(vec![b'k'; 1_000]); 100];
    let status = client
        .batch_may_exist(BatchMayExistRequest {
            namespace: String::new(),
            keys: huge,
            ..Default::default()
        })
        .await
        .expect_err("too large");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    // `Add` is read by its own route in front of the generated server: the same limit holds there.
    let status = client
        .add(AddRequest {
            namespace: String::new(),
            keys: vec![Bytes::from(vec![b'k'; 1_000]); 100],
            ..Default::default()
        })
        .await
        .expect_err("too large");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    // None of that used a seq.
    let reply = client.add(add("", &["first"])).await.unwrap().into_inner();
    assert_eq!(reply.seq, GENESIS_SEQ + 1);
}

#[tokio::test]
async fn subscription_live_resumed_and_resynced() {
    let server = start(SMALL).await;
    let mut client = client(&server).await;
    let mut live = client
        .subscribe_invalidations(SubscribeInvalidationsRequest {
            namespace: String::new(),
            after_seq: 0,
        })
        .await
        .unwrap()
        .into_inner();
    client.add(add("", &["a", "b"])).await.unwrap();
    client.add(add("users", &["elsewhere"])).await.unwrap();
    client.add(add("", &["c"])).await.unwrap();
    let first = live.message().await.unwrap().unwrap();
    assert_eq!(first.namespace, "default");
    assert_eq!(first.cause(), InvalidationCause::Added);
    assert_eq!((first.seq, first.keys.clone()), (2, keys(&["a", "b"])));
    let second = live.message().await.unwrap().unwrap();
    assert_eq!((second.seq, second.keys), (3, keys(&["c"])));

    // Resume exactly after seq 2.
    let mut resumed = client
        .subscribe_invalidations(SubscribeInvalidationsRequest {
            namespace: "default".into(),
            after_seq: 2,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resumed.message().await.unwrap().unwrap().seq, 3);

    // A seq this server never issued cannot be served exactly.
    let mut future = client
        .subscribe_invalidations(SubscribeInvalidationsRequest {
            namespace: String::new(),
            after_seq: 99,
        })
        .await
        .unwrap()
        .into_inner();
    let resync = future.message().await.unwrap().unwrap();
    assert_eq!(resync.cause(), InvalidationCause::Resync);
    assert_eq!(resync.seq, 3);
    assert!(resync.keys.is_empty());
    client.add(add("", &["d"])).await.unwrap();
    assert_eq!(future.message().await.unwrap().unwrap().seq, 4);
}

#[tokio::test]
async fn a_lagging_subscriber_gets_resync_then_continues() {
    let server = start("[limits]\nreplay_buffer_bytes = 8192").await;
    let mut client = client(&server).await;
    let mut slow = client
        .subscribe_invalidations(SubscribeInvalidationsRequest {
            namespace: String::new(),
            after_seq: 0,
        })
        .await
        .unwrap()
        .into_inner();
    // Far more than the replay buffer and the connection's flow-control windows, unread.
    let big_key = |i: u32| Bytes::from([i.to_be_bytes().to_vec(), vec![b'x'; 1_020]].concat());
    for batch in 0..400u32 {
        let keys = (0..10).map(|i| big_key(batch * 10 + i)).collect();
        client
            .add(AddRequest {
                namespace: String::new(),
                keys,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let mut last_seq = 0;
    let mut resync_seq = None;
    for _ in 0..500 {
        let message = slow.message().await.unwrap().unwrap();
        assert!(
            message.seq > last_seq,
            "seqs increase: {} after {last_seq}",
            message.seq
        );
        last_seq = message.seq;
        if message.cause() == InvalidationCause::Resync {
            resync_seq = Some(message.seq);
            break;
        }
    }
    assert_eq!(
        resync_seq,
        Some(GENESIS_SEQ + 400),
        "a RESYNC at the latest seq"
    );
    client.add(add("", &["after"])).await.unwrap();
    let next = slow.message().await.unwrap().unwrap();
    assert_eq!(
        (next.seq, next.cause()),
        (GENESIS_SEQ + 401, InvalidationCause::Added)
    );
}

#[tokio::test]
async fn shutdown_ends_streams_with_unavailable() {
    let server = start(SMALL).await;
    let mut client = client(&server).await;
    let mut stream = client
        .subscribe_invalidations(SubscribeInvalidationsRequest {
            namespace: String::new(),
            after_seq: 0,
        })
        .await
        .unwrap()
        .into_inner();
    client.add(add("", &["a"])).await.unwrap();
    assert_eq!(stream.message().await.unwrap().unwrap().seq, 2);
    let stopping = tokio::spawn(server.stop());
    let status = stream
        .message()
        .await
        .expect_err("stream ends with a status");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("after_seq = 2"), "{status:?}");
    stopping.await.unwrap().unwrap();
}

/// Keys `k0`, `k1`, ... `k{n-1}`.
fn numbered_keys(n: u32) -> Vec<Bytes> {
    (0..n).map(|i| Bytes::from(format!("k{i}"))).collect()
}

/// An `Add` with `packed_keys` adds exactly its keys, and is refused as a packed batch lookup is.
#[tokio::test]
async fn packed_adds_add_their_keys_and_are_refused_like_packed_lookups() {
    let server = start(SMALL).await;
    let mut client = client(&server).await;
    let all = numbered_keys(3_000);
    let added: Vec<Bytes> = all.iter().step_by(2).cloned().collect();
    let reply = client
        .add(AddRequest {
            packed_keys: pack(&added),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(reply.seq > 0);
    let answers = client
        .batch_may_exist(BatchMayExistRequest {
            keys: all.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let absent = answers.answers().filter(|a| *a == Answer::Absent).count();
    for (i, answer) in answers.answers().enumerate().step_by(2) {
        assert_eq!(answer, Answer::MayExist, "added key {i}");
    }
    assert!(absent > 1_400, "the other half stays absent: {absent}");

    for (keys, packed_keys, needle) in refused_packings() {
        let request = AddRequest {
            keys,
            packed_keys,
            ..Default::default()
        };
        assert_invalid(client.add(request).await, needle);
    }
    assert_invalid(client.add(AddRequest::default()).await, "at least one key");
}

#[tokio::test]
async fn packed_batches_answer_with_a_bitmap_matching_the_plain_answers() {
    let server = start(SMALL).await;
    let mut client = client(&server).await;
    let all = numbered_keys(10_000);
    client
        .add(AddRequest {
            namespace: String::new(),
            keys: all.iter().step_by(3).cloned().collect(),
            ..Default::default()
        })
        .await
        .unwrap();
    let plain = client
        .batch_may_exist(BatchMayExistRequest {
            namespace: String::new(),
            keys: all.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let packed = client
        .batch_may_exist(BatchMayExistRequest {
            namespace: String::new(),
            packed_keys: pack(&all),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(packed.answers.is_empty());
    assert!(!packed.warming && !plain.warming, "a warm gate says so");
    assert_eq!(packed.may_exist_bitmap.len(), 1_250);
    assert_eq!(packed.observed_seq, plain.observed_seq);
    for (i, answer) in plain.answers().enumerate() {
        let bit = packed.may_exist_bitmap[i / 8] >> (i % 8) & 1 == 1;
        assert_eq!(bit, answer == Answer::MayExist, "key {i}");
        if i % 3 == 0 {
            assert!(bit, "added key {i} must may-exist");
        }
    }

    for (keys, packed_keys, needle) in refused_packings() {
        let request = BatchMayExistRequest {
            keys,
            packed_keys,
            ..Default::default()
        };
        assert_invalid(client.batch_may_exist(request).await, needle);
    }
}

/// Requests that carry `packed_keys` wrongly, as (`keys`, `packed_keys`, what the refusal must say): both
/// forms at once, a length past the end, more keys than `max_batch_keys`, an empty key.
fn refused_packings() -> Vec<(Vec<Bytes>, Bytes, &'static str)> {
    let over: Vec<Bytes> = (0..10_001u32)
        .map(|i| Bytes::from(i.to_be_bytes().to_vec()))
        .collect();
    vec![
        (keys(&["a"]), pack(&keys(&["b"])), "not both"),
        (
            Vec::new(),
            Bytes::from_static(&[5, b'a', b'b']),
            "claims 5 bytes",
        ),
        (Vec::new(), pack(&over), "max_batch_keys = 10000"),
        (Vec::new(), pack(&keys(&["ok", ""])), "keys[1] is empty"),
    ]
}

/// `reply` is an `INVALID_ARGUMENT` whose message holds `needle`.
fn assert_invalid<T: std::fmt::Debug>(reply: Result<T, tonic::Status>, needle: &str) {
    let status = reply.expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains(needle),
        "{:?} lacks {needle:?}",
        status.message()
    );
}
