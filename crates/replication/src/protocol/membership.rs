//! Membership: which processes are replicas, as the stream's own records say, applied in stream order.
//!
//! Every replica applies the same records at the same seqs, so every replica computes the same membership
//! as of any seq: a writer deciding whether an `Add` at seq N may be acknowledged early asks exactly the
//! processes that were members at N, with no "heard from recently" guess that a late or lost report
//! could mislead.
//!
//! A member is an *incarnation*: a replica id (`--replica-id`) and a nonce drawn by the process when it
//! starts. A restarted or wiped replica is a new incarnation of the same id, and so is a second process
//! started by mistake with the same id: its join displaces the first, which learns so when it applies that
//! join and stops answering `ABSENT` (it names the other). Reports carry the nonce, so one process's word
//! is never taken for another's.

use std::collections::BTreeMap;

/// One of the stream's membership records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberRecord {
    /// A process joins as replica `id` (published once it has caught up with the stream).
    Join {
        /// The replica id.
        id: String,
        /// The process's nonce.
        nonce: u64,
        /// Where it runs (host, process, address): what a displaced twin names.
        origin: String,
    },
    /// A process stopping gracefully leaves (it has stopped answering `ABSENT` before publishing this).
    Leave {
        /// The replica id.
        id: String,
        /// The nonce of the process leaving: a late leave of an earlier incarnation changes nothing.
        nonce: u64,
    },
    /// An operator removes replica `id`, whichever incarnation holds it (`existence-gate replicas remove`).
    Remove {
        /// The replica id.
        id: String,
    },
}

/// A current member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The process's nonce.
    pub nonce: u64,
    /// The seq of its join.
    pub joined: u64,
    /// Where it runs, as its join said.
    pub origin: String,
}

/// Why an incarnation stopped being a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// Its own leave.
    Left,
    /// An operator's removal.
    Removed,
    /// Another process joined with the same id; its origin.
    Displaced(String),
}

/// An incarnation that stopped being a member at `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departure {
    /// The replica id.
    pub id: String,
    /// The incarnation's nonce.
    pub nonce: u64,
    /// The seq of its join.
    pub joined: u64,
    /// The seq of the record that ended it.
    pub seq: u64,
    /// Why.
    pub cause: Cause,
}

/// The members as of the last record applied, by replica id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    members: BTreeMap<String, Member>,
}

impl Membership {
    /// Applies `record`, stored at `seq`; returns the incarnation it ended, if it ended one.
    pub fn apply(&mut self, seq: u64, record: &MemberRecord) -> Option<Departure> {
        match record {
            MemberRecord::Join { id, nonce, origin } => {
                let joining = Member {
                    nonce: *nonce,
                    joined: seq,
                    origin: origin.clone(),
                };
                match self.members.get(id) {
                    Some(current) if current.nonce == *nonce => None,
                    _ => self.members.insert(id.clone(), joining).map(|displaced| {
                        departure(id, displaced, seq, Cause::Displaced(origin.clone()))
                    }),
                }
            }
            MemberRecord::Leave { id, nonce } => {
                if self.members.get(id).is_none_or(|m| m.nonce != *nonce) {
                    return None;
                }
                let left = self.members.remove(id)?;
                Some(departure(id, left, seq, Cause::Left))
            }
            MemberRecord::Remove { id } => {
                let removed = self.members.remove(id)?;
                Some(departure(id, removed, seq, Cause::Removed))
            }
        }
    }

    /// The current member with `id`.
    pub fn get(&self, id: &str) -> Option<&Member> {
        self.members.get(id)
    }

    /// The members, by id.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Member)> {
        self.members.iter()
    }

    /// Whether incarnation `nonce` of `id` is a member.
    pub fn holds(&self, id: &str, nonce: u64) -> bool {
        self.members.get(id).is_some_and(|m| m.nonce == nonce)
    }
}

fn departure(id: &str, member: Member, seq: u64, cause: Cause) -> Departure {
    Departure {
        id: id.to_string(),
        nonce: member.nonce,
        joined: member.joined,
        seq,
        cause,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(id: &str, nonce: u64) -> MemberRecord {
        MemberRecord::Join {
            id: id.into(),
            nonce,
            origin: format!("host-{nonce}"),
        }
    }

    #[test]
    fn joins_leaves_removals_and_twins_change_membership_as_recorded() {
        let mut members = Membership::default();
        assert_eq!(members.apply(2, &join("a", 1)), None);
        assert_eq!(
            members.apply(3, &join("a", 1)),
            None,
            "a join read again changes nothing"
        );
        assert_eq!(members.get("a").map(|m| m.joined), Some(2));
        let twin = members
            .apply(4, &join("a", 7))
            .expect("the first incarnation is displaced");
        assert_eq!(
            (twin.nonce, twin.cause),
            (1, Cause::Displaced("host-7".into()))
        );
        let stale_leave = MemberRecord::Leave {
            id: "a".into(),
            nonce: 1,
        };
        assert_eq!(
            members.apply(5, &stale_leave),
            None,
            "an earlier incarnation's leave ends nothing"
        );
        assert!(members.holds("a", 7));
        let leave = MemberRecord::Leave {
            id: "a".into(),
            nonce: 7,
        };
        assert_eq!(members.apply(6, &leave).map(|d| d.cause), Some(Cause::Left));
        assert_eq!(members.apply(7, &join("b", 2)), None);
        let removed = members.apply(8, &MemberRecord::Remove { id: "b".into() });
        assert_eq!(
            removed.map(|d| (d.joined, d.cause)),
            Some((7, Cause::Removed))
        );
        assert_eq!(members.iter().count(), 0);
    }
}
