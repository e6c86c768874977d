//! The RESP port with a real Redis client (redis-rs) against a gate started here: RedisBloom's commands
//! answer as gRPC does for the same keys, pipelines come back in order, tokens and roles hold, invalidations
//! arrive as Pub/Sub messages, and bad input gets Redis's errors within bounded memory. redis-cli,
//! redis-py and node-redis run the same ground from `tests/resp/run.sh` (the last test here).

use std::sync::Arc;
use std::time::Duration;

use existence_gate::core::clock::SystemClock;
use existence_gate::proto::{Answer, BatchMayExistRequest, SubscribeInvalidationsRequest};
use existence_gate::server::{DurabilityOptions, RespOptions, RunningServer};
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::nats::Nats;
use crate::common::polyglot::run_suite;
use crate::common::replicas::{config_file, start_serving};
use crate::common::{client, options, start_options, token_entry, wait_until, PATIENCE};

const NAMESPACES: &str = "[namespaces.users]\nexpected_keys = 10000\n";

pub(super) async fn start_resp(config: &str, tune: impl FnOnce(&mut RespOptions)) -> RunningServer {
    let mut options = options(config, 16 << 20);
    let mut resp = RespOptions::new("127.0.0.1:0".parse().unwrap());
    tune(&mut resp);
    options.resp = Some(resp);
    start_options(options, Arc::new(SystemClock)).await
}

async fn connection(server: &RunningServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://{}/", server.resp_addr.unwrap()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Sends `request` raw and reads until `done` holds of what came back (or the peer closed).
async fn raw(stream: &mut TcpStream, request: &[u8], done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    stream.write_all(request).await.unwrap();
    read_until(stream, done).await
}

/// Reads until `done` holds of what came back, or the peer closed (or reset) the connection.
async fn read_until(stream: &mut TcpStream, done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let mut reply = Vec::new();
    while !done(&reply) {
        let mut chunk = [0u8; 4096];
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .expect("a reply within 10 s");
        match read {
            Ok(n) if n > 0 => reply.extend_from_slice(&chunk[..n]),
            _ => break,
        }
    }
    reply
}

fn ends_line(reply: &[u8]) -> bool {
    reply.ends_with(b"\r\n")
}

#[tokio::test]
async fn redisbloom_commands_answer_as_grpc_does() {
    let server = start_resp(NAMESPACES, |_| {}).await;
    let mut redis = connection(&server).await;
    let cmd = |name: &str| redis::cmd(name);

    let added: i64 = cmd("BF.ADD")
        .arg("users")
        .arg("u1")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(added, 1, "a new item");
    let again: i64 = cmd("BF.ADD")
        .arg("users")
        .arg("u1")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(again, 0, "an item already present");
    let madd: Vec<i64> = cmd("BF.MADD")
        .arg("users")
        .arg(&["u2", "u1", "u3"])
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(madd, vec![1, 0, 1]);
    let inserted: Vec<i64> = cmd("BF.INSERT")
        .arg(&["users", "CAPACITY", "1000", "ERROR", "0.01", "ITEMS", "u4"])
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(inserted, vec![1]);

    // The same keys through gRPC and through BF.MEXISTS: the same answers.
    let keys: Vec<String> = (0..200).map(|i| format!("u{i}")).collect();
    let over_resp: Vec<i64> = cmd("BF.MEXISTS")
        .arg("users")
        .arg(&keys)
        .query_async(&mut redis)
        .await
        .unwrap();
    let over_grpc = client(&server)
        .await
        .batch_may_exist(BatchMayExistRequest {
            namespace: "users".into(),
            keys: keys.iter().map(|k| k.clone().into()).collect(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .answers;
    let as_grpc: Vec<i64> = over_grpc
        .iter()
        .map(|&a| i64::from(a == Answer::MayExist as i32))
        .collect();
    assert_eq!(over_resp, as_grpc);
    assert_eq!(&over_resp[..5], &[0, 1, 1, 1, 1], "u0 was never added");
    assert!(
        over_resp.iter().filter(|&&a| a == 0).count() > 150,
        "most never-added keys are absent"
    );

    // The gate's own verbs: a recorded absence is a tombstone; an add clears it.
    // `u1` was added: the source deleted it since.
    let recorded: (String, i64, i64) = cmd("GATE.ABSENT")
        .arg(&["users", "u1", "DELETED", "TTL", "60"])
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(recorded.0, "RECORDED");
    assert!(recorded.2 > 0, "a TTL: {recorded:?}");
    let looked_up: (String, String, i64) = cmd("GATE.LOOKUP")
        .arg(&["users", "u1"])
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(
        (looked_up.0.as_str(), looked_up.1.as_str()),
        ("ABSENT", "TOMBSTONE")
    );
    assert_eq!(
        looked_up.2, recorded.1,
        "observed_seq is the tombstone's seq"
    );
    let exists: i64 = cmd("BF.EXISTS")
        .arg(&["users", "u1"])
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(exists, 0, "a live tombstone answers 0");
    let added: i64 = cmd("BF.ADD")
        .arg(&["users", "u1"])
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(
        added, 1,
        "the add clears the tombstone: new as RedisBloom counts it"
    );
    let exists: i64 = cmd("BF.EXISTS")
        .arg(&["users", "u1"])
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(exists, 1);

    // What the configuration decides instead of BF.RESERVE.
    let reserve = cmd("BF.RESERVE")
        .arg(&["users", "0.01", "1000"])
        .query_async::<String>(&mut redis)
        .await
        .unwrap_err();
    assert!(reserve.to_string().contains("item exists"), "{reserve}");
    // Every argument shape's reply, beside RedisBloom's: resp_compat.rs.
    let unknown = cmd("BF.EXISTS")
        .arg(&["nope", "k"])
        .query_async::<i64>(&mut redis)
        .await
        .unwrap_err();
    assert!(
        unknown.to_string().contains("\"nope\" is not configured"),
        "{unknown}"
    );
    let nocreate = cmd("BF.INSERT")
        .arg(&["nope", "NOCREATE", "ITEMS", "k"])
        .query_async::<Vec<i64>>(&mut redis)
        .await
        .unwrap_err();
    assert!(nocreate.to_string().contains("not found"), "{nocreate}");
    // An item called "nocreate" is an item, not the option.
    let item = cmd("BF.INSERT")
        .arg(&["nope", "ITEMS", "nocreate"])
        .query_async::<Vec<i64>>(&mut redis)
        .await
        .unwrap_err();
    assert!(item.to_string().contains("is not configured"), "{item}");
    let info: Vec<redis::Value> = cmd("BF.INFO")
        .arg("users")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(info.len(), 10, "five fields and their values: {info:?}");
    let capacity: Vec<i64> = cmd("BF.INFO")
        .arg(&["users", "CAPACITY"])
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(capacity, vec![10_000]);
    let card: i64 = cmd("BF.CARD")
        .arg("users")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(
        (4..=6).contains(&card),
        "about the 5 distinct items added: {card}"
    );

    let wrong = cmd("BF.EXISTS")
        .arg("users")
        .query_async::<i64>(&mut redis)
        .await
        .unwrap_err();
    assert!(
        wrong
            .to_string()
            .contains("wrong number of arguments for 'bf.exists' command"),
        "{wrong}"
    );
    // Every command is counted by name and outcome.
    let (_, metrics) = crate::common::http_get(&server, "/metrics").await;
    for series in [
        r#"existence_resp_commands_total{command="bf.add",outcome="ok"}"#,
        r#"existence_resp_commands_total{command="bf.exists",outcome="error"}"#,
        r#"existence_resp_commands_total{command="gate.absent",outcome="ok"}"#,
    ] {
        assert!(metrics.contains(series), "{series} missing from /metrics");
    }
    let unknown = cmd("GET")
        .arg("k")
        .query_async::<String>(&mut redis)
        .await
        .unwrap_err();
    assert!(
        unknown.to_string().contains("unknown command 'GET'"),
        "{unknown}"
    );
}

#[tokio::test]
async fn ten_thousand_pipelined_lookups_come_back_in_order_as_unary_answers() {
    let server = start_resp(NAMESPACES, |_| {}).await;
    let mut redis = connection(&server).await;
    let added: Vec<String> = (0..500).map(|i| format!("k{i}")).collect();
    let _: Vec<i64> = redis::cmd("BF.MADD")
        .arg("users")
        .arg(&added)
        .query_async(&mut redis)
        .await
        .unwrap();
    // 10,000 commands: lookups of two namespaces interleaved in runs, and adds between them.
    let mut pipeline = redis::pipe();
    let mut expected = Vec::new();
    for i in 0..10_000u32 {
        let key = format!("k{}", i % 1_000);
        match i % 100 {
            99 => {
                pipeline.cmd("BF.ADD").arg("users").arg(format!("late{i}"));
                expected.push(1);
            }
            50..=59 => {
                pipeline.cmd("BF.EXISTS").arg("default").arg(&key);
                expected.push(-1); // decided below, one unary call each
            }
            _ => {
                pipeline.cmd("BF.EXISTS").arg("users").arg(&key);
                expected.push(-2);
            }
        }
    }
    let answers: Vec<i64> = pipeline.query_async(&mut redis).await.unwrap();
    assert_eq!(answers.len(), 10_000);
    let mut unary = connection(&server).await;
    for (i, (answer, kind)) in answers.iter().zip(&expected).enumerate() {
        let key = format!("k{}", i % 1_000);
        let namespace = match kind {
            1 => {
                assert_eq!(*answer, 1, "command {i}: a new item");
                continue;
            }
            -1 => "default",
            _ => "users",
        };
        let alone: i64 = redis::cmd("BF.EXISTS")
            .arg(namespace)
            .arg(&key)
            .query_async(&mut unary)
            .await
            .unwrap();
        assert_eq!(*answer, alone, "command {i}: {namespace} {key}");
    }
    // Half the keys looked up in `users` were added (k0 to k499), none of those in `default`.
    assert!(answers.iter().filter(|&&a| a == 1).count() > 4_000);
}

#[tokio::test]
async fn tokens_and_roles_hold_on_the_resp_port() {
    let config = [
        NAMESPACES.to_string(),
        crate::common::token_entry("reader", "read-token", &["read"], &["users"]),
        crate::common::token_entry("writer", "write-token", &["read", "write"], &["*"]),
    ]
    .concat();
    let server = start_resp(&config, |_| {}).await;
    let address = server.resp_addr.unwrap();
    let mut stream = TcpStream::connect(address).await.unwrap();
    let reply = raw(&mut stream, b"BF.EXISTS users k\r\n", ends_line).await;
    assert_eq!(reply, b"-NOAUTH Authentication required.\r\n");
    let reply = raw(&mut stream, b"AUTH nope\r\n", ends_line).await;
    assert!(
        reply.starts_with(b"-WRONGPASS"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    let reply = raw(&mut stream, b"AUTH writer read-token\r\n", ends_line).await;
    assert!(
        reply.starts_with(b"-WRONGPASS"),
        "a name that is not the token's"
    );
    let reply = raw(
        &mut stream,
        b"AUTH reader read-token\r\nBF.EXISTS users k\r\n",
        |r| r.ends_with(b":0\r\n"),
    )
    .await;
    assert_eq!(reply, b"+OK\r\n:0\r\n");
    let reply = raw(&mut stream, b"BF.ADD users k\r\n", ends_line).await;
    assert!(
        reply.starts_with(b"-NOPERM this token does not grant write"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    let reply = raw(&mut stream, b"BF.EXISTS default k\r\n", ends_line).await;
    assert!(reply.starts_with(b"-NOPERM"), "another namespace");
    let reply = raw(&mut stream, b"INFO\r\n", |r| r.ends_with(b"\r\n\r\n")).await;
    assert!(
        String::from_utf8_lossy(&reply).contains("namespaces:users\r\n"),
        "INFO names only the namespaces the token may use: {}",
        String::from_utf8_lossy(&reply)
    );

    // A client that authenticates in its URL (AUTH name token), with RESP3 through HELLO.
    let url = format!("redis://writer:write-token@{address}/?protocol=resp3");
    let mut writer = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // RESP3 booleans, as RedisBloom answers there.
    let added: bool = redis::cmd("BF.ADD")
        .arg(&["users", "k"])
        .query_async(&mut writer)
        .await
        .unwrap();
    assert!(added);
    let mut stream = TcpStream::connect(address).await.unwrap();
    let reply = raw(&mut stream, b"HELLO 3 AUTH reader read-token\r\n", |r| {
        r.ends_with(b"*0\r\n")
    })
    .await;
    assert!(
        reply.starts_with(b"%7\r\n"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    let reply = raw(&mut stream, b"BF.EXISTS users k\r\n", ends_line).await;
    assert_eq!(reply, b"#t\r\n");
}

#[tokio::test]
async fn invalidations_arrive_as_pubsub_messages() {
    let server = start_resp(NAMESPACES, |_| {}).await;
    let client = redis::Client::open(format!("redis://{}/", server.resp_addr.unwrap())).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe("invalidations:users").await.unwrap();
    let mut redis = connection(&server).await;
    let _: Vec<i64> = redis::cmd("BF.MADD")
        .arg(&["users", "a", "b"])
        .query_async(&mut redis)
        .await
        .unwrap();
    let mut messages = pubsub.on_message();
    let mut payloads = Vec::new();
    for _ in 0..2 {
        let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("an invalidation within 10 s")
            .unwrap();
        assert_eq!(message.get_channel_name(), "invalidations:users");
        payloads.push(String::from_utf8(message.get_payload_bytes().to_vec()).unwrap());
    }
    let seq = payloads[0].split(' ').nth(1).unwrap().to_string();
    assert_eq!(
        payloads,
        vec![format!("added {seq} a"), format!("added {seq} b")]
    );
    drop(messages);

    // A subscriber that reconnects resumes after the last seq it saw: what it missed is replayed.
    let added: bool = redis::cmd("BF.ADD")
        .arg(&["users", "c"])
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(added);
    let mut resumed = client.get_async_pubsub().await.unwrap();
    let channel = format!("invalidations:users@{seq}");
    resumed.subscribe(&channel).await.unwrap();
    let message = tokio::time::timeout(Duration::from_secs(10), resumed.on_message().next())
        .await
        .expect("the missed invalidation within 10 s")
        .unwrap();
    assert_eq!(message.get_channel_name(), channel);
    let payload = String::from_utf8(message.get_payload_bytes().to_vec()).unwrap();
    assert!(
        payload.starts_with("added ") && payload.ends_with(" c"),
        "{payload}"
    );
    assert!(payload.split(' ').nth(1).unwrap().parse::<u64>().unwrap() > seq.parse().unwrap());

    // One subscription per namespace and connection: one reader cannot take every subscriber place of a
    // namespace with channels that differ only by their seq.
    let mut stream = TcpStream::connect(server.resp_addr.unwrap()).await.unwrap();
    let reply = raw(
        &mut stream,
        b"SUBSCRIBE invalidations:users@1\r\nSUBSCRIBE invalidations:users@2\r\n",
        |r| r.windows(5).any(|w| w == b"-ERR ") && r.ends_with(b"\r\n"),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&reply)
            .contains("-ERR this connection follows namespace \"users\" already"),
        "{}",
        String::from_utf8_lossy(&reply)
    );

    let refused = pubsub.subscribe("users").await.unwrap_err();
    assert!(
        refused.to_string().contains("invalidations:<namespace>"),
        "{refused}"
    );
}

/// Reads until the server closes `stream`, then closes it here too.
async fn until_closed(mut stream: TcpStream) {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
    assert_eq!(read.expect("closed within 10 s").unwrap(), 0);
}

#[tokio::test]
async fn bad_input_gets_redis_errors_and_the_limits_hold() {
    let server = start_resp(NAMESPACES, |resp| resp.max_connections = 3).await;
    let address = server.resp_addr.unwrap();

    // A bulk string past the limit: refused from its header, the connection closed.
    let mut stream = TcpStream::connect(address).await.unwrap();
    let reply = raw(
        &mut stream,
        b"*2\r\n$9\r\nBF.EXISTS\r\n$999999999\r\n",
        ends_line,
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&reply),
        "-ERR Protocol error: invalid bulk length 999999999: the limit is 4096\r\n"
    );
    until_closed(stream).await;

    // More arguments than a batch may hold.
    let mut stream = TcpStream::connect(address).await.unwrap();
    let reply = raw(&mut stream, b"*100000\r\n", ends_line).await;
    let text = String::from_utf8_lossy(&reply);
    assert!(
        text.contains("invalid multibulk length 100000: the limit is 10016"),
        "{text}"
    );
    until_closed(stream).await;

    // A nested array, which a general RESP decoder would recurse into.
    let mut stream = TcpStream::connect(address).await.unwrap();
    let reply = raw(&mut stream, &b"*1\r\n".repeat(10_000), ends_line).await;
    assert_eq!(reply, b"-ERR Protocol error: expected '$', got '*'\r\n");
    until_closed(stream).await;

    // An over-long key is the gate's own refusal, and the connection goes on.
    let mut stream = TcpStream::connect(address).await.unwrap();
    let long = "k".repeat(2_000);
    let request = format!("*3\r\n$9\r\nBF.EXISTS\r\n$5\r\nusers\r\n$2000\r\n{long}\r\nPING\r\n");
    let reply = raw(&mut stream, request.as_bytes(), |r| {
        r.ends_with(b"+PONG\r\n")
    })
    .await;
    let text = String::from_utf8_lossy(&reply);
    assert!(text.starts_with("-ERR ") && text.contains("1024"), "{text}");

    // A pipeline of BF.EXISTS with one invalid item: each command answers for itself, as unpipelined
    // (batched, the invalid item failed its neighbours too). On the same connection: with at most three
    // open, a new one could be refused while the closed ones above still linger.
    let reply = raw(&mut stream, b"BF.ADD users present\r\n", ends_line).await;
    assert_eq!(reply, b":1\r\n");
    let pipeline = b"*3\r\n$9\r\nBF.EXISTS\r\n$5\r\nusers\r\n$7\r\npresent\r\n\
        *3\r\n$9\r\nBF.EXISTS\r\n$5\r\nusers\r\n$0\r\n\r\n\
        *3\r\n$9\r\nBF.EXISTS\r\n$5\r\nusers\r\n$6\r\nabsent\r\n";
    let reply = raw(&mut stream, pipeline, |r| r.ends_with(b":0\r\n")).await;
    let text = String::from_utf8_lossy(&reply);
    let lines: Vec<&str> = text.split("\r\n").collect();
    assert_eq!(lines[0], ":1", "{text}");
    assert!(
        lines[1].starts_with("-ERR ") && !lines[1].contains("keys[1]"),
        "{text}"
    );
    assert_eq!(lines[2], ":0", "{text}");

    // At the connection limit (three open), the next is told so.
    let _second = TcpStream::connect(address).await.unwrap();
    let mut third = TcpStream::connect(address).await.unwrap();
    // The closed connections leave the count just after their sockets close: wait for it to say three.
    wait_until(PATIENCE, "three RESP connections counted", async || {
        let reply = raw(&mut third, b"INFO\r\n", |r| {
            r.ends_with(b"namespaces:default,users\r\n\r\n")
        })
        .await;
        String::from_utf8_lossy(&reply)
            .contains("connected_clients:3\r\n")
            .then_some(())
    })
    .await;
    let mut fourth = TcpStream::connect(address).await.unwrap();
    let reply = raw(&mut fourth, b"", ends_line).await;
    assert_eq!(reply, b"-ERR max number of clients reached\r\n");
}

/// Before `AUTH` (tokens configured) a connection may send what Redis lets an unauthenticated client send —
/// ten arguments — and must authenticate within `handshake_timeout`; any connection must finish a request
/// within it of its first byte, however it trickles. (Before: an unauthenticated connection could hold an
/// unfinished request of 10,016 arguments of 4 KiB, 41 MB, and 50 of them aborted the process; one byte a
/// second kept a connection for ever.)
#[tokio::test]
async fn unauthenticated_and_slow_clients_are_bounded_and_closed_in_time() {
    let config = format!(
        "{NAMESPACES}[limits]\nhandshake_timeout = \"1s\"\n{}",
        crate::common::token_entry("reader", "read-token", &["read"], &["users"])
    );
    let server = start_resp(&config, |_| {}).await;
    let address = server.resp_addr.unwrap();

    let mut stream = TcpStream::connect(address).await.unwrap();
    let reply = raw(&mut stream, b"*11\r\n", ends_line).await;
    assert_eq!(
        String::from_utf8_lossy(&reply),
        "-ERR Protocol error: unauthenticated multibulk length 11: the limit is 10\r\n"
    );
    until_closed(stream).await;

    // AUTH lifts the limits for the commands after it, in the same write too.
    let mut stream = TcpStream::connect(address).await.unwrap();
    let keys: String = (0..20).map(|i| format!("$2\r\nk{}\r\n", i % 10)).collect();
    let request =
        format!("AUTH reader read-token\r\n*22\r\n$10\r\nBF.MEXISTS\r\n$5\r\nusers\r\n{keys}");
    let reply = raw(&mut stream, request.as_bytes(), |r| {
        r.ends_with(b":0\r\n") && r.len() > 80
    })
    .await;
    assert!(
        reply.starts_with(b"+OK\r\n*20\r\n"),
        "{}",
        String::from_utf8_lossy(&reply)
    );

    // Never authenticated: closed at the deadline, told why.
    let mut stream = TcpStream::connect(address).await.unwrap();
    let reply = raw(&mut stream, b"", ends_line).await;
    assert!(
        reply.starts_with(b"-NOAUTH Authentication required: a connection must AUTH within 1s"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    until_closed(stream).await;

    // A client that pipelines for longer than the deadline, every write ending mid-command and finishing
    // the one before: each request is finished in time, so the connection stays.
    let mut stream = TcpStream::connect(address).await.unwrap();
    let reply = raw(&mut stream, b"AUTH reader read-token\r\nPI", ends_line).await;
    assert_eq!(reply, b"+OK\r\n");
    let started = std::time::Instant::now();
    let mut pongs = 0;
    while started.elapsed() < Duration::from_millis(2_500) {
        let reply = raw(&mut stream, b"NG\r\nPI", ends_line).await;
        assert_eq!(reply, b"+PONG\r\n", "after {pongs} PONGs");
        pongs += 1;
        tokio::time::sleep(Duration::from_millis(50)).await; // the client's pace, not a synchronisation
    }
    let reply = raw(&mut stream, b"NG\r\n", ends_line).await;
    assert_eq!(reply, b"+PONG\r\n");

    // Authenticated, then a request trickled a byte at a time: closed a deadline after its first byte,
    // though each byte kept the connection from being idle.
    let mut stream = TcpStream::connect(address).await.unwrap();
    let reply = raw(&mut stream, b"AUTH reader read-token\r\n", ends_line).await;
    assert_eq!(reply, b"+OK\r\n");
    stream
        .write_all(b"*2\r\n$4\r\nECHO\r\n$100\r\n")
        .await
        .unwrap();
    let mut reply = Vec::new();
    for _ in 0..100 {
        if stream.write_all(b"a").await.is_err() {
            break;
        }
        let mut chunk = [0u8; 512];
        match tokio::time::timeout(Duration::from_millis(100), stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => reply.extend_from_slice(&chunk[..n]),
            Err(_) => {}
        }
    }
    assert!(
        reply.starts_with(
            b"-ERR Protocol error: a request not finished within 1s of its first byte"
        ),
        "{}",
        String::from_utf8_lossy(&reply)
    );
}

/// Unfinished requests share one memory budget across connections (no tokens configured, so no `AUTH`
/// limits apply): of two connections each holding a large request one argument short, one is refused with
/// the budget named and closed (whichever the gate read second: each connection is served on its own
/// thread), while the other goes on; small commands go on; once the survivor completes, its bytes come
/// back and a large request fits again. (Before: 100 connections each holding a 10 MB `BF.MADD` one
/// argument short took the gate to 1 GB; the default 1,024, about 10 GB.)
#[tokio::test]
async fn unfinished_requests_share_one_memory_budget() {
    let server = start_resp(NAMESPACES, |resp| resp.request_memory = 1 << 20).await;
    let address = server.resp_addr.unwrap();
    let keys = 800;
    let request = |tag: &str| {
        let mut request = format!("*{}\r\n$7\r\nBF.MADD\r\n$5\r\nusers\r\n", keys + 2).into_bytes();
        for i in 0..keys {
            let key = format!("{tag}-{i:0>1000}");
            request.extend_from_slice(format!("${}\r\n{key}\r\n", key.len()).as_bytes());
        }
        request
    };
    let (first, second) = (request("first"), request("second"));
    let last_argument = |request: &[u8]| request.len() - 1_008;
    let (refusal, completed) = wait_until(
        PATIENCE,
        "one of two large requests refused while the other completes",
        async || {
            let mut streams = [
                TcpStream::connect(address).await.unwrap(),
                TcpStream::connect(address).await.unwrap(),
            ];
            for (stream, request) in streams.iter_mut().zip([&first, &second]) {
                stream
                    .write_all(&request[..last_argument(request)])
                    .await
                    .ok()?;
            }
            let [one, other] = &mut streams;
            let (refusal, survivor) = tokio::select! {
                line = first_line(one) => (line?, 1),
                line = first_line(other) => (line?, 0),
                () = tokio::time::sleep(Duration::from_secs(10)) => return None,
            };
            let mut small = TcpStream::connect(address).await.unwrap();
            assert_eq!(raw(&mut small, b"PING\r\n", ends_line).await, b"+PONG\r\n");
            let (stream, request) = (&mut streams[survivor], [&first, &second][survivor]);
            stream
                .write_all(&request[last_argument(request)..])
                .await
                .ok()?;
            let reply =
                read_until(stream, |r| r.len() >= 4 + keys * 4 || r.starts_with(b"-")).await;
            // Both refused is possible (each refused while the other still held its share): try again.
            reply.starts_with(b"*800\r\n").then_some((refusal, reply))
        },
    )
    .await;
    assert!(
        refusal.starts_with("-ERR the RESP port's memory for unfinished requests (1 MiB")
            && refusal.contains("--resp-request-memory-mib"),
        "{refusal}"
    );
    assert!(
        completed.starts_with(b"*800\r\n:1\r\n"),
        "{}",
        String::from_utf8_lossy(&completed[..40])
    );
    // The survivor's buffer shrank before its reply was written, and the refused connection gave its
    // share back before its refusal was: the whole budget is free now.
    let mut next = TcpStream::connect(address).await.unwrap();
    let reply = raw(&mut next, &request("next"), |r| {
        r.len() >= 4 + keys * 4 || r.starts_with(b"-")
    })
    .await;
    assert!(
        reply.starts_with(b"*800\r\n:1\r\n"),
        "{}",
        String::from_utf8_lossy(&reply[..40])
    );
}

/// The first whole line `stream` sends, which may arrive in more than one read; `None` if it closes first.
async fn first_line(stream: &mut TcpStream) -> Option<String> {
    let mut line = Vec::new();
    let mut chunk = [0u8; 512];
    while !line.ends_with(b"\r\n") {
        match stream.read(&mut chunk).await {
            Ok(n) if n > 0 => line.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&line).into_owned())
}

/// One token holds at most `max_subscriptions_per_token` subscriptions, across both ports: a read-role
/// client could otherwise take a namespace's every place (distinct `invalidations:ns@N` channels on as many
/// connections as it liked), after which everyone's `SubscribeInvalidations` failed. Another token is not
/// held back, and a stream that ends gives its place back.
#[tokio::test]
async fn a_token_holds_at_most_its_share_of_subscriptions_on_both_ports() {
    let config = format!(
        "{NAMESPACES}[limits]\nmax_subscriptions_per_token = 2\n{}{}",
        token_entry("reader", "read-token", &["read"], &["*"]),
        token_entry("other", "other-token", &["read"], &["*"]),
    );
    let server = start_resp(&config, |_| {}).await;
    let address = server.resp_addr.unwrap();
    let mut grpc = client(&server).await;
    let subscribe = |token: &str| {
        let mut request = tonic::Request::new(SubscribeInvalidationsRequest {
            namespace: "users".to_string(),
            after_seq: 0,
        });
        let value = format!("Bearer {token}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
        request
    };
    let first = grpc
        .subscribe_invalidations(subscribe("read-token"))
        .await
        .unwrap();
    let mut resp = TcpStream::connect(address).await.unwrap();
    let reply = raw(
        &mut resp,
        b"AUTH reader read-token\r\nSUBSCRIBE invalidations:users\r\n",
        |r| r.ends_with(b":1\r\n"),
    )
    .await;
    assert!(
        reply.starts_with(b"+OK\r\n*3\r\n$9\r\nsubscribe"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    let refused = grpc
        .subscribe_invalidations(subscribe("read-token"))
        .await
        .expect_err("a third subscription of the token");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused
            .message()
            .contains("token \"reader\" holds 2 subscriptions")
            && refused
                .message()
                .contains("max_subscriptions_per_token = 2"),
        "{}",
        refused.message()
    );
    let mut again = TcpStream::connect(address).await.unwrap();
    let reply = raw(
        &mut again,
        b"AUTH reader read-token\r\nSUBSCRIBE invalidations:users@0\r\n",
        |r| r.len() > 5 && ends_line(r),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&reply)
            .starts_with("+OK\r\n-ERR token \"reader\" holds 2 subscriptions"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    grpc.subscribe_invalidations(subscribe("other-token"))
        .await
        .expect("another token has its own share");
    drop(first);
    wait_until(
        PATIENCE,
        "the ended stream's place to come back",
        async || {
            let mut grpc = grpc.clone();
            grpc.subscribe_invalidations(subscribe("read-token"))
                .await
                .ok()
                .map(drop)
        },
    )
    .await;
}

/// A subscriber on a quiet namespace outlives the idle timeout (Redis never times out Pub/Sub clients): closed,
/// a client library resubscribes without a word and the invalidations of the gap are lost, so a local cache
/// of absences would go on answering ABSENT for keys added meanwhile.
#[tokio::test]
async fn a_quiet_subscriber_outlives_the_idle_timeout() {
    let server = start_resp(NAMESPACES, |resp| {
        resp.idle_timeout = Duration::from_secs(1)
    })
    .await;
    let address = server.resp_addr.unwrap();
    let mut subscriber = TcpStream::connect(address).await.unwrap();
    let reply = raw(&mut subscriber, b"SUBSCRIBE invalidations:users\r\n", |r| {
        r.ends_with(b":1\r\n")
    })
    .await;
    assert!(reply.starts_with(b"*3\r\n$9\r\nsubscribe\r\n"));
    // Opened after the subscriber, an idle connection that is closed shows the timeout has passed for both.
    let mut idle = TcpStream::connect(address).await.unwrap();
    assert_eq!(raw(&mut idle, b"PING\r\n", ends_line).await, b"+PONG\r\n");
    until_closed(idle).await;
    let mut redis = connection(&server).await;
    let _: bool = redis::cmd("BF.ADD")
        .arg(&["users", "late"])
        .query_async(&mut redis)
        .await
        .unwrap();
    let push = raw(&mut subscriber, b"", |r| r.ends_with(b" late\r\n")).await;
    assert!(
        String::from_utf8_lossy(&push).contains("invalidations:users"),
        "{}",
        String::from_utf8_lossy(&push)
    );
}

#[tokio::test]
async fn idle_connections_and_clients_that_never_read_are_closed() {
    let server = start_resp(NAMESPACES, |resp| {
        resp.idle_timeout = Duration::from_secs(1)
    })
    .await;
    let mut stream = TcpStream::connect(server.resp_addr.unwrap()).await.unwrap();
    assert_eq!(raw(&mut stream, b"PING\r\n", ends_line).await, b"+PONG\r\n");
    until_closed(stream).await;

    // A client that pipelines without ever reading its replies: once the socket buffers hold all they
    // can, the server stops reading it (its memory stays one round's replies) and closes it after the idle
    // timeout, so the client's writes fail rather than pile up without end.
    let mut stream = TcpStream::connect(server.resp_addr.unwrap()).await.unwrap();
    let commands = b"*3\r\n$9\r\nBF.EXISTS\r\n$5\r\nusers\r\n$3\r\nkey\r\n".repeat(10_000);
    let refused = wait_until(
        PATIENCE,
        "the server to close a connection that never reads",
        async || {
            tokio::time::timeout(PATIENCE, stream.write_all(&commands))
                .await
                .expect("the server neither read nor closed the connection")
                .err()
        },
    )
    .await;
    assert!(
        matches!(
            refused.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
        ),
        "{refused}"
    );
}

/// On replicas of one stream, the RESP port keeps the replicated rule: a `BF.ADD` acknowledged by one replica
/// answers `BF.EXISTS` 1 on every replica right away, and `0` only comes from a replica under its read lease.
#[tokio::test]
async fn bf_add_through_one_replica_is_seen_by_bf_exists_on_every_replica() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), NAMESPACES);
    let replicas = start_serving(&nats.url, &config, 3, &[]).await;
    let mut connections = Vec::new();
    for replica in &replicas {
        let url = format!("redis://{}/", replica.resp_addr);
        let client = redis::Client::open(url).unwrap();
        connections.push(client.get_multiplexed_async_connection().await.unwrap());
    }
    for connection in &mut connections {
        // A serving replica answers 0 for a key nobody added once it holds its lease.
        wait_until(PATIENCE, "a leased 0 on every replica", async || {
            let exists: i64 = redis::cmd("BF.EXISTS")
                .arg(&["users", "never-added"])
                .query_async(connection)
                .await
                .unwrap();
            (exists == 0).then_some(())
        })
        .await;
    }
    for round in 0..30 {
        let key = format!("resp-{round}");
        let added: i64 = redis::cmd("BF.ADD")
            .arg(&["users", &key])
            .query_async(&mut connections[round % 3])
            .await
            .unwrap();
        assert_eq!(added, 1, "{key}");
        for (reader, connection) in replicas.iter().zip(&mut connections) {
            let exists: i64 = redis::cmd("BF.EXISTS")
                .arg(&["users", &key])
                .query_async(connection)
                .await
                .unwrap();
            assert_eq!(
                exists,
                1,
                "{key} added through replica {} read on {}",
                round % 3,
                reader.id
            );
        }
    }
    // Concurrent BF.ADDs of one new item, three through each replica on connections of their own (a
    // replica merges those that meet into one message): exactly one is told 1, as RedisBloom tells one.
    let mut racing = Vec::new();
    for replica in &replicas {
        for _ in 0..3 {
            let url = format!("redis://{}/", replica.resp_addr);
            let client = redis::Client::open(url).unwrap();
            racing.push(client.get_multiplexed_async_connection().await.unwrap());
        }
    }
    for round in 0..20 {
        let key = format!("raced-{round}");
        assert_eq!(one_told_new(&mut racing, &key).await, 1, "{key}");
    }
}

/// How many of concurrent `BF.ADD`s of `key`, one on each connection, are told 1.
async fn one_told_new(connections: &mut [redis::aio::MultiplexedConnection], key: &str) -> i64 {
    let adds = connections.iter_mut().map(|connection| async move {
        redis::cmd("BF.ADD")
            .arg(&["users", key])
            .query_async::<i64>(connection)
            .await
            .unwrap()
    });
    futures_util::future::join_all(adds).await.iter().sum()
}

/// Concurrent `BF.ADD`s of one new item on a single server: exactly one is told 1 (a lookup made before the
/// `Add` let more than one see it absent: 64 of 300 rounds of 8), and `BF.MADD` of an item twice is told 1
/// then 0, as RedisBloom answers.
#[tokio::test]
async fn of_concurrent_bf_adds_of_one_new_item_exactly_one_is_told_1() {
    // Durable (fsync before each acknowledgement), as served: an `Add` takes long enough for a racing
    // caller to look the item up meanwhile.
    let dir = tempfile::tempdir().unwrap();
    let mut options = options(NAMESPACES, 16 << 20);
    options.resp = Some(RespOptions::new("127.0.0.1:0".parse().unwrap()));
    options.durability = Some(DurabilityOptions::new(dir.path().to_path_buf()));
    let server = start_options(options, Arc::new(SystemClock)).await;
    let mut racing = Vec::new();
    for _ in 0..8 {
        racing.push(connection(&server).await);
    }
    for round in 0..100 {
        let key = format!("raced-{round}");
        assert_eq!(one_told_new(&mut racing, &key).await, 1, "{key}");
    }
    let twice: Vec<i64> = redis::cmd("BF.MADD")
        .arg(&["users", "twice", "twice", "raced-0"])
        .query_async(&mut racing[0])
        .await
        .unwrap();
    assert_eq!(twice, [1, 0, 0]);
}

/// redis-cli, redis-benchmark, redis-py and node-redis against the binary (tests/resp/run.sh).
#[test]
fn redis_clients_in_other_languages() {
    run_suite(
        "RESP port with redis-cli, redis-py, node-redis",
        "tests/resp/run.sh",
        &[],
    );
}

/// `args` as a RESP array of bulk strings.
fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

/// Whether `reply` holds one whole RESP2 reply of a write: an integer, an error, or an array of integers.
fn one_reply(reply: &[u8]) -> bool {
    let text = String::from_utf8_lossy(reply);
    let lines = text.matches("\r\n").count();
    match text.strip_prefix('*') {
        Some(array) => array
            .split("\r\n")
            .next()
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| lines == n + 1),
        None => lines == 1,
    }
}

/// The namespace `users`'s latest seq, as a lookup reports it.
async fn latest_seq(server: &RunningServer) -> u64 {
    let request = existence_gate::proto::MayExistRequest {
        namespace: "users".into(),
        key: bytes::Bytes::from_static(b"anything"),
    };
    client(server)
        .await
        .may_exist(request)
        .await
        .unwrap()
        .into_inner()
        .observed_seq
}

/// A pipelined run of `BF.ADD`s and `BF.MADD`s of one namespace is one `Add` (one seq for the run, one log
/// record and one writer lock instead of one each), and every reply is what the same commands sent one at
/// a time give a gate of their own: an item repeated across commands is new (1) in the first only, and an
/// empty item fails its own command alone, not its neighbours'.
#[tokio::test]
async fn pipelined_adds_are_one_add_with_the_replies_of_adds_sent_one_at_a_time() {
    let valid: &[&[&str]] = &[
        &["BF.ADD", "users", "a"],
        &["BF.MADD", "users", "b", "a", "c", "b"],
        &["BF.ADD", "users", "c"],
        &["BF.ADD", "users", "d"],
    ];
    let with_invalid: &[&[&str]] = &[
        &["BF.ADD", "users", "e"],
        &["BF.MADD", "users", "f", ""],
        &["BF.ADD", "users", "e"],
        &["BF.ADD", "users", "g"],
    ];
    // An empty request (`*0`) between them is nothing, and no reply (it once crashed the batching).
    let with_empty: &[&[&str]] = &[
        &["BF.ADD", "users", "h"],
        &[],
        &["BF.MADD", "users", "h", "i"],
    ];
    let (pipelined, one_by_one) = (
        start_resp(NAMESPACES, |_| {}).await,
        start_resp(NAMESPACES, |_| {}).await,
    );
    let mut one_stream = TcpStream::connect(one_by_one.resp_addr.unwrap())
        .await
        .unwrap();
    let mut piped_stream = TcpStream::connect(pipelined.resp_addr.unwrap())
        .await
        .unwrap();
    for (commands, added_seqs) in [(valid, 1), (with_invalid, 3), (with_empty, 2)] {
        let mut expected = Vec::new();
        for args in commands.iter().filter(|args| !args.is_empty()) {
            let reply = raw(&mut one_stream, &encode(args), one_reply).await;
            expected.extend(reply);
        }
        let before = latest_seq(&pipelined).await;
        let request: Vec<u8> = commands.iter().flat_map(|args| encode(args)).collect();
        let reply = raw(&mut piped_stream, &request, |r| r.len() >= expected.len()).await;
        assert_eq!(
            String::from_utf8_lossy(&reply),
            String::from_utf8_lossy(&expected),
            "pipelined {commands:?}"
        );
        assert_eq!(
            latest_seq(&pipelined).await - before,
            added_seqs,
            "seqs the pipelined run took: {commands:?}"
        );
    }
}
