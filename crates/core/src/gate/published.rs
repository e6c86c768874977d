//! A gate's writes through a log that assigns seqs itself (a replicated stream): each write is validated,
//! decided where it can be and [prepared](Gate::prepare_add) here, published by the wiring, and handed back
//! in stream order to [`apply_streamed`](Gate::apply_streamed). A replica's write path.

use std::time::Duration;

use super::{still_loading, Gate, GateError, Seqs, WriteMode};
use crate::keys::PackedKeys;
use crate::log::{Mutation, RebuildStep};
use crate::namespace::{Absence, AbsenceReport, Applied, NewKeys, WriteError};

impl Gate {
    /// A message of the stream, stored by its leader at `stored_at_ms`, was applied (a mutation or not).
    pub fn stream_time_passed(&self, stored_at_ms: u64) {
        if let Some(time) = &self.stream_time {
            time.passed(stored_at_ms);
        }
    }

    /// The `Add` of `keys` to `namespace`, validated and timed but not applied: for the wiring to publish to
    /// a log that assigns its seq, and to hand back to [`apply_streamed`](Self::apply_streamed).
    pub fn prepare_add(
        &self,
        namespace: &str,
        keys: impl Into<PackedKeys>,
    ) -> Result<Mutation, GateError> {
        let (namespace, keys) = self.add_request(namespace, keys)?;
        self.published_writes()?;
        namespace
            .prepare_add(keys, self.clock.now_ms())
            .map_err(|stopped| WriteError::from(stopped).into())
    }

    /// A reported absence decided against this replica's state: the answer when nothing is to be published
    /// (`REDUNDANT` — only under the read lease —, `SUPERSEDED`, `THROTTLED`), else the tombstone to publish.
    /// `latest_known` is the newest seq the shared log is known to hold: an `observed_seq` above it was never
    /// observed anywhere.
    pub fn prepare_absence(
        &self,
        namespace: &str,
        report: AbsenceReport,
        latest_known: u64,
    ) -> Result<Absence, GateError> {
        let namespace = self.absence_request(namespace, &report)?;
        self.published_writes()?;
        if report.observed_seq > latest_known.max(namespace.latest_seq()) {
            return Err(GateError::InvalidArgument(format!(
                "observed_seq {} is ahead of the newest seq of the stream ({latest_known}): it was not \
                 observed in this deployment (another deployment, or a stream that was reset); look the \
                 key up again",
                report.observed_seq
            )));
        }
        // `REDUNDANT` says the gate answers `ABSENT` for the key: only while this replica's answers hold.
        let filter_answers = self.absent_allowed();
        namespace
            .prepare_absence(report, self.clock.now_ms(), filter_answers)
            .map_err(|stopped| WriteError::from(stopped).into())
    }

    /// The `Begin` of a rebuild of `namespace` through a log that assigns its seq (see
    /// [`RebuildStep`]); `CONFLICT` while another rebuild of it took a step within `idle`.
    pub fn prepare_rebuild(&self, namespace: &str, idle: Duration) -> Result<Mutation, GateError> {
        let namespace = self.namespace(namespace)?;
        self.published_writes()?;
        namespace
            .prepare_rebuild(self.clock.now_ms(), idle)
            .map_err(WriteError::from)?
            .ok_or_else(|| {
                GateError::Conflict(format!(
                    "a rebuild of namespace {:?} is already running (it sent keys within the last {idle:?}); \
                     wait for it to finish",
                    namespace.name()
                ))
            })
    }

    /// A later step of a rebuild of `namespace` (`Keys`, `Commit`, `Abort`), its keys validated.
    pub fn prepare_rebuild_step(
        &self,
        namespace: &str,
        step: RebuildStep,
    ) -> Result<Mutation, GateError> {
        let namespace = self.namespace(namespace)?;
        if let RebuildStep::Keys { keys, .. } = &step {
            self.check_keys(keys.iter().map(AsRef::as_ref))?;
        }
        self.published_writes()?;
        Ok(namespace.rebuild_step(step, self.clock.now_ms()))
    }

    /// Applies one mutation of a replicated stream, whose seqs are the stream's sequence numbers: shared by
    /// every namespace, so a namespace's seqs rise with gaps. Skipped if the state already includes it.
    /// Returns what applying it did (`None` if it was included already).
    /// Its times are first [agreed](Mutation::agreed) with `stored_at_ms`, when the stream stored it.
    pub fn apply_streamed(
        &self,
        mutation: Mutation,
        stored_at_ms: u64,
    ) -> Result<Option<Applied>, String> {
        self.apply_streamed_with(mutation, stored_at_ms, NewKeys::Skip)
    }

    /// [`apply_streamed`](Self::apply_streamed), an `Add` reporting its new keys if `new_keys` asks (the
    /// replica that published it, for a caller that wants them).
    pub fn apply_streamed_with(
        &self,
        mutation: Mutation,
        stored_at_ms: u64,
        new_keys: NewKeys,
    ) -> Result<Option<Applied>, String> {
        self.stream_time_passed(stored_at_ms);
        self.apply_logged(mutation.agreed(stored_at_ms), Seqs::Gapped, new_keys)
    }

    /// Ok once loading is done, for a gate whose writes are published.
    fn published_writes(&self) -> Result<(), GateError> {
        match self.writes.get() {
            Some(WriteMode::Published) => Ok(()),
            Some(WriteMode::Logged(_)) => Err(GateError::Unavailable(
                "this gate writes to a local log: its writes are not prepared for a stream"
                    .to_string(),
            )),
            None => Err(still_loading()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::clock::{Clock, ManualClock, MonotonicClock};
    use crate::config::GateConfig;
    use crate::gate::Gate;
    use crate::hashing::KeyHasher;
    use crate::lease::ReadLease;
    use crate::namespace::{Absence, AbsenceReport, RecordOutcome};
    use crate::tombstones::AbsenceKind;

    /// A gate of a stream's replica, open for writes, namespace `users`; answering under a read lease
    /// (not yet held) if `leased`.
    fn replica(leased: bool) -> (Arc<ManualClock>, Arc<ReadLease>, Gate) {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let lease = Arc::new(ReadLease::new(clock.clone()));
        let config = GateConfig::from_toml("[namespaces.users]\nexpected_keys = 1000\n").unwrap();
        let mut gate = Gate::new(&config, KeyHasher::from_seed([1; 32]), clock.clone());
        if leased {
            gate = gate.with_read_lease(Arc::clone(&lease));
        }
        gate.open_published();
        (clock, lease, gate)
    }

    /// `REDUNDANT` tells the caller the gate already answers `ABSENT` for the key: a replica without its read
    /// lease may lack an `Add` acknowledged through another one, so it publishes the tombstone instead (its
    /// outcome decided in stream order), and says `REDUNDANT` only while the lease holds.
    #[test]
    fn only_a_replica_holding_its_lease_answers_redundant() {
        let (clock, lease, gate) = replica(true);
        let report = || AbsenceReport {
            key: "never-added".into(),
            kind: AbsenceKind::Missing,
            observed_seq: 0,
            ttl_seconds: 0,
        };
        lease.set_until(clock.now_ns() + 1_000_000_000);
        match gate.prepare_absence("users", report(), 0).unwrap() {
            Absence::Answered(recorded) => assert_eq!(recorded.outcome, RecordOutcome::Redundant),
            other => panic!("under the lease: {other:?}"),
        }
        lease.set_until(0);
        assert!(
            matches!(
                gate.prepare_absence("users", report(), 0).unwrap(),
                Absence::Store { .. }
            ),
            "without the lease the tombstone is published"
        );
    }

    /// A replica's answers claim no `observed_seq` past the seq its copy of the stream is vouched for
    /// through (a copy that diverged counts ahead of the stream; a tombstone observed at such a seq would
    /// stand over an `Add` stored below it), and never 0; a gate with no lease claims its latest seq.
    #[test]
    fn answers_claim_no_observed_seq_past_the_vouched_copy() {
        let (clock, lease, gate) = replica(true);
        let add = gate.prepare_add("users", vec!["k".into()]).unwrap();
        gate.apply_streamed(add.with_seq(10), clock.now_ms())
            .unwrap();
        lease.set_until(clock.now_ns() + 1_000_000_000);
        let claimed = |gate: &Gate| {
            let (_, one) = gate.may_exist("users", b"k").unwrap();
            let mut answers = Vec::new();
            let batch = gate
                .batch_may_exist("users", &[b"k"], &mut answers)
                .unwrap();
            let current = gate.current_seq("users").unwrap();
            assert!(one == batch && batch == current, "{one} {batch} {current}");
            one
        };
        assert_eq!(
            claimed(&gate),
            1,
            "nothing vouched for: the genesis seq, not 0"
        );
        lease.set_vouched_seq(4);
        assert_eq!(claimed(&gate), 4);
        lease.set_vouched_seq(12);
        assert_eq!(claimed(&gate), 10, "no more than it applied");
        let (clock, _, single) = replica(false);
        let add = single.prepare_add("users", vec!["k".into()]).unwrap();
        single
            .apply_streamed(add.with_seq(10), clock.now_ms())
            .unwrap();
        assert_eq!(claimed(&single), 10, "no lease: its latest seq");
    }
}
