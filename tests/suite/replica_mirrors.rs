//! Mirrors of a replica, as real processes: two replicas on a real nats-server, a Rust mirror attached to
//! one of them (r1) through a faulty proxy. A replica grants sub-leases only under its own read lease, and
//! counts an `Add` as applied — before acknowledging its own, and before reporting another writer's — only
//! once its mirrors applied it or their sub-leases ended ([`existence_gate::core::sublease`]). So no `Add`
//! acknowledged through either replica is answered `ABSENT` by the mirror: while they race its lookups,
//! while its link is silent, while its replica is cut off from NATS, once its replica has left, once its
//! replica was displaced by a new process with its id, and once it was removed by an operator.

use crate::common;

use std::net::SocketAddr;

use common::nats::Nats;
use common::proxy::{Mode, Proxy};
use common::replicas::{config_file, start_serving, Launch, Replica};
use common::{wait_until, PATIENCE};
use existence_gate::proto::{AddRequest, ListReplicasRequest, RemoveReplicaRequest};
use existence_gate_client::{ClientOptions, GateClient, Mirror, MirrorOptions};

const CONFIG: &str = r#"
[mirrors]
max_per_namespace = 2
sublease = "300ms"

[namespaces.users]
expected_keys = 100000
"#;

/// Long enough for sub-leases a loaded 2-core machine renews in time (a replica grants no longer than its
/// own lease has left).
const READ_LEASE: &str = "400ms";

/// Two replicas serving, and a mirror of `users` attached to r1 through a proxy.
struct Deployment {
    _nats: Nats,
    _dir: tempfile::TempDir,
    replicas: Vec<Replica>,
    proxy: Proxy,
    mirror: Mirror,
}

async fn deployment() -> Option<Deployment> {
    let nats = Nats::start().await?;
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), CONFIG);
    let args = ["--read-lease", READ_LEASE, "--drain-delay", "0s"];
    let replicas = start_serving(&nats.url, &config, 2, &args).await;
    let proxy = Proxy::start(replicas[1].grpc_addr).await;
    let mirror = holding_mirror(proxy.addr).await;
    Some(Deployment {
        _nats: nats,
        _dir: dir,
        replicas,
        proxy,
        mirror,
    })
}

/// A mirror of `users` attached through `address`, once it holds a sub-lease.
async fn holding_mirror(address: SocketAddr) -> Mirror {
    let client = GateClient::new([address.to_string()], ClientOptions::namespace("users")).unwrap();
    let mirror = client.mirror(MirrorOptions::default()).unwrap();
    until("the mirror holds a sub-lease", || mirror.holds_sublease()).await;
    mirror
}

/// Waits until `condition` holds, or fails saying what it waited for.
async fn until(what: &str, condition: impl Fn() -> bool) {
    wait_until(PATIENCE, what, async || condition().then_some(())).await
}

async fn add(replica: &Replica, key: &str) {
    let request = AddRequest {
        namespace: "users".to_string(),
        keys: vec![key.as_bytes().to_vec().into()],
        ..Default::default()
    };
    replica
        .client()
        .add(request)
        .await
        .unwrap_or_else(|status| panic!("Add {key:?} through {}: {status:?}", replica.id));
}

/// 400 `Add`s through both replicas in turn, each looked up in the mirror as soon as it is acknowledged,
/// and never answered `ABSENT` there; meanwhile the mirror answers for keys never added on its own (it held
/// sub-leases throughout, renewed by a replica whose lookups it takes away), claiming no later
/// `observed_seq` than r1 would: a replica's copy of the log is vouched for only through its newest barrier
/// (a later claim could let a `RecordAbsent` stand over an `Add`).
#[tokio::test]
async fn a_replicas_mirror_never_answers_absent_for_an_add_acknowledged_through_any_replica() {
    let Some(d) = deployment().await else {
        return;
    };
    let mut answered_locally = 0;
    for n in 0..400 {
        let key = format!("raced-{n}");
        let writer = &d.replicas[n % 2];
        add(writer, &key).await;
        assert!(
            !d.mirror.absent_locally(key.as_bytes()),
            "the mirror of r1 answered ABSENT for {key:?}, acknowledged through {}",
            writer.id
        );
        let never = format!("never-{n}");
        let local = d.mirror.may_exist(never.clone()).await.unwrap();
        if local.local {
            answered_locally += 1;
            // No more than r1 itself may claim, read after it: its copy of the log is vouched for only
            // through its newest barrier, which lags the Adds it applies.
            let (_, _, claimed) = d.replicas[1].lookup("users", never.as_bytes()).await;
            assert!(
                local.observed_seq <= claimed,
                "the mirror's local answer claimed seq {} observed, r1 only {claimed}",
                local.observed_seq
            );
        }
    }
    assert!(
        answered_locally > 0,
        "the mirror never answered on its own: it held no sub-lease while the Adds ran"
    );
}

/// A mirror whose link goes silent while it holds a sub-lease: an `Add` through the other replica is
/// acknowledged only once r1 reported it, which waits for the mirror's sub-lease to end (or by the
/// writers' fallback, which outlasts it too), and one through r1 itself waits the same; so when either
/// returns, the mirror, which never saw it, answers it no `ABSENT`. Once the link passes again the mirror
/// holds again, with both keys.
#[tokio::test]
async fn a_silent_mirror_holds_its_replicas_reports_and_adds_until_its_sublease_ends() {
    let Some(d) = deployment().await else {
        return;
    };
    for (writer, key) in [(0, "silent-through-r0"), (1, "silent-through-r1")] {
        until("the mirror holds a sub-lease", || d.mirror.holds_sublease()).await;
        d.proxy.set(Mode::Silent);
        add(&d.replicas[writer], key).await;
        assert!(
            !d.mirror.absent_locally(key.as_bytes()),
            "{key:?} was acknowledged while the silent mirror still answered ABSENT for it"
        );
        d.proxy.set(Mode::Pass);
        until("the mirror holds again, with the Add it missed", || {
            d.mirror.holds_sublease() && !d.mirror.absent_locally(key.as_bytes())
        })
        .await;
    }
}

/// A replica cut off from NATS loses its read lease, and its mirror its sub-lease with it (no grant
/// outlives the replica's own lease); an `Add` acknowledged through the other replica meanwhile is not
/// answered `ABSENT` by the mirror. Reconnected, the replica leases again and so does its mirror.
#[tokio::test]
async fn a_replica_cut_off_from_nats_takes_its_mirrors_sublease_with_its_lease() {
    let Some(nats) = Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), CONFIG);
    let nats_addr = nats.url.trim_start_matches("nats://").parse().unwrap();
    let nats_link = Proxy::start(nats_addr).await;
    let mut launches = [
        Launch::new(&nats.url, &config, "r0"),
        Launch::new(&nats_link.url(), &config, "r1"),
    ];
    for launch in &mut launches {
        launch.args = vec!["--read-lease".to_string(), READ_LEASE.to_string()];
    }
    let replicas = common::replicas::start_in_turn(&launches).await;
    let mirror = holding_mirror(replicas[1].grpc_addr).await;
    nats_link.set(Mode::Silent);
    add(&replicas[0], "while-r1-is-cut-off").await;
    assert!(
        !mirror.absent_locally(b"while-r1-is-cut-off"),
        "an Add acknowledged through r0 was answered ABSENT by the mirror of r1, cut off from NATS"
    );
    until("the mirror's sub-lease ended with r1's lease", || {
        !mirror.holds_sublease()
    })
    .await;
    nats_link.set(Mode::Pass);
    until("the mirror holds again, with the Add r1 missed", || {
        mirror.holds_sublease() && !mirror.absent_locally(b"while-r1-is-cut-off")
    })
    .await;
}

/// A replica stopped gracefully gives its lease up and leaves the membership, after which writers no longer
/// wait for it; it publishes the leave only once every sub-lease it granted has ended. So an `Add`
/// acknowledged through the other replica after the leave is not answered `ABSENT` by a mirror that never
/// heard its replica stop (its link silent), which may still hold a sub-lease when the stop begins.
#[tokio::test]
async fn a_replica_leaving_waits_out_its_mirrors_subleases() {
    let Some(mut d) = deployment().await else {
        return;
    };
    until("the mirror holds a sub-lease", || d.mirror.holds_sublease()).await;
    d.proxy.set(Mode::Silent);
    let leaving = d.replicas.pop().expect("r1");
    leaving.signal("TERM");
    let r0 = &d.replicas[0];
    wait_until(PATIENCE, "r1 to have left, as r0 sees it", async || {
        let listed = r0.admin().list_replicas(ListReplicasRequest {}).await;
        let ids: Vec<String> = listed
            .unwrap()
            .into_inner()
            .replicas
            .into_iter()
            .map(|m| m.id)
            .collect();
        (ids == ["r0"]).then_some(())
    })
    .await;
    add(r0, "after-r1-left").await;
    assert!(
        !d.mirror.absent_locally(b"after-r1-left"),
        "an Add acknowledged after r1 left was answered ABSENT by r1's mirror"
    );
    leaving.kill().await;
}

/// A replica frozen (SIGSTOP: its connections stay open, its mirror hears nothing) and displaced by a new
/// process with its id, under a mirror holding a sub-lease from it: the new incarnation knows nothing of
/// that sub-lease and takes no quiet period, yet an `Add` acknowledged through the other replica after it
/// joined is not answered `ABSENT` by the mirror — writers wait for the incarnation it displaced until that
/// one's lease is over, and the sub-lease ended no later.
#[tokio::test]
async fn a_replica_displaced_under_its_mirror_counts_on_the_writers_grace() {
    let Some(frozen) = FrozenUnderMirror::start().await else {
        return;
    };
    let mut twin = frozen.launch("r1");
    twin.data_dir = frozen.dir.path().join("r1-twin");
    let twin = twin.start().await;
    twin.serving().await;
    add(&frozen.replicas[0], "after-r1-was-displaced").await;
    assert!(
        !frozen.mirror.absent_locally(b"after-r1-was-displaced"),
        "an Add acknowledged after r1's twin joined was answered ABSENT by the mirror of the r1 it displaced"
    );
}

/// The same frozen replica removed by an operator instead: writers no longer wait for its reports once
/// they applied the removal, but wait for it a fallback more, as it may still hold a lease — and its
/// mirror a sub-lease under it. So an `Add` acknowledged after the removal is not answered `ABSENT` by
/// the mirror, which never heard of either.
#[tokio::test]
async fn a_replica_removed_under_its_mirror_counts_on_the_writers_grace() {
    let Some(frozen) = FrozenUnderMirror::start().await else {
        return;
    };
    frozen.replicas[0]
        .admin()
        .remove_replica(RemoveReplicaRequest { id: "r1".into() })
        .await
        .expect("r1 removed");
    add(&frozen.replicas[0], "after-r1-was-removed").await;
    assert!(
        !frozen.mirror.absent_locally(b"after-r1-was-removed"),
        "an Add acknowledged after r1's removal was answered ABSENT by the mirror of the removed r1"
    );
}

/// Two replicas with leases of seconds (sub-leases of up to 5 s under read leases of 3 s, so that a
/// sub-lease outlasts what a test does next), a mirror of r1 holding a sub-lease, and r1 then frozen.
struct FrozenUnderMirror {
    nats: Nats,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
    replicas: Vec<Replica>,
    mirror: Mirror,
}

impl FrozenUnderMirror {
    async fn start() -> Option<Self> {
        let nats = Nats::start().await?;
        let dir = tempfile::tempdir().unwrap();
        let config = config_file(dir.path(), &CONFIG.replace("300ms", "5s"));
        let launches = ["r0", "r1"].map(|id| long_leased(&nats.url, &config, id));
        let replicas = common::replicas::start_in_turn(&launches).await;
        let mirror = holding_mirror(replicas[1].grpc_addr).await;
        replicas[1].signal("STOP");
        Some(Self {
            nats,
            dir,
            config,
            replicas,
            mirror,
        })
    }

    /// A replica with r0's and r1's leases: `id` r1 for a twin that displaces the frozen one.
    fn launch(&self, id: &str) -> Launch {
        long_leased(&self.nats.url, &self.config, id)
    }
}

fn long_leased(nats: &str, config: &std::path::Path, id: &str) -> Launch {
    let mut launch = Launch::new(nats, config, id);
    launch.args = ["--read-lease", "3s"].map(String::from).to_vec();
    launch
}
