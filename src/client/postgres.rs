//! Keys from PostgreSQL: the first column of a query, streamed with `COPY (query) TO STDOUT`, so the result is
//! never held in memory whatever its size, and each row costs one message rather than a cursor round trip.
//! The key is the column's text form — what psql would print — so `SELECT id::text FROM users` and
//! `SELECT id FROM users` give the same keys for a bigint `id`.
//!
//! The connection is made without TLS (`sslmode=disable` or `prefer`): the bootstrap runs beside the
//! database or the gate, and a DSN that requires TLS is refused with PostgreSQL's own message.

use bytes::Bytes;
use futures_util::StreamExt;
use tokio_postgres::{Client, CopyOutStream, NoTls};

use crate::client::Batch;

/// How a PostgreSQL value becomes a key (`--key-format`): the key an application passes to `MayExist` must
/// be these bytes exactly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyFormat {
    /// The value's text form, as psql prints it (`42`, a uuid in lowercase, a bytea as `\x0a1b`).
    #[default]
    Text,
    /// A bytea's bytes as lowercase hexadecimal, without the `\x` (`0a1b`).
    Hex,
    /// A bytea's bytes themselves.
    Raw,
}

impl KeyFormat {
    /// The key of a value given in its text form; `hex` and `raw` take a bytea's (`\x` and hex digits).
    pub fn key(self, text: Bytes) -> Result<Bytes, String> {
        if self == KeyFormat::Text {
            return Ok(text);
        }
        let digits = text.strip_prefix(b"\\x").ok_or_else(|| {
            format!(
                "{:?} is not a bytea value: --key-format {} takes bytea columns only",
                String::from_utf8_lossy(&text[..text.len().min(64)]),
                self.name()
            )
        })?;
        match self {
            KeyFormat::Hex => Ok(text.slice(2..)),
            _ => hex::decode(digits)
                .map(Bytes::from)
                .map_err(|e| format!("a bytea value that is not hexadecimal after \\x: {e}")),
        }
    }

    /// Its name, as written on the command line.
    pub fn name(self) -> &'static str {
        match self {
            KeyFormat::Text => "text",
            KeyFormat::Hex => "hex",
            KeyFormat::Raw => "raw",
        }
    }
}

/// The rows of a query, as keys.
pub struct QueryKeys {
    rows: std::pin::Pin<Box<CopyOutStream>>,
    /// How each value becomes a key.
    format: KeyFormat,
    /// Rows read so far, to name one in errors.
    rows_read: u64,
    /// Where PostgreSQL is, for errors (never the password).
    server: String,
    /// Rows whose first column was NULL or empty: no key.
    pub skipped: u64,
    /// Whether the COPY has ended: polling its stream again then fails.
    done: bool,
}

impl QueryKeys {
    /// Connects with `dsn` and starts streaming `query`; also returns the planner's estimate of its rows
    /// (from `EXPLAIN`, which costs a plan and no execution) for the progress bar.
    pub async fn open(
        dsn: &str,
        query: &str,
        format: KeyFormat,
    ) -> Result<(Self, Option<u64>), String> {
        let config: tokio_postgres::Config = dsn.parse().map_err(|e: tokio_postgres::Error| {
            format!(
                "invalid --postgres {}: {}; write it as postgres://USER:PASSWORD@HOST:PORT/DATABASE or \
                 \"host=HOST port=PORT user=USER dbname=DATABASE\"",
                redacted(dsn),
                crate::client::failure::chain(&e)
            )
        })?;
        let (client, server) = connect(&config).await?;
        // A query written with a trailing semicolon, as in psql, would end the COPY's parenthesis early.
        let query = query.trim().trim_end_matches(';').trim_end();
        let refused = |e: tokio_postgres::Error| query_refused(&server, e);
        let plan = client
            .query(format!("EXPLAIN {query}").as_str(), &[])
            .await
            .map_err(refused)?;
        let estimate = plan
            .first()
            .and_then(|row| row.try_get::<_, &str>(0).ok())
            .and_then(planned_rows);
        let rows = client
            .copy_out(format!("COPY ({query}) TO STDOUT").as_str())
            .await
            .map_err(refused)?;
        Ok((
            Self {
                rows: Box::pin(rows),
                format,
                rows_read: 0,
                server,
                skipped: 0,
                done: false,
            },
            estimate,
        ))
    }

    /// Up to `size` keys, or `None` once every row has been read.
    pub async fn next_batch(&mut self, size: usize) -> Result<Option<Batch>, String> {
        let mut keys = Vec::with_capacity(size);
        while keys.len() < size && !self.done {
            // PostgreSQL sends each row of a COPY TO in a message of its own.
            let Some(row) = self.rows.next().await else {
                self.done = true;
                break;
            };
            let row = row.map_err(|e| query_refused(&self.server, e))?;
            self.rows_read += 1;
            match first_field(&row) {
                Some(value) if !value.is_empty() => {
                    let key = self
                        .format
                        .key(value)
                        .map_err(|e| format!("row {} of the query: {e}", self.rows_read))?;
                    keys.push(key);
                }
                _ => self.skipped += 1,
            }
        }
        Ok((!keys.is_empty()).then_some(Batch {
            keys,
            input_bytes: 0,
        }))
    }
}

/// Connects as `config` says; returns the client (its connection runs on the current runtime until the
/// client is dropped) and `HOST:PORT`, for messages.
pub async fn connect(config: &tokio_postgres::Config) -> Result<(Client, String), String> {
    let server = describe_server(config);
    let (client, connection) = config.connect(NoTls).await.map_err(|e| match e.as_db_error() {
        Some(db) => format!(
            "PostgreSQL at {server} refused the connection: {} (SQLSTATE {}); check the user, password and \
             database in --postgres",
            db.message(),
            db.code().code()
        ),
        None => format!(
            "cannot connect to PostgreSQL at {server}: {}; is it running, and is --postgres right?",
            crate::client::failure::chain(&e)
        ),
    })?;
    // Its errors surface through the client's calls.
    tokio::spawn(connection);
    Ok((client, server))
}

/// `dsn` without its password, for messages.
fn redacted(dsn: &str) -> String {
    if dsn.contains("password") || dsn.contains('@') {
        "(the DSN, not shown: it may hold a password)".to_string()
    } else {
        dsn.to_string()
    }
}

/// `HOST:PORT` of the first host `config` names.
fn describe_server(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(name)) => name.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
}

/// An error from running the query, with PostgreSQL's message and code (`relation "users" does not exist`).
fn query_refused(server: &str, error: tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => {
            let hint = db.hint().map(|h| format!(" ({h})")).unwrap_or_default();
            format!(
                "PostgreSQL at {server} refused the query: {}{hint} (SQLSTATE {}); check --query",
                db.message(),
                db.code().code()
            )
        }
        None => format!(
            "reading the query's rows from PostgreSQL at {server} failed: {}",
            crate::client::failure::chain(&error)
        ),
    }
}

/// The row estimate in the first line of a text `EXPLAIN` (`Seq Scan on users  (cost=… rows=10000 …)`).
fn planned_rows(line: &str) -> Option<u64> {
    let (_, after) = line.split_once(" rows=")?;
    let digits = after.split(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok()
}

/// The first column of a `COPY ... TO STDOUT` text row, unescaped; `None` for NULL (`\N`).
pub fn first_field(row: &Bytes) -> Option<Bytes> {
    let end = memchr::memchr2(b'\t', b'\n', row).unwrap_or(row.len());
    let field = &row[..end];
    if field == b"\\N" {
        return None;
    }
    if !field.contains(&b'\\') {
        return Some(row.slice(..end));
    }
    Some(Bytes::from(unescape(field)))
}

/// COPY's text escapes undone: `\\`, `\t`, `\n`, `\r`, `\b`, `\f`, `\v`, octal `\NNN`, hex `\xHH`, and a
/// backslash before any other character standing for that character.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let byte = field[i];
        i += 1;
        if byte != b'\\' || i == field.len() {
            out.push(byte);
            continue;
        }
        let escaped = field[i];
        i += 1;
        match escaped {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut value = u32::from(escaped - b'0');
                for _ in 0..2 {
                    match field.get(i) {
                        Some(digit @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(digit - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(value as u8);
            }
            b'x' if field.get(i).is_some_and(u8::is_ascii_hexdigit) => {
                let mut value = 0u8;
                for _ in 0..2 {
                    match field.get(i).and_then(|d| (*d as char).to_digit(16)) {
                        Some(digit) => {
                            value = value * 16 + digit as u8;
                            i += 1;
                        }
                        None => break,
                    }
                }
                out.push(value);
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_field_is_cut_and_unescaped() {
        let field = |row: &'static [u8]| first_field(&Bytes::from_static(row)).map(|b| b.to_vec());
        assert_eq!(field(b"42\n"), Some(b"42".to_vec()));
        assert_eq!(field(b"42\tother\n"), Some(b"42".to_vec()));
        assert_eq!(field(b"\\N\t1\n"), None);
        assert_eq!(
            field(b"a\\tb\\\\c\\nd\\101\\x41\\q\n"),
            Some(b"a\tb\\c\ndAAq".to_vec())
        );
    }

    #[test]
    fn the_estimate_comes_from_the_top_plan_node() {
        assert_eq!(
            planned_rows("Seq Scan on users  (cost=0.00..144248.48 rows=10000048 width=32)"),
            Some(10_000_048)
        );
        assert_eq!(planned_rows("Result"), None);
    }
}
