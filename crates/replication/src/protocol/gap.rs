//! A gap in the seqs a consumer delivered: what may be concluded from it, and from whom.
//!
//! After applying seq `first - 1`, a replica's consumer delivers seq `last + 1`: seqs `first..=last` were
//! skipped. Either the consumer lost them and the stream still holds them (follow it again), or they are
//! gone for good: purged — covered by a shared snapshot, which alone can stand in for them — or deleted one
//! by one (junk an operator removed, which every replica passes over alike).
//!
//! Telling these apart takes a read of the stream, and no read of a NATS stream is linearizable: it is
//! answered by whichever server believes it leads the stream, which can be an isolated leader serving a
//! stale prefix, or a server that has just rejoined and not yet caught up. "No message at seq `first`"
//! from such a server means only that it has not *yet* stored `first`; counting `first..=last` as applied on
//! that word lets the replica take a lease (from a later barrier) while missing every `Add` in the gap, and
//! answer `ABSENT` for them. So the question asked is instead *which is the first message held at or after
//! `first`*. JetStream stores and removes a stream's messages in its Raft log's order on every server, so a
//! server that holds seq `s` has already applied the storing and every removal of every seq below `s` that
//! was committed before `s`: if its answer is `s`, the seqs `first..s` are gone on the quorum too, whoever
//! answered, however stale. A server holding nothing at or after `first` proves nothing: the consumer just
//! delivered `last + 1`, so follow the stream again and ask again.
//!
//! Purged or deleted is told by the snapshots' index: a purge reaches only seqs at or below the oldest
//! snapshot named by the index version current when it was made (written before it), and each version
//! names an oldest snapshot at least as new as the one before. That read too may be a stale server's: an
//! older version names older snapshots, and would pass a purge off as a deletion — the replica would step
//! over the purged `Add`s and, with its next barrier, answer `ABSENT` for them. So a verdict of
//! [`Gap::Deleted`] holds only once the version read is proved current, by writing it again with the stream
//! expecting it to be the subject's last (checked in the quorum's order, after the purge that made the gap);
//! the simulation's stale index reads break the safety rule within the default seeds without that proof.

/// What the applier may do about a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gap {
    /// The stream still holds a skipped seq, or the answer proves nothing: follow the stream again from the
    /// applied seq.
    ReadAgain,
    /// The skipped seqs were purged (a retained snapshot at or after them covers them): only a newer
    /// snapshot can replace them.
    Purged,
    /// The skipped seqs were deleted one by one — if the index the verdict used is proved current (see the
    /// module's doc); then count them as applied, as every replica does.
    Deleted,
}

/// Judges the gap `first..=last`, given the first seq held at or after `first` as some server answered
/// (`None`: it held none) and the oldest snapshot the bucket retains (`None`: no snapshot).
pub fn judge(first: u64, last: u64, next_held: Option<u64>, oldest_snapshot: Option<u64>) -> Gap {
    match next_held {
        Some(held) if held > last => match oldest_snapshot {
            Some(oldest) if first <= oldest => Gap::Purged,
            _ => Gap::Deleted,
        },
        _ => Gap::ReadAgain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_server_holding_a_message_past_the_gap_proves_the_gap_gone() {
        assert_eq!(judge(10, 12, Some(13), None), Gap::Deleted);
        assert_eq!(judge(10, 12, Some(40), None), Gap::Deleted);
        // A stale server: it has not stored 10 yet, and holds nothing after it either.
        assert_eq!(judge(10, 12, None, None), Gap::ReadAgain);
        // The stream holds a skipped seq: the consumer lost it.
        assert_eq!(judge(10, 12, Some(10), None), Gap::ReadAgain);
        assert_eq!(judge(10, 12, Some(12), None), Gap::ReadAgain);
    }

    #[test]
    fn a_gone_gap_at_or_below_the_oldest_snapshot_was_purged() {
        assert_eq!(judge(10, 12, Some(13), Some(10)), Gap::Purged);
        assert_eq!(judge(10, 12, Some(13), Some(20)), Gap::Purged);
        assert_eq!(judge(10, 12, Some(13), Some(9)), Gap::Deleted);
        assert_eq!(judge(10, 12, None, Some(20)), Gap::ReadAgain);
    }
}
