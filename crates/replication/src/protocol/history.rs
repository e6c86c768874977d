//! Divergence noticed online: replicas compare digests of the histories they applied.
//!
//! The rules in [`super`] catch a copy of the stream that differs from the quorum's where this process's
//! own barrier, write or join was acknowledged, and where a new consumer moves to another copy
//! ([`copy`](super::copy)). A copy that goes wrong and comes back into line between two such checks is
//! not caught by them: after a partition, nats-server 2.9.10 left one server holding another message at
//! one seq; a replica restarted on that copy served a state with one key more than the others' at the same
//! seq, and nothing noticed.
//!
//! So every replica keeps a digest of the history it applied — a chain over each mutation's seq and
//! [message digest](MessageDigest) — and tells the others, about once a second, what it is at the seq it
//! has applied through ([`HistoryReport`]). Each compares a report with its own digest at that seq: it keeps
//! the digest at each of its last [`RECENT`] seqs, and holds a report from a replica ahead of it until it
//! gets there. Equal digests at a seq mean equal mutations at every seq through it (short of a 64-bit
//! collision); one differing mutation anywhere before makes them differ at every seq after, however long
//! ago it was applied. Snapshots carry the digest at the seq they cover, so a replica started from one
//! goes on with the chain of the replica that took it; one restored from an earlier release's snapshot has
//! no digest, says so in its reports, and counts in no one's judgement.
//!
//! Only mutations enter the chain: they are the state. A message that is not one — a barrier, a membership
//! record, junk — changes no state, and junk deleted from the stream is read by some replicas and passed
//! over by others.
//!
//! Which side is wrong the digests cannot say. A replica gives up its history ([`History::judge`]) when
//! every replica it has heard from within [`FORGET`], and has a digest, differs from it: with three, the
//! one that read a diverged copy stops and the two that agree go on; with two that differ, both stop — the
//! safe side of not knowing. While a comparison with one of them is still to come, it waits.

use std::collections::{BTreeMap, VecDeque};

use super::copy::MessageDigest;
use super::Nanos;

/// What a history digests to through a seq.
pub type HistoryDigest = u64;

/// The digest of the empty history: a replica that applies the stream from its start begins here.
pub const EMPTY: HistoryDigest = 0;

/// Seqs whose digest a replica keeps, to compare with reports of replicas behind or beside it (16 bytes
/// each: 128 KiB).
pub const RECENT: usize = 8192;

/// A replica whose reports have not been heard for this long counts in no judgement.
pub const FORGET: Nanos = 30_000_000_000;

/// How long a process listens after it starts before it judges: long enough to hear every live replica
/// (each reports at least once a second), so that the first report heard — maybe the one diverged
/// replica's — is not taken for everyone's.
pub const LISTEN_FIRST: Nanos = 5_000_000_000;

/// One replica's word on its history: its digest through the seq it has applied through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryReport {
    /// The replica's id.
    pub replica: String,
    /// The reporting process's nonce.
    pub nonce: u64,
    /// The seq it has applied through.
    pub seq: u64,
    /// Its digest through `seq`; `None` if its state began in a snapshot that carried none.
    pub digest: Option<HistoryDigest>,
}

/// How a replica's history compared with this one's, at the latest seq both had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The same digest at `seq`.
    Same { seq: u64 },
    /// Different digests at `seq`.
    Differs {
        seq: u64,
        mine: HistoryDigest,
        theirs: HistoryDigest,
    },
}

/// This process's history and what the other replicas said of theirs.
#[derive(Debug, Clone)]
pub struct History {
    /// The digest through the applied seq (`None`: unknown, see the module doc).
    through: Option<HistoryDigest>,
    /// (seq, digest through it) for the last [`RECENT`] seqs applied, oldest first.
    recent: VecDeque<(u64, HistoryDigest)>,
    peers: BTreeMap<String, Peer>,
    /// When this process started listening (its clock).
    started_at: Nanos,
}

#[derive(Debug, Clone)]
struct Peer {
    /// When its last report was heard.
    heard_at: Nanos,
    /// Whether it has a digest.
    known: bool,
    /// Its report at a seq this process has not applied yet.
    ahead: Option<(u64, HistoryDigest)>,
    /// The latest comparison.
    verdict: Option<Verdict>,
}

impl History {
    /// A history through `seq` that digests to `digest` (the one a snapshot covering `seq` carried; `None`
    /// if it carried none), started at `now`.
    pub fn start(seq: u64, digest: Option<HistoryDigest>, now: Nanos) -> Self {
        let mut history = Self {
            through: digest,
            recent: VecDeque::new(),
            peers: BTreeMap::new(),
            started_at: now,
        };
        history.remember(seq);
        history
    }

    /// The digest through the applied seq.
    pub fn digest(&self) -> Option<HistoryDigest> {
        self.through
    }

    /// Applies seq `seq`: a mutation with message digest `mutation`, or (`None`) anything else.
    pub fn applied(&mut self, seq: u64, mutation: Option<MessageDigest>) {
        if let (Some(through), Some(message)) = (self.through, mutation) {
            self.through = Some(chain(through, seq, message));
        }
        self.remember(seq);
        self.compare_ahead();
    }

    /// Seqs through `last` were passed over (deleted from the stream): nothing is applied, as everywhere.
    pub fn passed_over(&mut self, last: u64) {
        self.remember(last);
        self.compare_ahead();
    }

    /// A report heard at `now` (this process's own, by `me`, is ignored).
    pub fn heard(&mut self, report: &HistoryReport, me: u64, now: Nanos) {
        if report.nonce == me {
            return;
        }
        let peer = self.peers.entry(report.replica.clone()).or_insert(Peer {
            heard_at: now,
            known: false,
            ahead: None,
            verdict: None,
        });
        peer.heard_at = now;
        peer.known = report.digest.is_some();
        let Some(theirs) = report.digest else {
            peer.verdict = None;
            return;
        };
        let applied = self.recent.back().map_or(0, |(seq, _)| *seq);
        if report.seq > applied {
            // The earliest held: replacing it with each newer one could keep it ahead for ever.
            peer.ahead.get_or_insert((report.seq, theirs));
            return;
        }
        let verdict = compare(&self.recent, self.through, report.seq, theirs);
        if let Some(verdict) = verdict {
            self.peers
                .get_mut(&report.replica)
                .expect("inserted")
                .verdict = Some(verdict);
        }
    }

    /// The replicas that differ from this one, if this one should give up its history at `now`: every
    /// replica heard from within [`FORGET`] with a digest has been compared with, and every one differs
    /// (see the module doc). `None` while this process has no digest itself, or has listened for less than
    /// [`LISTEN_FIRST`].
    pub fn judge(&self, now: Nanos) -> Option<Vec<(String, Verdict)>> {
        self.through?;
        if now < self.started_at.saturating_add(LISTEN_FIRST) {
            return None;
        }
        let mut differing = Vec::new();
        for (id, peer) in &self.peers {
            if now.saturating_sub(peer.heard_at) >= FORGET || !peer.known {
                continue;
            }
            match peer.verdict? {
                Verdict::Same { .. } => return None,
                differs @ Verdict::Differs { .. } => differing.push((id.clone(), differs)),
            }
        }
        (!differing.is_empty()).then_some(differing)
    }

    /// How many replicas heard from within [`FORGET`] have the same history as this one, and how many
    /// another, at the latest seq compared.
    pub fn compared(&self, now: Nanos) -> (usize, usize) {
        let recent = self
            .peers
            .values()
            .filter(|peer| now.saturating_sub(peer.heard_at) < FORGET);
        recent.fold((0, 0), |(same, differ), peer| match peer.verdict {
            Some(Verdict::Same { .. }) => (same + 1, differ),
            Some(Verdict::Differs { .. }) => (same, differ + 1),
            None => (same, differ),
        })
    }

    /// Records the digest through `seq`, the newest applied.
    fn remember(&mut self, seq: u64) {
        let Some(through) = self.through else {
            return;
        };
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((seq, through));
    }

    /// Compares the reports held from replicas that were ahead, now that this one may have caught up.
    fn compare_ahead(&mut self) {
        let applied = self.recent.back().map_or(0, |(seq, _)| *seq);
        for peer in self.peers.values_mut() {
            let Some((seq, theirs)) = peer.ahead.filter(|(seq, _)| *seq <= applied) else {
                continue;
            };
            peer.ahead = None;
            if let Some(verdict) = compare(&self.recent, self.through, seq, theirs) {
                peer.verdict = Some(verdict);
            }
        }
    }
}

/// The comparison of `theirs` with this process's digest at `seq`, if it is still kept.
fn compare(
    recent: &VecDeque<(u64, HistoryDigest)>,
    through: Option<HistoryDigest>,
    seq: u64,
    theirs: HistoryDigest,
) -> Option<Verdict> {
    through?;
    let at = recent.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
    let mine = recent[at].1;
    Some(if mine == theirs {
        Verdict::Same { seq }
    } else {
        Verdict::Differs { seq, mine, theirs }
    })
}

/// The digest through a mutation at `seq` with message digest `message`, after `before`.
fn chain(before: HistoryDigest, seq: u64, message: MessageDigest) -> HistoryDigest {
    let mut bytes = [0u8; 24];
    bytes[..8].copy_from_slice(&before.to_le_bytes());
    bytes[8..16].copy_from_slice(&seq.to_le_bytes());
    bytes[16..].copy_from_slice(&message.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A moment past every history's first listening.
    const SECOND: Nanos = LISTEN_FIRST + 1_000_000_000;

    /// A history that applied `messages` (seq, mutation digest or `None`) from the stream's start.
    fn applied(messages: &[(u64, Option<u64>)]) -> History {
        let mut history = History::start(0, Some(EMPTY), 0);
        for (seq, message) in messages {
            history.applied(*seq, *message);
        }
        history
    }

    fn report(replica: &str, history: &History, seq: u64) -> HistoryReport {
        let digest = match history.recent.binary_search_by_key(&seq, |(s, _)| *s) {
            Ok(at) => Some(history.recent[at].1),
            Err(_) => history.through,
        };
        HistoryReport {
            replica: replica.into(),
            nonce: replica.len() as u64 + 100,
            seq,
            digest,
        }
    }

    fn mutations(seqs: std::ops::RangeInclusive<u64>) -> Vec<(u64, Option<u64>)> {
        seqs.map(|seq| (seq, Some(seq * 31))).collect()
    }

    proptest! {
        /// One mutation that differs, anywhere before, is noticed at every later seq compared — however
        /// many seqs ago it was applied — and histories that do not differ are never judged.
        #[test]
        fn one_differing_mutation_is_noticed_at_every_later_seq(
            length in 2u64..300,
            differing in 1u64..300,
            compared in 1u64..300,
        ) {
            let (differing, compared) = (differing.min(length), compared.min(length));
            let sound = mutations(1..=length);
            let mut other = sound.clone();
            other[differing as usize - 1].1 = Some(7);
            let (mut a, b, c) = (applied(&sound), applied(&other), applied(&sound));
            a.heard(&report("b", &b, compared), 0, SECOND);
            let noticed = matches!(a.peers["b"].verdict, Some(Verdict::Differs { .. }));
            prop_assert_eq!(noticed, compared >= differing);
            a.heard(&report("c", &c, compared), 0, SECOND);
            prop_assert_eq!(a.peers["c"].verdict, Some(Verdict::Same { seq: compared }));
        }
    }

    #[test]
    fn messages_that_are_not_mutations_leave_the_digest_as_it_was() {
        let with_barriers = applied(&[(1, Some(5)), (2, None), (3, Some(6))]);
        let mut without = applied(&[(1, Some(5))]);
        without.passed_over(2);
        without.applied(3, Some(6));
        assert_eq!(with_barriers.digest(), without.digest());
        assert_ne!(
            with_barriers.digest(),
            applied(&[(1, Some(5)), (3, Some(7))]).digest()
        );
        assert_ne!(
            applied(&[(1, Some(5))]).digest(),
            applied(&[(2, Some(5))]).digest(),
            "the seq counts"
        );
    }

    #[test]
    fn a_report_from_a_replica_ahead_is_compared_once_this_one_gets_there() {
        let ahead = applied(&mutations(1..=10));
        let mut behind = applied(&mutations(1..=4));
        behind.heard(&report("ahead", &ahead, 8), 0, SECOND);
        behind.heard(&report("ahead", &ahead, 10), 0, SECOND);
        assert_eq!(behind.peers["ahead"].verdict, None);
        for (seq, message) in mutations(5..=8) {
            behind.applied(seq, message);
        }
        assert_eq!(
            behind.peers["ahead"].verdict,
            Some(Verdict::Same { seq: 8 }),
            "the earliest report held"
        );
    }

    #[test]
    fn the_one_that_differs_from_the_others_gives_up_and_they_do_not() {
        let sound = mutations(1..=20);
        let mut diverged = sound.clone();
        diverged[3].1 = None; // read something else at seq 4: one key fewer
        let histories = [applied(&sound), applied(&sound), applied(&diverged)];
        let ids = ["r0", "r1", "r2"];
        let judged: Vec<bool> = (0..3)
            .map(|me| {
                let mut mine = histories[me].clone();
                assert_eq!(mine.judge(SECOND), None, "nothing heard yet");
                for other in (0..3).filter(|other| *other != me) {
                    mine.heard(&report(ids[other], &histories[other], 20), 0, SECOND);
                }
                mine.judge(SECOND).is_some()
            })
            .collect();
        assert_eq!(judged, [false, false, true]);
        let mut r0 = histories[0].clone();
        for other in [1, 2] {
            r0.heard(&report(ids[other], &histories[other], 20), 0, SECOND);
        }
        assert_eq!(r0.compared(SECOND), (1, 1));
        assert_eq!(r0.compared(SECOND + FORGET), (0, 0), "forgotten");
    }

    #[test]
    fn of_two_that_differ_both_give_up_and_a_comparison_still_to_come_waits() {
        let (a, b) = (applied(&mutations(1..=5)), applied(&[(1, Some(1))]));
        let mut judging = a.clone();
        judging.heard(&report("b", &b, 1), 0, SECOND);
        assert_eq!(
            judging.judge(LISTEN_FIRST - 1),
            None,
            "still listening first"
        );
        let differing = judging.judge(SECOND).expect("b differs, none agrees");
        assert_eq!(differing[0].0, "b");
        judging.heard(&report("c", &a, 9), 0, SECOND);
        assert_eq!(
            judging.judge(SECOND),
            None,
            "c's report is ahead: wait for it"
        );
        let mut forgotten = judging.clone();
        forgotten.heard(&report("b", &b, 1), 0, SECOND + 1);
        assert!(
            forgotten.judge(SECOND + FORGET - 1).is_none(),
            "c is still heard from recently"
        );
        assert!(forgotten.judge(SECOND + FORGET).is_some(), "c forgotten");
    }

    #[test]
    fn a_history_without_a_digest_judges_nothing_and_counts_in_no_judgement() {
        let mut unknown = History::start(10, None, 0);
        unknown.applied(11, Some(1));
        assert_eq!(unknown.digest(), None);
        let sound = applied(&mutations(1..=11));
        unknown.heard(&report("s", &sound, 11), 0, SECOND);
        assert_eq!(unknown.judge(SECOND), None);
        let mut judging = sound.clone();
        judging.heard(&report("u", &unknown, 11), 0, SECOND);
        judging.heard(&report("d", &applied(&[(1, Some(2))]), 1), 0, SECOND);
        assert!(judging.judge(SECOND).is_some(), "u counts for nothing");
    }

    #[test]
    fn only_the_last_recent_seqs_are_kept_and_its_own_reports_are_ignored() {
        let length = RECENT as u64 + 10;
        let long = applied(&mutations(1..=length));
        assert_eq!(long.recent.len(), RECENT);
        let mut judging = long.clone();
        let old = HistoryReport {
            digest: Some(1),
            ..report("old", &long, 5)
        };
        judging.heard(&old, 0, SECOND);
        assert_eq!(
            judging.peers["old"].verdict, None,
            "seq 5 is no longer kept"
        );
        let own = report("me", &applied(&[(1, Some(9))]), 1);
        judging.heard(&own, own.nonce, SECOND);
        assert!(!judging.peers.contains_key("me"));
    }
}
