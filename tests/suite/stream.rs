//! The replicated log against a real nats-server with JetStream: publishers on several connections agree on
//! one order, every reader sees the same mutations with the same seqs from any starting seq, a retried
//! publish is stored once, and a setup that cannot work says why.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::nats::Nats;
use existence_gate::core::answer::Answer;
use existence_gate::core::clock::{Clock, ManualClock, SystemClock};
use existence_gate::core::config::GateConfig;
use existence_gate::core::filter::{FilterSpec, Retention};
use existence_gate::core::gate::Gate;
use existence_gate::core::hashing::KeyHasher;
use existence_gate::core::log::{Mutation, VolatileLog};
use existence_gate::core::tombstones::AbsenceKind;
use existence_gate::replication::protocol::history::HistoryReport;
use existence_gate::replication::protocol::{WriteId, WriteRead};
use existence_gate::replication::stream::{
    AppliedReport, Framing, Heard, MutationStream, Record, StreamError, StreamOptions,
};
use futures_util::StreamExt;

/// The host's clock when these tests first made a mutation: what a writer stamps its mutations with (one
/// value, so that a mutation read back equals the one published). The stream's leader, on the same host,
/// stamps them a little later when it stores them, and a replica agrees a mutation's times with that.
fn now_ms() -> u64 {
    static FIRST: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *FIRST.get_or_init(|| SystemClock.now_ms())
}

fn add(namespace: &str, key: &str) -> Mutation {
    Mutation::Add {
        namespace: Arc::from(namespace),
        seq: 0,
        at_ms: now_ms(),
        keys: vec![Bytes::copy_from_slice(key.as_bytes())].into(),
    }
}

fn absent(namespace: &str, key: &str) -> Mutation {
    let at_ms = now_ms();
    Mutation::RecordAbsent {
        namespace: Arc::from(namespace),
        seq: 0,
        at_ms,
        key: Bytes::copy_from_slice(key.as_bytes()),
        kind: AbsenceKind::Deleted,
        expires_at_ms: at_ms + 600_000,
        observed_seq: 0,
    }
}

async fn try_open(nats: &Nats) -> Result<MutationStream, StreamError> {
    MutationStream::open(&StreamOptions::new(vec![nats.url.clone()], "existence")).await
}

async fn open(nats: &Nats) -> MutationStream {
    try_open(nats).await.unwrap()
}

/// A stream named "existence" with `subjects`, as another program would create it.
async fn stream_of_another_program(nats: &Nats, subjects: &str) -> async_nats::jetstream::Context {
    let client = async_nats::connect(nats.url.as_str()).await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    jetstream
        .create_stream(async_nats::jetstream::stream::Config {
            name: "existence".to_string(),
            subjects: vec![subjects.to_string()],
            ..Default::default()
        })
        .await
        .unwrap();
    jetstream
}

/// The first `count` mutations after `after_seq`, as a reader sees them.
async fn read(stream: &MutationStream, after_seq: u64, count: usize) -> Vec<Mutation> {
    let follow = stream.follow(after_seq).await.unwrap();
    let mutations = follow.filter_map(|read| std::future::ready(read.unwrap().mutation));
    tokio::time::timeout(common::PATIENCE, mutations.take(count).collect())
        .await
        .expect("the stream delivers what it acknowledged")
}

#[tokio::test]
async fn replicas_publishing_at_once_read_one_order_with_stream_seqs() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let (a, b) = (open(&nats).await, open(&nats).await);
    let publish = |stream: MutationStream, prefix: &'static str| {
        tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            for i in 0..50 {
                let namespace = if i % 2 == 0 { "users" } else { "orders.eu" };
                let mutation = if i % 5 == 4 {
                    absent(namespace, &format!("{prefix}{i}"))
                } else {
                    add(namespace, &format!("{prefix}{i}"))
                };
                let published = stream
                    .publish(&mutation, &format!("{prefix}-{i}"))
                    .await
                    .unwrap();
                assert!(!published.duplicate);
                acknowledged.push(mutation.with_seq(published.seq));
            }
            acknowledged
        })
    };
    let (from_a, from_b) = (publish(a.clone(), "a"), publish(b.clone(), "b"));
    let mut acknowledged = from_a.await.unwrap();
    acknowledged.extend(from_b.await.unwrap());
    acknowledged.sort_by_key(Mutation::seq);
    let seqs: Vec<u64> = acknowledged.iter().map(Mutation::seq).collect();
    // Seq 1 is the deployment identity, so mutations start above GENESIS_SEQ.
    assert_eq!(seqs, (2..=101).collect::<Vec<_>>(), "one stream, one order");
    assert_eq!(a.last_seq().await.unwrap(), 101);

    // Every reader, from any seq, sees exactly the acknowledged mutations after it, in order.
    let c = open(&nats).await;
    assert_eq!(read(&c, 0, 100).await, acknowledged);
    assert_eq!(read(&a, 0, 100).await, read(&b, 0, 100).await);
    let after_63: Vec<Mutation> = acknowledged
        .iter()
        .filter(|m| m.seq() > 63)
        .cloned()
        .collect();
    assert_eq!(read(&c, 63, after_63.len()).await, after_63);
}

const TWO_NAMESPACES: &str = r#"
[namespaces.users]
expected_keys = 10000
retention = "1h"
windows = 4
[namespaces."orders.eu"]
expected_keys = 10000
"#;

/// A replica's core, built from the stream's identity, that has applied the stream up to `last_seq`.
async fn replica(stream: &MutationStream, last_seq: u64) -> Gate {
    let config = GateConfig::from_toml(TWO_NAMESPACES).unwrap();
    for (name, settings) in &config.namespaces {
        stream
            .agree_sizing(name, &settings.filter_spec())
            .await
            .unwrap();
    }
    let clock = Arc::new(ManualClock::new(now_ms()));
    let gate = Gate::new(&config, KeyHasher::from_seed(stream.seed()), clock);
    let mut follow = std::pin::pin!(stream.follow(0).await.unwrap());
    let mut applied = 1;
    while applied < last_seq {
        let read = tokio::time::timeout(common::PATIENCE, follow.next())
            .await
            .expect("the stream delivers what it acknowledged")
            .unwrap()
            .unwrap();
        applied = read.seq;
        if let Some(mutation) = read.mutation {
            assert_eq!(mutation.seq(), read.seq);
            gate.apply_streamed(mutation, read.stored_at_ms).unwrap();
        }
    }
    // Caught up: it answers (its own writes are not what this test is about).
    gate.open(Arc::new(VolatileLog));
    gate
}

/// Replicas are deterministic state machines of the stream: two cores that applied it (each namespace's
/// seqs rising with gaps, since the namespaces share the stream) hold bit-identical state, and applying a
/// mutation again changes nothing.
#[tokio::test]
async fn replicas_applying_the_stream_agree_bit_for_bit() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let stream = open(&nats).await;
    let mut last = 0;
    let mut published = Vec::new();
    for i in 0..60 {
        // Groups of four in one namespace: three Adds, then an absence of the third key.
        let namespace = if (i / 4) % 3 == 0 {
            "orders.eu"
        } else {
            "users"
        };
        let mutation = if i % 4 == 3 {
            absent(namespace, &format!("k{}", i - 1))
        } else {
            add(namespace, &format!("k{i}"))
        };
        last = stream
            .publish(&mutation, &format!("w{i}"))
            .await
            .unwrap()
            .seq;
        published.push(mutation.with_seq(last));
    }
    let (a, b) = tokio::join!(replica(&stream, last), replica(&stream, last));
    let digests = |gate: &Gate| {
        let mut digests: Vec<_> = gate
            .scan()
            .into_iter()
            .map(|(n, s)| (n, s.digest))
            .collect();
        digests.sort_by(|x, y| x.0.cmp(&y.0));
        digests
    };
    assert_eq!(digests(&a), digests(&b));
    let users = a.namespace("users").unwrap();
    assert_eq!(
        users.latest_seq(),
        published
            .iter()
            .rev()
            .find(|m| m.namespace() == "users")
            .unwrap()
            .seq()
    );
    let before = digests(&a);
    for mutation in published {
        a.apply_streamed(mutation, 0).unwrap();
    }
    assert_eq!(
        digests(&a),
        before,
        "a mutation applied again changes nothing"
    );
    for (namespace, key, answer) in [
        ("orders.eu", "k2", Answer::Absent),
        ("orders.eu", "k1", Answer::MayExist),
        ("users", "k6", Answer::Absent),
        ("users", "k5", Answer::MayExist),
    ] {
        let found = a.may_exist(namespace, key.as_bytes()).unwrap();
        let also = b.may_exist(namespace, key.as_bytes()).unwrap();
        assert_eq!((found.0.answer, found), (answer, also), "{namespace} {key}");
    }
}

/// Replicas hear each other's applied seqs and the writes read at each seq (what an acknowledgement waits
/// on), those sent to all and those sent to them alone, never those sent to another, and each other's
/// history digests; and none of it enters the stream: reports take no stream seq.
#[tokio::test]
async fn replicas_hear_each_others_applied_seqs_outside_the_stream() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let (a, b, c) = (open(&nats).await, open(&nats).await, open(&nats).await);
    let a_hears = a.reports(1).await.unwrap();
    let c_hears = c.reports(3).await.unwrap();
    let reads = [
        WriteRead {
            seq: 8,
            write: WriteId {
                writer: 1,
                counter: 5,
            },
        },
        WriteRead {
            seq: 6,
            write: WriteId {
                writer: 3,
                counter: u64::MAX,
            },
        },
    ];
    b.report_applied("replica-b", 2, 7, &[], None)
        .await
        .unwrap();
    b.report_applied("replica-b", 2, 8, &reads, Some(1))
        .await
        .unwrap();
    b.report_applied("replica-b", 2, 10, &[], None)
        .await
        .unwrap();
    a.report_applied("replica-a", 1, 9, &[], None)
        .await
        .unwrap();
    let history = HistoryReport {
        replica: "replica-b".into(),
        nonce: 2,
        seq: 10,
        digest: Some(0xfeed),
    };
    b.report_history(&history).await.unwrap();
    let report = |replica: &str, nonce, seq| {
        Heard::Applied(AppliedReport {
            replica: replica.to_string(),
            nonce,
            seq,
            reads: if seq == 8 { reads.to_vec() } else { Vec::new() },
        })
    };
    let mut heard: Vec<Heard> = tokio::time::timeout(common::PATIENCE, a_hears.take(5).collect())
        .await
        .expect("the reports to all and to a arrive at a");
    // Two connections: the server may pass on theirs in either order, each connection's in its order.
    heard.sort_by_key(|r| match r {
        Heard::Applied(r) => (r.seq, 0),
        Heard::History(r) => (r.seq, 1),
    });
    assert_eq!(
        heard,
        [
            report("replica-b", 2, 7),
            report("replica-b", 2, 8),
            report("replica-a", 1, 9),
            report("replica-b", 2, 10),
            Heard::History(history),
        ]
    );
    // c hears b's reports in the order b sent them: the one to a alone would come before b's seq 10.
    let mut c_hears = std::pin::pin!(c_hears);
    let mut from_b = Vec::new();
    while from_b.last() != Some(&10) {
        let next = tokio::time::timeout(common::PATIENCE, c_hears.next())
            .await
            .expect("b's reports to all arrive at c")
            .expect("c is still subscribed");
        if let Heard::Applied(next) = next {
            if next.replica == "replica-b" {
                from_b.push(next.seq);
            }
        }
    }
    assert_eq!(from_b, [7, 10], "c does not hear the report meant for a");
    assert_eq!(
        a.last_seq().await.unwrap(),
        1,
        "only the identity is in the stream"
    );
}

#[tokio::test]
async fn a_retried_publish_is_stored_once() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let stream = open(&nats).await;
    let first = stream.publish(&add("users", "k"), "write-1").await.unwrap();
    let retried = stream.publish(&add("users", "k"), "write-1").await.unwrap();
    assert_eq!((first.seq, first.duplicate), (2, false));
    assert_eq!((retried.seq, retried.duplicate), (2, true));
    let next = stream
        .publish(&add("users", "k2"), "write-2")
        .await
        .unwrap();
    assert_eq!(next.seq, 3, "the retry took no seq");
    assert_eq!(
        read(&stream, 0, 2).await,
        [
            add("users", "k").with_seq(2),
            add("users", "k2").with_seq(3)
        ]
    );
}

/// Replicas starting together on an empty stream agree on one hash seed, written once, at seq 1.
#[tokio::test]
async fn replicas_starting_together_share_one_identity() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let opened = futures_util::future::join_all((0..4).map(|_| open(&nats))).await;
    let seed = opened[0].seed();
    assert_ne!(seed, [0; 32]);
    assert!(opened.iter().all(|s| s.seed() == seed));
    assert_eq!(
        opened[0].last_seq().await.unwrap(),
        1,
        "one identity message"
    );
    let later = open(&nats).await;
    assert_eq!(later.seed(), seed);
    let published = later.publish(&add("users", "k"), "w").await.unwrap();
    assert_eq!(published.seq, 2);
}

/// The first replica to serve a namespace records its sizing; the same sizing is accepted, another is
/// refused with both, and two replicas racing to record different sizings cannot both win.
#[tokio::test]
async fn replicas_must_size_a_namespace_alike() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let spec = |expected_keys| FilterSpec {
        expected_keys,
        false_positive_rate: 0.01,
        retention: Retention::Millis(3_600_000),
        windows: 4,
        max_bytes: 1 << 24,
    };
    let (a, b) = (open(&nats).await, open(&nats).await);
    let (small, large) = (spec(1_000), spec(2_000));
    let (first, second) = tokio::join!(
        a.agree_sizing("users", &small),
        b.agree_sizing("users", &large)
    );
    assert!(first.is_ok() != second.is_ok(), "{first:?} {second:?}");
    let winner = if first.is_ok() { 1_000 } else { 2_000 };
    let c = open(&nats).await;
    c.agree_sizing("users", &spec(winner)).await.unwrap();
    let refused = c.agree_sizing("users", &spec(5_000)).await.unwrap_err();
    let message = refused.to_string();
    assert!(
        message.contains("\"users\"")
            && message.contains("expected_keys = 5000")
            && message.contains(&format!("expected_keys = {winner}")),
        "{message}"
    );
    c.agree_sizing("orders", &spec(5_000)).await.unwrap();
}

/// Junk published where a namespace's sizing belongs, before its first replica starts, stops no start: it
/// is passed over, the first replica's sizing is written after it and counts, and a later sizing (even a
/// well-formed one published by hand) changes nothing.
#[tokio::test]
async fn junk_before_a_namespaces_first_sizing_is_passed_over() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let spec = |expected_keys| FilterSpec {
        expected_keys,
        false_positive_rate: 0.01,
        retention: Retention::Forever,
        windows: 1,
        max_bytes: 1 << 24,
    };
    let stream = open(&nats).await;
    let jetstream =
        async_nats::jetstream::new(async_nats::connect(nats.url.as_str()).await.unwrap());
    let publish = async |payload: String| {
        jetstream
            .publish("existence.$sizing.users", payload.into())
            .await
            .unwrap()
            .await
            .unwrap();
    };
    publish("junk".to_string()).await;
    publish(String::new()).await;
    // Shaped like a sizing but not sealed: junk too, or this one would be the namespace's sizing.
    publish(spec(9_000).describe()).await;
    stream.agree_sizing("users", &spec(1_000)).await.unwrap();
    publish(spec(9_000).describe()).await;
    open(&nats)
        .await
        .agree_sizing("users", &spec(1_000))
        .await
        .unwrap();
    let refused = stream
        .agree_sizing("users", &spec(9_000))
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("expected_keys = 1000"), "{refused}");
}

/// The first byte of stream message `seq`: a mutation's type says how it frames its keys.
async fn type_of(jetstream: &async_nats::jetstream::Context, stream: &str, seq: u64) -> u8 {
    let stream = jetstream.get_stream(stream).await.unwrap();
    stream.get_raw_message(seq).await.unwrap().payload[0]
}

/// A stream's identity names its format; a new stream is set up in format 4 (its own records sealed: a
/// magic, a version and a checksum; an `Add` of keys of one length gives it once, other keys a varint
/// length each), a stream set up in format 3 keeps its records unsealed, one in format 2 also varint
/// lengths and one in format 1 u32 lengths (which the older replicas following them read: they would pass
/// anything else over as junk), and a newer format is refused.
#[tokio::test]
async fn a_stream_frames_keys_as_its_identity_says() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let client = async_nats::connect(nats.url.as_str()).await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    let fresh = open(&nats).await;
    let identity = jetstream
        .get_stream("existence")
        .await
        .unwrap()
        .get_raw_message(1)
        .await
        .unwrap()
        .payload;
    assert_eq!(
        identity[8..12],
        4u32.to_le_bytes(),
        "a new stream is format 4"
    );
    assert_eq!(identity.len(), 48, "the seed, then its checksum");
    fresh.publish(&add("users", "k"), "w1").await.unwrap();
    assert_eq!(
        type_of(&jetstream, "existence", 2).await,
        7,
        "keys of one length"
    );
    assert_eq!(read(&fresh, 0, 1).await, [add("users", "k").with_seq(2)]);

    for (name, format) in [
        ("legacy", 1u32),
        ("varint", 2),
        ("unsealed", 3),
        ("future", 5),
    ] {
        jetstream
            .create_stream(async_nats::jetstream::stream::Config {
                name: name.to_string(),
                subjects: vec![format!("{name}.>")],
                ..Default::default()
            })
            .await
            .unwrap();
        let mut payload = b"EXGIDNT1".to_vec();
        payload.extend_from_slice(&format.to_le_bytes());
        payload.extend_from_slice(&[7; 32]);
        jetstream
            .publish(format!("{name}.$identity"), payload.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let legacy = MutationStream::open(&StreamOptions::new(vec![nats.url.clone()], "legacy"))
        .await
        .unwrap();
    assert_eq!(legacy.seed(), [7; 32]);
    legacy.publish(&add("users", "k"), "w1").await.unwrap();
    assert_eq!(type_of(&jetstream, "legacy", 2).await, 1, "u32 key lengths");
    assert_eq!(read(&legacy, 0, 1).await, [add("users", "k").with_seq(2)]);
    let varint = MutationStream::open(&StreamOptions::new(vec![nats.url.clone()], "varint"))
        .await
        .unwrap();
    varint.publish(&add("users", "k"), "w1").await.unwrap();
    assert_eq!(
        type_of(&jetstream, "varint", 2).await,
        5,
        "varint key lengths"
    );
    assert_eq!(read(&varint, 0, 1).await, [add("users", "k").with_seq(2)]);
    // The stream's own records follow its format too: sealed on a new stream, and as older builds wrote them
    // on one set up in format 3 (an older replica there would pass a sealed record over as junk).
    let unsealed = MutationStream::open(&StreamOptions::new(vec![nats.url.clone()], "unsealed"))
        .await
        .unwrap();
    let sizing = FilterSpec {
        expected_keys: 1_000,
        false_positive_rate: 0.01,
        retention: Retention::Forever,
        windows: 1,
        max_bytes: 1 << 24,
    };
    for (stream, framing) in [(&fresh, Framing::Sealed), (&unsealed, Framing::Legacy)] {
        stream.agree_sizing("users", &sizing).await.unwrap();
        let written = jetstream
            .get_stream(stream.name())
            .await
            .unwrap()
            .get_last_raw_message_by_subject(&format!("{}.$sizing.users", stream.name()))
            .await
            .unwrap()
            .payload;
        assert_eq!(
            framing.body(Record::Sizing, &written).unwrap(),
            sizing.describe().as_bytes(),
            "{}",
            stream.name()
        );
        assert_eq!(
            written.starts_with(b"expected_keys"),
            framing == Framing::Legacy
        );
    }

    let refused = MutationStream::open(&StreamOptions::new(vec![nats.url.clone()], "future"))
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("newer existence-gate (identity format 5"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_stream_written_by_something_else_is_refused() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let jetstream = stream_of_another_program(&nats, "existence.>").await;
    jetstream
        .publish("existence.users", "not a mutation".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let refused = try_open(&nats).await.unwrap_err();
    assert!(
        refused.to_string().contains("no existence-gate identity"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_stream_of_that_name_with_other_subjects_is_refused() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    stream_of_another_program(&nats, "orders.>").await;
    let refused = try_open(&nats).await.unwrap_err();
    assert!(matches!(refused, StreamError::Setup(_)), "{refused}");
    let message = refused.to_string();
    assert!(
        message.contains("\"existence\"")
            && message.contains("orders.>")
            && message.contains("--nats-stream"),
        "{message}"
    );
}

#[tokio::test]
async fn unusable_options_and_an_unreachable_nats_are_named() {
    let unreachable_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("nats://127.0.0.1:{unreachable_port}");
    let refused = tokio::time::timeout(
        Duration::from_secs(60),
        MutationStream::open(&StreamOptions::new(vec![url.clone()], "existence")),
    )
    .await
    .expect("a refused connection is reported, not retried forever")
    .unwrap_err();
    assert!(matches!(refused, StreamError::Unreachable(_)), "{refused}");
    assert!(refused.to_string().contains(&url), "{refused}");

    for name in ["", "has.dot", "has space", "wild*"] {
        let refused = MutationStream::open(&StreamOptions::new(vec![url.clone()], name))
            .await
            .unwrap_err();
        assert!(
            matches!(refused, StreamError::Config(_)),
            "{name:?}: {refused}"
        );
    }
    let refused = MutationStream::open(&StreamOptions::new(vec!["not a url".into()], "existence"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("not a url"), "{refused}");
}

/// Purging a namespace below a seq removes only that namespace's mutations below it: other namespaces'
/// mutations and the stream's own records (identity, sizing) stay.
#[tokio::test]
async fn a_purge_removes_only_one_namespace_below_the_seq() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let stream = open(&nats).await;
    let mut seqs = Vec::new();
    for (namespace, key) in [
        ("users", "a"),
        ("orders", "b"),
        ("users", "c"),
        ("orders", "d"),
    ] {
        let published = stream.publish(&add(namespace, key), key).await.unwrap();
        seqs.push(published.seq);
    }
    assert_eq!(
        stream.purge_below("users", 1).await.unwrap(),
        0,
        "nothing is below seq 1"
    );
    let purged = stream.purge_below("users", seqs[2]).await.unwrap();
    assert_eq!(
        purged, 1,
        "only users' first mutation is below seq {}",
        seqs[2]
    );
    let left: Vec<Mutation> = read(&stream, 0, 3).await;
    let keys: Vec<_> = left
        .iter()
        .map(|m| match m {
            Mutation::Add { keys, .. } => keys.iter().next().expect("a key"),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(keys, ["b", "c", "d"]);
    assert!(
        try_open(&nats).await.is_ok(),
        "the identity record is still there"
    );
}
