//! Hostile traffic: a flood of random absences next to hot tombstones, overload far beyond the in-flight
//! limit, subscribers that never read, and malformed wire input. The gate must stay up, bounded and correct.
//! Scales are set for a 2-core CI machine; `EXISTENCE_FLOOD_KEYS` raises the flood (the figure in
//! docs/security.md uses 2,000,000) and `EXISTENCE_SUBSCRIBER_KEYS` sets the keys added past idle
//! subscribers.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use existence_gate::core::answer::Basis;
use existence_gate::core::clock::ManualClock;
use existence_gate::core::config::GateConfig;
use existence_gate::core::gate::Gate;
use existence_gate::core::hashing::KeyHasher;
use existence_gate::core::log::{VolatileLog, GENESIS_SEQ};
use existence_gate::core::namespace::{AbsenceReport, RecordOutcome};
use existence_gate::core::tombstones::{AbsenceKind, BUCKET_BYTES, WAYS};
use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use existence_gate::proto::{
    AddRequest, BatchMayExistRequest, InvalidationCause, MayExistRequest,
    SubscribeInvalidationsRequest,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

const START_MS: u64 = 1_800_000_000_000;

/// A flood of one-off absences (every key passes the saturated filter, the worst case) cannot evict hot
/// tombstones or grow the store past its bound, and beyond the admission rate it is throttled.
#[test]
fn a_flood_of_random_absences_keeps_hot_tombstones_and_the_bound() {
    let flood: u64 = std::env::var("EXISTENCE_FLOOD_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300_000);
    let hot_keys = (flood / 200).max(1_000);
    let max_tombstones = flood / 10;
    // A filter sized for 1,000 keys and not allowed to grow, then overfilled: nearly every key passes it,
    // so every absence is a candidate tombstone.
    let config = GateConfig::from_toml(&format!(
        "[namespaces.default]\nexpected_keys = 1000\nmax_filter_bytes = 2048\nmax_tombstones = {max_tombstones}\n\
         max_tombstone_rate = 100000\nmissing_ttl = \"1h\"\nmax_ttl = \"1h\""
    ))
    .unwrap();
    let clock = Arc::new(ManualClock::new(START_MS));
    let gate = Gate::new(&config, KeyHasher::from_seed([3; 32]), clock.clone());
    gate.open(Arc::new(VolatileLog));
    for batch in 0..20u32 {
        let keys: Vec<Bytes> = (0..1_000u32)
            .map(|i| Bytes::from(format!("real-{batch}-{i}")))
            .collect();
        gate.add("default", keys).unwrap();
    }
    let report = |key: Bytes| AbsenceReport {
        key,
        kind: AbsenceKind::Missing,
        observed_seq: 0,
        ttl_seconds: 0,
    };
    let hot: Vec<Bytes> = (0..hot_keys)
        .map(|i| Bytes::from(format!("hot-{i}")))
        .collect();
    for key in &hot {
        assert_eq!(
            gate.record_absent("default", report(key.clone()))
                .unwrap()
                .outcome,
            RecordOutcome::Recorded
        );
        clock.advance(1);
    }
    let mut throttled = 0u64;
    for i in 0..flood {
        // 100 µs per absence: 10,000/s, a tenth of the admission rate...
        clock.set(START_MS + hot_keys + i / 10);
        if gate
            .record_absent("default", report(Bytes::from(format!("flood-{i}"))))
            .unwrap()
            .outcome
            == RecordOutcome::Throttled
        {
            throttled += 1;
        }
        // ...while the hot keys keep being looked up, as hot keys are.
        gate.may_exist("default", &hot[(i % hot_keys) as usize])
            .unwrap();
    }
    assert_eq!(
        throttled, 0,
        "within the admission rate nothing is throttled"
    );
    let stats = &gate.stats()[0];
    assert!(
        stats.tombstones <= max_tombstones,
        "{} > {max_tombstones}",
        stats.tombstones
    );
    let bytes_per_tombstone = stats.tombstone_bytes as f64 / stats.tombstones as f64;
    assert!(
        bytes_per_tombstone <= 40.0,
        "{bytes_per_tombstone} bytes per tombstone"
    );
    let surviving = hot
        .iter()
        .filter(|k| gate.may_exist("default", k).unwrap().0.basis == Basis::Tombstone)
        .count() as f64
        / hot.len() as f64;
    assert!(
        surviving >= 0.95,
        "only {:.1}% of hot tombstones survived",
        surviving * 100.0
    );

    // A burst far above the rate: most of it is throttled, and the store stays bounded.
    let before = gate.stats()[0].tombstones;
    let burst = 300_000u64;
    let throttled = (0..burst)
        .filter(|i| {
            gate.record_absent("default", report(Bytes::from(format!("burst-{i}"))))
                .unwrap()
                .outcome
                == RecordOutcome::Throttled
        })
        .count() as u64;
    assert!(
        throttled >= burst - 100_001,
        "only {throttled} of {burst} throttled"
    );
    assert!(gate.stats()[0].tombstones <= max_tombstones.max(before));
    println!(
        "flood {flood}: {:.1}% of {hot_keys} hot tombstones survived, {} tombstones stored ({:.1} bytes each, \
         bound {max_tombstones}, {} slots in buckets of {WAYS} × {:.1} bytes), burst of {burst}: {throttled} throttled",
        surviving * 100.0,
        stats.tombstones,
        bytes_per_tombstone,
        stats.tombstone_bytes / BUCKET_BYTES * WAYS as u64,
        BUCKET_BYTES as f64 / WAYS as f64
    );
}

/// Far more concurrent calls than the in-flight limit: the excess is refused at once with
/// RESOURCE_EXHAUSTED, admitted calls succeed, health answers throughout, and the server stays up.
///
/// The disk is made to stall (every fsync waits until released), so the two admitted Adds hold both slots
/// for as long as the test needs instead of for as long as a real fsync happens to take: every call beyond
/// them is shed, whatever this machine's speed. The server runs on a runtime of its own so the test's
/// client keeps working even if the server's threads were blocked.
#[test]
fn overload_is_shed_fast_and_health_stays_answerable() {
    const BEYOND_THE_LIMIT: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    let files = existence_gate::storage::faulty_files::FaultyFiles::new();
    let mut options = options("[limits]\nmax_in_flight = 2", 16 << 20);
    options.durability = Some(existence_gate::server::DurabilityOptions {
        sync: existence_gate::storage::SyncMode::Always,
        snapshot_interval: Duration::from_secs(3_600),
        snapshot_log_bytes: u64::MAX,
        segment_files: files.clone(),
        ..existence_gate::server::DurabilityOptions::new(dir.path().to_path_buf())
    });
    let server_runtime = runtime_of_its_own();
    let server = server_runtime.block_on(start_options(
        options,
        Arc::new(existence_gate::core::clock::SystemClock),
    ));
    let client_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    client_runtime.block_on(async {
        let channel = channel(&server).await;
        let client = ExistenceGateClient::new(channel.clone());
        files.stall_syncs();
        let _release = ReleaseSyncs(files.clone());
        let add = |key: &'static [u8]| {
            let mut client = client.clone();
            tokio::spawn(async move {
                client
                    .add(AddRequest {
                        namespace: String::new(),
                        keys: vec![Bytes::from_static(key)],
                        ..Default::default()
                    })
                    .await
            })
        };
        // The first Add holds a slot once its fsync stalls.
        let first = add(b"admitted-1");
        wait_until(PATIENCE, "the first Add's fsync to stall", async || {
            (files.stalled_syncs() >= 1).then_some(())
        })
        .await;
        // The second holds the other once a lookup (which takes a slot only while it runs) is refused. A
        // lookup and the second Add may arrive together, the Add while the lookup holds the slot: then the
        // Add is shed, and sent again.
        let mut second = add(b"admitted-2");
        wait_until(PATIENCE, "the two Adds to hold both slots", async || {
            if second.is_finished() {
                let shed = (&mut second)
                    .await
                    .unwrap()
                    .expect_err("an Add can only finish now by being shed");
                assert_eq!(shed.code(), Code::ResourceExhausted, "{shed:?}");
                second = add(b"admitted-2");
                return None;
            }
            let mut client = client.clone();
            let lookup = client
                .may_exist(MayExistRequest {
                    namespace: String::new(),
                    key: Bytes::from_static(b"probe"),
                })
                .await;
            matches!(lookup, Err(status) if status.code() == Code::ResourceExhausted).then_some(())
        })
        .await;
        let admitted = [first, second];

        let beyond: Vec<_> = (0..BEYOND_THE_LIMIT)
            .map(|i| {
                let mut client = client.clone();
                tokio::spawn(async move {
                    let keys = vec![Bytes::from(format!("beyond-{i}"))];
                    if i % 2 == 0 {
                        client
                            .add(AddRequest {
                                namespace: String::new(),
                                keys,
                                ..Default::default()
                            })
                            .await
                            .map(|_| ())
                    } else {
                        client
                            .batch_may_exist(BatchMayExistRequest {
                                namespace: String::new(),
                                keys,
                                ..Default::default()
                            })
                            .await
                            .map(|_| ())
                    }
                })
            })
            .collect();
        // Refused without waiting for a slot: every one answers while both slots are still held.
        for call in beyond {
            let refused = tokio::time::timeout(PATIENCE, call)
                .await
                .expect("a call beyond the limit is answered while the slots are held")
                .unwrap()
                .expect_err("a call beyond the limit is shed");
            assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
            assert!(refused.message().contains("max_in_flight"), "{refused:?}");
        }
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        for _ in 0..5 {
            let reply = tokio::time::timeout(
                PATIENCE,
                health.check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                }),
            )
            .await
            .expect("health answers under overload")
            .expect("health is served under overload");
            assert_eq!(reply.into_inner().status, 1, "SERVING");
        }
        assert!(
            admitted.iter().all(|add| !add.is_finished()),
            "the admitted Adds wait for the disk"
        );

        files.release_syncs();
        for add in admitted {
            add.await
                .unwrap()
                .expect("an admitted Add is acknowledged once the disk answers");
        }
        let mut client = client.clone();
        let refused = client
            .may_exist(MayExistRequest::default())
            .await
            .expect_err("empty key");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        client
            .add(AddRequest {
                namespace: String::new(),
                keys: vec![Bytes::from_static(b"still-alive")],
                ..Default::default()
            })
            .await
            .expect("the server still serves");
    });
    // The client's connections close with its runtime, so the server's drain need not wait them out.
    drop(client_runtime);
    server_runtime.block_on(server.stop()).unwrap();
}

/// Reads are shed too: the in-flight limit counts calls from their dispatch (their headers), so calls whose
/// messages have not been read yet — queued for a busy request thread, or still arriving — count, and those
/// beyond the limit are refused before they are decoded. Two calls are held in flight here by sending their
/// headers and withholding their messages (no timing involved); a third is refused with the limit named,
/// health is exempt, the refusal is counted in `/metrics`, and the held calls are answered once their
/// messages arrive.
#[tokio::test]
async fn queued_reads_beyond_the_limit_are_shed_and_health_is_exempt() {
    let server = start("[limits]\nmax_in_flight = 2").await;
    let addr = server.grpc_addr;
    let (connection, driver) =
        h2::client::handshake(tokio::net::TcpStream::connect(addr).await.unwrap())
            .await
            .unwrap();
    tokio::spawn(driver);
    let mut held = Vec::new();
    for _ in 0..2 {
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("http://{addr}/existence.v1.ExistenceGate/MayExist"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let mut ready = connection.clone().ready().await.unwrap();
        held.push(ready.send_request(request, false).unwrap());
    }

    let mut client = client(&server).await;
    let lookup = MayExistRequest {
        namespace: String::new(),
        key: Bytes::from_static(b"k"),
    };
    let refused = wait_until(
        PATIENCE,
        "the two held calls to fill the limit",
        async || client.may_exist(lookup.clone()).await.err(),
    )
    .await;
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("max_in_flight"), "{refused:?}");
    assert!(refused.message().contains("2 calls"), "{refused:?}");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(&server).await);
    let reply = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health is exempt from the limit");
    assert_eq!(reply.into_inner().status, 1, "SERVING");
    let (_, metrics) = http_get(&server, "/metrics").await;
    let counted: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("existence_requests_shed_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the shed counter is exported");
    assert!(counted >= 1, "{counted} counted");

    let message = prost::Message::encode_to_vec(&lookup);
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    for (response, mut body) in held {
        body.send_data(Bytes::from(frame.clone()), true).unwrap();
        let mut response = tokio::time::timeout(PATIENCE, response)
            .await
            .expect("the held call is answered")
            .unwrap()
            .into_body();
        while response.data().await.is_some() {}
        let trailers = response.trailers().await.unwrap().expect("trailers");
        assert_eq!(trailers["grpc-status"], "0", "{trailers:?}");
    }
    client
        .may_exist(lookup)
        .await
        .expect("with the held calls answered, calls are served again");
}

/// 100 subscribers that never read while many keys are added: the server's memory for them stays bounded
/// (the replay buffer evicts; subscribers hold only a cursor) and each gets a RESYNC when it reads again.
///
/// Measured with the server's own accounting and with what each subscriber was sent, not with the process's
/// RSS (which allocator and page-cache behaviour make noisy): the replay buffer stays within its limit after
/// every Add, and all that a subscriber receives before its RESYNC — everything the server ever held for it —
/// fits in its flow-control window plus what the transport encodes ahead of it, however many keys were added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_that_never_read_get_resync_and_memory_stays_bounded() {
    const REPLAY_BUFFER_BYTES: usize = 65_536;
    const WINDOW_BYTES: u32 = 65_535;
    // The most a subscriber may be sent before its RESYNC: its window, plus what the transport encodes and
    // buffers ahead of the window (chunks of 32 KiB or more; up to 85 KiB seen). Queued invalidations would
    // instead grow with the keys added: 1,000 Adds of 1,000 keys are ~25 MB per subscriber.
    const MOST_SENT_BEFORE_RESYNC: usize = 4 * WINDOW_BYTES as usize;
    const SUBSCRIBERS: usize = 100;
    let server = start(&format!(
        "[limits]\nreplay_buffer_bytes = {REPLAY_BUFFER_BYTES}\nmax_subscribers_per_namespace = 200"
    ))
    .await;
    // Each subscriber on its own connection, as the client recipes do: an unread stream holds HTTP/2
    // connection-level flow control, which would stall every other stream sharing its connection.
    let mut client = client(&server).await;
    let mut subscribers = Vec::new();
    for _ in 0..SUBSCRIBERS {
        // Small receive windows, so the test reaches the steady state quickly (the server side is bounded by
        // the same windows plus what the transport buffers ahead of them).
        let channel =
            tonic::transport::Channel::from_shared(format!("http://{}", server.grpc_addr))
                .unwrap()
                .initial_stream_window_size(WINDOW_BYTES)
                .initial_connection_window_size(WINDOW_BYTES)
                .connect()
                .await
                .unwrap();
        let stream =
            existence_gate::proto::existence_gate_client::ExistenceGateClient::new(channel)
                .subscribe_invalidations(SubscribeInvalidationsRequest::default())
                .await
                .unwrap()
                .into_inner();
        subscribers.push(stream);
    }
    let keys_total: u32 = std::env::var("EXISTENCE_SUBSCRIBER_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let batches = keys_total / 1_000;
    let mut largest_replay_buffer = 0;
    for batch in 0..batches {
        let keys = (0..1_000u32)
            .map(|i| Bytes::from(format!("{batch:04}-{i:06}-pad-pad-pad")))
            .collect();
        client
            .add(AddRequest {
                namespace: String::new(),
                keys,
                ..Default::default()
            })
            .await
            .unwrap();
        let stats = &server.gate.stats()[0];
        assert!(
            stats.replay_buffer_bytes <= REPLAY_BUFFER_BYTES,
            "the replay buffer outgrew its limit after batch {batch}: {stats:?}"
        );
        assert_eq!(
            stats.subscribers, SUBSCRIBERS,
            "every idle subscriber stays subscribed: {stats:?}"
        );
        largest_replay_buffer = largest_replay_buffer.max(stats.replay_buffer_bytes);
    }
    let latest = server.gate.stats()[0].seq;
    let mut largest_backlog = 0;
    for (i, stream) in subscribers.iter_mut().enumerate() {
        // The invalidations sent before the RESYNC: how many, their encoded bytes with gRPC framing, the last.
        let (mut sent, mut sent_bytes, mut last_seq) = (0u32, 0usize, None);
        let resync = loop {
            let message = tokio::time::timeout(PATIENCE, stream.message())
                .await
                .expect("the subscriber is answered")
                .unwrap()
                .expect("the stream stays open");
            if message.cause() == InvalidationCause::Resync {
                break message;
            }
            if let Some(last) = last_seq {
                assert_eq!(message.seq, last + 1, "one invalidation per Add, in order");
            }
            last_seq = Some(message.seq);
            sent += 1;
            sent_bytes += prost::Message::encoded_len(&message) + 5;
            assert!(
                sent_bytes <= MOST_SENT_BEFORE_RESYNC,
                "subscriber {i} was sent {sent} invalidations ({sent_bytes} bytes) without a RESYNC: the \
                 server held more for it than its window and the transport's buffers \
                 ({MOST_SENT_BEFORE_RESYNC} bytes)"
            );
        };
        // The latest seq when this subscriber's stream noticed it had fallen behind.
        assert!(
            resync.seq > last_seq.unwrap_or_default() && resync.seq <= latest,
            "subscriber {i}: {resync:?} after {sent} invalidations up to seq {last_seq:?}, latest {latest}"
        );
        largest_backlog = largest_backlog.max(sent_bytes);
    }
    println!(
        "{SUBSCRIBERS} idle subscribers while {keys_total} keys were added: replay buffer at most \
         {largest_replay_buffer} bytes, at most {largest_backlog} bytes sent to a subscriber before its RESYNC; \
         all resynced"
    );
}

/// Garbage on the gRPC port — not HTTP/2, HTTP/2 with junk frames, and a gRPC call whose protobuf body is
/// garbage — gets a clean error and the server keeps serving.
#[tokio::test]
async fn malformed_wire_input_gets_a_clean_error_and_the_server_keeps_serving() {
    let server = start("").await;
    for garbage in [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        b"\x00\x01\x02\x03 not http at all \xff\xfe".repeat(100),
        [
            &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..],
            &[0, 0, 4, 0xff, 0, 0, 0, 0, 9, 1, 2, 3, 4][..],
            &[0x55; 512][..],
        ]
        .concat(),
    ] {
        let mut stream = tokio::net::TcpStream::connect(server.grpc_addr)
            .await
            .unwrap();
        let _ = stream.write_all(&garbage).await;
        let mut sink = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut sink)).await;
        assert!(
            read.is_ok(),
            "the server neither answered nor closed the connection"
        );
    }

    // Well-formed gRPC frames whose protobuf bodies do not decode: garbage, a truncated field, a namespace
    // that is not UTF-8. The caller's fault, so INVALID_ARGUMENT (tonic alone says INTERNAL).
    let not_utf8 = [0x0a, 0x02, 0xff, 0xfe, 0x12, 0x01, b'k'];
    for (what, body) in [
        ("garbage", &[0xffu8; 12][..]),
        ("truncated", &[0x12, 0x05, b'k'][..]),
        ("a namespace that is not UTF-8", &not_utf8[..]),
    ] {
        let (status, message) = raw_call(
            server.grpc_addr,
            "/existence.v1.ExistenceGate/MayExist",
            body,
        )
        .await;
        assert_eq!(status, "3", "{what}: {message}");
        assert!(message.contains("failed to decode"), "{what}: {message}");
    }

    let mut client = client(&server).await;
    let reply = client
        .may_exist(MayExistRequest {
            namespace: String::new(),
            key: Bytes::from_static(b"k"),
        })
        .await
        .expect("the server keeps serving");
    assert_eq!(reply.into_inner().observed_seq, GENESIS_SEQ);
}

/// Sends one gRPC frame carrying `body` to `path` over raw HTTP/2; returns the `grpc-status` and the
/// decoded `grpc-message`, from the headers or the trailers.
async fn raw_call(addr: std::net::SocketAddr, path: &str, body: &[u8]) -> (String, String) {
    let (mut sender, connection) =
        h2::client::handshake(tokio::net::TcpStream::connect(addr).await.unwrap())
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut stream) = sender.send_request(request, false).unwrap();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(body);
    stream.send_data(frame.into(), true).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(30), response)
        .await
        .unwrap()
        .unwrap();
    let headers = if response.headers().contains_key("grpc-status") {
        response.headers().clone()
    } else {
        let mut body = response.into_body();
        while body.data().await.is_some() {}
        body.trailers().await.unwrap().expect("trailers")
    };
    let text = |name: &str| {
        headers
            .get(name)
            .map(|v| v.to_str().unwrap().replace("%20", " "))
            .unwrap_or_default()
    };
    (text("grpc-status"), text("grpc-message"))
}
