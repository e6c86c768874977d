//! Decoding of PostgreSQL's `pgoutput` logical replication messages (protocol version 1, text format):
//! exactly what the feed needs — relations, and the tuples of inserts, updates, deletes — and nothing of
//! column types. `Begin`, `Commit` and logical messages are decoded by the replication client; the rest
//! arrive here as the payload of an `XLogData`, tag byte first.
//!
//! ```text
//! R  u32 relation id, cstring schema, cstring name, u8 replica identity, u16 columns,
//!    per column: u8 flags (1 = part of the key), cstring name, u32 type oid, i32 type modifier
//! I  u32 relation id, 'N', tuple
//! U  u32 relation id, ['K' key tuple | 'O' old tuple], 'N' new tuple
//! D  u32 relation id, 'K' key tuple | 'O' old tuple
//! T  u32 relations, u8 options, u32 relation id × relations
//! tuple: u16 columns, per column: 'n' null | 'u' unchanged TOAST value | 't' u32 length, text | 'b' ...
//! Y (type), O (origin): not needed
//! ```
//!
//! Every length and count is checked against what is left, so a damaged or unexpected message is an
//! error naming what was wrong, never a panic.

use bytes::Bytes;

/// A decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A table's description, sent before its first change in a session and again after it changes.
    Relation(Relation),
    /// A row inserted.
    Insert {
        /// Its table.
        relation: u32,
        /// The row.
        new: Tuple,
    },
    /// A row updated: `old` holds the old key (identity `DEFAULT`, when the key changed) or the whole old
    /// row (identity `FULL`), else it is `None`: the key did not change.
    Update {
        /// Its table.
        relation: u32,
        /// The old key or row, if sent.
        old: Option<Tuple>,
        /// The new row.
        new: Tuple,
    },
    /// A row deleted: its key (or whole row, with identity `FULL`).
    Delete {
        /// Its table.
        relation: u32,
        /// The old key or row.
        old: Tuple,
    },
    /// Tables truncated.
    Truncate {
        /// The tables.
        relations: Vec<u32>,
    },
    /// A message the feed has no use for (a type or an origin), by its tag.
    Ignored(u8),
}

/// A table as `pgoutput` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// Its id within this replication session.
    pub id: u32,
    /// Its schema.
    pub schema: String,
    /// Its name.
    pub name: String,
    /// Its columns, in order.
    pub columns: Vec<Column>,
}

/// A column of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Its name.
    pub name: String,
    /// Whether it is part of the table's replica identity (its primary key, or the index or whole row
    /// `REPLICA IDENTITY` names): only those columns are sent for deletes and key changes.
    pub in_identity: bool,
}

/// A row's columns, in the table's column order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuple(pub Vec<Value>);

/// One column of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// A TOASTed value that did not change (not sent).
    Unchanged,
    /// The value in PostgreSQL's text output form.
    Text(Bytes),
    /// The value in binary form (only when binary output was asked for, which the feed does not do).
    Binary(Bytes),
}

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed pgoutput message: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

/// Decodes one message (an `XLogData` payload).
pub fn decode(data: &Bytes) -> Result<Message, Malformed> {
    let mut reader = Reader { data, at: 0 };
    let tag = reader.u8("the message tag")?;
    let message = match tag {
        b'R' => Message::Relation(relation(&mut reader)?),
        b'I' => {
            let relation = reader.u32("the relation id")?;
            reader.expect(b'N', "an insert's new tuple")?;
            Message::Insert {
                relation,
                new: tuple(&mut reader)?,
            }
        }
        b'U' => {
            let relation = reader.u32("the relation id")?;
            let old = match reader.u8("an update's tuple marker")? {
                b'K' | b'O' => {
                    let old = tuple(&mut reader)?;
                    reader.expect(b'N', "an update's new tuple")?;
                    Some(old)
                }
                b'N' => None,
                other => return Err(unexpected(other, "an update's tuple marker")),
            };
            Message::Update {
                relation,
                old,
                new: tuple(&mut reader)?,
            }
        }
        b'D' => {
            let relation = reader.u32("the relation id")?;
            match reader.u8("a delete's tuple marker")? {
                b'K' | b'O' => {}
                other => return Err(unexpected(other, "a delete's tuple marker")),
            }
            Message::Delete {
                relation,
                old: tuple(&mut reader)?,
            }
        }
        b'T' => {
            let count = reader.u32("the number of truncated relations")? as usize;
            reader.u8("the truncate options")?;
            reader.fits(count, 4, "truncated relations")?;
            let relations = (0..count)
                .map(|_| reader.u32("a truncated relation id"))
                .collect::<Result<_, _>>()?;
            Message::Truncate { relations }
        }
        b'Y' | b'O' => return Ok(Message::Ignored(tag)),
        other => return Err(unexpected(other, "the message tag")),
    };
    reader.finish()?;
    Ok(message)
}

fn relation(reader: &mut Reader<'_>) -> Result<Relation, Malformed> {
    let id = reader.u32("the relation id")?;
    let schema = reader.cstring("the schema")?;
    let name = reader.cstring("the table name")?;
    reader.u8("the replica identity")?;
    let count = reader.u16("the number of columns")? as usize;
    // Each column takes at least 10 bytes (flags, an empty name, type oid and modifier).
    reader.fits(count, 10, "columns")?;
    let columns = (0..count)
        .map(|_| {
            let flags = reader.u8("a column's flags")?;
            let name = reader.cstring("a column name")?;
            reader.u32("a column's type")?;
            reader.u32("a column's type modifier")?;
            Ok(Column {
                name,
                in_identity: flags & 1 == 1,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Relation {
        id,
        schema,
        name,
        columns,
    })
}

fn tuple(reader: &mut Reader<'_>) -> Result<Tuple, Malformed> {
    let count = reader.u16("the number of columns of a tuple")? as usize;
    reader.fits(count, 1, "tuple columns")?;
    let values = (0..count)
        .map(|_| match reader.u8("a column's kind")? {
            b'n' => Ok(Value::Null),
            b'u' => Ok(Value::Unchanged),
            b't' => reader.sized("a text value").map(Value::Text),
            b'b' => reader.sized("a binary value").map(Value::Binary),
            other => Err(unexpected(other, "a column's kind")),
        })
        .collect::<Result<_, _>>()?;
    Ok(Tuple(values))
}

fn unexpected(byte: u8, what: &str) -> Malformed {
    Malformed(format!(
        "unexpected byte {byte:#04x} ({:?}) as {what}",
        byte as char
    ))
}

/// A cursor over a message that checks every read against what is left.
struct Reader<'a> {
    data: &'a Bytes,
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], Malformed> {
        let end = self.at.checked_add(n).filter(|end| *end <= self.data.len());
        let Some(end) = end else {
            return Err(Malformed(format!(
                "{what} needs {n} bytes at offset {} of {}",
                self.at,
                self.data.len()
            )));
        };
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u8(&mut self, what: &str) -> Result<u8, Malformed> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, Malformed> {
        Ok(u16::from_be_bytes(
            self.take(2, what)?.try_into().expect("2"),
        ))
    }

    fn u32(&mut self, what: &str) -> Result<u32, Malformed> {
        Ok(u32::from_be_bytes(
            self.take(4, what)?.try_into().expect("4"),
        ))
    }

    fn expect(&mut self, byte: u8, what: &str) -> Result<(), Malformed> {
        match self.u8(what)? {
            found if found == byte => Ok(()),
            other => Err(unexpected(other, what)),
        }
    }

    /// Fails unless `count` items of at least `each` bytes can be left: a damaged count is refused before
    /// anything is allocated for it.
    fn fits(&self, count: usize, each: usize, what: &str) -> Result<(), Malformed> {
        let left = self.data.len() - self.at;
        if count.saturating_mul(each) > left {
            return Err(Malformed(format!(
                "{count} {what} cannot fit in the {left} bytes left"
            )));
        }
        Ok(())
    }

    fn cstring(&mut self, what: &str) -> Result<String, Malformed> {
        let rest = &self.data[self.at..];
        let Some(length) = rest.iter().position(|b| *b == 0) else {
            return Err(Malformed(format!("{what} has no terminating NUL")));
        };
        let text = String::from_utf8_lossy(&rest[..length]).into_owned();
        self.at += length + 1;
        Ok(text)
    }

    fn sized(&mut self, what: &str) -> Result<Bytes, Malformed> {
        let length = self.u32(what)? as usize;
        let start = self.at;
        self.take(length, what)?;
        Ok(self.data.slice(start..start + length))
    }

    fn finish(&self) -> Result<(), Malformed> {
        match self.data.len() - self.at {
            0 => Ok(()),
            extra => Err(Malformed(format!("{extra} bytes after the message"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodes messages the way pgoutput does, for the tests.
    #[derive(Default)]
    struct Wire(Vec<u8>);

    impl Wire {
        fn u8(mut self, v: u8) -> Self {
            self.0.push(v);
            self
        }
        fn u16(mut self, v: u16) -> Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn u32(mut self, v: u32) -> Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn cstring(mut self, v: &str) -> Self {
            self.0.extend_from_slice(v.as_bytes());
            self.0.push(0);
            self
        }
        fn text(self, v: &str) -> Self {
            let mut wire = self.u8(b't').u32(v.len() as u32);
            wire.0.extend_from_slice(v.as_bytes());
            wire
        }
        fn bytes(self) -> Bytes {
            Bytes::from(self.0)
        }
    }

    fn users_relation() -> Wire {
        Wire::default()
            .u8(b'R')
            .u32(16_385)
            .cstring("public")
            .cstring("users")
            .u8(b'd')
            .u16(2)
            .u8(1)
            .cstring("id")
            .u32(20)
            .u32(u32::MAX)
            .u8(0)
            .cstring("email")
            .u32(25)
            .u32(u32::MAX)
    }

    fn text(v: &str) -> Value {
        Value::Text(Bytes::copy_from_slice(v.as_bytes()))
    }

    #[test]
    fn decodes_relations_and_the_tuples_of_each_change() {
        assert_eq!(
            decode(&users_relation().bytes()),
            Ok(Message::Relation(Relation {
                id: 16_385,
                schema: "public".into(),
                name: "users".into(),
                columns: vec![
                    Column {
                        name: "id".into(),
                        in_identity: true
                    },
                    Column {
                        name: "email".into(),
                        in_identity: false
                    },
                ],
            }))
        );
        let insert = Wire::default()
            .u8(b'I')
            .u32(16_385)
            .u8(b'N')
            .u16(2)
            .text("42")
            .u8(b'n');
        assert_eq!(
            decode(&insert.bytes()),
            Ok(Message::Insert {
                relation: 16_385,
                new: Tuple(vec![text("42"), Value::Null]),
            })
        );
        let key_changed = Wire::default()
            .u8(b'U')
            .u32(16_385)
            .u8(b'K')
            .u16(2)
            .text("42")
            .u8(b'n')
            .u8(b'N')
            .u16(2)
            .text("43")
            .u8(b'u');
        assert_eq!(
            decode(&key_changed.bytes()),
            Ok(Message::Update {
                relation: 16_385,
                old: Some(Tuple(vec![text("42"), Value::Null])),
                new: Tuple(vec![text("43"), Value::Unchanged]),
            })
        );
        let same_key = Wire::default()
            .u8(b'U')
            .u32(16_385)
            .u8(b'N')
            .u16(1)
            .text("43");
        assert!(matches!(
            decode(&same_key.bytes()),
            Ok(Message::Update { old: None, .. })
        ));
        let delete = Wire::default()
            .u8(b'D')
            .u32(16_385)
            .u8(b'K')
            .u16(1)
            .text("43");
        assert_eq!(
            decode(&delete.bytes()),
            Ok(Message::Delete {
                relation: 16_385,
                old: Tuple(vec![text("43")]),
            })
        );
        let truncate = Wire::default().u8(b'T').u32(2).u8(0).u32(7).u32(9);
        assert_eq!(
            decode(&truncate.bytes()),
            Ok(Message::Truncate {
                relations: vec![7, 9]
            })
        );
        let origin = Wire::default().u8(b'O').u32(0).u32(1).cstring("elsewhere");
        assert_eq!(decode(&origin.bytes()), Ok(Message::Ignored(b'O')));
    }

    /// Every prefix of a valid message, and a message with bytes after its end, is refused with a reason;
    /// a count that cannot fit is refused before anything is allocated for it.
    #[test]
    fn damage_is_an_error_that_says_what_was_wrong() {
        let whole = users_relation().bytes();
        for end in 0..whole.len() {
            let error = decode(&whole.slice(..end)).unwrap_err();
            assert!(!error.0.is_empty());
        }
        let mut longer = whole.to_vec();
        longer.push(0);
        assert_eq!(
            decode(&Bytes::from(longer)).unwrap_err().0,
            "1 bytes after the message"
        );
        let huge = Wire::default().u8(b'T').u32(u32::MAX).u8(0).bytes();
        assert!(decode(&huge).unwrap_err().0.contains("cannot fit"));
        let unknown = Wire::default().u8(b'Z').bytes();
        assert!(decode(&unknown).unwrap_err().0.contains("message tag"));
        let bad_kind = Wire::default().u8(b'I').u32(1).u8(b'N').u16(1).u8(b'x');
        assert!(decode(&bad_kind.bytes())
            .unwrap_err()
            .0
            .contains("column's kind"));
    }

    proptest::proptest! {
        /// Whatever arrives, decoding answers (a message or a reason) and never panics.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80)) {
            let _ = decode(&Bytes::from(bytes));
        }
    }
}
