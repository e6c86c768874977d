//! The PostgreSQL change feed as an operator runs it: the real binary following a real PostgreSQL 15
//! (logical replication, `pgoutput`) into a real gate on loopback ports.

mod common;

use std::net::SocketAddr;

use bytes::Bytes;
use common::feed::{feed_command, Feed};
use common::postgres::Postgres;
use common::*;
use existence_gate::proto::{Answer, Basis, BatchMayExistRequest, MayExistRequest};
use existence_gate::server::RunningServer;

const CONFIG: &str = "[namespaces.users]\nexpected_keys = 100000\n";

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
    db.batch_execute("CREATE TABLE unkeyed (id bigint, note text)")
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
        line.contains("no primary key") && line.contains("REPLICA IDENTITY FULL"),
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
        "{CONFIG}[[tokens]]\nname = \"w\"\nsha256 = \"{}\"\nroles = [\"write\"]\nnamespaces = [\"*\"]\n",
        existence_gate::service::auth::hash_token("right")
    ))
    .await;
    let mut wrong_token = feed_command(&postgres.dsn(), &addr(&secured), &["--token", "wrong"]);
    let line = failure(&mut wrong_token).await;
    assert!(
        line.contains("UNAUTHENTICATED") && line.contains("--token"),
        "{line}"
    );
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
