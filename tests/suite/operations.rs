//! What operators and load balancers see: gRPC health, reflection, the HTTP port, and the binary's graceful
//! shutdown on SIGTERM.

use crate::common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use existence_gate::proto::{AddRequest, MayExistRequest, SubscribeInvalidationsRequest};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_stream::StreamExt;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

#[tokio::test]
async fn health_reports_serving_for_the_server_and_the_contract() {
    let server = start("").await;
    let mut health = HealthClient::new(channel(&server).await);
    for service in ["", "existence.v1.ExistenceGate"] {
        let reply = health
            .check(HealthCheckRequest {
                service: service.to_string(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            reply.status(),
            ServingStatus::Serving,
            "service {service:?}"
        );
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "nope".into(),
        })
        .await
        .expect_err("unknown service");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn reflection_lists_the_services_in_v1_and_v1alpha() {
    use tonic_reflection::pb::{v1, v1alpha};
    let server = start("").await;

    let mut client =
        v1::server_reflection_client::ServerReflectionClient::new(channel(&server).await);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut replies = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.next().await.unwrap().unwrap();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("unexpected reply {reply:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"existence.v1.ExistenceGate".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_string()),
        "{names:?}"
    );

    let mut alpha =
        v1alpha::server_reflection_client::ServerReflectionClient::new(channel(&server).await);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::FileContainingSymbol(
                "existence.v1.ExistenceGate".into(),
            ),
        ),
    };
    let mut replies = alpha
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.next().await.unwrap().unwrap();
    assert!(
        matches!(
            reply.message_response,
            Some(v1alpha::server_reflection_response::MessageResponse::FileDescriptorResponse(_))
        ),
        "{reply:?}"
    );
}

#[tokio::test]
async fn http_port_serves_health_readiness_and_metrics() {
    let server = start("[namespaces.metered]\nexpected_keys = 1000").await;
    assert_eq!(http_get(&server, "/healthz").await.0, 200);
    assert_eq!(http_get(&server, "/readyz").await.0, 200);
    assert_eq!(http_get(&server, "/nope").await.0, 404);

    let mut client = client(&server).await;
    client
        .add(AddRequest {
            namespace: "metered".into(),
            keys: vec![Bytes::from_static(b"k")],
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .may_exist(MayExistRequest {
            namespace: "metered".into(),
            key: Bytes::from_static(b"k"),
        })
        .await
        .unwrap();
    let (status, metrics) = http_get(&server, "/metrics").await;
    assert_eq!(status, 200);
    for needle in [
        "existence_answers_total{namespace=\"metered\",answer=\"may_exist\",basis=\"filter\"} 1",
        "existence_keys_added_total{namespace=\"metered\"} 1",
        "existence_tombstones{namespace=\"metered\"} 0",
        "existence_filter_bytes{namespace=\"metered\"}",
        "existence_filter_windows{namespace=\"metered\"} 1",
        "existence_filter_estimated_false_positive_rate{namespace=\"metered\"}",
        "existence_filter_false_positives_total{namespace=\"metered\"}",
        "existence_requests_total{rpc=\"MayExist\",code=\"OK\"}",
        "existence_request_duration_seconds_bucket{rpc=\"Add\",code=\"OK\",le=",
        // The process's memory, part by part (this test process's, since the server runs in it).
        "existence_resident_bytes ",
        "existence_memory_bytes{part=\"filters\"}",
        "existence_memory_bytes{part=\"replay_buffers\"}",
        "existence_memory_bytes{part=\"other_heap\"}",
        "existence_memory_bytes{part=\"program\"}",
    ] {
        assert!(
            metrics.contains(needle),
            "metrics lack {needle}:\n{metrics}"
        );
    }

    // Readiness turns 503 as soon as shutdown begins. Through the port that moment cannot be caught reliably
    // (the HTTP server stops accepting when shutdown begins, and a connection it had accepted but not yet
    // read is closed), so the routes the port serves are asked directly, bound to this server's gate and
    // shutdown handle; the port itself must never answer 200 again, and must close.
    let stopping = server.shutdown_handle();
    let routes = existence_gate::service::http::router(
        Arc::clone(&server.gate),
        existence_gate::service::metrics::install_recorder(),
        server.lifecycle(),
    );
    assert_eq!(readiness(&routes).await, 200, "ready before shutdown");
    stopping.trigger();
    assert_eq!(
        readiness(&routes).await,
        503,
        "readiness once shutdown began"
    );
    let http_addr = server.http_addr;
    let drained = tokio::spawn(server.run_until_shutdown());
    wait_until(
        PATIENCE,
        "the HTTP port to close",
        async || match try_http_get(http_addr, "/readyz").await {
            Ok((status, body)) => {
                assert_eq!(status, 503, "readiness during shutdown: {body}");
                None
            }
            Err(_) => Some(()),
        },
    )
    .await;
    drained.await.unwrap().unwrap();
}

/// The status `/readyz` answers on `routes`.
async fn readiness(routes: &axum::Router) -> u16 {
    use tower::ServiceExt;
    let request = http::Request::get("/readyz")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = routes.clone().oneshot(request).await.unwrap();
    response.status().as_u16()
}

/// The real binary: serves with defaults on the given ports, and on SIGTERM ends streams with UNAVAILABLE,
/// drains and exits 0.
#[tokio::test]
async fn the_binary_shuts_down_gracefully_on_sigterm() {
    let data_dir = tempfile::tempdir().unwrap();
    let (mut child, channel, _) = spawned(data_dir.path(), "", &[]).await;
    let mut client =
        existence_gate::proto::existence_gate_client::ExistenceGateClient::new(channel);
    let mut stream = client
        .subscribe_invalidations(SubscribeInvalidationsRequest::default())
        .await
        .unwrap()
        .into_inner();

    let pid = child.id().expect("running");
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());

    let status = stream
        .message()
        .await
        .expect_err("the stream ends with a status");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let exit = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exits within the drain deadline")
        .unwrap();
    assert!(exit.success(), "exit status {exit:?}");
}

/// The binary on `dir` with `FAILPOINTS=faults` and `extra` arguments, and a channel to its gRPC port as soon
/// as it is bound (before the state is loaded), and that port's address; its output is read on, so that it
/// never blocks on a full pipe.
async fn spawned(
    dir: &std::path::Path,
    faults: &str,
    extra: &[&std::ffi::OsStr],
) -> (tokio::process::Child, tonic::transport::Channel, String) {
    let mut child = common::binary::serve()
        .arg("--data-dir")
        .arg(dir)
        .args(extra)
        .env("FAILPOINTS", faults)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let grpc_addr = tokio::time::timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.split("grpc_addr=").nth(1) {
                return rest.split_whitespace().next().unwrap().to_string();
            }
        }
        panic!("the binary exited before serving");
    })
    .await
    .expect("serves its ports");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let channel = tonic::transport::Channel::from_shared(format!("http://{grpc_addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (child, channel, grpc_addr)
}

/// Adds `key` and looks it up: both answered (`when` says when, for the failure message), and the key found.
async fn added_and_found(
    client: &mut existence_gate::proto::existence_gate_client::ExistenceGateClient<
        tonic::transport::Channel,
    >,
    key: &'static [u8],
    when: &str,
) {
    client
        .add(AddRequest {
            keys: vec![Bytes::from_static(key)],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("an Add {when}: {status:?}"));
    let found = client
        .may_exist(MayExistRequest {
            key: Bytes::from_static(key),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("a lookup {when}: {status:?}"))
        .into_inner();
    assert_eq!(
        found.answer(),
        existence_gate::proto::Answer::MayExist,
        "{when}"
    );
}

/// On SIGTERM the binary turns `/readyz` 503 and health `NOT_SERVING` at once but serves on for
/// `--drain-delay` — what lets a load balancer move calls away before any is refused (before, every call
/// routed between the signal and the balancer's next check failed `UNAVAILABLE`) — and a second signal ends
/// the wait: then streams end with `UNAVAILABLE`, and it exits 0.
#[tokio::test]
async fn sigterm_turns_readiness_down_first_and_serves_on_for_the_drain_delay() {
    let data_dir = tempfile::tempdir().unwrap();
    let mut command = common::binary::serve();
    command
        .args(["--drain-delay", "10m", "--data-dir"])
        .arg(data_dir.path());
    let served = common::binary::start(command).await;
    let http_addr: std::net::SocketAddr = served.http_addr.parse().unwrap();
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", served.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client =
        existence_gate::proto::existence_gate_client::ExistenceGateClient::new(channel.clone());
    let mut stream = client
        .subscribe_invalidations(SubscribeInvalidationsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let pid = served.child.id().expect("running");
    common::send_signal(pid, "TERM");
    let body = wait_until(PATIENCE, "/readyz to turn 503", async || {
        let (status, body) = try_http_get(http_addr, "/readyz").await.ok()?;
        (status == 503).then_some(body)
    })
    .await;
    assert_eq!(body, "shutting down\n");
    let mut health = HealthClient::new(channel);
    let reply = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), ServingStatus::NotServing);
    // Still serving: lookups and writes are answered, the subscription goes on.
    added_and_found(
        &mut client,
        b"added-while-draining",
        "during the drain delay",
    )
    .await;
    let pushed = stream.message().await.expect("the stream is still open");
    assert!(pushed.is_some(), "the Add's invalidation arrives");
    // Two RESP clients: one idle, one halfway through sending a command when the drain ends.
    let resp_addr = served.resp_addr.clone().expect("the RESP port is on");
    let mut idle = resp_connection(&resp_addr).await;
    let mut sending = resp_connection(&resp_addr).await;
    sending
        .write_all(b"*3\r\n$9\r\nBF.EXISTS\r\n$7\r\ndefault\r\n$5\r\nab")
        .await
        .unwrap();
    sending.write_all(b"c").await.unwrap();
    common::send_signal(pid, "TERM");
    let status = stream
        .message()
        .await
        .expect_err("the stream ends with a status once the second signal ends the wait");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    // The client that had begun a command gets the retryable reply for it, not a connection closed under it;
    // the idle one is closed cleanly (end of stream), to reconnect elsewhere on its next command.
    let mut reply = String::new();
    tokio::time::timeout(PATIENCE, sending.read_to_string(&mut reply))
        .await
        .expect("the connection is closed at shutdown")
        .unwrap();
    assert_eq!(
        reply,
        "-TRYAGAIN the server is shutting down; retry on another replica\r\n"
    );
    let mut rest = Vec::new();
    let read = tokio::time::timeout(PATIENCE, idle.read_to_end(&mut rest))
        .await
        .expect("the idle connection is closed at shutdown");
    assert!(read.is_ok() && rest.is_empty(), "{read:?} {rest:?}");
    let mut child = served.child;
    let exit = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("exits within the drain deadline")
        .unwrap();
    assert!(exit.success(), "exit status {exit:?}");
}

/// A connection to the RESP port at `address`, served (a `PING` answered) before it is returned.
async fn resp_connection(address: &str) -> tokio::net::TcpStream {
    let mut connection = tokio::net::TcpStream::connect(address).await.unwrap();
    connection.write_all(b"PING\r\n").await.unwrap();
    let mut pong = [0u8; 7];
    connection.read_exact(&mut pong).await.unwrap();
    assert_eq!(&pong, b"+PONG\r\n");
    connection
}

/// An `Add` that reaches a server still loading its state — a restarted one a balancer already sends calls
/// to — waits for the state and is acknowledged, instead of failing `UNAVAILABLE` "still loading" (fault
/// point `recovery-start` holds the load for 1.5 s).
#[tokio::test]
async fn an_add_sent_while_the_state_loads_waits_for_it() {
    let data_dir = tempfile::tempdir().unwrap();
    let (mut child, channel, _) = spawned(data_dir.path(), "recovery-start=sleep(1500)", &[]).await;
    let mut health = HealthClient::new(channel.clone());
    let status = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .status();
    assert_eq!(
        status,
        ServingStatus::NotServing,
        "still loading when the Add is sent"
    );
    let mut client =
        existence_gate::proto::existence_gate_client::ExistenceGateClient::new(channel);
    added_and_found(
        &mut client,
        b"sent-while-loading",
        "sent while loading: it waits for the state",
    )
    .await;
    child.kill().await.unwrap();
}

/// A server whose state takes `load_ms` to load (fault point `recovery-start`) and whose `request_timeout` is
/// 300 ms, serving namespace `default` meanwhile: a call to it is held past its deadline.
struct Loading {
    child: tokio::process::Child,
    channel: tonic::transport::Channel,
    address: String,
    _dirs: [tempfile::TempDir; 2],
}

impl Loading {
    async fn for_ms(load_ms: u64) -> Self {
        let data_dir = tempfile::tempdir().unwrap();
        let config_dir = tempfile::tempdir().unwrap();
        let config = common::replicas::config_file(
            config_dir.path(),
            "[limits]\nrequest_timeout = \"300ms\"\n\n[namespaces.default]\nexpected_keys = 1000\n",
        );
        let (child, channel, address) = spawned(
            data_dir.path(),
            &format!("recovery-start=sleep({load_ms})"),
            &["--config".as_ref(), config.as_os_str()],
        )
        .await;
        Self {
            child,
            channel,
            address,
            _dirs: [data_dir, config_dir],
        }
    }
}

/// An `Add` held past the server's deadline (here: sent while the state loads, to a server whose
/// `request_timeout` is 300 ms, shorter than the client's 20 s) ends `DEADLINE_EXCEEDED` at 300 ms, naming
/// the deadline; not tonic's `CANCELLED: Timeout expired`, which client libraries take for the caller's own
/// cancellation and do not retry on another address.
#[tokio::test]
async fn a_call_held_past_its_deadline_ends_deadline_exceeded() {
    let mut loading = Loading::for_ms(5000).await;
    let mut client = existence_gate::proto::existence_gate_client::ExistenceGateClient::new(
        loading.channel.clone(),
    );
    let mut add = tonic::Request::new(AddRequest {
        keys: vec![Bytes::from_static(b"held-past-its-deadline")],
        ..Default::default()
    });
    add.set_timeout(Duration::from_secs(20));
    let status = client
        .add(add)
        .await
        .expect_err("the state loads for 5 s: the Add is held past the server's 300 ms");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("300ms"), "{status:?}");
    loading.child.kill().await.unwrap();
}

/// The Rust library moves an `Add` that a gate held past that gate's deadline (a replica still loading,
/// with `request_timeout` 300 ms) to its next address, where it is acknowledged, well within the call's own
/// 10 s deadline; that first address is then skipped while down.
#[tokio::test]
async fn the_rust_library_moves_a_call_a_gate_held_past_its_deadline_to_the_next_address() {
    let mut loading = Loading::for_ms(30_000).await;
    let live = start("").await;
    let options = existence_gate_client::ClientOptions {
        deadline: Duration::from_secs(10),
        address_policy: existence_gate_client::AddressPolicy::PickFirst,
        down_for: Duration::from_secs(600),
        ..existence_gate_client::ClientOptions::namespace("")
    };
    let addresses = [loading.address.clone(), live.grpc_addr.to_string()];
    let client = existence_gate_client::GateClient::new(addresses, options).unwrap();
    for i in 0..3 {
        client
            .add([Bytes::from(format!("moved-on-{i}"))])
            .await
            .unwrap_or_else(|status| panic!("Add {i}: {status:?}"));
    }
    assert_eq!(client.stats().retries, 1, "the held address tried once");
    loading.child.kill().await.unwrap();
    live.stop().await.unwrap();
}

/// `existence-gate probe` exits 0 only for a SERVING server (container HEALTHCHECKs and scripts rely on it).
#[tokio::test]
async fn the_probe_command_exits_zero_only_when_serving() {
    let server = start("").await;
    let probe = |args: Vec<String>| async move {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_existence-gate"))
            .arg("probe")
            .args(args)
            .output()
            .await
            .unwrap()
    };
    let addr = server.grpc_addr.to_string();
    let serving = probe(vec!["--addr".into(), addr.clone()]).await;
    assert!(serving.status.success(), "{serving:?}");
    let contract = probe(vec![
        "--addr".into(),
        addr.clone(),
        "--service".into(),
        "existence.v1.ExistenceGate".into(),
    ])
    .await;
    assert!(contract.status.success(), "{contract:?}");
    let unknown = probe(vec![
        "--addr".into(),
        addr,
        "--service".into(),
        "nope".into(),
    ])
    .await;
    assert!(!unknown.status.success());
    server.stop().await.unwrap();
    let down = probe(vec![
        "--addr".into(),
        "127.0.0.1:1".into(),
        "--timeout".into(),
        "1s".into(),
    ])
    .await;
    assert!(!down.status.success());
    assert!(
        String::from_utf8_lossy(&down.stderr).contains("127.0.0.1:1"),
        "{down:?}"
    );
}
