//! `--initial-load`: the slot is created with an exported snapshot, every followed table is read within
//! that snapshot, and only then does the stream start, from the slot's start.
//!
//! The snapshot shows exactly the transactions committed before the slot's consistent point, and the
//! stream carries exactly those committed after it: every committed key reaches the gate, by one or the
//! other, and there is no window in which a committed key is missing — however many inserts run meanwhile.
//! (The exported snapshot lives only until the session that exported it runs its next command: it is
//! imported first, then the stream is started on that same session.)

use bytes::Bytes;
use futures_util::StreamExt;
use pgwire_replication::ReplicationClient;
use tokio::task::JoinSet;
use tokio_postgres::{Client, IsolationLevel};

use super::batch::Call;
use super::changes::{quote, FollowedTable};
use super::follow::{GateWriter, Stop};
use crate::client::postgres::first_field;

/// Creates the slot `slot` on the gated `session` with an exported snapshot and loads `tables` within it
/// through `writer`, `batch` keys per `Add`; returns the keys loaded per table.
pub async fn load(
    session: &mut ReplicationClient,
    client: &mut Client,
    slot: &str,
    tables: &[FollowedTable],
    writer: &GateWriter,
    batch: usize,
) -> Result<Vec<(String, u64)>, String> {
    let created = session
        .simple_query(&format!(
            "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'export')",
            quote(slot)
        ))
        .await
        .map_err(|e| {
            format!(
                "cannot create replication slot {slot} with an exported snapshot: {e}; the user needs the \
                 REPLICATION attribute"
            )
        })?;
    // Columns: slot_name, consistent_point, snapshot_name, output_plugin.
    let snapshot = created
        .first()
        .and_then(|row| row.get(2).cloned().flatten())
        .map(|name| String::from_utf8_lossy(&name).into_owned())
        .ok_or_else(|| format!("creating slot {slot} exported no snapshot"))?;
    tracing::info!(slot, %snapshot, "replication slot created; loading the tables within its snapshot");
    let transaction = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(|e| format!("cannot start the initial load's transaction: {e}"))?;
    transaction
        .batch_execute(&format!("SET TRANSACTION SNAPSHOT '{snapshot}'"))
        .await
        .map_err(|e| format!("cannot import the slot's snapshot {snapshot}: {e}"))?;
    let mut loaded = Vec::new();
    for table in tables {
        let copy = format!(
            "COPY (SELECT {column}::text FROM {name} WHERE {column} IS NOT NULL) TO STDOUT",
            column = quote(&table.column),
            name = table.quoted()
        );
        let rows = transaction
            .copy_out(copy.as_str())
            .await
            .map_err(|e| format!("cannot read table {}: {e}", table.name()))?;
        let keys = send_rows(Box::pin(rows), table, writer, batch).await?;
        tracing::info!(table = %table.name(), keys, "table loaded");
        loaded.push((table.name(), keys));
    }
    transaction
        .commit()
        .await
        .map_err(|e| format!("cannot end the initial load's transaction: {e}"))?;
    Ok(loaded)
}

/// `Add`s of one table's keys in flight at once during the initial load: as `load` does (its default), so
/// that the load is not one round trip per batch; their order does not matter, every change is an `Add`.
const LOAD_IN_FLIGHT: usize = 4;

/// Sends the keys of a `COPY` as `Add`s of `batch` keys, [`LOAD_IN_FLIGHT`] at a time (tasks of their own,
/// so they progress while rows are read); returns how many.
async fn send_rows(
    mut rows: std::pin::Pin<Box<tokio_postgres::CopyOutStream>>,
    table: &FollowedTable,
    writer: &GateWriter,
    batch: usize,
) -> Result<u64, String> {
    let mut keys: Vec<Bytes> = Vec::with_capacity(batch);
    let mut sent = 0;
    let mut in_flight = JoinSet::new();
    loop {
        let row = rows.next().await;
        let done = row.is_none();
        if let Some(row) = row {
            let row = row.map_err(|e| format!("reading table {} failed: {e}", table.name()))?;
            keys.extend(first_field(&row));
        }
        if keys.len() >= batch || (done && !keys.is_empty()) {
            sent += keys.len() as u64;
            let call = Call::Add {
                namespace: table.namespace.clone(),
                keys: std::mem::replace(&mut keys, Vec::with_capacity(batch)),
            };
            let writer = writer.clone();
            in_flight.spawn(async move { writer.send(call).await });
            while in_flight.len() >= LOAD_IN_FLIGHT {
                settled(in_flight.join_next().await)?;
            }
        }
        if done {
            while !in_flight.is_empty() {
                settled(in_flight.join_next().await)?;
            }
            return Ok(sent);
        }
    }
}

/// The outcome of one `Add` of the load, as the load's error.
fn settled(sent: Option<Result<Result<(), Stop>, tokio::task::JoinError>>) -> Result<(), String> {
    match sent {
        None | Some(Ok(Ok(()))) => Ok(()),
        Some(Ok(Err(
            Stop::Fatal(reason)
            | Stop::Session(reason)
            | Stop::SlotLost(reason)
            | Stop::SlotConsumed(reason),
        ))) => Err(reason),
        Some(Err(error)) => Err(format!("an Add of the initial load failed: {error}")),
    }
}
