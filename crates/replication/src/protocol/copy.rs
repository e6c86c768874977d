//! A new consumer may read another server's copy of the stream: it is checked against the message read last.
//!
//! A replica follows the stream with an ordered consumer, which lives on one NATS server and reads that
//! server's copy. Every time it is created again — the client recreates it after missed heartbeats or a
//! lost message, the applier after a gap or a stall, each without a word about where — the next messages
//! may come from another copy. Copies are the same where JetStream keeps its promise; nats-server 2.9.10
//! did not always (docs/replication.md, "What is checked of JetStream, not trusted"): a stream leader cut off from the quorum stored
//! messages no quorum took, and went on one seq off after the heal. A replica that read a stretch of such a
//! copy and then moved to a sound one holds a history with holes — the quorum's messages at the seqs where
//! it read others — and its next barrier, read at the seq it was acknowledged at, proves nothing about them:
//! a lease from it answered `ABSENT` for an `Add` acknowledged by the fallback (the simulation without this
//! check, seed 3514: r2 reads a cut-off server's own messages at seqs 75 to 79, moves to a sound server, and
//! misses the `Add` the quorum stored at 75).
//!
//! So a new consumer starts at the seq read last, not after it, and its first message must be the one read
//! there (its [digest](MessageDigest): subject, message id and payload). Another message there means what
//! was applied is no one copy's history: no lease from it, ever ([`Protocol::copy_differs`]). The message
//! gone from the new copy (deleted or purged since) leaves nothing to compare: the replica stops, and is
//! restarted. A restart moves too: a local snapshot records the message read last, which the restarted
//! replica's first consumer must deliver (seed 256018 without it), and a replica that finds its copy
//! diverged removes its own snapshots, which may hold that copy's messages (seed 19010 without it); a
//! snapshot is shared only once a barrier vouches for it ([`Protocol::checked_through`], seed 5870 without
//! it). A copy that goes wrong and comes back into line under one consumer between two barriers is not
//! caught here: the replicas' history digests catch it ([`history`](super::history)).
//!
//! [`Protocol::checked_through`]: super::Protocol::checked_through
//!
//! [`Protocol::copy_differs`]: super::Protocol::copy_differs

/// What identifies a stored message across copies of the stream: a hash of its subject, message id and
/// payload. Two different messages at one seq digest alike only by a hash collision, or if they are
/// byte-for-byte the same (identical junk, which changes nothing a replica applies).
pub type MessageDigest = u64;

/// What a new consumer's first message says of the copy it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyCheck {
    /// The message read last is there: the copy agrees so far; read on.
    Same,
    /// Another message is there: what was applied is not this copy's history.
    Differs,
    /// The seq read last is gone from this copy: nothing to compare; stop.
    Gone,
}

/// Checks a new consumer's first message `first` (its seq and digest) against the message read last,
/// `last_read`; the consumer was asked to start at `last_read`'s seq.
pub fn check(last_read: (u64, MessageDigest), first: (u64, MessageDigest)) -> CopyCheck {
    match first {
        (seq, digest) if seq == last_read.0 && digest == last_read.1 => CopyCheck::Same,
        (seq, _) if seq == last_read.0 => CopyCheck::Differs,
        _ => CopyCheck::Gone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_read_last_found_again_lets_the_reader_read_on() {
        assert_eq!(check((7, 0xabc), (7, 0xabc)), CopyCheck::Same);
    }

    #[test]
    fn another_message_at_the_seq_read_last_means_another_history() {
        assert_eq!(check((7, 0xabc), (7, 0xabd)), CopyCheck::Differs);
    }

    #[test]
    fn a_copy_without_the_seq_read_last_leaves_nothing_to_compare() {
        assert_eq!(check((7, 0xabc), (9, 0xabc)), CopyCheck::Gone);
    }
}
