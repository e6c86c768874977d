//! `existence-gate feed`: a long-running process that follows tables of a PostgreSQL database through
//! logical replication and keeps the gate complete for every writer that never calls `Add` (a batch job,
//! a migration, a fix by hand in SQL): an insert becomes an `Add` of its key, a delete a
//! `RecordAbsent(DELETED)`, a key-changing update both; a truncate is logged and counted (rebuild).
//!
//! - [`pgoutput`]: decoding of the replication messages.
//! - [`changes`]: what a table's changes mean for the gate (keys that exist, keys deleted).
//! - [`batch`]: those changes as few gate calls as their order allows.
//! - [`fence`]: the gate seq each delete carries, written into the WAL, so a stale delete is refused.
//! - [`follow`]: the loop — events in, calls out, the slot confirmed only after the gate acknowledged.
//! - [`setup`]: the checks and the publication and slot it creates, each refusal naming what to fix.
//! - [`initial_load`]: `--initial-load`, the tables read within the new slot's snapshot.
//! - [`metrics`] and [`health`]: its own `/metrics`, `/healthz` and `/readyz`.
//!
//! The replication protocol is `pgwire-replication` (0.5.0, pinned in `Cargo.toml` with the reasons);
//! `pgoutput` is decoded here, behind [`pgoutput::decode`], with its own tests.

pub mod batch;
pub mod changes;
pub mod fence;
pub mod follow;
pub mod health;
pub mod initial_load;
pub mod metrics;
pub mod pgoutput;
pub mod setup;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use pgwire_replication::{PgWireError, ReplicationClient, ReplicationConfig, TlsConfig};
use tokio_postgres::config::{Host, SslMode};

use crate::client::connection::{ConnectArgs, Gate};
use crate::client::postgres::KeyFormat;
use crate::core::config::parse_duration;
use changes::{FollowedTable, Tables};
use fence::Fencer;
use follow::{Follower, GateWriter, Stop};
use health::Health;

/// How often the WAL the slot holds back is measured.
const RETAINED_EVERY: Duration = Duration::from_secs(5);
/// The pause before reconnecting to PostgreSQL after a session that had started; doubled after each
/// attempt that did not get as far, up to `MAX_RECONNECT_PAUSE`.
const FIRST_RECONNECT_PAUSE: Duration = Duration::from_millis(100);
const MAX_RECONNECT_PAUSE: Duration = Duration::from_secs(5);

/// The `feed` subcommand's flags.
#[derive(Debug, Args)]
pub struct FeedArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// The database to follow: postgres://USER:PASSWORD@HOST:PORT/DATABASE (or key=value pairs). The user
    /// needs the REPLICATION attribute, and to create the publication, ownership of the tables.
    #[arg(long, env = "EXISTENCE_GATE_POSTGRES", hide_env_values = true)]
    pub postgres: String,
    /// A table to follow, SCHEMA.TABLE:COLUMN=NAMESPACE: COLUMN's values (as text) are keys of NAMESPACE.
    /// Repeat for several tables. COLUMN must be unique (a primary key or unique index on it alone) and in
    /// the table's replica identity.
    #[arg(long = "table", required = true)]
    pub tables: Vec<FollowedTable>,
    /// The logical replication slot (created if missing). It keeps WAL until the feed confirms it: drop an
    /// abandoned one (SELECT pg_drop_replication_slot('NAME')).
    #[arg(long)]
    pub slot: String,
    /// The publication (created for the tables if missing; an existing one must publish them).
    #[arg(long)]
    pub publication: String,
    /// When the slot is created here: load every key of the tables within the slot's snapshot first, so the
    /// gate misses no committed key. Ignored when the slot exists (it was loaded when it was created).
    #[arg(long)]
    pub initial_load: bool,
    /// How a column's value becomes a key. text: its text form, as psql prints it (and `load --postgres`
    /// takes it); hex: a bytea's bytes as lowercase hexadecimal; raw: a bytea's bytes themselves (what an
    /// application holding the bytes passes to MayExist). hex and raw take bytea columns only.
    #[arg(long, value_enum, default_value_t = KeyFormat::Text)]
    pub key_format: KeyFormat,
    /// Follow a column no unique index covers alone (several rows may hold one key) by sending its inserts
    /// and new keys only: its deletes are not sent, since the key may live on in another row, so such keys
    /// answer MAY_EXIST until their window expires or a rebuild. Without it such a column is refused.
    #[arg(long)]
    pub non_unique_adds_only: bool,
    /// When the slot is gone (dropped, or invalidated by max_slot_wal_keep_size), at start or while
    /// following it: create it again and load every key of the tables within its snapshot, as
    /// --initial-load does, then follow it. Without it the feed says what happened on /readyz and in its
    /// log, and retries until the slot is back.
    #[arg(long)]
    pub recreate_slot: bool,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, default_value = "127.0.0.1:9465")]
    pub http_listen: SocketAddr,
    /// Keys per Add (at most the gate's max_batch_keys), and keys waiting that trigger a send.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// How long committed changes may wait to share a call with the next ones.
    #[arg(long, default_value = "5ms", value_parser = parse_duration)]
    pub linger: Duration,
}

/// Runs the feed until `stop` resolves (Ctrl-C, SIGTERM) or something only the operator can fix happens.
pub async fn run(
    mut args: FeedArgs,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let prometheus = crate::service::metrics::install_recorder();
    let health = Arc::new(Health::default());
    let http = health::serve(args.http_listen, prometheus, Arc::clone(&health)).await?;
    let config: tokio_postgres::Config = args.postgres.parse().map_err(|e| {
        format!(
            "invalid --postgres: {e}; write it as postgres://USER:PASSWORD@HOST:PORT/DATABASE or \
             \"host=HOST port=PORT user=USER dbname=DATABASE\""
        )
    })?;
    let replication = replication_config(&config, &args)?;
    let (mut client, server) = crate::client::postgres::connect(&config).await?;
    setup::check_wal_level(&client).await?;
    for table in &mut args.tables {
        setup::check_table(&client, table, args.non_unique_adds_only).await?;
        setup::check_key_format(&client, table, args.key_format).await?;
    }
    // The gate is checked before anything is created in PostgreSQL: a refused start leaves nothing behind.
    let writer = GateWriter {
        gate: Gate::connect(&args.connect).await?.gate(),
        metrics: metrics::FeedMetrics,
    };
    for namespace in args.tables.iter().map(|t| &t.namespace) {
        writer.check_writable(namespace).await?;
    }
    setup::ensure_publication(&client, &args.publication, &args.tables).await?;
    let mut first = None;
    if !setup::slot_exists(&client, &args.slot).await? {
        // --recreate-slot at start, as a lost slot's message advises, is a slot to create with every key: a
        // plain create would follow changes from now on and load none of the rows inserted while it was
        // gone.
        if args.initial_load || args.recreate_slot {
            let mut session = connect_gated(&replication, &server).await?;
            let loaded = initial_load::load(
                &mut session,
                &mut client,
                &args.slot,
                &args.tables,
                &writer,
                args.batch,
            )
            .await?;
            tracing::info!(?loaded, "initial load done; following the slot");
            first = Some(session);
        } else {
            refuse_without_catch_up(&writer, &args).await?;
            setup::create_slot(&client, &args.slot).await?;
        }
    }
    // The first fence at start, so a user who may not write one is told in one line; then every
    // `FENCE_EVERY` while the gate's seqs move, and when a session asks.
    let client = Arc::new(client);
    let fence_wanted = Arc::new(tokio::sync::Notify::new());
    let fencer = Fencer::new(
        writer.gate.clone(),
        Arc::clone(&client),
        &args.slot,
        args.tables.iter().map(|t| t.namespace.clone()),
        Arc::clone(&fence_wanted),
    );
    let fenced = fencer.fence().await?;
    let fencing = tokio::spawn(fencer.run(fenced));
    let retained = tokio::spawn(watch_retained(
        Arc::clone(&client),
        args.slot.clone(),
        writer.metrics,
    ));
    let confirmed = AtomicU64::new(0);
    let mut tables = Tables::new(args.tables.clone(), args.key_format);
    let follow = async {
        let mut pause = FIRST_RECONNECT_PAUSE;
        let mut told_slot_lost = false;
        loop {
            let moved = consumed_elsewhere(&client, &args.slot, &confirmed).await;
            let session = match (moved, first.take()) {
                (Some(moved), _) => Err(Stop::SlotConsumed(moved)),
                (None, Some(session)) => Ok(session),
                (None, None) => connect_gated(&replication, &server)
                    .await
                    .map_err(Stop::Session),
            };
            let stopped = match session {
                Ok(mut session) => {
                    let follower = Follower {
                        writer: &writer,
                        tables: &mut tables,
                        batch_keys: args.batch,
                        linger: args.linger,
                        slot: &args.slot,
                        fence_wanted: &fence_wanted,
                        confirmed: &confirmed,
                    };
                    let (started, stopped) = follow_session(&mut session, follower, &health).await;
                    if started {
                        (pause, told_slot_lost) = (FIRST_RECONNECT_PAUSE, false);
                        writer.metrics.slot_lost(false);
                    }
                    stopped
                }
                Err(stop) => stop,
            };
            let reason = match stopped {
                Stop::Fatal(reason) => return reason,
                Stop::SlotLost(reason) | Stop::SlotConsumed(reason) if args.recreate_slot => {
                    tracing::warn!(%reason, slot = %args.slot, "the replication slot lost changes: creating it again and loading every key of the tables (--recreate-slot)");
                    match recreate_slot(&config, &replication, &server, &args, &writer).await {
                        Ok(session) => {
                            confirmed.store(0, Ordering::Relaxed);
                            first = Some(session);
                            continue;
                        }
                        Err(reason) => {
                            format!("recreating replication slot {}: {reason}", args.slot)
                        }
                    }
                }
                stop @ (Stop::SlotLost(_) | Stop::SlotConsumed(_)) => {
                    writer.metrics.slot_lost(true);
                    let lost = slot_lost(&args.slot, &stop);
                    if !told_slot_lost {
                        tracing::error!("{lost}");
                        told_slot_lost = true;
                    }
                    lost
                }
                Stop::Session(reason) => {
                    tracing::warn!(%reason, ?pause, "replication session ended; reconnecting");
                    format!("disconnected from PostgreSQL at {server}: {reason}")
                }
            };
            health.not_ready(reason);
            writer.metrics.connected(false);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_RECONNECT_PAUSE);
        }
    };
    let result = tokio::select! {
        reason = follow => Err(reason),
        () = stop => Ok(()),
    };
    retained.abort();
    fencing.abort();
    http.abort();
    result
}

/// Starts streaming on `session` and follows it until it stops; whether it started.
/// Refuses to create the slot with nothing loaded where a followed namespace already holds writes: the
/// slot would follow changes from now on, and rows committed before — while a slot this feed followed was
/// gone, or before the feed ever ran — would be missing from the gate, answering `ABSENT`. (Dropped while
/// the feed was stopped, a slot was re-created so and lost every row inserted meanwhile, with `/readyz`
/// 200.) A namespace's seq moves past the first only with a write, and any role the feed may hold can
/// read it (`CurrentSeq`).
async fn refuse_without_catch_up(writer: &GateWriter, args: &FeedArgs) -> Result<(), String> {
    for table in &args.tables {
        let seq = fence::current_seq(&writer.gate, &table.namespace).await?;
        if seq > crate::core::log::GENESIS_SEQ {
            return Err(format!(
                "the replication slot {:?} does not exist, but namespace {:?} already holds writes (seq \
                 {seq}): a slot created now follows changes from now on, and rows of {} committed before it \
                 (while a slot this feed followed was gone, or before the feed first ran) would be missing \
                 from the gate. Start the feed with --recreate-slot (or --initial-load): it creates the slot \
                 and loads every key of the tables within its snapshot, then follows it",
                args.slot, table.namespace, table.table
            ));
        }
    }
    Ok(())
}

async fn follow_session(
    session: &mut ReplicationClient,
    mut follower: Follower<'_>,
    health: &Health,
) -> (bool, Stop) {
    let started = match session.start().await {
        Ok(()) => session.wait_started().await,
        Err(error) => Err(error),
    };
    if let Err(error) = started {
        return (false, start_refused(error));
    }
    health.ready();
    follower.writer.metrics.connected(true);
    tracing::info!(slot = %follower.slot, "following the replication slot");
    (true, follower.follow(session).await)
}

/// Why `START_REPLICATION` failed: the slot gone (dropped: SQLSTATE 42704; invalidated by
/// `max_slot_wal_keep_size`: 55000, "can no longer get changes from replication slot"), or a session
/// error to retry.
fn start_refused(error: PgWireError) -> Stop {
    match &error {
        PgWireError::Server(message)
            if message.contains("(SQLSTATE 42704)")
                || (message.contains("(SQLSTATE 55000)")
                    && message.contains("replication slot")) =>
        {
            Stop::SlotLost(message.clone())
        }
        _ => Stop::Session(error.to_string()),
    }
}

/// What a lost or consumed slot means and what to do, as one line for the log and `/readyz`.
fn slot_lost(slot: &str, stop: &Stop) -> String {
    match stop {
        Stop::SlotConsumed(moved) => format!(
            "replication slot {slot} was consumed by another client ({moved}): the changes it took are not \
             followed, so keys inserted meanwhile are missing from the gate. Start this feed with \
             --recreate-slot to have it create the slot again and load every key of the tables when this \
             happens; now, drop the slot (SELECT pg_drop_replication_slot('{slot}')) and restart the feed \
             with --recreate-slot (a restarted feed cannot tell a consumed slot from its own); retrying \
             meanwhile"
        ),
        Stop::SlotLost(reason) | Stop::Session(reason) | Stop::Fatal(reason) => format!(
            "replication slot {slot} is gone ({reason}): it was dropped, or PostgreSQL invalidated it \
             (max_slot_wal_keep_size), and changes made since are not followed, so keys inserted meanwhile \
             are missing from the gate. Restart the feed with --recreate-slot to create it again and load \
             every key of the tables, or create it (--initial-load) and rebuild the namespaces; retrying \
             meanwhile"
        ),
    }
}

/// Why the slot's confirmed position is past where this feed left it, if it is: another client consumed it
/// (a second feed on the same slot, `pg_logical_slot_get_changes`, `pg_replication_slot_advance`), and the
/// changes it took never reached the gate — while this feed, reconnecting, would resume after them without
/// a word. Checked before each session; `confirmed` is where this feed left the slot (0: not known yet,
/// then the slot's position now is taken as where it starts).
async fn consumed_elsewhere(
    client: &tokio_postgres::Client,
    slot: &str,
    confirmed: &AtomicU64,
) -> Option<String> {
    let ours = confirmed.load(Ordering::Relaxed);
    let theirs = setup::confirmed_position(client, slot).await.ok()??;
    if ours == 0 {
        // Where this feed starts following: its own from now on.
        confirmed.store(theirs, Ordering::Relaxed);
        return None;
    }
    (theirs > ours).then(|| {
        format!(
            "its confirmed position moved from {} to {} without this feed",
            pgwire_replication::Lsn::from_u64(ours),
            pgwire_replication::Lsn::from_u64(theirs)
        )
    })
}

/// Drops what is left of `args.slot` (an invalidated slot still exists) and creates it again with an
/// initial load, on a new session that then follows it.
async fn recreate_slot(
    config: &tokio_postgres::Config,
    replication: &ReplicationConfig,
    server: &str,
    args: &FeedArgs,
    writer: &GateWriter,
) -> Result<ReplicationClient, String> {
    let (mut client, _) = crate::client::postgres::connect(config).await?;
    if setup::slot_exists(&client, &args.slot).await? {
        setup::drop_slot(&client, &args.slot).await?;
    }
    let mut session = connect_gated(replication, server).await?;
    let loaded = initial_load::load(
        &mut session,
        &mut client,
        &args.slot,
        &args.tables,
        writer,
        args.batch,
    )
    .await?;
    tracing::info!(
        ?loaded,
        "replication slot created again and the tables loaded; following it"
    );
    Ok(session)
}

/// A replication session, authenticated and waiting for `START_REPLICATION`.
async fn connect_gated(
    config: &ReplicationConfig,
    server: &str,
) -> Result<ReplicationClient, String> {
    let mut session = ReplicationClient::connect_gated(config.clone())
        .await
        .map_err(|e| {
            format!("cannot open a replication session with PostgreSQL at {server}: {e}")
        })?;
    // The first command shows whether connecting and authenticating worked.
    session.identify_system().await.map_err(|e| match e {
        PgWireError::Io(_) | PgWireError::Task(_) => format!(
            "cannot reach PostgreSQL at {server} for a replication session: {e}; is it running, and is \
             --postgres right?"
        ),
        _ => format!(
            "PostgreSQL at {server} refused the replication session: {e}; the user needs the REPLICATION \
             attribute and a `replication` line in pg_hba.conf"
        ),
    })?;
    Ok(session)
}

/// The replication client's settings from the DSN: the same server, user and database, no TLS (the feed
/// runs beside the database or the gate; a DSN that requires TLS is refused).
fn replication_config(
    config: &tokio_postgres::Config,
    args: &FeedArgs,
) -> Result<ReplicationConfig, String> {
    if config.get_ssl_mode() == SslMode::Require {
        return Err(
            "--postgres asks for sslmode=require, but the feed connects without TLS: run it beside the \
             database (or the gate) and use sslmode=disable"
                .to_string(),
        );
    }
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(name)) => name.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_string(),
    };
    let password = config
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let user = config.get_user().unwrap_or("postgres");
    let database = config.get_dbname().unwrap_or(user);
    Ok(ReplicationConfig::new(
        host,
        user,
        password,
        database,
        args.slot.clone(),
        args.publication.clone(),
    )
    .with_port(config.get_ports().first().copied().unwrap_or(5432))
    .with_tls(TlsConfig::disabled())
    .with_status_interval(Duration::from_secs(1))
    .with_application_name("existence-gate feed"))
}

/// Measures the WAL the slot holds back, every [`RETAINED_EVERY`].
async fn watch_retained(
    client: Arc<tokio_postgres::Client>,
    slot: String,
    metrics: metrics::FeedMetrics,
) {
    let mut ticks = tokio::time::interval(RETAINED_EVERY);
    loop {
        ticks.tick().await;
        match setup::retained_wal(&client, &slot).await {
            Ok(bytes) => metrics.retained(bytes),
            Err(reason) => tracing::debug!(%reason, "cannot measure the slot's retained WAL"),
        }
    }
}
