//! Mirrors against the real gate: a copy that answers `ABSENT` only as the gate would, never for an
//! acknowledged key — while `Add`s race lookups, while the link to the gate is silent, across a restart of
//! the gate — that follows a rebuild, and refusals that say what was wrong.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use existence_gate::server::RunningServer;
use existence_gate_client::proto::mirror_client::MirrorClient;
use existence_gate_client::proto::{self, mirror_request};
use existence_gate_client::{ClientOptions, GateClient, Mirror, MirrorOptions};
use existence_gate_testkit::proxy::{Mode, Proxy};
use existence_gate_testkit::tokens::token_entry;
use tonic::Code;

use super::{start_gate, PATIENCE};

const MIRRORED: &str = r#"
[mirrors]
max_per_namespace = 3
sublease = "300ms"

[namespaces.users]
expected_keys = 100000

[namespaces.windowed]
expected_keys = 100000
retention = "1h"
windows = 4
"#;

/// `MIRRORED`'s sub-lease.
const SUBLEASE: Duration = Duration::from_millis(300);

async fn mirrored() -> RunningServer {
    start_gate(MIRRORED, "127.0.0.1:0", None, None).await
}

fn client_at(address: impl ToString, namespace: &str) -> GateClient {
    GateClient::new([address.to_string()], ClientOptions::namespace(namespace)).unwrap()
}

/// Waits until `condition` holds, or fails saying what it waited for.
async fn until(what: &str, condition: impl Fn() -> bool) {
    let waited = tokio::time::timeout(PATIENCE, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "gave up after {PATIENCE:?} waiting until {what}"
    );
}

fn keys(prefix: &str, n: usize) -> Vec<Bytes> {
    (0..n)
        .map(|i| Bytes::from(format!("{prefix}-{i}")))
        .collect()
}

/// Which of `keys` the mirror answers `ABSENT` locally, read while it held its sub-lease the whole time
/// (a lapse on a loaded machine makes it try again).
async fn local_absences(mirror: &Mirror, keys: &[Bytes]) -> Vec<bool> {
    loop {
        until("the mirror holds a sub-lease", || mirror.holds_sublease()).await;
        let answers: Vec<bool> = keys.iter().map(|k| mirror.absent_locally(k)).collect();
        if mirror.holds_sublease() {
            return answers;
        }
    }
}

/// The copy is the gate's filter: for keys added before and after it attached, and 20,000 never added,
/// in a plain and a windowed namespace, the mirror answers `ABSENT` for exactly the keys the gate does
/// (its false positives included), and each such answer is counted as a local one.
#[tokio::test]
async fn a_mirror_answers_absent_exactly_where_the_gate_does() {
    let server = mirrored().await;
    for namespace in ["users", "windowed"] {
        let client = client_at(server.grpc_addr, namespace);
        client.add(keys("before", 3_000)).await.unwrap();
        let mirror = client.mirror(MirrorOptions::default()).unwrap();
        until("the mirror holds a sub-lease", || mirror.holds_sublease()).await;
        client.add(keys("after", 3_000)).await.unwrap();
        let mut probes = keys("before", 3_000);
        probes.extend(keys("after", 3_000));
        probes.extend(keys("never", 20_000));
        let local = local_absences(&mirror, &probes).await;
        let gate = client.may_exist_many(&probes).await.unwrap().may_exist;
        for (i, key) in probes.iter().enumerate() {
            assert_eq!(
                local[i],
                !gate[i],
                "{namespace}: {key:?} is {} locally and {} at the gate",
                if local[i] { "ABSENT" } else { "not absent" },
                if gate[i] { "MAY_EXIST" } else { "ABSENT" },
            );
        }
        let absent = local.iter().filter(|a| **a).count();
        assert!(
            absent > 19_000,
            "{namespace}: only {absent} of the 20,000 never added were absent"
        );
        // `may_exist` answers such a key locally, as ABSENT, and counts it (tried again only if the
        // sub-lease lapsed in between, as it may on a loaded machine).
        let key = &probes[local.iter().position(|a| *a).expect("a key absent locally")];
        let mut attempts = 0;
        loop {
            until("the mirror holds a sub-lease", || mirror.holds_sublease()).await;
            let before = client.stats().mirror_answers;
            let lookup = mirror.may_exist(key.clone()).await.unwrap();
            if lookup.local {
                assert!(!lookup.may_exist, "{namespace}: {key:?}");
                assert_eq!(client.stats().mirror_answers, before + 1);
                break;
            }
            attempts += 1;
            assert!(
                attempts < 100,
                "{namespace}: {key:?} was never answered locally"
            );
        }
    }
}

/// A grant names the latest `Add`, not the latest seq: a mirror is sent `Add`s only, so in a namespace
/// whose latest seq is a tombstone's (absences recorded after the last `Add`) a grant naming that seq would
/// never hold. The mirror holds, before and after more absences and `Add`s.
#[tokio::test]
async fn a_mirror_holds_in_a_namespace_whose_latest_seq_is_a_tombstone() {
    let server = mirrored().await;
    let client = client_at(server.grpc_addr, "users");
    client.add(["deleted-1", "deleted-2"]).await.unwrap();
    // Deleted at the source: keys the filter holds, so their tombstones are stored, each with a seq.
    let record = |key: &'static str| {
        let client = client.clone();
        async move {
            let recorded = client
                .record_absent(key, existence_gate_client::AbsenceKind::Deleted, 0)
                .await
                .unwrap();
            assert_eq!(
                recorded.outcome,
                existence_gate_client::RecordOutcome::Recorded
            );
        }
    };
    record("deleted-1").await;
    let mirror = client.mirror(MirrorOptions::default()).unwrap();
    until("the mirror holds a sub-lease", || mirror.holds_sublease()).await;
    client.add(["later"]).await.unwrap();
    record("deleted-2").await;
    let recorded = std::time::Instant::now();
    assert!(!mirror.absent_locally(b"later"));
    // Held on a grant made after the last tombstone: the grants before it end within two sub-leases.
    until(
        "the mirror holds a sub-lease granted after the absences",
        || {
            recorded.elapsed() > 2 * SUBLEASE
                && mirror.holds_sublease()
                && mirror.absent_locally(b"never")
        },
    )
    .await;
}

/// `Add`s acknowledged one after another while lookups read every key acknowledged so far: none is ever
/// `ABSENT` locally after its `Add` returned — the gate waited for the mirror's acknowledgement. And the
/// mirror did answer locally meanwhile (keys never added), so the check was not empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_key_is_ever_absent_in_a_mirror_while_adds_race_lookups() {
    let server = mirrored().await;
    let client = client_at(server.grpc_addr, "users");
    let mirror = client.mirror(MirrorOptions::default()).unwrap();
    until("the mirror holds a sub-lease", || mirror.holds_sublease()).await;
    let added = keys("raced", 1_500);
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (mirror, added, acknowledged, done) = (
            mirror.clone(),
            added.clone(),
            Arc::clone(&acknowledged),
            Arc::clone(&done),
        );
        tokio::spawn(async move {
            let (mut wrong, mut local, mut i) = (Vec::new(), 0u64, 0usize);
            while !done.load(Ordering::Acquire) {
                let through = acknowledged.load(Ordering::Acquire);
                for key in &added[through.saturating_sub(64)..through] {
                    if mirror.absent_locally(key) {
                        wrong.push(key.clone());
                    }
                }
                i += 1;
                local += u64::from(mirror.absent_locally(format!("never-{i}").as_bytes()));
                tokio::task::yield_now().await;
            }
            (wrong, local)
        })
    };
    for (i, key) in added.iter().enumerate() {
        client.add([key.clone()]).await.unwrap();
        assert!(
            !mirror.absent_locally(key),
            "{key:?} is ABSENT in the mirror after its Add was acknowledged"
        );
        acknowledged.store(i + 1, Ordering::Release);
    }
    done.store(true, Ordering::Release);
    let (wrong, local) = reader.await.unwrap();
    assert!(
        wrong.is_empty(),
        "acknowledged keys ABSENT in the mirror: {wrong:?}"
    );
    assert!(
        local > 0,
        "the mirror never answered locally: the check proved nothing"
    );
}

/// A mirror whose link goes silent (a partition TCP outlasts) keeps no sub-lease past the gate's: the next
/// `Add` waits for the sub-lease to run out at the gate, and when it returns the mirror no longer holds
/// one, so it cannot answer `ABSENT` for the key. Once the link passes again, it holds one again.
#[tokio::test]
async fn a_silent_mirror_holds_an_add_at_most_a_sublease_and_stops_answering_first() {
    let server = mirrored().await;
    let proxy = Proxy::start(server.grpc_addr).await;
    let through_proxy = client_at(proxy.addr, "users");
    let direct = client_at(server.grpc_addr, "users");
    let mirror = through_proxy.mirror(MirrorOptions::default()).unwrap();
    until("the mirror holds a sub-lease", || mirror.holds_sublease()).await;
    proxy.set(Mode::Silent);
    direct.add(["cut-off"]).await.unwrap();
    assert!(
        !mirror.holds_sublease(),
        "the gate acknowledged an Add the silent mirror never saw while the mirror still held a sub-lease"
    );
    assert!(!mirror.absent_locally(b"cut-off"));
    proxy.set(Mode::Pass);
    until("the mirror holds a sub-lease again", || {
        mirror.holds_sublease()
    })
    .await;
    until("the mirror applied the Add it missed", || {
        mirror.holds_sublease() && !mirror.absent_locally(b"cut-off")
    })
    .await;
}

/// A gate restarted under a mirror that did not see it go (its link silent): the restarted gate forgets
/// its mirrors but holds its first `Add`s until any sub-lease its previous run granted is over, so the
/// mirror has stopped holding by the time the `Add` returns. (Sub-leases of 10 s here, so that the mirror
/// surely still holds one when the restarted gate takes the `Add`.)
#[tokio::test]
async fn a_restarted_gate_holds_adds_until_its_previous_subleases_are_over() {
    let config = MIRRORED.replace("sublease = \"300ms\"", "sublease = \"10s\"");
    let first = start_gate(&config, "127.0.0.1:0", None, None).await;
    let address = first.grpc_addr;
    let proxy = Proxy::start(address).await;
    let mirror = client_at(proxy.addr, "users")
        .mirror(MirrorOptions::default())
        .unwrap();
    until("the mirror holds a sub-lease", || mirror.holds_sublease()).await;
    proxy.set(Mode::Silent);
    // The first run stops taking connections at once; its stream to the mirror drains behind the silent
    // link while the second run starts on its address (in memory: what counts is the new run's start).
    first.shutdown_handle().trigger();
    until("the first run's port is free", || {
        std::net::TcpListener::bind(address).is_ok()
    })
    .await;
    let _second = start_gate(&config, &address.to_string(), None, None).await;
    assert!(
        mirror.holds_sublease(),
        "the mirror's sub-lease ran out before the restart was over"
    );
    let patient = ClientOptions {
        deadline: PATIENCE,
        ..ClientOptions::namespace("users")
    };
    let writer = GateClient::new([address.to_string()], patient).unwrap();
    writer.add(["after-restart"]).await.unwrap();
    assert!(
        !mirror.holds_sublease() && !mirror.absent_locally(b"after-restart"),
        "a mirror of the previous run still held its sub-lease when the restarted gate acknowledged an Add"
    );
}

/// A rebuild swaps in a filter whose keys no `Add` announced: the mirror is told to resync, downloads the
/// new filter and answers from it (a key only the old filter held is `ABSENT` again, the rebuilt ones are
/// not).
#[tokio::test]
async fn a_rebuild_makes_the_mirror_download_the_new_filter() {
    let server = mirrored().await;
    let client = client_at(server.grpc_addr, "users");
    client.add(["only-before"]).await.unwrap();
    let mirror = client.mirror(MirrorOptions::default()).unwrap();
    until("the mirror holds a sub-lease", || mirror.holds_sublease()).await;
    assert!(!mirror.absent_locally(b"only-before"));
    let mut admin =
        proto::admin_client::AdminClient::connect(format!("http://{}", server.grpc_addr))
            .await
            .unwrap();
    let rebuild = proto::RebuildRequest {
        namespace: "users".into(),
        keys: vec![
            Bytes::from_static(b"rebuilt-1"),
            Bytes::from_static(b"rebuilt-2"),
        ],
        commit: true,
        ..Default::default()
    };
    admin
        .rebuild(tokio_stream::iter([rebuild]))
        .await
        .expect("the rebuild succeeds");
    until("the mirror took the rebuilt filter", || {
        mirror.holds_sublease() && mirror.absent_locally(b"only-before")
    })
    .await;
    assert!(!mirror.absent_locally(b"rebuilt-1") && !mirror.absent_locally(b"rebuilt-2"));
    assert!(client.stats().mirror_attaches >= 1);
}

/// Opens `Mirror.Attach` with `first` as its first message (and a token, if given): the status it ends
/// with, if it does before the filter comes.
async fn attach_refusal(
    address: std::net::SocketAddr,
    first: mirror_request::Request,
    token: Option<&str>,
) -> Option<tonic::Status> {
    let mut client = MirrorClient::connect(format!("http://{address}"))
        .await
        .unwrap();
    let (sender, requests) = tokio::sync::mpsc::channel(4);
    sender
        .send(proto::MirrorRequest {
            request: Some(first),
        })
        .await
        .unwrap();
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(requests));
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
    }
    let result = client.attach(request).await;
    drop(sender);
    result.err()
}

fn open(namespace: &str, max_filter_bytes: u64) -> mirror_request::Request {
    mirror_request::Request::Open(proto::MirrorOpen {
        namespace: namespace.into(),
        max_filter_bytes,
    })
}

/// Each refusal is the precise status, its message naming what was wrong and the limit.
#[tokio::test]
async fn attaching_is_refused_precisely() {
    let off = start_gate("", "127.0.0.1:0", None, None).await;
    let refused = attach_refusal(off.grpc_addr, open("", 0), None)
        .await
        .unwrap();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("max_per_namespace"),
        "{refused:?}"
    );

    let server = mirrored().await;
    let cases = [
        (open("nowhere", 0), Code::NotFound, "nowhere"),
        (
            open("users", 64),
            Code::ResourceExhausted,
            "max_filter_bytes (64)",
        ),
        (
            mirror_request::Request::Ask(proto::LeaseAsk { id: 1 }),
            Code::InvalidArgument,
            "first message must be `open`",
        ),
    ];
    for (first, code, says) in cases {
        let refused = attach_refusal(server.grpc_addr, first, None)
            .await
            .unwrap_or_else(|| panic!("not refused: {says}"));
        assert_eq!(refused.code(), code, "{refused:?}");
        assert!(
            refused.message().contains(says),
            "{refused:?} does not say {says:?}"
        );
    }
    let client = client_at(server.grpc_addr, "users");
    let held: Vec<Mirror> = (0..3)
        .map(|_| client.mirror(MirrorOptions::default()).unwrap())
        .collect();
    for mirror in &held {
        until("each mirror is attached", || mirror.is_attached()).await;
    }
    let refused = attach_refusal(server.grpc_addr, open("users", 0), None)
        .await
        .unwrap();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("3 mirrors attached"),
        "{refused:?}"
    );

    let config = format!(
        "{MIRRORED}{}{}",
        token_entry("reader", "read-secret", &["read", "write"], &["*"]),
        token_entry("mirror", "mirror-secret", &["mirror"], &["users"]),
    );
    let guarded = start_gate(&config, "127.0.0.1:0", None, None).await;
    let refused = attach_refusal(guarded.grpc_addr, open("users", 0), Some("read-secret"))
        .await
        .unwrap();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("mirror"), "{refused:?}");
    assert!(
        attach_refusal(guarded.grpc_addr, open("users", 0), Some("mirror-secret"))
            .await
            .is_none(),
        "a token with the mirror role attaches"
    );
}
