//! Tenants, tokens, TLS and limits over real gRPC: one tenant cannot read, write or subscribe in another's
//! namespace, a read token cannot write, refusals do not reveal which namespaces exist, health and reflection
//! stay open; mutual TLS refuses clients without a valid certificate; load is shed and subscribers bounded.

use crate::common;

use std::sync::Arc;

use bytes::Bytes;
use common::*;
use existence_gate::core::clock::SystemClock;
use existence_gate::proto::admin_client::AdminClient;
use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use existence_gate::proto::{
    AddRequest, MayExistRequest, RebuildRequest, RecordAbsentRequest, SnapshotRequest,
    StatsRequest, SubscribeInvalidationsRequest,
};
use existence_gate::server::TlsOptions;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Request, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

fn tenants() -> String {
    [
        "[namespaces.a]\nexpected_keys = 1000\n[namespaces.b]\nexpected_keys = 1000\n".to_string(),
        token_entry("tenant-a", "token-a", &["read", "write"], &["a"]),
        token_entry("tenant-b-reader", "token-b", &["read"], &["b"]),
        token_entry("ops", "token-ops", &["read", "write", "admin"], &["*"]),
    ]
    .join("\n")
}

fn with_token<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        let value: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
    }
    request
}

fn may_exist(namespace: &str) -> MayExistRequest {
    MayExistRequest {
        namespace: namespace.into(),
        key: Bytes::from_static(b"k"),
    }
}

fn add(namespace: &str) -> AddRequest {
    AddRequest {
        namespace: namespace.into(),
        keys: vec![Bytes::from_static(b"k")],
        ..Default::default()
    }
}

fn code(result: Result<impl Sized, Status>) -> Code {
    result.map_or_else(|s| s.code(), |_| Code::Ok)
}

#[tokio::test]
async fn tokens_confine_tenants_to_their_namespaces_and_roles() {
    let server = start(&tenants()).await;
    let mut gate = client(&server).await;

    // No token, a malformed header and an unknown token are unauthenticated.
    assert_eq!(
        code(gate.may_exist(with_token(may_exist("a"), None)).await),
        Code::Unauthenticated
    );
    assert_eq!(
        code(
            gate.may_exist(with_token(may_exist("a"), Some("nope")))
                .await
        ),
        Code::Unauthenticated
    );

    // Tenant A works in "a".
    assert_eq!(
        code(gate.add(with_token(add("a"), Some("token-a"))).await),
        Code::Ok
    );
    assert_eq!(
        code(
            gate.may_exist(with_token(may_exist("a"), Some("token-a")))
                .await
        ),
        Code::Ok
    );

    // ...and cannot query, add, record or subscribe in "b".
    assert_eq!(
        code(
            gate.may_exist(with_token(may_exist("b"), Some("token-a")))
                .await
        ),
        Code::PermissionDenied
    );
    assert_eq!(
        code(gate.add(with_token(add("b"), Some("token-a"))).await),
        Code::PermissionDenied
    );
    let record = RecordAbsentRequest {
        namespace: "b".into(),
        key: Bytes::from_static(b"k"),
        ..Default::default()
    };
    assert_eq!(
        code(
            gate.record_absent(with_token(record, Some("token-a")))
                .await
        ),
        Code::PermissionDenied
    );
    let subscribe = SubscribeInvalidationsRequest {
        namespace: "b".into(),
        after_seq: 0,
    };
    assert_eq!(
        code(
            gate.subscribe_invalidations(with_token(subscribe, Some("token-a")))
                .await
        ),
        Code::PermissionDenied
    );

    // A read token cannot write, even in its own namespace.
    assert_eq!(
        code(
            gate.may_exist(with_token(may_exist("b"), Some("token-b")))
                .await
        ),
        Code::Ok
    );
    assert_eq!(
        code(gate.add(with_token(add("b"), Some("token-b"))).await),
        Code::PermissionDenied
    );

    // A refusal reads the same for a namespace that exists and one that does not.
    let existing = gate
        .may_exist(with_token(may_exist("b"), Some("token-a")))
        .await
        .unwrap_err();
    let missing = gate
        .may_exist(with_token(may_exist("zzz"), Some("token-a")))
        .await
        .unwrap_err();
    assert_eq!(existing.code(), missing.code());
    assert_eq!(
        existing.message().replace("\"b\"", "X"),
        missing.message().replace("\"zzz\"", "X"),
        "refusals must not reveal which namespaces exist"
    );

    // Health stays open for load balancers.
    let mut health = HealthClient::new(channel(&server).await);
    health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health needs no token");
}

#[tokio::test]
async fn the_admin_service_needs_the_admin_role() {
    let server = start(&tenants()).await;
    let mut admin = AdminClient::new(channel(&server).await);
    assert_eq!(
        code(admin.stats(with_token(StatsRequest::default(), None)).await),
        Code::Unauthenticated
    );
    assert_eq!(
        code(
            admin
                .stats(with_token(StatsRequest::default(), Some("token-a")))
                .await
        ),
        Code::PermissionDenied
    );
    let stats = admin
        .stats(with_token(StatsRequest::default(), Some("token-ops")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.namespaces.len(), 3);
    assert_eq!(
        code(
            admin
                .snapshot(with_token(SnapshotRequest {}, Some("token-a")))
                .await
        ),
        Code::PermissionDenied
    );
    let rebuild = tokio_stream::iter([RebuildRequest {
        namespace: "a".into(),
        keys: vec![Bytes::from_static(b"k")],
        commit: true,
        ..Default::default()
    }]);
    assert_eq!(
        code(admin.rebuild(with_token(rebuild, Some("token-a"))).await),
        Code::PermissionDenied
    );
}

async fn tls_channel(
    addr: std::net::SocketAddr,
    tls: ClientTlsConfig,
) -> Result<Channel, tonic::transport::Error> {
    Channel::from_shared(format!("https://localhost:{}", addr.port()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
}

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_valid_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = new_pki();
    let write = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let mut options = options("", 16 << 20);
    options.tls = Some(TlsOptions {
        cert: write("server.pem", &pki.server_cert),
        key: write("server.key", &pki.server_key),
        client_ca: Some(write("ca.pem", &pki.ca)),
    });
    let server = start_options(options, Arc::new(SystemClock)).await;
    let trusted = || {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&pki.ca))
            .domain_name("localhost")
    };

    // With a client certificate signed by the CA: served.
    let channel = tls_channel(
        server.grpc_addr,
        trusted().identity(Identity::from_pem(&pki.client_cert, &pki.client_key)),
    )
    .await
    .unwrap();
    let mut client = ExistenceGateClient::new(channel);
    client.add(add("")).await.unwrap();

    // Without one: the handshake or the first call fails.
    let refused = match tls_channel(server.grpc_addr, trusted()).await {
        Err(_) => true,
        Ok(channel) => ExistenceGateClient::new(channel)
            .may_exist(may_exist(""))
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate was served");

    // With a certificate from another CA: refused too.
    let other = new_pki();
    let refused = match tls_channel(
        server.grpc_addr,
        trusted().identity(Identity::from_pem(&other.client_cert, &other.client_key)),
    )
    .await
    {
        Err(_) => true,
        Ok(channel) => ExistenceGateClient::new(channel)
            .may_exist(may_exist(""))
            .await
            .is_err(),
    };
    assert!(refused, "a client with a foreign certificate was served");

    // Plaintext is not served at all.
    let plain = Channel::from_shared(format!("http://{}", server.grpc_addr))
        .unwrap()
        .connect()
        .await;
    let refused = match plain {
        Err(_) => true,
        Ok(channel) => ExistenceGateClient::new(channel)
            .may_exist(may_exist(""))
            .await
            .is_err(),
    };
    assert!(refused, "plaintext was served on a TLS port");
}

#[tokio::test]
async fn excess_calls_are_shed_at_once_and_subscribers_are_bounded() {
    let server = start("[limits]\nmax_in_flight = 1\nmax_subscribers_per_namespace = 2").await;
    let mut gate = client(&server).await;

    // A rebuild stream holds the only in-flight slot while it is open. It takes the slot once the server
    // dispatches it, and until then lookups are served; should a lookup hold the slot at that moment, the
    // rebuild is the call shed, and it is opened again.
    let open_rebuild = async || {
        let (sender, receiver) = tokio::sync::mpsc::channel(1);
        sender
            .send(RebuildRequest {
                namespace: String::new(),
                keys: vec![Bytes::from_static(b"k")],
                commit: false,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut admin = AdminClient::new(channel(&server).await);
        let call = tokio::spawn(async move {
            admin
                .rebuild(tokio_stream::wrappers::ReceiverStream::new(receiver))
                .await
        });
        (sender, call)
    };
    let (mut sender, mut rebuild) = open_rebuild().await;
    let shed = wait_until(
        PATIENCE,
        "a call beyond max_in_flight to be shed",
        async || {
            if rebuild.is_finished() {
                let status = (&mut rebuild)
                    .await
                    .unwrap()
                    .expect_err("an open rebuild ends only if refused");
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                (sender, rebuild) = open_rebuild().await;
                return None;
            }
            gate.may_exist(may_exist("")).await.err()
        },
    )
    .await;
    assert_eq!(shed.code(), Code::ResourceExhausted, "{shed:?}");
    assert!(shed.message().contains("max_in_flight"), "{shed:?}");
    let commit = RebuildRequest {
        commit: true,
        ..Default::default()
    };
    sender.send(commit).await.unwrap();
    rebuild.await.unwrap().unwrap();
    gate.may_exist(may_exist(""))
        .await
        .expect("served again once the slot is free");

    // Two subscribers per namespace.
    let subscribe = || SubscribeInvalidationsRequest::default();
    let first = gate
        .subscribe_invalidations(subscribe())
        .await
        .unwrap()
        .into_inner();
    let _second = gate
        .subscribe_invalidations(subscribe())
        .await
        .unwrap()
        .into_inner();
    let mut third = gate.subscribe_invalidations(subscribe()).await;
    if let Ok(stream) = &mut third {
        // Some clients report a refused stream on the first read.
        let status = stream.get_mut().message().await.unwrap_err();
        third = Err(status);
    }
    let status = third.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("max_subscribers_per_namespace"),
        "{status:?}"
    );
    drop(first);
    // The server frees the slot once it sees the stream closed; until then subscribing is refused (when
    // subscribing, or on the first read). A subscription that is served gets the next Add's invalidation.
    let invalidation = wait_until(
        PATIENCE,
        "a closed subscription's slot to be freed",
        async || {
            let refused = match gate.subscribe_invalidations(subscribe()).await {
                Ok(mut stream) => {
                    gate.add(add("")).await.unwrap();
                    match stream.get_mut().message().await {
                        Ok(invalidation) => return invalidation,
                        Err(status) => status,
                    }
                }
                Err(status) => status,
            };
            assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
            None
        },
    )
    .await;
    assert_eq!(invalidation.keys, vec![Bytes::from_static(b"k")]);
}
