//! The door of each port: connections that send nothing are closed after the handshake timeout (plaintext,
//! TLS, the HTTP port), a connection past its preface is left to HTTP/2 keepalive, and at the
//! file-descriptor limit the server backs off instead of spinning and keeps serving the connections it has.
//!
//! Every wait is on a condition (a read returning, a log line) under a generous deadline; no assertion
//! depends on this machine being fast (the descriptor-limit test waits for the server's seventh retry and
//! checks it came no sooner than its backoff allows: a loaded machine only makes it later).

use crate::common;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use existence_gate::core::clock::SystemClock;
use existence_gate::proto::MayExistRequest;
use existence_gate::server::TlsOptions;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// How long any one expected event may take on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(30);
/// The HTTP/2 client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads (and discards) until the server closes `stream`; how long that took from `since`.
async fn closed_by_server(mut stream: impl AsyncReadExt + Unpin, since: Instant) -> Duration {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(DEADLINE, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return since.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("the server closes the connection")
}

/// A `grpc.health.v1.Health/Check` request to `addr` (its body is sent on the stream).
fn health_request(addr: SocketAddr) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// One `grpc.health.v1.Health/Check` of the whole server on an existing HTTP/2 connection: its status, or
/// the error that ended the connection. A raw HTTP/2 client, because tonic's channel would reconnect and
/// hide a closed connection.
async fn health_over(
    connection: &mut h2::client::SendRequest<Bytes>,
    addr: SocketAddr,
) -> Result<ServingStatus, h2::Error> {
    let mut ready = connection.clone().ready().await?;
    let (response, mut body) = ready.send_request(health_request(addr), false)?;
    // An empty HealthCheckRequest: uncompressed, zero bytes long.
    body.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true)?;
    let mut response = response.await?.into_body();
    let mut message = Vec::new();
    while let Some(chunk) = response.data().await {
        let chunk = chunk?;
        let _ = response.flow_control().release_capacity(chunk.len());
        message.extend_from_slice(&chunk);
    }
    let trailers = response.trailers().await?.expect("trailers");
    assert_eq!(trailers["grpc-status"], "0", "{trailers:?}");
    // A length-prefixed HealthCheckResponse whose only field is `status` (field 1, a varint).
    assert_eq!(message[..6], [0, 0, 0, 0, 2, 0x08], "{message:?}");
    Ok(ServingStatus::try_from(i32::from(message[6])).unwrap())
}

/// A raw HTTP/2 connection to `addr`, driven in the background.
async fn h2_connection(addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    let (connection, driver) = h2::client::handshake(TcpStream::connect(addr).await.unwrap())
        .await
        .unwrap();
    tokio::spawn(driver);
    connection
}

/// The value of the Prometheus series `series` (its full name and labels) in `metrics`, 0 when absent.
fn metric(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn connections_that_send_no_preface_are_closed_while_clients_are_served() {
    let server = start("[limits]\nhandshake_timeout = \"300ms\"").await;
    // A client that connected before: its connection must outlive the timeout.
    let mut established = h2_connection(server.grpc_addr).await;
    assert_eq!(
        health_over(&mut established, server.grpc_addr)
            .await
            .unwrap(),
        ServingStatus::Serving
    );

    let opened = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(TcpStream::connect(server.grpc_addr).await.unwrap());
    }
    // Part of a preface, then nothing.
    let mut partial = TcpStream::connect(server.grpc_addr).await.unwrap();
    partial.write_all(&PREFACE[..10]).await.unwrap();
    silent.push(partial);

    let mut slowest = Duration::ZERO;
    for stream in silent {
        slowest = slowest.max(closed_by_server(stream, opened).await);
    }
    println!("21 connections without a preface, handshake timeout 300 ms: all closed {slowest:?} after opening");

    // The established connection and new clients are served.
    assert_eq!(
        health_over(&mut established, server.grpc_addr)
            .await
            .expect("the established connection is still open"),
        ServingStatus::Serving
    );
    let reply = client(&server)
        .await
        .may_exist(MayExistRequest {
            namespace: String::new(),
            key: Bytes::from_static(b"k"),
        })
        .await;
    assert!(reply.is_ok(), "{reply:?}");

    let (_, metrics) = http_get(&server, "/metrics").await;
    let timed_out = metric(
        &metrics,
        "existence_handshakes_failed_total{reason=\"timeout\"}",
    );
    assert!(
        timed_out >= 21.0,
        "{timed_out} timeouts counted:\n{metrics}"
    );
    server.stop().await.unwrap();
}

/// After the preface, closing peers that stop answering is HTTP/2 keepalive's job: a peer that sends the
/// preface and then never answers a ping is closed after `keepalive_interval + keepalive_timeout`.
#[tokio::test]
async fn a_connection_silent_after_its_preface_is_closed_by_keepalive() {
    let server = start(
        "[limits]\nhandshake_timeout = \"1m\"\nkeepalive_interval = \"200ms\"\nkeepalive_timeout = \"200ms\"",
    )
    .await;
    let opened = Instant::now();
    let mut stream = TcpStream::connect(server.grpc_addr).await.unwrap();
    stream.write_all(PREFACE).await.unwrap();
    let closed = closed_by_server(stream, opened).await;
    println!("preface then silence, keepalive 200 ms + 200 ms: closed after {closed:?}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn over_tls_a_connection_without_a_handshake_or_a_preface_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_pem = certified.cert.pem();
    let cert = dir.path().join("server.pem");
    let key = dir.path().join("server.key");
    std::fs::write(&cert, &cert_pem).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let mut options = options("[limits]\nhandshake_timeout = \"300ms\"", 16 << 20);
    options.tls = Some(TlsOptions {
        cert,
        key,
        client_ca: None,
    });
    let server = start_options(options, Arc::new(SystemClock)).await;

    // A TLS client is served, past the timeout too.
    let channel = Channel::from_shared(format!("https://localhost:{}", server.grpc_addr.port()))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&cert_pem))
                .domain_name("localhost"),
        )
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let check = HealthCheckRequest {
        service: String::new(),
    };
    health.check(check.clone()).await.unwrap();

    // Silent from the start: no TLS handshake.
    let opened = Instant::now();
    let silent = TcpStream::connect(server.grpc_addr).await.unwrap();
    // A TLS handshake, then no HTTP/2 preface.
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    roots
        .add(tokio_rustls::rustls::pki_types::CertificateDer::from(
            certified.cert.der().to_vec(),
        ))
        .unwrap();
    let mut config = tokio_rustls::rustls::ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            "localhost".try_into().unwrap(),
            TcpStream::connect(server.grpc_addr).await.unwrap(),
        )
        .await
        .expect("the TLS handshake completes");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));

    let silent = closed_by_server(silent, opened).await;
    let no_preface = closed_by_server(tls, opened).await;
    println!("TLS port, timeout 300 ms: no handshake closed after {silent:?}, no preface after {no_preface:?}");
    health
        .check(check)
        .await
        .expect("the TLS client is still served");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn the_http_port_closes_connections_that_send_no_request() {
    let server = start("[limits]\nhandshake_timeout = \"300ms\"").await;
    let opened = Instant::now();
    let silent = TcpStream::connect(server.http_addr).await.unwrap();
    // Served once, then idle on keep-alive.
    let mut idle = TcpStream::connect(server.http_addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut response = [0u8; 12];
    idle.read_exact(&mut response).await.unwrap();
    assert_eq!(&response, b"HTTP/1.1 200");

    let silent = closed_by_server(silent, opened).await;
    let idle = closed_by_server(idle, opened).await;
    println!(
        "HTTP port, timeout 300 ms: silent closed after {silent:?}, idle keep-alive after {idle:?}"
    );
    assert_eq!(http_get(&server, "/healthz").await.0, 200);
    server.stop().await.unwrap();
}

/// The real binary under `ulimit -n 64`, its log lines, and its addresses.
struct Limited {
    child: tokio::process::Child,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    log: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Limited {
    async fn start(descriptors: u32) -> Self {
        let mut child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -n {descriptors} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_existence-gate"))
            .args(["serve", "--in-memory", "--listen", "127.0.0.1:0"])
            .args(["--http-listen", "127.0.0.1:0", "--resp-listen", "off"])
            // Long enough that the connections opened here stay until the test closes them.
            .args(["--handshake-timeout", "10m"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the binary starts");
        let (lines, mut log) = tokio::sync::mpsc::unbounded_channel();
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        // Read for as long as the child writes, so it never blocks on a full pipe.
        tokio::spawn(async move {
            while let Ok(Some(line)) = stdout.next_line().await {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let serving = wait_for_line(&mut log, "grpc_addr=").await;
        let address = |key: &str| {
            serving
                .split(key)
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|text| text.parse().ok())
                .expect("the serving line has both addresses")
        };
        Self {
            grpc_addr: address("grpc_addr="),
            http_addr: address("http_addr="),
            child,
            log,
        }
    }
}

async fn wait_for_line(
    log: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    needle: &str,
) -> String {
    tokio::time::timeout(DEADLINE, async {
        loop {
            let line = log.recv().await.expect("the server exited");
            if line.contains(needle) {
                return line;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no log line with {needle:?} in {DEADLINE:?}"))
}

/// `GET path` on a kept-alive HTTP/1.1 connection (which needs no new descriptor on the server): the body.
async fn get_kept_alive(stream: &mut TcpStream, path: &str) -> String {
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut reader = BufReader::new(stream);
    let mut length = None;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok();
            }
        }
    }
    let mut body = vec![0u8; length.expect("a content-length")];
    reader.read_exact(&mut body).await.unwrap();
    String::from_utf8(body).unwrap()
}

/// At the descriptor limit `accept` fails with `EMFILE` while the connection stays queued, so a loop that
/// retries at once spins (it took ~95% of a core). The server must back off, say so, count it, keep
/// serving its open connections, and accept again once descriptors are free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_descriptor_limit_the_server_backs_off_and_keeps_serving() {
    let mut server = Limited::start(64).await;
    let channel = Channel::from_shared(format!("http://{}", server.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel.clone());
    let mut gate = existence_gate::proto::existence_gate_client::ExistenceGateClient::new(channel);
    let check = HealthCheckRequest {
        service: String::new(),
    };
    health.check(check.clone()).await.unwrap();
    let mut metrics = TcpStream::connect(server.http_addr).await.unwrap();
    get_kept_alive(&mut metrics, "/metrics").await;

    // More connections than descriptors; those beyond the limit wait in the listen queue.
    let first_possible_failure = Instant::now();
    let mut held = Vec::new();
    for _ in 0..100 {
        let connect = TcpStream::connect(server.grpc_addr);
        held.push(
            tokio::time::timeout(DEADLINE, connect)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let warning = wait_for_line(&mut server.log, "cannot accept connections").await;
    assert!(warning.contains("Too many open files"), "{warning}");

    // Each failed accept is counted, then waited out: 5 ms doubling to 1 s, so the seventh failure comes
    // at least 5 + 10 + ... + 160 = 315 ms after the first. A loop retrying at once counts seven within a
    // few milliseconds; a loaded machine only takes longer.
    let seventh = wait_until(DEADLINE, "seven failed accepts", async || {
        let text = get_kept_alive(&mut metrics, "/metrics").await;
        let failures = metric(
            &text,
            "existence_accept_errors_total{port=\"grpc\",reason=\"emfile\"}",
        );
        (failures >= 7.0).then(|| first_possible_failure.elapsed())
    })
    .await;
    println!("at the descriptor limit with 100 connections held: 7 failed accepts in {seventh:?}");
    assert!(
        seventh >= Duration::from_millis(315),
        "7 failed accepts in {seventh:?}: faster than the backoff allows (315 ms); the accept loop spins"
    );

    // Open connections are served.
    let served = tokio::time::timeout(DEADLINE, health.check(check.clone()))
        .await
        .expect("health answered at the limit")
        .unwrap();
    assert_eq!(served.into_inner().status(), ServingStatus::Serving);
    tokio::time::timeout(
        DEADLINE,
        gate.may_exist(MayExistRequest {
            namespace: String::new(),
            key: Bytes::from_static(b"k"),
        }),
    )
    .await
    .expect("MayExist answered at the limit")
    .unwrap();
    let text = get_kept_alive(&mut metrics, "/metrics").await;
    let failures = metric(
        &text,
        "existence_accept_errors_total{port=\"grpc\",reason=\"emfile\"}",
    );
    assert!(failures >= 1.0, "EMFILE not counted:\n{text}");
    // Descriptors back: a new client is accepted and served.
    drop(held);
    let fresh = tokio::time::timeout(DEADLINE, async {
        let channel = Channel::from_shared(format!("http://{}", server.grpc_addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        HealthClient::new(channel).check(check).await
    })
    .await
    .expect("a new connection is served once descriptors are free")
    .unwrap();
    assert_eq!(fresh.into_inner().status(), ServingStatus::Serving);
    server.child.kill().await.unwrap();
}

/// A client that gave up on its calls while the server was paused (SIGSTOP here; a long GC pause or a
/// starved VM alike) reset each of them, and the server reads every reset at once when it resumes. h2
/// counts resets of streams the server had not accepted yet and, past its default of 20 (a defence against
/// HTTP/2 rapid reset), ends the connection with GOAWAY `ENHANCE_YOUR_CALM` "too_many_resets", failing the
/// calls still in flight on it: the Java library lost five calls that way after a 10 s pause in the
/// balancer test. The connection lives on after 100 such resets, and answers.
#[tokio::test]
async fn a_client_that_gave_up_on_calls_while_the_server_was_paused_keeps_its_connection() {
    let served = binary::start(binary::serve()).await;
    let addr: SocketAddr = served.grpc_addr.parse().unwrap();
    let pid = served.child.id().unwrap();
    let mut connection = h2_connection(addr).await;
    assert_eq!(
        health_over(&mut connection, addr).await.unwrap(),
        ServingStatus::Serving
    );
    send_signal(pid, "STOP");
    for _ in 0..100 {
        let mut ready = connection.clone().ready().await.unwrap();
        let (_response, mut body) = ready.send_request(health_request(addr), false).unwrap();
        body.send_reset(h2::Reason::CANCEL);
    }
    send_signal(pid, "CONT");
    assert_eq!(
        health_over(&mut connection, addr).await.expect(
            "the connection outlives the resets its client sent while the server was paused"
        ),
        ServingStatus::Serving
    );
}
