//! The replicated log against a real nats-server with JetStream: publishers on several connections agree on
//! one order, every reader sees the same mutations with the same seqs from any starting seq, a retried
//! publish is stored once, and a setup that cannot work says why.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::nats::Nats;
use existence_gate::core::log::Mutation;
use existence_gate::core::tombstones::AbsenceKind;
use existence_gate::storage::stream::{MutationStream, StreamError, StreamOptions};
use futures_util::StreamExt;

fn add(namespace: &str, key: &str) -> Mutation {
    Mutation::Add {
        namespace: Arc::from(namespace),
        seq: 0,
        at_ms: 1_800_000_000_000,
        keys: vec![Bytes::copy_from_slice(key.as_bytes())],
    }
}

fn absent(namespace: &str, key: &str) -> Mutation {
    Mutation::RecordAbsent {
        namespace: Arc::from(namespace),
        seq: 0,
        at_ms: 1_800_000_000_001,
        key: Bytes::copy_from_slice(key.as_bytes()),
        kind: AbsenceKind::Deleted,
        expires_at_ms: 1_800_000_060_000,
    }
}

async fn open(nats: &Nats) -> MutationStream {
    MutationStream::open(&StreamOptions::new(vec![nats.url.clone()], "existence"))
        .await
        .unwrap()
}

/// The first `count` mutations after `after_seq`, as a reader sees them.
async fn read(stream: &MutationStream, after_seq: u64, count: usize) -> Vec<Mutation> {
    let follow = stream.follow(after_seq).await.unwrap();
    tokio::time::timeout(
        common::PATIENCE,
        follow.take(count).map(Result::unwrap).collect(),
    )
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
    assert_eq!(seqs, (1..=100).collect::<Vec<_>>(), "one stream, one order");
    assert_eq!(a.last_seq().await.unwrap(), 100);

    // Every reader, from any seq, sees exactly the acknowledged mutations after it, in order.
    let c = open(&nats).await;
    assert_eq!(read(&c, 0, 100).await, acknowledged);
    assert_eq!(read(&a, 0, 100).await, read(&b, 0, 100).await);
    assert_eq!(read(&c, 63, 37).await, acknowledged[63..]);
}

#[tokio::test]
async fn a_retried_publish_is_stored_once() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let stream = open(&nats).await;
    let first = stream.publish(&add("users", "k"), "write-1").await.unwrap();
    let retried = stream.publish(&add("users", "k"), "write-1").await.unwrap();
    assert_eq!((first.seq, first.duplicate), (1, false));
    assert_eq!((retried.seq, retried.duplicate), (1, true));
    let next = stream
        .publish(&add("users", "k2"), "write-2")
        .await
        .unwrap();
    assert_eq!(next.seq, 2, "the retry took no seq");
    assert_eq!(
        read(&stream, 0, 2).await,
        [
            add("users", "k").with_seq(1),
            add("users", "k2").with_seq(2)
        ]
    );
}

#[tokio::test]
async fn a_stream_of_that_name_with_other_subjects_is_refused() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let client = async_nats::connect(nats.url.as_str()).await.unwrap();
    async_nats::jetstream::new(client)
        .create_stream(async_nats::jetstream::stream::Config {
            name: "existence".to_string(),
            subjects: vec!["orders.>".to_string()],
            ..Default::default()
        })
        .await
        .unwrap();
    let refused = MutationStream::open(&StreamOptions::new(vec![nats.url.clone()], "existence"))
        .await
        .unwrap_err();
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
