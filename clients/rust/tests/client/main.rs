//! The Rust client against the real gate, served in-process on loopback ports; `conformance` runs the cases
//! every client library shares. One test binary: each links the whole gate, and linking is most of building one.

mod conformance;
mod mirror;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use existence_gate::core::clock::SystemClock;
use existence_gate::core::config::GateConfig;
use existence_gate::server::{self, DurabilityOptions, RunningServer, ServeOptions, TlsOptions};
use existence_gate_client::{
    AddressPolicy, ClientOptions, ClientTls, GateClient, GatedReader, ReaderOptions, SourceRead,
};
use futures_util::FutureExt;
use tonic::Code;

const CONFIG: &str = r#"
[namespaces.users]
expected_keys = 100000
missing_ttl = "1h"
deleted_ttl = "1h"
ttl_jitter = 0.0
max_ttl = "1h"
"#;

/// Far beyond what a loaded 2-core machine needs; waits end as soon as their condition holds.
const PATIENCE: Duration = Duration::from_secs(30);

async fn start(listen: &str, data_dir: Option<&Path>) -> RunningServer {
    start_with_tls(listen, data_dir, None).await
}

async fn start_with_tls(
    listen: &str,
    data_dir: Option<&Path>,
    tls: Option<TlsOptions>,
) -> RunningServer {
    start_gate(CONFIG, listen, data_dir, tls).await
}

/// A gate with `config` (TOML) served in-process on `listen`, its state loaded.
async fn start_gate(
    config: &str,
    listen: &str,
    data_dir: Option<&Path>,
    tls: Option<TlsOptions>,
) -> RunningServer {
    let options = ServeOptions {
        listen: listen.parse().unwrap(),
        http_listen: "127.0.0.1:0".parse().unwrap(),
        config: GateConfig::from_toml(config).unwrap(),
        max_message_bytes: 16 << 20,
        drain_timeout: Duration::from_secs(5),
        durability: data_dir.map(|dir| DurabilityOptions::new(dir.to_path_buf())),
        tls,
        replication: None,
        resp: None,
    };
    let server = server::start(options, Arc::new(SystemClock))
        .await
        .expect("server starts");
    server.loaded().await.expect("state loads");
    server
}

async fn serve() -> RunningServer {
    start("127.0.0.1:0", None).await
}

/// A loopback address nothing listens on.
fn closed_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

fn client(server: &RunningServer, options: ClientOptions) -> GateClient {
    GateClient::new([server.grpc_addr.to_string()], options).unwrap()
}

fn users() -> ClientOptions {
    ClientOptions::namespace("users")
}

fn unary() -> ClientOptions {
    ClientOptions {
        coalesce_window: Duration::ZERO,
        ..users()
    }
}

fn key(name: impl std::fmt::Display) -> Bytes {
    Bytes::from(name.to_string())
}

async fn wait_until(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let give_up = Instant::now() + PATIENCE;
    while !condition().await {
        assert!(Instant::now() < give_up, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_lookups_answer_each_caller_as_unary_calls_do() {
    let server = serve().await;
    let writer = client(&server, unary());
    writer
        .add((0..200).map(|i| key(format!("k{i}"))))
        .await
        .unwrap();
    let keys: Vec<Bytes> = (0..400).map(|i| key(format!("k{i}"))).collect();
    let mut expected = HashMap::new();
    for k in &keys {
        expected.insert(
            k.clone(),
            writer.may_exist(k.clone()).await.unwrap().may_exist,
        );
    }
    assert_eq!(
        writer.stats().gate_calls,
        400,
        "window 0: one unary call per lookup"
    );
    assert_eq!(writer.stats().batched_keys, 0);

    let coalescing = client(&server, users());
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let callers: Vec<_> = (0..64)
        .map(|caller| {
            let (client, barrier) = (coalescing.clone(), barrier.clone());
            let mine: Vec<Bytes> = keys.iter().skip(caller).step_by(64).cloned().collect();
            tokio::spawn(async move {
                barrier.wait().await;
                let mut answers = Vec::new();
                for k in mine {
                    answers.push((k.clone(), client.may_exist(k).await.unwrap().may_exist));
                }
                answers
            })
        })
        .collect();
    for caller in callers {
        for (k, may_exist) in caller.await.unwrap() {
            assert_eq!(may_exist, expected[&k], "key {k:?}");
        }
    }
    let stats = coalescing.stats();
    assert_eq!(stats.lookups, 400);
    assert_eq!(stats.batched_keys, 400, "every lookup went in a batch");
    assert!(
        stats.gate_calls < stats.lookups,
        "lookups shared calls: {stats:?}"
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batches_share_calls_and_each_gets_its_own_answers() {
    let server = serve().await;
    let writer = client(&server, unary());
    writer
        .add((0..1_000).step_by(3).map(|i| key(format!("b{i}"))))
        .await
        .unwrap();
    let keys: Vec<Bytes> = (0..1_000).map(|i| key(format!("b{i}"))).collect();
    let expected = writer.may_exist_many(&keys).await.unwrap().may_exist;
    assert_eq!(expected.iter().filter(|m| **m).count(), 334);

    let coalescing = client(&server, users());
    let callers: Vec<_> = (0..10)
        .map(|part| {
            let (client, mine) = (
                coalescing.clone(),
                keys[part * 100..part * 100 + 100].to_vec(),
            );
            tokio::spawn(async move { (part, client.may_exist_many(&mine).await.unwrap()) })
        })
        .collect();
    for caller in callers {
        let (part, answers) = caller.await.unwrap();
        assert_eq!(
            answers.may_exist,
            expected[part * 100..part * 100 + 100],
            "part {part}"
        );
    }
    let stats = coalescing.stats();
    assert_eq!(stats.batched_keys, 1_000);
    assert!(stats.gate_calls < 10, "batches shared calls: {stats:?}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_lone_caller_does_not_wait_for_the_window() {
    let server = serve().await;
    // A window far beyond the deadline: only "no batch in flight, so leave now" answers in time.
    let options = ClientOptions {
        coalesce_window: Duration::from_secs(3_600),
        deadline: Duration::from_secs(10),
        ..users()
    };
    let client = client(&server, options);
    for i in 0..5 {
        assert!(!client.may_exist(key(i)).await.unwrap().may_exist);
    }
    assert_eq!(client.stats().batched_keys, 5);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_failed_batch_fails_each_of_its_callers_with_the_same_status() {
    let server = serve().await;
    let options = ClientOptions {
        coalesce_window: Duration::from_millis(50),
        ..ClientOptions::namespace("no-such-namespace")
    };
    let client = client(&server, options);
    let lookups = (0..8).map(|i| client.may_exist(key(i)));
    let results = futures_util::future::join_all(lookups).await;
    for result in results {
        let status = result.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        assert!(status.message().contains("no-such-namespace"), "{status:?}");
    }
    let calls = client.stats().gate_calls;
    assert!(calls < 8, "the 8 lookups shared batches: {calls} calls");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_caller_that_gives_up_leaves_its_batch_to_the_others() {
    let server = serve().await;
    client(&server, unary())
        .add([key("present")])
        .await
        .unwrap();
    let options = ClientOptions {
        coalesce_window: Duration::from_millis(50),
        ..users()
    };
    let client = client(&server, options);
    // Polled once (its key is queued), then dropped: the caller gives up before any answer.
    let gave_up = client.may_exist(key("x")).now_or_never();
    assert!(gave_up.is_none(), "no answer can arrive within one poll");
    let answers =
        futures_util::future::join_all((0..4).map(|_| client.may_exist(key("present")))).await;
    for answer in answers {
        assert!(answer.unwrap().may_exist);
    }
    assert_eq!(
        client.stats().batched_keys,
        5,
        "its key still went with the batch"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_gate_that_never_answers_is_a_deadline_exceeded_within_the_deadline() {
    // Accepts connections (the kernel completes the handshake) and never speaks HTTP/2.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let options = ClientOptions {
        deadline: Duration::from_millis(200),
        ..users()
    };
    let client = GateClient::new([silent.local_addr().unwrap().to_string()], options).unwrap();
    let started = Instant::now();
    let status = client.may_exist(key("k")).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(started.elapsed() < PATIENCE);
    let status = client.add([key("k")]).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
}

#[tokio::test]
async fn invalid_keys_get_the_gates_own_status_and_do_not_fail_a_batch() {
    let server = serve().await;
    let client = client(&server, users());
    let (empty, long, fine) = tokio::join!(
        client.may_exist(Bytes::new()),
        client.may_exist(Bytes::from(vec![b'x'; 2000])),
        client.may_exist(key("fine")),
    );
    let empty = empty.unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument, "{empty:?}");
    let long = long.unwrap_err();
    assert_eq!(long.code(), Code::InvalidArgument, "{long:?}");
    assert!(long.message().contains("1024"), "{long:?}");
    assert!(!fine.unwrap().may_exist);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_dead_address_is_skipped_and_counted_as_a_retry() {
    let server = serve().await;
    let live = server.grpc_addr.to_string();
    client(&server, unary())
        .add([key("present")])
        .await
        .unwrap();
    for policy in [AddressPolicy::RoundRobin, AddressPolicy::PickFirst] {
        let options = ClientOptions {
            address_policy: policy,
            down_for: Duration::from_secs(600),
            ..users()
        };
        let client = GateClient::new([closed_address(), live.clone()], options).unwrap();
        for _ in 0..4 {
            assert!(client.may_exist(key("present")).await.unwrap().may_exist);
        }
        // The dead address is tried once, then skipped while it is down.
        assert_eq!(client.stats().retries, 1, "{policy:?}");
    }
    let options = ClientOptions {
        address_policy: AddressPolicy::PickFirst,
        ..users()
    };
    let client = GateClient::new([live, closed_address()], options).unwrap();
    for _ in 0..4 {
        client.may_exist(key("present")).await.unwrap();
    }
    assert_eq!(
        client.stats().retries,
        0,
        "pick-first never reached the second address"
    );
    server.stop().await.unwrap();
}

/// A replica that accepts connections and never answers (SIGSTOPped) beside a live one: a call sent to it
/// moves on to the live one after half its deadline instead of failing at the deadline, and the silent
/// address is then skipped while down: every call is answered, one retry in all.
#[tokio::test]
async fn a_silent_address_costs_a_call_half_its_deadline_and_is_then_skipped() {
    let server = serve().await;
    client(&server, unary())
        .add([key("present")])
        .await
        .unwrap();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let options = ClientOptions {
        deadline: Duration::from_millis(400),
        down_for: Duration::from_secs(600),
        ..users()
    };
    let addresses = [
        silent.local_addr().unwrap().to_string(),
        server.grpc_addr.to_string(),
    ];
    let client = GateClient::new(addresses, options).unwrap();
    for _ in 0..4 {
        assert!(client.may_exist(key("present")).await.unwrap().may_exist);
    }
    assert_eq!(client.stats().retries, 1, "the silent address tried once");
    server.stop().await.unwrap();
}

/// With every other address down, the one left gets the whole deadline: a replica that is slow but alone
/// must still be able to answer. (Here it never answers, so the call ends at its deadline, not at half of it
/// with the down address's `UNAVAILABLE`.)
#[tokio::test]
async fn the_only_address_up_gets_the_whole_deadline() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let options = ClientOptions {
        deadline: Duration::from_millis(300),
        down_for: Duration::from_secs(600),
        coalesce_window: Duration::ZERO,
        ..users()
    };
    let client = GateClient::new(
        [closed_address(), silent.local_addr().unwrap().to_string()],
        options,
    )
    .unwrap();
    for _ in 0..2 {
        let status = client.may_exist(key("k")).await.unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    }
}

/// A source over a map, counting its reads.
#[derive(Clone, Default)]
struct Database {
    rows: Arc<std::sync::Mutex<HashMap<Bytes, SourceRead<String>>>>,
    reads: Arc<AtomicUsize>,
}

impl Database {
    fn insert(&self, k: &str, row: SourceRead<String>) {
        self.rows.lock().unwrap().insert(key(k), row);
    }

    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }

    fn reader(&self, client: GateClient, options: ReaderOptions) -> GatedReader<String, String> {
        let db = self.clone();
        GatedReader::new(client, options, move |k: Bytes| {
            let db = db.clone();
            async move {
                db.reads.fetch_add(1, Ordering::SeqCst);
                let row = db.rows.lock().unwrap().get(&k).cloned();
                Ok(row.unwrap_or(SourceRead::Missing))
            }
        })
    }
}

/// Looks `k` up until the reader answers it from its local cache (once its subscription is live).
async fn until_cached(reader: &GatedReader<String, String>, k: &str) {
    wait_until("the absence to be cached locally", async || {
        let hits = reader.stats().cache_hits;
        assert_eq!(reader.get(key(k)).await.unwrap(), None);
        reader.stats().cache_hits > hits
    })
    .await;
}

#[tokio::test]
async fn the_read_path_answers_absences_without_the_source_and_records_what_the_source_lacks() {
    let server = serve().await;
    let db = Database::default();
    let gate = client(&server, users());
    let reader = db.reader(gate.clone(), ReaderOptions::default());

    // Never added: absent by the filter, no source read, then from the local cache.
    until_cached(&reader, "never-added").await;
    assert_eq!(db.reads(), 0);

    // Added and inserted: read once from the source.
    reader.add([key("user-1")]).await.unwrap();
    db.insert("user-1", SourceRead::Found("Ada".into()));
    assert_eq!(
        reader.get(key("user-1")).await.unwrap().as_deref(),
        Some("Ada")
    );
    assert_eq!(db.reads(), 1);

    // Added but never inserted: one source read, RECORDED, then the gate answers absent by its tombstone.
    reader.add([key("user-2")]).await.unwrap();
    assert_eq!(reader.get(key("user-2")).await.unwrap(), None);
    assert_eq!(db.reads(), 2);
    assert_eq!(reader.stats().absences_recorded, 1);
    assert!(!gate.may_exist(key("user-2")).await.unwrap().may_exist);
    until_cached(&reader, "user-2").await;
    assert_eq!(db.reads(), 2);

    // A deleted row is recorded too.
    reader.add([key("user-3")]).await.unwrap();
    db.insert("user-3", SourceRead::Deleted);
    assert_eq!(reader.get(key("user-3")).await.unwrap(), None);
    assert_eq!(reader.stats().absences_recorded, 2);
    assert!(!gate.may_exist(key("user-3")).await.unwrap().may_exist);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn an_add_elsewhere_drops_a_cached_absence() {
    let server = serve().await;
    let db = Database::default();
    let reader = db.reader(client(&server, users()), ReaderOptions::default());
    until_cached(&reader, "late").await;

    client(&server, unary()).add([key("late")]).await.unwrap();
    db.insert("late", SourceRead::Found("row".into()));
    wait_until("the invalidation to reach the reader", async || {
        reader.get(key("late")).await.unwrap().is_some()
    })
    .await;
    assert!(reader.stats().invalidations >= 1);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_resumed_subscription_delivers_an_add_made_while_it_was_down_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let server = start("127.0.0.1:0", Some(dir)).await;
    let address = server.grpc_addr.to_string();
    let db = Database::default();
    let options = ReaderOptions {
        cache_ttl: Duration::from_secs(600),
        ..ReaderOptions::default()
    };
    let reader = db.reader(client(&server, users()), options);
    until_cached(&reader, "added-in-the-gap").await;
    until_cached(&reader, "never-added").await;
    // An Add the reader applies, so it has a seq to resume after.
    client(&server, unary()).add([key("before")]).await.unwrap();
    wait_until("the reader to apply an invalidation", async || {
        reader.stats().invalidations >= 1
    })
    .await;

    server.stop().await.unwrap();
    // The same state on the same port: the reader resubscribes with the last seq it applied (backing off
    // at least 200 ms after the failure, by which time this Add has long landed).
    let server = start(&address, Some(dir)).await;
    client(&server, unary())
        .add([key("added-in-the-gap")])
        .await
        .unwrap();
    db.insert("added-in-the-gap", SourceRead::Found("row".into()));
    wait_until("the resumed subscription to deliver the Add", async || {
        reader.get(key("added-in-the-gap")).await.unwrap().is_some()
    })
    .await;
    assert!(reader.stats().resubscribes >= 1);
    let hits = reader.stats().cache_hits;
    assert_eq!(reader.get(key("never-added")).await.unwrap(), None);
    assert_eq!(
        reader.stats().cache_hits,
        hits + 1,
        "resuming by seq kept the other absence (a fresh subscription would have cleared it)"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn with_the_gate_down_the_reader_reads_the_source_and_never_answers_absent() {
    let db = Database::default();
    db.insert("user-1", SourceRead::Found("Ada".into()));
    let options = ClientOptions {
        deadline: Duration::from_millis(300),
        ..users()
    };
    let gate = GateClient::new([closed_address(), closed_address()], options).unwrap();
    let reader = db.reader(gate, ReaderOptions::default());
    for _ in 0..3 {
        assert_eq!(
            reader.get(key("user-1")).await.unwrap().as_deref(),
            Some("Ada")
        );
        assert_eq!(reader.get(key("user-2")).await.unwrap(), None);
    }
    let stats = reader.stats();
    assert_eq!(stats.fail_opens, 6);
    assert_eq!(db.reads(), 6, "every get read the source");
    assert_eq!(stats.cache_hits, 0);
}

#[tokio::test]
async fn concurrent_gets_of_one_key_share_one_source_read() {
    let server = serve().await;
    let gate = client(&server, users());
    gate.add([key("slow")]).await.unwrap();
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let reads = Arc::new(AtomicUsize::new(0));
    let (release_in_source, reads_in_source) = (release.clone(), reads.clone());
    let reader: GatedReader<String, String> =
        GatedReader::new(gate, ReaderOptions::default(), move |_key| {
            let (release, reads) = (release_in_source.clone(), reads_in_source.clone());
            async move {
                reads.fetch_add(1, Ordering::SeqCst);
                let _permit = release.acquire().await.unwrap();
                Ok(SourceRead::Found("row".to_string()))
            }
        });
    let gets: Vec<_> = (0..8)
        .map(|_| {
            let reader = reader.clone();
            tokio::spawn(async move { reader.get(key("slow")).await })
        })
        .collect();
    // Each get joins the flight the moment its lookup returns, before any await; the source stays blocked
    // until all 8 lookups have been answered, so each of them either started the read or joined it.
    wait_until("the 8 lookups", async || reader.stats().lookups == 8).await;
    wait_until("the source read to start", async || {
        reads.load(Ordering::SeqCst) >= 1
    })
    .await;
    release.add_permits(1);
    for get in gets {
        assert_eq!(get.await.unwrap().unwrap().as_deref(), Some("row"));
    }
    assert_eq!(
        reads.load(Ordering::SeqCst),
        reader.stats().source_reads as usize
    );
    assert!(reader.stats().source_reads <= 2, "{:?}", reader.stats());
    server.stop().await.unwrap();
}

#[tokio::test]
async fn tls_with_a_client_certificate_is_served_and_without_one_refused() {
    let pki = existence_gate_testkit::new_pki();
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let tls = TlsOptions {
        cert: file("server.pem", &pki.server_cert),
        key: file("server.key", &pki.server_key),
        client_ca: Some(file("ca.pem", &pki.ca)),
    };
    let server = start_with_tls("127.0.0.1:0", None, Some(tls)).await;
    let trusting = ClientTls {
        ca_pem: Some(pki.ca.clone()),
        domain: Some("localhost".to_string()),
        identity: Some((pki.client_cert.clone(), pki.client_key.clone())),
    };
    let over_tls = |tls: Option<ClientTls>| {
        let options = ClientOptions {
            tls,
            coalesce_window: Duration::ZERO,
            ..users()
        };
        GateClient::new([server.grpc_addr.to_string()], options).unwrap()
    };

    let client = over_tls(Some(trusting.clone()));
    client.add([key("secret")]).await.unwrap();
    assert!(client.may_exist(key("secret")).await.unwrap().may_exist);

    let anonymous = over_tls(Some(ClientTls {
        identity: None,
        ..trusting
    }));
    // TLS 1.3: the handshake completes on the client's side, and the gate's alert fails the call.
    let refused = anonymous.may_exist(key("secret")).await.unwrap_err();
    assert!(
        format!("{refused:?}").contains("CertificateRequired"),
        "{refused:?}"
    );
    // Plaintext to a TLS port: the gate closes the connection (UNAVAILABLE or UNKNOWN, by timing).
    let plaintext = over_tls(None).may_exist(key("secret")).await.unwrap_err();
    assert!(
        matches!(plaintext.code(), Code::Unavailable | Code::Unknown),
        "{plaintext:?}"
    );
    server.stop().await.unwrap();
}
