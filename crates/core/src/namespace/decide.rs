//! The decisions that turn a request into a mutation: an `Add`'s record, and what a reported absence comes to
//! (`REDUNDANT`, `SUPERSEDED`, `THROTTLED`, or a tombstone with its TTL and jitter).

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::hashing::KeyHash;
use crate::keys::PackedKeys;
use crate::log::{Log, Mutation, Ticket};
use crate::tombstones::AbsenceKind;

/// What a reported absence comes to before it is logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Absence {
    /// Nothing to store: the answer as it stands.
    Answered(Recorded),
    /// A tombstone to log, and the answer if applying it records it.
    Store {
        /// The mutation to log.
        mutation: Mutation,
        /// The answer once it is recorded (its seq is the mutation's).
        recorded: Recorded,
    },
}

/// 64 well-mixed bits from a key's hash and a time: splitmix64's finalizer over their combination (every input
/// bit flips about half the output bits), so that keys with close hashes, or one key at close times, draw
/// unrelated jitters.
fn jitter_bits(hash: KeyHash, at_ms: u64) -> u64 {
    let mut z = hash.0 ^ at_ms.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Namespace {
    /// Adds `keys` (non-empty, validated) at `now_ms`.
    pub fn add(
        &self,
        keys: impl Into<PackedKeys>,
        now_ms: u64,
        log: &dyn Log,
    ) -> Result<Added, WriteError> {
        self.add_with(keys, now_ms, log, NewKeys::Skip)
    }

    /// [`add`](Self::add), reporting its new keys if `new_keys` asks.
    pub fn add_with(
        &self,
        keys: impl Into<PackedKeys>,
        now_ms: u64,
        log: &dyn Log,
        new_keys: NewKeys,
    ) -> Result<Added, WriteError> {
        let (added, ticket) = self.add_appended(keys, now_ms, log, new_keys)?;
        log.commit(ticket)?;
        Ok(added)
    }

    /// [`add_with`](Self::add_with) up to the log's commit: applied and appended, not yet durable. The
    /// caller commits `ticket` before it tells anyone.
    pub fn add_appended(
        &self,
        keys: impl Into<PackedKeys>,
        now_ms: u64,
        log: &dyn Log,
        new_keys: NewKeys,
    ) -> Result<(Added, Ticket), WriteError> {
        let mut writer = self.writer()?;
        let mutation = self.addition(keys.into(), now_ms, self.latest_seq() + 1);
        let seq = mutation.seq();
        let ticket = log.append(&mutation)?;
        let Applied::Added { cleared, new } = self.apply_locked(&mut writer, mutation, new_keys)
        else {
            unreachable!("an Add applies as added")
        };
        drop(writer);
        let added = Added {
            seq,
            tombstones_cleared: cleared.len() as u32,
            new,
        };
        Ok((added, ticket))
    }

    /// The `Add` of `keys` at `now_ms`, for a log that assigns seqs itself (seq 0 until it does). Nothing
    /// changes until the log hands it back to [`apply`](Self::apply).
    pub fn prepare_add(&self, keys: PackedKeys, now_ms: u64) -> Result<Mutation, WritesStopped> {
        drop(self.writer()?);
        Ok(self.addition(keys, now_ms, 0))
    }

    fn addition(&self, keys: PackedKeys, at_ms: u64, seq: u64) -> Mutation {
        Mutation::Add {
            namespace: Arc::clone(&self.name),
            seq,
            at_ms,
            keys,
        }
    }

    /// Decides what to do with a reported absence and, if it is to be stored, logs and applies it.
    pub fn record_absent(
        &self,
        report: AbsenceReport,
        now_ms: u64,
        log: &dyn Log,
    ) -> Result<Recorded, WriteError> {
        let (recorded, ticket) = self.record_absent_appended(report, now_ms, log)?;
        if let Some(ticket) = ticket {
            log.commit(ticket)?;
        }
        Ok(recorded)
    }

    /// [`record_absent`](Self::record_absent) up to the log's commit: the ticket to commit before the
    /// answer is given, if a tombstone was stored (`None`: nothing was logged).
    pub fn record_absent_appended(
        &self,
        report: AbsenceReport,
        now_ms: u64,
        log: &dyn Log,
    ) -> Result<(Recorded, Option<Ticket>), WriteError> {
        let mut writer = self.writer()?;
        let seq = self.latest_seq() + 1;
        let (mutation, recorded) = match self.decide_absence(&mut writer, report, now_ms, seq, true)
        {
            Absence::Answered(recorded) => return Ok((recorded, None)),
            Absence::Store { mutation, recorded } => (mutation, recorded),
        };
        let ticket = log.append(&mutation)?;
        let applied = self.apply_locked(&mut writer, mutation, NewKeys::Skip);
        // Checked by the decision under the same lock, against the same memory of adds.
        debug_assert_eq!(applied, Applied::Recorded);
        drop(writer);
        Ok((recorded, Some(ticket)))
    }

    /// Decides a reported absence against this replica's state, for a log that assigns seqs itself: either
    /// the answer (`REDUNDANT`, `SUPERSEDED`, `THROTTLED` — nothing to log), or the mutation to publish (seq
    /// 0 until the log assigns it), whose outcome is decided again when it is applied, in log order.
    /// `REDUNDANT` only if `filter_answers`: the replica answers `ABSENT` from its filter now (it holds its
    /// read lease); a replica without one may lack an `Add` acknowledged elsewhere, and must not tell the
    /// caller the gate already answers `ABSENT` for the key.
    pub fn prepare_absence(
        &self,
        report: AbsenceReport,
        now_ms: u64,
        filter_answers: bool,
    ) -> Result<Absence, WritesStopped> {
        let mut writer = self.writer()?;
        Ok(self.decide_absence(&mut writer, report, now_ms, 0, filter_answers))
    }

    /// The decisions of `RecordAbsent` before anything is logged: the filter already answers absent (when
    /// `filter_answers`: its answers are current), the key may have been added after the caller's
    /// observation, or the namespace is over its tombstone rate — else a tombstone at `seq` with its
    /// jittered TTL.
    fn decide_absence(
        &self,
        writer: &mut Writer,
        report: AbsenceReport,
        now_ms: u64,
        seq: u64,
        filter_answers: bool,
    ) -> Absence {
        let hash = self.hasher.hash(&report.key);
        let not_stored = |outcome| {
            Absence::Answered(Recorded {
                outcome,
                seq: self.latest_seq(),
                expires_in_ms: 0,
            })
        };
        if filter_answers && !self.filter.load().contains(hash, now_ms) {
            return not_stored(RecordOutcome::Redundant);
        }
        if report.observed_seq != 0
            && writer
                .recent_adds
                .may_have_been_added_after(hash, report.observed_seq)
        {
            return not_stored(RecordOutcome::Superseded);
        }
        if report.kind == AbsenceKind::Missing {
            // The filter passed a key the source does not have: a false positive as clients see it.
            self.metrics.false_positives.increment(1);
        }
        if !writer.admission.try_take(now_ms) {
            self.metrics.throttled.increment(1);
            return not_stored(RecordOutcome::Throttled);
        }
        let ttl_ms = self.ttl_ms(report.kind, report.ttl_seconds, hash, now_ms);
        Absence::Store {
            mutation: Mutation::RecordAbsent {
                namespace: Arc::clone(&self.name),
                seq,
                at_ms: now_ms,
                key: report.key,
                kind: report.kind,
                expires_at_ms: now_ms.saturating_add(ttl_ms),
                observed_seq: report.observed_seq,
            },
            recorded: Recorded {
                outcome: RecordOutcome::Recorded,
                seq,
                expires_in_ms: ttl_ms,
            },
        }
    }

    /// The TTL for a tombstone: requested or default, clamped to the maximum, jittered (never above it).
    ///
    /// The jitter spreads the expiries of keys recorded together (a burst of misses would otherwise all
    /// expire, and all reach the source, in the same millisecond). It is drawn from the key's keyed hash and
    /// the time of the report rather than from a random generator, so the core stays a pure function of its
    /// inputs: whoever computes a mutation — this process, or any replica from the same message — gets the
    /// same expiry, and property tests reproduce. Keys differ in hash, so a burst still spreads; one key
    /// recorded again later gets another draw. The draw is uniform in `[-jitter, +jitter]` to 2^-53.
    fn ttl_ms(&self, kind: AbsenceKind, requested_seconds: u32, hash: KeyHash, at_ms: u64) -> u64 {
        let base = match (requested_seconds, kind) {
            (0, AbsenceKind::Missing) => self.settings.missing_ttl,
            (0, AbsenceKind::Deleted) => self.settings.deleted_ttl,
            (seconds, _) => Duration::from_secs(u64::from(seconds)),
        };
        let max_ms = self.settings.max_ttl.as_millis() as f64;
        let base_ms = (base.as_millis() as f64).min(max_ms);
        let unit = (jitter_bits(hash, at_ms) >> 11) as f64 / (1u64 << 53) as f64;
        let factor = 1.0 + self.settings.ttl_jitter * (2.0 * unit - 1.0);
        (base_ms * factor).round().clamp(1.0, max_ms) as u64
    }
}
