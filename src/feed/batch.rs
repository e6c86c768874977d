//! Changes waiting to be sent to the gate, in commit order, as few calls as that order allows.
//!
//! Order matters only between changes of the same key, but it matters there: a key deleted and inserted
//! again must end `MAY_EXIST`, so its `RecordAbsent` must reach the gate before its `Add` (the `Add`
//! clears the tombstone) — never after, which would answer `ABSENT` for a key that exists. So calls keep
//! commit order, and consecutive inserts of a namespace share one `Add` (across transactions too). A key
//! deleted and inserted again within one batch drops its delete: the key exists in the end, and the gate
//! never passes through answering `ABSENT` for it.

use std::collections::HashSet;

use bytes::Bytes;

/// One call to the gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `Add` of keys that exist.
    Add {
        /// The namespace.
        namespace: String,
        /// The keys.
        keys: Vec<Bytes>,
    },
    /// `RecordAbsent` with `DELETED`.
    Deleted {
        /// The namespace.
        namespace: String,
        /// The key.
        key: Bytes,
        /// A gate seq read before the delete committed: the gate refuses the tombstone if the key was
        /// added after it.
        observed_seq: u64,
    },
}

/// Calls waiting to be sent.
#[derive(Debug)]
pub struct Batch {
    calls: Vec<Call>,
    keys: usize,
    max_add_keys: usize,
    /// The keys of the `Deleted` calls waiting, to find one that is inserted again.
    deleted: HashSet<(String, Bytes)>,
}

impl Batch {
    /// An empty batch whose `Add`s carry at most `max_add_keys` keys (the gate's `max_batch_keys`).
    pub fn new(max_add_keys: usize) -> Self {
        Self {
            calls: Vec::new(),
            keys: 0,
            max_add_keys: max_add_keys.max(1),
            deleted: HashSet::new(),
        }
    }

    /// Appends a key that exists.
    pub fn exists(&mut self, namespace: String, key: Bytes) {
        let again = (namespace, key);
        if self.deleted.remove(&again) {
            self.calls.retain(|call| {
                !matches!(call, Call::Deleted { namespace, key, .. } if *namespace == again.0 && *key == again.1)
            });
            self.keys -= 1;
        }
        let (namespace, key) = again;
        let joins = matches!(
            self.calls.last(),
            Some(Call::Add { namespace: last, keys }) if *last == namespace && keys.len() < self.max_add_keys
        );
        if joins {
            let Some(Call::Add { keys, .. }) = self.calls.last_mut() else {
                unreachable!("checked above")
            };
            keys.push(key);
        } else {
            self.calls.push(Call::Add {
                namespace,
                keys: vec![key],
            });
        }
        self.keys += 1;
    }

    /// Appends a key that was deleted, with the gate seq of the fence before its delete (see
    /// [`fence`](super::fence)).
    pub fn deleted(&mut self, namespace: String, key: Bytes, observed_seq: u64) {
        if !self.deleted.insert((namespace.clone(), key.clone())) {
            return; // deleted twice in a row: once says it (with the older, safer fence)
        }
        self.calls.push(Call::Deleted {
            namespace,
            key,
            observed_seq,
        });
        self.keys += 1;
    }

    /// Keys waiting.
    pub fn keys(&self) -> usize {
        self.keys
    }

    /// The calls, in order; the batch is empty afterwards.
    pub fn take(&mut self) -> Vec<Call> {
        self.keys = 0;
        self.deleted.clear();
        std::mem::take(&mut self.calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change the follower hands the batch.
    enum Change {
        Exists(&'static str, &'static str),
        Deleted(&'static str),
    }

    fn push(batch: &mut Batch, changes: impl IntoIterator<Item = Change>) {
        for change in changes {
            match change {
                Change::Exists(namespace, key) => batch.exists(namespace.into(), Bytes::from(key)),
                Change::Deleted(key) => batch.deleted("users".into(), Bytes::from(key), 3),
            }
        }
    }

    fn add(namespace: &str, keys: &[&str]) -> Call {
        Call::Add {
            namespace: namespace.into(),
            keys: keys
                .iter()
                .map(|k| Bytes::copy_from_slice(k.as_bytes()))
                .collect(),
        }
    }

    fn delete(key: &str) -> Call {
        Call::Deleted {
            namespace: "users".into(),
            key: Bytes::copy_from_slice(key.as_bytes()),
            observed_seq: 3,
        }
    }

    #[test]
    fn inserts_share_adds_up_to_the_limit_and_deletes_keep_their_place() {
        let mut batch = Batch::new(2);
        push(
            &mut batch,
            [
                Change::Exists("users", "1"),
                Change::Exists("users", "2"),
                Change::Exists("users", "3"),
                Change::Exists("orders", "9"),
                Change::Deleted("3"),
                Change::Deleted("3"),
                Change::Exists("users", "4"),
            ],
        );
        assert_eq!(batch.keys(), 6);
        let calls = batch.take();
        assert_eq!(
            calls,
            [
                add("users", &["1", "2"]),
                add("users", &["3"]),
                add("orders", &["9"]),
                delete("3"),
                add("users", &["4"]),
            ]
        );
        assert_eq!((batch.keys(), batch.take()), (0, Vec::new()));
    }

    /// Deleted then inserted again: the delete goes, so the gate never answers `ABSENT` for the key on the
    /// way; inserted then deleted: both stay, in order, and the key ends deleted.
    #[test]
    fn a_key_deleted_and_inserted_again_in_one_batch_loses_its_delete() {
        let mut batch = Batch::new(100);
        push(
            &mut batch,
            [
                Change::Deleted("5"),
                Change::Exists("users", "6"),
                Change::Exists("users", "5"),
                Change::Exists("users", "7"),
                Change::Deleted("7"),
            ],
        );
        assert_eq!(batch.keys(), 4);
        assert_eq!(batch.take(), [add("users", &["6", "5", "7"]), delete("7")]);
    }
}
