//! The PostgreSQL change feed as an operator runs it: the real binary following a real PostgreSQL 15
//! (logical replication, `pgoutput`) into a real gate on loopback ports.

use crate::common;

use std::net::SocketAddr;

use bytes::Bytes;
use common::feed::{feed_command, Feed};
use common::postgres::Postgres;
use common::*;
use existence_gate::proto::{Answer, Basis, BatchMayExistRequest, MayExistRequest};
use existence_gate::server::RunningServer;

const CONFIG: &str = "[namespaces.users]\nexpected_keys = 100000\n";

type GateClient =
    existence_gate::proto::existence_gate_client::ExistenceGateClient<tonic::transport::Channel>;

fn addr(server: &RunningServer) -> String {
    format!("http://{}", server.grpc_addr)
}

/// A gate keeping its state in `dir`, on `listen` (`127.0.0.1:0` for any port).
async fn start_durable(dir: &std::path::Path, listen: SocketAddr) -> RunningServer {
    let mut options = options(CONFIG, 16 << 20);
    options.listen = listen;
    options.durability = Some(existence_gate::server::DurabilityOptions::new(
        dir.to_path_buf(),
    ));
    start_options(
        options,
        std::sync::Arc::new(existence_gate::core::clock::SystemClock),
    )
    .await
}

/// A cluster with `users(id bigint primary key, email text)`.
async fn database() -> Option<Postgres> {
    let postgres = Postgres::start().await?;
    postgres
        .client()
        .await
        .batch_execute("CREATE TABLE users (id bigint PRIMARY KEY, email text)")
        .await
        .unwrap();
    Some(postgres)
}

/// Inserts ids `from..to`.
async fn insert(client: &tokio_postgres::Client, from: i64, to: i64) {
    client
        .execute(
            "INSERT INTO users (id, email) SELECT i, 'u' || i FROM generate_series($1::bigint, $2::bigint - 1) i",
            &[&from, &to],
        )
        .await
        .unwrap();
}

fn ids(range: std::ops::Range<i64>) -> Vec<Bytes> {
    range.map(|i| Bytes::from(i.to_string())).collect()
}

/// How many of `keys` answer `MAY_EXIST` in `users`.
async fn present(gate: &RunningServer, keys: Vec<Bytes>) -> usize {
    let mut gate = client(gate).await;
    let mut present = 0;
    for chunk in keys.chunks(5_000) {
        let reply = gate
            .batch_may_exist(BatchMayExistRequest {
                namespace: "users".into(),
                keys: chunk.to_vec(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        present += reply.answers().filter(|a| *a == Answer::MayExist).count();
    }
    present
}

/// Waits until every one of `keys` answers `MAY_EXIST`.
async fn all_present(gate: &RunningServer, keys: Vec<Bytes>) {
    let n = keys.len();
    wait_until(
        PATIENCE,
        &format!("{n} keys to reach the gate"),
        async || (present(gate, keys.clone()).await == n).then_some(()),
    )
    .await;
}

async fn lookup(gate: &RunningServer, key: &str) -> (Answer, Basis) {
    let reply = client(gate)
        .await
        .may_exist(MayExistRequest {
            namespace: "users".into(),
            key: Bytes::from(key.to_string()),
        })
        .await
        .unwrap()
        .into_inner();
    (reply.answer(), reply.basis())
}

/// Waits until the feed has written a fence covering every write `gate` has applied to `users`: a
/// delete committed after that carries a seq newer than its key's Add. (A delete right after its key's
/// Add may carry an older fence and lose its tombstone: safe, but not what the tests look at.)
async fn fenced(feed: &Feed, gate: &GateClient) {
    let applied = gate
        .clone()
        .current_seq(existence_gate::proto::CurrentSeqRequest {
            namespace: "users".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .seq;
    wait_until(PATIENCE, "a fence of the gate's writes", async || {
        let fenced = feed
            .metric("existence_feed_fenced_seq{namespace=\"users\"}")
            .await;
        (fenced >= applied as f64).then_some(())
    })
    .await;
}

/// Inserts, deletes, a key-changing update and a truncate, followed into the gate.
#[tokio::test]
async fn inserts_deletes_key_changes_and_truncates_are_followed() {
    let Some(postgres) = database().await else {
        return;
    };
    let gate = start(CONFIG).await;
    let feed = Feed::start(&postgres.dsn(), &addr(&gate), &[]).await;
    feed.ready().await;
    let db = postgres.client().await;
    insert(&db, 0, 1_000).await;
    all_present(&gate, ids(0..1_000)).await;
    fenced(&feed, &client(&gate).await).await;

    db.execute("DELETE FROM users WHERE id = 7", &[])
        .await
        .unwrap();
    wait_until(PATIENCE, "the delete to reach the gate", async || {
        (lookup(&gate, "7").await == (Answer::Absent, Basis::Tombstone)).then_some(())
    })
    .await;
    db.execute("UPDATE users SET id = 100000 WHERE id = 8", &[])
        .await
        .unwrap();
    db.execute("UPDATE users SET email = 'changed' WHERE id = 9", &[])
        .await
        .unwrap();
    wait_until(PATIENCE, "the key change to reach the gate", async || {
        let moved = lookup(&gate, "8").await == (Answer::Absent, Basis::Tombstone);
        let arrived = lookup(&gate, "100000").await.0 == Answer::MayExist;
        (moved && arrived).then_some(())
    })
    .await;
    assert_eq!(lookup(&gate, "9").await.0, Answer::MayExist);

    db.execute("TRUNCATE users", &[]).await.unwrap();
    wait_until(PATIENCE, "the truncate to be counted", async || {
        (feed.metric("existence_feed_truncates_total").await >= 1.0).then_some(())
    })
    .await;
    let inserts = "existence_feed_rows_total{table=\"public.users\",operation=\"insert\"}";
    assert_eq!(feed.metric(inserts).await, 1_000.0);

    // PostgreSQL gone: the feed says so on /readyz (and keeps trying to reconnect).
    drop(db);
    drop(postgres);
    let (status, body) = wait_until(
        PATIENCE,
        "/readyz to report the lost database",
        async || {
            let (status, body) = common::try_http_get(feed.http, "/readyz").await.ok()?;
            (status == 503).then_some((status, body))
        },
    )
    .await;
    assert!(
        body.contains("disconnected from PostgreSQL"),
        "{status} {body}"
    );
    feed.kill().await;
}

/// The slot's confirmed position never passes what the gate acknowledged: with the gate down, inserts wait
/// in PostgreSQL (the feed retries), and once the gate is back they arrive and the slot moves on. A feed
/// killed mid-stream resumes from the slot and loses nothing.
#[tokio::test]
async fn nothing_is_confirmed_before_the_gate_acknowledges_and_nothing_is_lost() {
    let Some(postgres) = database().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let gate = start_durable(dir.path(), "127.0.0.1:0".parse().unwrap()).await;
    let feed = Feed::start(&postgres.dsn(), &addr(&gate), &[]).await;
    feed.ready().await;
    let db = postgres.client().await;
    insert(&db, 0, 100).await;
    all_present(&gate, ids(0..100)).await;
    let confirmed = || async {
        let row = db
            .query_one(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'feed_slot'",
                &[],
            )
            .await
            .unwrap();
        lsn(&row.get::<_, String>(0))
    };

    // The gate goes away; rows committed meanwhile are retried, not confirmed.
    let listen = gate.grpc_addr;
    gate.stop().await.unwrap();
    // A transaction the gate cannot acknowledge: the slot may be confirmed up to its rows (a keepalive's
    // WAL end while nothing is pending) but never to its commit record, which follows `before_commit`.
    let mut other = postgres.client().await;
    let transaction = other.transaction().await.unwrap();
    transaction
        .execute(
            "INSERT INTO users (id) SELECT generate_series(100, 199)",
            &[],
        )
        .await
        .unwrap();
    let before_commit = current_lsn(&transaction).await;
    transaction.commit().await.unwrap();
    let committed = current_lsn(&db).await;
    wait_until(
        PATIENCE,
        "the feed to retry the unavailable gate",
        async || (feed.metric("existence_feed_gate_retries_total").await >= 2.0).then_some(()),
    )
    .await;
    let told = feed.metric("existence_feed_confirmed_lsn").await as u64;
    let held = confirmed().await;
    assert!(
        told <= before_commit && held <= before_commit,
        "confirmed past the unacknowledged commit: the feed told the slot {told:#x}, the slot holds \
         {held:#x}; the commit follows {before_commit:#x}"
    );

    let gate = start_durable(dir.path(), listen).await;
    all_present(&gate, ids(0..200)).await;
    wait_until(PATIENCE, "the slot to confirm the commit", async || {
        (confirmed().await >= committed).then_some(())
    })
    .await;

    // Killed with rows streaming: the restarted feed sends again what was not confirmed.
    let writer = {
        let db = postgres.client().await;
        tokio::spawn(async move {
            for batch in 0..20 {
                insert(&db, 1_000 + batch * 100, 1_100 + batch * 100).await;
            }
        })
    };
    feed.kill().await;
    writer.await.unwrap();
    let feed = Feed::start(&postgres.dsn(), &addr(&gate), &[]).await;
    all_present(&gate, ids(1_000..3_000)).await;
    feed.kill().await;
}

/// `--initial-load` with inserts running throughout: every row committed at the end is in the gate.
#[tokio::test]
async fn an_initial_load_under_concurrent_inserts_misses_no_key() {
    let Some(postgres) = database().await else {
        return;
    };
    let gate = start(CONFIG).await;
    let db = postgres.client().await;
    insert(&db, 0, 20_000).await;
    let writer = {
        let db = postgres.client().await;
        tokio::spawn(async move {
            for batch in 0..50 {
                insert(&db, 100_000 + batch * 10, 100_010 + batch * 10).await;
            }
        })
    };
    let feed = Feed::start(&postgres.dsn(), &addr(&gate), &["--initial-load"]).await;
    writer.await.unwrap();
    feed.ready().await;
    let all: Vec<Bytes> = ids(0..20_000)
        .into_iter()
        .chain(ids(100_000..100_500))
        .collect();
    all_present(&gate, all).await;
    feed.kill().await;
}

/// Each mistake an operator can make at start is one line naming what to fix, and a non-zero exit.
#[tokio::test]
async fn a_feed_that_cannot_work_says_why_in_one_line() {
    let Some(postgres) = database().await else {
        return;
    };
    let gate = start(CONFIG).await;
    let db = postgres.client().await;
    db.batch_execute(
        "CREATE TABLE unkeyed (id bigint, note text);
         CREATE TABLE memberships (tenant int, id bigint, PRIMARY KEY (tenant, id));
         CREATE TABLE logged (id bigint, note text);
         ALTER TABLE logged REPLICA IDENTITY FULL;
         CREATE TABLE unique_unkeyed (id bigint UNIQUE, note text);",
    )
    .await
    .unwrap();
    let failure = async |command: &mut tokio::process::Command| {
        let output = command.output().await.expect("the binary runs");
        assert!(!output.status.success(), "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr)
            .trim_end()
            .to_string();
        assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
        stderr
    };
    let mut missing = feed_command(&postgres.dsn(), &addr(&gate), &[]);
    missing.args(["--table", "public.nothing:id=users"]);
    let line = failure(&mut missing).await;
    assert!(
        line.contains("table public.nothing does not exist"),
        "{line}"
    );

    let mut unkeyed = feed_command(
        &postgres.dsn(),
        &addr(&gate),
        &["--table", "public.unkeyed:id=users"],
    );
    let line = failure(&mut unkeyed).await;
    assert!(
        line.contains("column \"id\" of table public.unkeyed is not unique")
            && line.contains("CREATE UNIQUE INDEX ON \"public\".\"unkeyed\" (\"id\")")
            && line.contains("--non-unique-adds-only"),
        "{line}"
    );
    // One column of a composite key, or any column of a table whose deletes carry the whole row: several
    // rows may hold one key, so a delete must not become a tombstone.
    for table in ["public.memberships:id=users", "public.logged:id=users"] {
        let mut shared = feed_command(&postgres.dsn(), &addr(&gate), &["--table", table]);
        let line = failure(&mut shared).await;
        assert!(line.contains("is not unique"), "{table}: {line}");
    }
    // Unique, but its deletes carry no key.
    let mut no_identity = feed_command(
        &postgres.dsn(),
        &addr(&gate),
        &["--table", "public.unique_unkeyed:id=users"],
    );
    let line = failure(&mut no_identity).await;
    assert!(
        line.contains("no primary key") && line.contains("REPLICA IDENTITY FULL"),
        "{line}"
    );

    let mut raw_bigint = feed_command(&postgres.dsn(), &addr(&gate), &["--key-format", "raw"]);
    let line = failure(&mut raw_bigint).await;
    assert!(
        line.contains("column \"id\" of table public.users is bigint, and --key-format raw takes bytea columns only"),
        "{line}"
    );

    let mut no_column = feed_command(
        &postgres.dsn(),
        &addr(&gate),
        &["--table", "public.users:uuid=users"],
    );
    let line = failure(&mut no_column).await;
    assert!(line.contains("has no column \"uuid\""), "{line}");

    let mut bad_dsn = feed_command("postgres://nobody@127.0.0.1:1/none", &addr(&gate), &[]);
    let line = failure(&mut bad_dsn).await;
    assert!(
        line.contains("cannot connect to PostgreSQL at 127.0.0.1:1"),
        "{line}"
    );

    let secured = start(&format!(
        "{CONFIG}{}",
        token_entry("w", "right", &["write"], &["*"])
    ))
    .await;
    let mut wrong_token = feed_command(&postgres.dsn(), &addr(&secured), &["--token", "wrong"]);
    let line = failure(&mut wrong_token).await;
    assert!(
        line.contains("UNAUTHENTICATED") && line.contains("--token"),
        "{line}"
    );
    let mut unknown_namespace = feed_command(
        &postgres.dsn(),
        &addr(&gate),
        &["--table", "public.users:id=nowhere"],
    );
    let line = failure(&mut unknown_namespace).await;
    assert!(
        line.contains("NOT_FOUND") && line.contains("nowhere"),
        "{line}"
    );
    // Refused starts leave nothing behind in PostgreSQL.
    let left = db
        .query_one(
            "SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_replication_slots)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        left.get::<_, i64>(0),
        0,
        "a publication or slot was left behind"
    );
}

/// The race fences close: the feed lags (paused); a row is deleted; the application adds its key again
/// (acknowledged) and, following docs/contract.md, inserts the row only after that (its transaction still
/// open when the feed resumes). The feed's old delete must not hide the key: it carries a fence from before
/// the delete, the gate finds the key added since and refuses the tombstone (`SUPERSEDED`). A delete without
/// a re-add still becomes a tombstone.
#[tokio::test]
async fn a_stale_delete_never_hides_a_key_added_again() {
    let Some(postgres) = database().await else {
        return;
    };
    let gate = start(CONFIG).await;
    let gate_client = client(&gate).await;
    stale_delete_after_an_add(
        &postgres,
        &addr(&gate),
        &gate_client,
        std::slice::from_ref(&gate_client),
    )
    .await;
}

/// The same with replicas: the feed writes through r0, the application adds through r1, and no replica
/// answers `ABSENT` for the key added again.
#[tokio::test]
async fn a_stale_delete_never_hides_a_key_added_again_on_any_replica() {
    let Some(postgres) = database().await else {
        return;
    };
    let Some(nats) = common::nats::Nats::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = common::replicas::config_file(dir.path(), CONFIG);
    let replicas = common::replicas::start_serving(&nats.url, &config, 2, &[]).await;
    let clients: Vec<_> = replicas.iter().map(|r| r.client()).collect();
    let feed_addr = format!("http://{}", replicas[0].grpc_addr);
    stale_delete_after_an_add(&postgres, &feed_addr, &clients[1], &clients).await;
}

/// The scenario above: the feed writes to the gate at `feed_addr`, the application adds through `app`,
/// and every gate of `readers` (all serving the same state) is asked.
async fn stale_delete_after_an_add(
    postgres: &Postgres,
    feed_addr: &str,
    app: &GateClient,
    readers: &[GateClient],
) {
    let feed = Feed::start(&postgres.dsn(), feed_addr, &[]).await;
    feed.ready().await;
    let db = postgres.client().await;
    insert(&db, 1, 3).await;
    everywhere_present(readers, "1").await;
    everywhere_present(readers, "2").await;
    fenced(&feed, &readers[0]).await;

    feed.signal("STOP");
    db.batch_execute("DELETE FROM users WHERE id IN (1, 2)")
        .await
        .unwrap();
    app.clone()
        .add(existence_gate::proto::AddRequest {
            namespace: "users".into(),
            keys: vec![Bytes::from("1")],
            ..Default::default()
        })
        .await
        .unwrap();
    let mut writer = postgres.client().await;
    let insert_again = writer.transaction().await.unwrap();
    insert_again
        .execute("INSERT INTO users (id) VALUES (1)", &[])
        .await
        .unwrap();
    // Committed after the delete: once its key is in the gate, the feed has sent the delete.
    insert(&db, 100, 101).await;
    feed.signal("CONT");
    everywhere_present(readers, "100").await;

    for reader in readers {
        assert_eq!(
            leased_lookup(reader, "1").await,
            (Answer::MayExist, Basis::Filter),
            "the feed's stale delete hid a key added again before its row was inserted"
        );
        assert_eq!(
            leased_lookup(reader, "2").await,
            (Answer::Absent, Basis::Tombstone)
        );
    }
    let deletes_sent = "existence_feed_calls_total{call=\"deleted\"}";
    assert_eq!(
        feed.metric(deletes_sent).await,
        2.0,
        "both deletes were sent"
    );
    assert_eq!(
        feed.metric("existence_feed_unfenced_deletes_total").await,
        0.0
    );
    insert_again.commit().await.unwrap();
    feed.kill().await;
}

/// `key`'s answer in `users` from `gate`, once not `WARMING` (a replica without its read lease).
async fn leased_lookup(gate: &GateClient, key: &str) -> (Answer, Basis) {
    wait_until(PATIENCE, "an answer that is not WARMING", async || {
        let reply = gate
            .clone()
            .may_exist(MayExistRequest {
                namespace: "users".into(),
                key: Bytes::from(key.to_string()),
            })
            .await
            .unwrap()
            .into_inner();
        (reply.basis() != Basis::Warming).then(|| (reply.answer(), reply.basis()))
    })
    .await
}

/// Waits until every gate of `gates` answers `MAY_EXIST` for `key` from its filter.
async fn everywhere_present(gates: &[GateClient], key: &str) {
    for gate in gates {
        wait_until(PATIENCE, &format!("{key} to reach the gate"), async || {
            (leased_lookup(gate, key).await == (Answer::MayExist, Basis::Filter)).then_some(())
        })
        .await;
    }
}

/// A column several rows share, followed with `--non-unique-adds-only`: deleting one of two rows holding a
/// key leaves it `MAY_EXIST` (a tombstone would hide the other row's key), and so does deleting both.
#[tokio::test]
async fn a_non_unique_column_followed_adds_only_is_never_tombstoned() {
    let Some(postgres) = database().await else {
        return;
    };
    let gate = start(CONFIG).await;
    let db = postgres.client().await;
    db.batch_execute("CREATE TABLE tags (id bigserial PRIMARY KEY, name text)")
        .await
        .unwrap();
    let feed = Feed::start(
        &postgres.dsn(),
        &addr(&gate),
        &[
            "--table",
            "public.tags:name=users",
            "--non-unique-adds-only",
        ],
    )
    .await;
    feed.ready().await;
    db.batch_execute("INSERT INTO tags (name) VALUES ('shared'), ('shared'), ('renamed-from')")
        .await
        .unwrap();
    all_present(
        &gate,
        vec![Bytes::from("shared"), Bytes::from("renamed-from")],
    )
    .await;

    let mut marker = 0;
    let mut settle = async |statement: &str| {
        // Changes reach the gate in commit order: once a later insert's key is there, so is the change.
        marker += 1;
        db.batch_execute(&format!(
            "{statement}; INSERT INTO users (id) VALUES ({marker})"
        ))
        .await
        .unwrap();
        all_present(&gate, ids(marker..marker + 1)).await;
    };
    settle("DELETE FROM tags WHERE id = 1").await;
    assert_eq!(lookup(&gate, "shared").await.0, Answer::MayExist);
    settle("DELETE FROM tags WHERE name = 'shared'").await;
    settle("UPDATE tags SET name = 'renamed-to' WHERE name = 'renamed-from'").await;
    assert_eq!(lookup(&gate, "shared").await.0, Answer::MayExist);
    assert_eq!(lookup(&gate, "renamed-from").await.0, Answer::MayExist);
    assert_eq!(lookup(&gate, "renamed-to").await.0, Answer::MayExist);
    let deletes = "existence_feed_rows_total{table=\"public.tags\",operation=\"delete\"}";
    assert_eq!(feed.metric(deletes).await, 2.0, "the feed saw both deletes");
    feed.kill().await;
}

/// A bytea key column followed with `--key-format raw`: the gate gets the bytes an application holds.
#[tokio::test]
async fn a_bytea_key_column_is_followed_as_its_bytes() {
    let Some(postgres) = Postgres::start().await else {
        return;
    };
    postgres
        .client()
        .await
        .batch_execute("CREATE TABLE users (id bytea PRIMARY KEY)")
        .await
        .unwrap();
    let gate = start(CONFIG).await;
    let feed = Feed::start(&postgres.dsn(), &addr(&gate), &["--key-format", "raw"]).await;
    feed.ready().await;
    postgres
        .client()
        .await
        .batch_execute("INSERT INTO users VALUES ('\\x00ff10'), ('\\x6869')")
        .await
        .unwrap();
    all_present(
        &gate,
        vec![Bytes::from_static(&[0x00, 0xff, 0x10]), Bytes::from("hi")],
    )
    .await;
    feed.kill().await;
}

/// Cuts the feed off from its slot: the feed paused (SIGSTOP), its walsender ended, the slot released.
async fn cut_off(db: &tokio_postgres::Client, feed: &Feed) {
    feed.signal("STOP");
    db.execute(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'feed_slot'",
        &[],
    )
    .await
    .unwrap();
    slot_released(db).await;
}

/// Waits until no walsender holds the feed's slot: PostgreSQL releases it only once the walsender of a
/// feed that stopped or was killed has noticed.
async fn slot_released(db: &tokio_postgres::Client) {
    wait_until(PATIENCE, "the slot to be released", async || {
        let row = db
            .query_one(
                "SELECT active FROM pg_replication_slots WHERE slot_name = 'feed_slot'",
                &[],
            )
            .await
            .unwrap();
        (!row.get::<_, bool>(0)).then_some(())
    })
    .await;
}

/// Loses the feed's slot under it, as an operator's mistake or `max_slot_wal_keep_size` would: the feed
/// paused, its walsender ended, the slot dropped, then `rows` inserted while no slot records them.
async fn lose_slot(db: &tokio_postgres::Client, feed: &Feed, rows: std::ops::Range<i64>) {
    cut_off(db, feed).await;
    db.execute("SELECT pg_drop_replication_slot('feed_slot')", &[])
        .await
        .unwrap();
    insert(db, rows.start, rows.end).await;
    feed.signal("CONT");
}

/// A slot dropped under the feed: without `--recreate-slot` it says so on `/readyz` (what happened, what
/// to do) and in a gauge, and keeps retrying; restarted with it, as advised, or losing the slot while running
/// with it, the slot is created again and the rows inserted while it was gone are loaded.
#[tokio::test]
async fn a_lost_slot_is_said_and_recreated_on_request() {
    let Some(postgres) = database().await else {
        return;
    };
    let gate = start(CONFIG).await;
    let db = postgres.client().await;
    let feed = Feed::start(&postgres.dsn(), &addr(&gate), &[]).await;
    feed.ready().await;
    lose_slot(&db, &feed, 0..100).await;
    let body = wait_until(PATIENCE, "/readyz to say the slot is gone", async || {
        let (status, body) = common::try_http_get(feed.http, "/readyz").await.ok()?;
        (status == 503 && body.contains("is gone")).then_some(body)
    })
    .await;
    assert!(
        body.contains("replication slot feed_slot is gone") && body.contains("--recreate-slot"),
        "{body}"
    );
    assert_eq!(feed.metric("existence_feed_slot_lost").await, 1.0);
    assert_eq!(
        present(&gate, ids(0..100)).await,
        0,
        "nothing follows a lost slot"
    );
    feed.kill().await;

    // Restarted with --recreate-slot, as /readyz advised: it finds no slot at start, and creates it with
    // every key of the tables (it once took the fresh-start path, loading nothing, while /readyz said 200).
    let feed = Feed::start(&postgres.dsn(), &addr(&gate), &["--recreate-slot"]).await;
    feed.ready().await;
    all_present(&gate, ids(0..100)).await;
    lose_slot(&db, &feed, 100..200).await;
    all_present(&gate, ids(0..200)).await;
    feed.ready().await;
    insert(&db, 200, 300).await;
    all_present(&gate, ids(200..300)).await;
    assert_eq!(feed.metric("existence_feed_slot_lost").await, 0.0);
    feed.kill().await;
}

/// A database, a gate and a feed following it, rows 0..50 inserted and in the gate; `None` without
/// PostgreSQL.
async fn fed_fifty_rows() -> Option<(Postgres, RunningServer, tokio_postgres::Client, Feed)> {
    let postgres = database().await?;
    let gate = start(CONFIG).await;
    let db = postgres.client().await;
    let feed = Feed::start(&postgres.dsn(), &addr(&gate), &[]).await;
    feed.ready().await;
    insert(&db, 0, 50).await;
    all_present(&gate, ids(0..50)).await;
    Some((postgres, gate, db, feed))
}

/// A feed restarted with no slot where its namespace already holds writes — the slot was dropped while the
/// feed was stopped — refuses to create it with nothing loaded, naming `--recreate-slot` (it once created
/// a plain slot and followed changes from then on: the rows inserted while it was down answered `ABSENT`,
/// `/readyz` 200); started so, it loads them.
#[tokio::test]
async fn a_feed_restarted_without_its_slot_refuses_to_skip_what_it_missed() {
    let Some((postgres, gate, db, feed)) = fed_fifty_rows().await else {
        return;
    };
    feed.kill().await;
    slot_released(&db).await;
    db.execute("SELECT pg_drop_replication_slot('feed_slot')", &[])
        .await
        .unwrap();
    insert(&db, 50, 100).await;
    let output = feed_command(&postgres.dsn(), &addr(&gate), &[])
        .output()
        .await
        .expect("the binary runs");
    assert!(!output.status.success(), "{output:?}");
    let refused = String::from_utf8_lossy(&output.stderr)
        .trim_end()
        .to_string();
    assert_eq!(refused.lines().count(), 1, "not one line: {refused}");
    assert!(
        refused.contains("already holds writes") && refused.contains("--recreate-slot"),
        "{refused}"
    );
    let feed = Feed::start(&postgres.dsn(), &addr(&gate), &["--recreate-slot"]).await;
    feed.ready().await;
    all_present(&gate, ids(50..100)).await;
    feed.kill().await;
}

/// Another client consumes the feed's slot while the feed is paused (its walsender ended): `rows` are
/// inserted, then the slot is advanced past them, as a second feed or `pg_logical_slot_get_changes` would.
async fn consume_slot(db: &tokio_postgres::Client, feed: &Feed, rows: std::ops::Range<i64>) {
    cut_off(db, feed).await;
    insert(db, rows.start, rows.end).await;
    // A slot advances only as far as WAL is flushed, which `synchronous_commit = off` leaves behind: a
    // switch to the next WAL segment flushes the rows' WAL, and the slot is advanced past it.
    db.execute("SELECT pg_switch_wal()", &[]).await.unwrap();
    db.execute(
        "SELECT pg_replication_slot_advance('feed_slot', pg_current_wal_lsn())",
        &[],
    )
    .await
    .unwrap();
    feed.signal("CONT");
}

/// A slot consumed by another client while the feed was cut off: the feed sees its confirmed position moved
/// past its own when it reconnects, says so on `/readyz` with what to do (it once resumed after the
/// consumed changes without a word, their keys answering ABSENT while `/readyz` said 200); following that
/// advice, or running with `--recreate-slot`, loads every key again.
#[tokio::test]
async fn a_slot_consumed_by_another_client_is_said_and_recreated_on_request() {
    let Some((postgres, gate, db, feed)) = fed_fifty_rows().await else {
        return;
    };
    consume_slot(&db, &feed, 50..100).await;
    let body = wait_until(
        PATIENCE,
        "/readyz to say the slot was consumed",
        async || {
            let (status, body) = common::try_http_get(feed.http, "/readyz").await.ok()?;
            (status == 503 && body.contains("consumed by another client")).then_some(body)
        },
    )
    .await;
    assert!(
        body.contains("pg_drop_replication_slot('feed_slot')"),
        "{body}"
    );
    assert_eq!(present(&gate, ids(50..100)).await, 0);
    feed.kill().await;

    // As advised: drop the slot, restart with --recreate-slot.
    db.execute("SELECT pg_drop_replication_slot('feed_slot')", &[])
        .await
        .unwrap();
    let feed = Feed::start(&postgres.dsn(), &addr(&gate), &["--recreate-slot"]).await;
    feed.ready().await;
    all_present(&gate, ids(50..100)).await;
    insert(&db, 100, 110).await;
    all_present(&gate, ids(100..110)).await;
    // Consumed while it runs with --recreate-slot: created again and loaded at once.
    consume_slot(&db, &feed, 110..160).await;
    all_present(&gate, ids(110..160)).await;
    feed.kill().await;
}

fn lsn(text: &str) -> u64 {
    let (high, low) = text.split_once('/').expect("an LSN");
    (u64::from_str_radix(high, 16).unwrap() << 32) | u64::from_str_radix(low, 16).unwrap()
}

/// Where the next WAL record goes: everything committed so far ends at or before it (the *write* position
/// can trail behind, with `synchronous_commit = off`).
async fn current_lsn(db: &impl tokio_postgres::GenericClient) -> u64 {
    let row = db
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .unwrap();
    lsn(&row.get::<_, String>(0))
}
