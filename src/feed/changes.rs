//! What a table's changes mean for the gate: a row inserted is a key that exists, a row deleted a key that
//! no longer does, an update that changes the key both, a truncate a warning (the operator rebuilds).
//!
//! Keys are the key column's value in PostgreSQL's text form — the same bytes `SELECT id::text` gives,
//! so that a bootstrap with `load --postgres` and the feed agree on every key.

use std::collections::HashMap;
use std::str::FromStr;

use bytes::Bytes;

use super::pgoutput::{Message, Relation, Tuple, Value};
use crate::client::postgres::KeyFormat;

/// A table the feed follows: `SCHEMA.TABLE:COLUMN=NAMESPACE` (`--table public.users:id=users`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowedTable {
    /// Its schema (`public` when not given).
    pub schema: String,
    /// Its name.
    pub table: String,
    /// The column whose values are the keys.
    pub column: String,
    /// The gate namespace they go to.
    pub namespace: String,
    /// Whether only its inserts and new keys are sent, never its deletes: set at start for a column no
    /// unique index covers alone (`--non-unique-adds-only`), where a deleted row's key may still be held by
    /// another row and a tombstone would hide it.
    pub adds_only: bool,
}

impl FollowedTable {
    /// `schema.table`, quoted for SQL.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote(&self.schema), quote(&self.table))
    }

    /// `schema.table`, as people write it.
    pub fn name(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }
}

/// An SQL identifier, quoted.
pub fn quote(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

impl FromStr for FollowedTable {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "--table {spec:?}: expected SCHEMA.TABLE:COLUMN=NAMESPACE, e.g. public.users:id=users"
            )
        };
        let (table, rest) = spec.split_once(':').ok_or_else(bad)?;
        let (column, namespace) = rest.split_once('=').ok_or_else(bad)?;
        let (schema, table) = table.split_once('.').unwrap_or(("public", table));
        if [schema, table, column, namespace]
            .iter()
            .any(|p| p.is_empty())
        {
            return Err(bad());
        }
        Ok(Self {
            schema: schema.to_string(),
            table: table.to_string(),
            column: column.to_string(),
            namespace: namespace.to_string(),
            adds_only: false,
        })
    }
}

/// What one change means for the gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyChange {
    /// The key exists (`Add`).
    Exists {
        /// Its namespace.
        namespace: String,
        /// The key.
        key: Bytes,
    },
    /// The key was deleted (`RecordAbsent` with `DELETED`).
    Deleted {
        /// Its namespace.
        namespace: String,
        /// The key.
        key: Bytes,
    },
    /// The table was truncated: its keys are gone, which only a rebuild can tell the gate.
    Truncated {
        /// `schema.table`.
        table: String,
    },
    /// A row's key column was NULL or not sent (not part of the replica identity): nothing can be done.
    NoKey {
        /// `schema.table`.
        table: String,
        /// What happened to the row.
        operation: &'static str,
    },
}

/// A followed table as this replication session numbers it.
#[derive(Debug, Clone)]
struct Known {
    table: String,
    column: usize,
    column_in_identity: bool,
    namespace: String,
    adds_only: bool,
    format: KeyFormat,
}

/// The followed tables, and what the session told of them so far.
#[derive(Debug)]
pub struct Tables {
    followed: Vec<FollowedTable>,
    /// How a key column's value becomes a key.
    format: KeyFormat,
    /// Relation id → the followed table it is, or `None` for one the feed does not follow.
    known: HashMap<u32, Option<Known>>,
}

impl Tables {
    /// Follows `followed`, their keys in `format`.
    pub fn new(followed: Vec<FollowedTable>, format: KeyFormat) -> Self {
        Self {
            followed,
            format,
            known: HashMap::new(),
        }
    }

    /// What `message` means for the gate (nothing, for most messages of tables not followed); `Err` for a
    /// change of a relation the session never described, or a followed table without its key column.
    pub fn changes(&mut self, message: Message) -> Result<Vec<KeyChange>, String> {
        Ok(match message {
            Message::Relation(relation) => {
                let known = self.describe(&relation)?;
                self.known.insert(relation.id, known);
                Vec::new()
            }
            Message::Insert { relation, new } => match self.row(relation, "insert")? {
                Some(known) => vec![known.exists(&new, "insert")],
                None => Vec::new(),
            },
            Message::Update { relation, old, new } => match self.row(relation, "update")? {
                Some(known) => known.updated(old.as_ref(), &new),
                None => Vec::new(),
            },
            Message::Delete { relation, old } => match self.row(relation, "delete")? {
                Some(known) if !known.adds_only => vec![known.deleted(&old)],
                _ => Vec::new(),
            },
            Message::Truncate { relations } => relations
                .into_iter()
                .filter_map(|id| self.known.get(&id).cloned().flatten())
                .map(|known| {
                    rows_seen(&known.table, "truncate");
                    KeyChange::Truncated { table: known.table }
                })
                .collect(),
            Message::Ignored(_) => Vec::new(),
        })
    }

    fn describe(&self, relation: &Relation) -> Result<Option<Known>, String> {
        let Some(followed) = self
            .followed
            .iter()
            .find(|f| f.schema == relation.schema && f.table == relation.name)
        else {
            return Ok(None);
        };
        let column = relation
            .columns
            .iter()
            .position(|c| c.name == followed.column)
            .ok_or_else(|| {
                format!(
                    "table {} has no column {:?} (it has {}); fix --table",
                    followed.name(),
                    followed.column,
                    relation
                        .columns
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
        Ok(Some(Known {
            table: followed.name(),
            column,
            column_in_identity: relation.columns[column].in_identity,
            namespace: followed.namespace.clone(),
            adds_only: followed.adds_only,
            format: self.format,
        }))
    }

    /// The followed table a row change of `relation` belongs to (counted), or `None` if not followed.
    fn row(&self, relation: u32, operation: &'static str) -> Result<Option<&Known>, String> {
        let known = self.known.get(&relation).map(Option::as_ref).ok_or_else(|| {
            format!("a change of relation {relation}, which the replication session never described")
        })?;
        if let Some(known) = known {
            rows_seen(&known.table, operation);
        }
        Ok(known)
    }
}

/// Counts a row change of a followed table.
fn rows_seen(table: &str, operation: &'static str) {
    metrics::counter!("existence_feed_rows_total", "table" => table.to_string(), "operation" => operation)
        .increment(1);
}

impl Known {
    /// The row's key in the feed's key format; `None` without one (NULL, not sent, or — the column being
    /// checked at start — never: a value the format cannot take).
    fn key(&self, tuple: &Tuple) -> Option<Bytes> {
        match tuple.0.get(self.column) {
            Some(Value::Text(value) | Value::Binary(value)) => self.format.key(value.clone()).ok(),
            _ => None,
        }
    }

    fn no_key(&self, operation: &'static str) -> KeyChange {
        KeyChange::NoKey {
            table: self.table.clone(),
            operation,
        }
    }

    fn exists(&self, new: &Tuple, operation: &'static str) -> KeyChange {
        match self.key(new) {
            Some(key) => KeyChange::Exists {
                namespace: self.namespace.clone(),
                key,
            },
            None => self.no_key(operation),
        }
    }

    fn deleted(&self, old: &Tuple) -> KeyChange {
        match self.key(old) {
            Some(key) => KeyChange::Deleted {
                namespace: self.namespace.clone(),
                key,
            },
            None => self.no_key("delete"),
        }
    }

    /// An update: nothing if the key did not change; the old key deleted and the new one existing if it
    /// did. Without the old key (a key column outside the replica identity is never sent) the new value is
    /// added: `Add` of an existing key changes nothing, and a value left behind answers `MAY_EXIST`, which
    /// is safe.
    fn updated(&self, old: Option<&Tuple>, new: &Tuple) -> Vec<KeyChange> {
        if matches!(new.0.get(self.column), Some(Value::Unchanged)) {
            return Vec::new(); // a TOASTed key that did not change
        }
        match old.and_then(|old| self.key(old)) {
            Some(old_key) if Some(&old_key) == self.key(new).as_ref() => Vec::new(),
            Some(_) if self.adds_only => vec![self.exists(new, "update")],
            Some(old_key) => vec![
                KeyChange::Deleted {
                    namespace: self.namespace.clone(),
                    key: old_key,
                },
                self.exists(new, "update"),
            ],
            // With the column in the identity, an update that sends no old key kept the key.
            None if old.is_none() && self.column_in_identity => Vec::new(),
            None => vec![self.exists(new, "update")],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feed::pgoutput::Column;

    fn users() -> Tables {
        Tables::new(
            vec!["public.users:id=users".parse().unwrap()],
            KeyFormat::Text,
        )
    }

    fn relation(id: u32, name: &str, key_in_identity: bool) -> Message {
        Message::Relation(Relation {
            id,
            schema: "public".into(),
            name: name.into(),
            columns: vec![
                Column {
                    name: "id".into(),
                    in_identity: key_in_identity,
                },
                Column {
                    name: "email".into(),
                    in_identity: false,
                },
            ],
        })
    }

    fn row(id: Option<&str>) -> Tuple {
        let key = id.map_or(Value::Null, |id| {
            Value::Text(Bytes::copy_from_slice(id.as_bytes()))
        });
        Tuple(vec![key, Value::Null])
    }

    fn exists(key: &str) -> KeyChange {
        KeyChange::Exists {
            namespace: "users".into(),
            key: Bytes::copy_from_slice(key.as_bytes()),
        }
    }

    fn deleted(key: &str) -> KeyChange {
        KeyChange::Deleted {
            namespace: "users".into(),
            key: Bytes::copy_from_slice(key.as_bytes()),
        }
    }

    #[test]
    fn table_specs_parse_or_say_what_is_expected() {
        let spec: FollowedTable = "billing.invoices:number=invoices".parse().unwrap();
        assert_eq!(
            (spec.name(), spec.column.as_str(), spec.namespace.as_str()),
            ("billing.invoices".to_string(), "number", "invoices")
        );
        assert_eq!(spec.quoted(), "\"billing\".\"invoices\"");
        let default_schema: FollowedTable = "users:id=users".parse().unwrap();
        assert_eq!(default_schema.schema, "public");
        for bad in ["users", "users:id", "public.users:=users", ":id=users"] {
            let error = bad.parse::<FollowedTable>().unwrap_err();
            assert!(error.contains("SCHEMA.TABLE:COLUMN=NAMESPACE"), "{error}");
        }
    }

    #[test]
    fn inserts_deletes_and_key_changes_become_key_changes() {
        let mut tables = users();
        assert!(tables
            .changes(relation(1, "users", true))
            .unwrap()
            .is_empty());
        assert!(tables
            .changes(relation(2, "orders", true))
            .unwrap()
            .is_empty());
        let insert = |relation, id| Message::Insert {
            relation,
            new: row(Some(id)),
        };
        assert_eq!(tables.changes(insert(1, "42")).unwrap(), [exists("42")]);
        assert!(
            tables.changes(insert(2, "7")).unwrap().is_empty(),
            "not followed"
        );
        let delete = Message::Delete {
            relation: 1,
            old: row(Some("42")),
        };
        assert_eq!(tables.changes(delete).unwrap(), [deleted("42")]);
        let moved = Message::Update {
            relation: 1,
            old: Some(row(Some("42"))),
            new: row(Some("43")),
        };
        assert_eq!(
            tables.changes(moved).unwrap(),
            [deleted("42"), exists("43")]
        );
        let kept = Message::Update {
            relation: 1,
            old: None,
            new: row(Some("43")),
        };
        assert!(tables.changes(kept).unwrap().is_empty());
        let truncate = Message::Truncate {
            relations: vec![1, 2],
        };
        assert_eq!(
            tables.changes(truncate).unwrap(),
            [KeyChange::Truncated {
                table: "public.users".into()
            }]
        );
    }

    /// A key column outside the replica identity is never sent for deletes: said, not guessed; updates
    /// add the new value.
    #[test]
    fn a_key_column_outside_the_identity_adds_on_update_and_reports_deletes() {
        let mut tables = users();
        tables.changes(relation(1, "users", false)).unwrap();
        let update = Message::Update {
            relation: 1,
            old: None,
            new: row(Some("9")),
        };
        assert_eq!(tables.changes(update).unwrap(), [exists("9")]);
        let delete = Message::Delete {
            relation: 1,
            old: row(None),
        };
        assert_eq!(
            tables.changes(delete).unwrap(),
            [KeyChange::NoKey {
                table: "public.users".into(),
                operation: "delete"
            }]
        );
    }

    /// A column several rows may share: a deleted row's key may still be held by another, so no delete
    /// becomes a tombstone, and a key change only adds the new key.
    #[test]
    fn an_adds_only_table_sends_no_tombstone() {
        let mut followed: FollowedTable = "public.users:id=users".parse().unwrap();
        followed.adds_only = true;
        let mut tables = Tables::new(vec![followed], KeyFormat::Text);
        tables.changes(relation(1, "users", true)).unwrap();
        let delete = Message::Delete {
            relation: 1,
            old: row(Some("42")),
        };
        assert!(tables.changes(delete).unwrap().is_empty());
        let moved = Message::Update {
            relation: 1,
            old: Some(row(Some("42"))),
            new: row(Some("43")),
        };
        assert_eq!(tables.changes(moved).unwrap(), [exists("43")]);
        let insert = Message::Insert {
            relation: 1,
            new: row(Some("44")),
        };
        assert_eq!(tables.changes(insert).unwrap(), [exists("44")]);
    }

    #[test]
    fn a_missing_column_or_an_undescribed_relation_is_an_error() {
        let mut tables = Tables::new(
            vec!["public.users:uuid=users".parse().unwrap()],
            KeyFormat::Text,
        );
        let error = tables.changes(relation(1, "users", true)).unwrap_err();
        assert!(
            error.contains("no column \"uuid\" (it has id, email)"),
            "{error}"
        );
        let error = users()
            .changes(Message::Insert {
                relation: 5,
                new: row(Some("1")),
            })
            .unwrap_err();
        assert!(error.contains("never described"), "{error}");
    }
}
