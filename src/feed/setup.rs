//! What the feed checks and creates in PostgreSQL before it follows: logical WAL, each table with its key
//! column in the replica identity, the publication, the slot — each refusal a line naming what to fix.
//!
//! Privileges: creating the publication needs `CREATE` on the database and ownership of the tables (or
//! a superuser); creating the slot and following it need the `REPLICATION` attribute
//! (`ALTER ROLE feeder REPLICATION`) and a `replication` line for the user in `pg_hba.conf`. Create both
//! ahead as an administrator and the feed uses them as they are.

use tokio_postgres::Client;

use super::changes::{quote, FollowedTable};
use crate::client::postgres::KeyFormat;

/// What PostgreSQL said, as a line.
pub(super) fn said(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => crate::client::failure::chain(error),
    }
}

/// Checks that PostgreSQL writes logical WAL.
pub async fn check_wal_level(client: &Client) -> Result<(), String> {
    let row = client
        .query_one("SHOW wal_level", &[])
        .await
        .map_err(|e| format!("cannot read wal_level: {}", said(&e)))?;
    let level: String = row.get(0);
    if level != "logical" {
        return Err(format!(
            "PostgreSQL runs with wal_level = {level}: logical replication needs wal_level = logical in \
             postgresql.conf (then restart PostgreSQL)"
        ));
    }
    Ok(())
}

/// Checks that `table` exists and has its key column, that the column identifies one row (a primary key or
/// unique index on it alone), and that it is part of its replica identity (its primary key, the `REPLICA
/// IDENTITY USING INDEX` index, or `REPLICA IDENTITY FULL`): otherwise a delete would not carry the key, and
/// the gate could not be told.
///
/// Uniqueness matters because a delete becomes a tombstone: if two rows hold one key (a non-unique column,
/// or one column of a composite key), deleting one would make the gate answer `ABSENT` while the other
/// row still holds it. With `adds_only_if_not_unique` such a column is followed anyway, its deletes not
/// sent (`table.adds_only` is set), and then needs no replica identity.
pub async fn check_table(
    client: &Client,
    table: &mut FollowedTable,
    adds_only_if_not_unique: bool,
) -> Result<(), String> {
    let row = client
        .query_opt(
            "SELECT c.relreplident::text, a.attnum, \
                    EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid \
                            AND (i.indisprimary OR i.indisreplident)) AS keyed, \
                    EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid \
                            AND ((c.relreplident = 'd' AND i.indisprimary) \
                                 OR (c.relreplident = 'i' AND i.indisreplident)) \
                            AND a.attnum = ANY (i.indkey::int2[])) AS in_identity, \
                    EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisunique \
                            AND i.indisvalid AND i.indnkeyatts = 1 AND i.indkey[0] = a.attnum \
                            AND i.indpred IS NULL AND i.indexprs IS NULL) AS unique_alone \
             FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = $3 AND NOT a.attisdropped \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
            &[&table.schema, &table.table, &table.column],
        )
        .await
        .map_err(|e| format!("cannot look up table {}: {}", table.name(), said(&e)))?;
    let Some(row) = row else {
        return Err(format!(
            "table {} does not exist (or is not a table); fix --table",
            table.name()
        ));
    };
    let (identity, column, keyed, in_identity, unique): (String, Option<i16>, bool, bool, bool) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    if column.is_none() {
        return Err(format!(
            "table {} has no column {:?}; fix --table",
            table.name(),
            table.column
        ));
    }
    if !unique {
        if !adds_only_if_not_unique {
            return Err(format!(
                "column {column:?} of table {name} is not unique (no primary key or unique index covers it \
                 alone), so deleting one row would answer ABSENT for a key another row still holds: \
                 CREATE UNIQUE INDEX ON {quoted} ({quoted_column}) if its values are unique, or follow it \
                 with --non-unique-adds-only (its deletes are then not sent; keys expire with their \
                 windows or a rebuild)",
                column = table.column,
                name = table.name(),
                quoted = table.quoted(),
                quoted_column = super::changes::quote(&table.column),
            ));
        }
        tracing::warn!(table = %table.name(), column = %table.column,
            "the column is not unique: following its inserts and new keys only, never its deletes");
        table.adds_only = true;
        return Ok(());
    }
    if identity == "f" || in_identity {
        return Ok(());
    }
    let fix = format!(
        "give it a primary key on {column:?}, or run ALTER TABLE {name} REPLICA IDENTITY FULL",
        column = table.column,
        name = table.quoted()
    );
    Err(if !keyed || identity == "n" {
        format!(
            "table {} has no primary key or replica identity, so its deletes carry no key: {fix}",
            table.name()
        )
    } else {
        format!(
            "column {:?} is not part of the replica identity of table {}, so deletes do not carry it: {fix}",
            table.column,
            table.name()
        )
    })
}

/// Checks that `table`'s key column is a bytea when `format` takes bytea values (`hex`, `raw`).
pub async fn check_key_format(
    client: &Client,
    table: &FollowedTable,
    format: KeyFormat,
) -> Result<(), String> {
    if format == KeyFormat::Text {
        return Ok(());
    }
    let row = client
        .query_one(
            "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND a.attname = $3 AND NOT a.attisdropped",
            &[&table.schema, &table.table, &table.column],
        )
        .await
        .map_err(|e| format!("cannot look up table {}: {}", table.name(), said(&e)))?;
    let column_type: String = row.get(0);
    if column_type != "bytea" {
        return Err(format!(
            "column {:?} of table {} is {column_type}, and --key-format {} takes bytea columns only \
             (use --key-format text)",
            table.column,
            table.name(),
            format.name()
        ));
    }
    Ok(())
}

/// Uses the publication `name`, creating it for `tables` if missing; an existing one must publish them.
pub async fn ensure_publication(
    client: &Client,
    name: &str,
    tables: &[FollowedTable],
) -> Result<(), String> {
    let exists = client
        .query_opt("SELECT 1 FROM pg_publication WHERE pubname = $1", &[&name])
        .await
        .map_err(|e| format!("cannot look up publication {name}: {}", said(&e)))?
        .is_some();
    let list = tables
        .iter()
        .map(FollowedTable::quoted)
        .collect::<Vec<_>>()
        .join(", ");
    if !exists {
        let create = format!("CREATE PUBLICATION {} FOR TABLE {list}", quote(name));
        client.batch_execute(&create).await.map_err(|e| {
            format!(
                "cannot create publication {name}: {}; create it as the tables' owner: {create}",
                said(&e)
            )
        })?;
        tracing::info!(publication = name, tables = %list, "publication created");
        return Ok(());
    }
    for table in tables {
        let published = client
            .query_opt(
                "SELECT 1 FROM pg_publication_tables \
                 WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
                &[&name, &table.schema, &table.table],
            )
            .await
            .map_err(|e| format!("cannot read publication {name}: {}", said(&e)))?
            .is_some();
        if !published {
            return Err(format!(
                "publication {name} does not publish {}: ALTER PUBLICATION {} ADD TABLE {}",
                table.name(),
                quote(name),
                table.quoted()
            ));
        }
    }
    Ok(())
}

/// Whether the slot `name` exists; an existing one must be a `pgoutput` slot of this database.
pub async fn slot_exists(client: &Client, name: &str) -> Result<bool, String> {
    let row = client
        .query_opt(
            "SELECT plugin, database = current_database() FROM pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await
        .map_err(|e| format!("cannot look up replication slot {name}: {}", said(&e)))?;
    match row {
        None => Ok(false),
        Some(row) => {
            let (plugin, here): (Option<String>, Option<bool>) = (row.get(0), row.get(1));
            if plugin.as_deref() != Some("pgoutput") || here != Some(true) {
                return Err(format!(
                    "replication slot {name} exists but is not a pgoutput slot of this database (plugin \
                     {plugin:?}); pick another --slot, or drop it: SELECT pg_drop_replication_slot('{name}')"
                ));
            }
            Ok(true)
        }
    }
}

/// Creates the logical slot `name` with `pgoutput`, starting at the current WAL position.
pub async fn create_slot(client: &Client, name: &str) -> Result<(), String> {
    client
        .query_one(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&name],
        )
        .await
        .map_err(|e| {
            format!(
                "cannot create replication slot {name}: {}; the user needs the REPLICATION attribute \
                 (ALTER ROLE ... REPLICATION)",
                said(&e)
            )
        })?;
    tracing::info!(slot = name, "replication slot created");
    Ok(())
}

/// Drops the slot `name` (one PostgreSQL invalidated, before it is created again).
pub async fn drop_slot(client: &Client, name: &str) -> Result<(), String> {
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&name])
        .await
        .map_err(|e| format!("cannot drop replication slot {name}: {}", said(&e)))?;
    tracing::info!(slot = name, "replication slot dropped");
    Ok(())
}

/// How much WAL the slot holds back, in bytes (what an abandoned slot would keep growing).
pub async fn retained_wal(client: &Client, name: &str) -> Result<u64, String> {
    let row = client
        .query_opt(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await
        .map_err(|e| format!("cannot read replication slot {name}: {}", said(&e)))?;
    Ok(row
        .and_then(|row| row.get::<_, Option<i64>>(0))
        .map_or(0, |bytes| bytes.max(0) as u64))
}

/// Where `name`'s consumer has confirmed it up to (`confirmed_flush_lsn`, as a u64); `None` if the slot is
/// gone.
pub async fn confirmed_position(client: &Client, name: &str) -> Result<Option<u64>, String> {
    let row = client
        .query_opt(
            "SELECT pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint FROM pg_replication_slots \
             WHERE slot_name = $1",
            &[&name],
        )
        .await
        .map_err(|e| format!("cannot read replication slot {name}: {}", said(&e)))?;
    Ok(row
        .and_then(|row| row.get::<_, Option<i64>>(0))
        .map(|lsn| lsn.max(0) as u64))
}
