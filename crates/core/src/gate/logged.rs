//! A gate's writes through a [`Log`] it appends to and applies after — the write-ahead log, or memory —
//! and the mutations read back from one at start. The single server's write path.

use bytes::Bytes;

use super::{still_loading, Gate, GateError, Seqs, WriteMode};
use crate::keys::PackedKeys;
use crate::log::{Log, Mutation, Ticket};
use crate::namespace::{AbsenceReport, Added, NewKeys, Rebuild, Recorded, WriteError};

/// A write applied and appended to the log but not yet durable: its answer may be told only once
/// [`Gate::commit`] or [`Gate::committed`] has waited for the log.
#[derive(Debug)]
#[must_use = "a write is not durable until it is committed"]
pub struct Logged<T> {
    value: T,
    /// `None`: nothing was logged (an absence answered without a tombstone).
    ticket: Option<Ticket>,
}

impl Gate {
    /// Adds `keys` to `namespace` under one new seq.
    pub fn add(&self, namespace: &str, keys: impl Into<PackedKeys>) -> Result<Added, GateError> {
        self.add_with(namespace, keys, NewKeys::Skip)
    }

    /// [`add`](Self::add), reporting which keys were new if `new_keys` asks ([`Added::new`]).
    pub fn add_with(
        &self,
        namespace: &str,
        keys: impl Into<PackedKeys>,
        new_keys: NewKeys,
    ) -> Result<Added, GateError> {
        self.commit(self.add_logged(namespace, keys, new_keys)?)
    }

    /// [`add_with`](Self::add_with) up to the log's commit, which the caller waits for.
    pub fn add_logged(
        &self,
        namespace: &str,
        keys: impl Into<PackedKeys>,
        new_keys: NewKeys,
    ) -> Result<Logged<Added>, GateError> {
        let (namespace, keys) = self.add_request(namespace, keys)?;
        let log = self.writable_log()?;
        let (value, ticket) = namespace.add_appended(keys, self.clock.now_ms(), log, new_keys)?;
        Ok(Logged {
            value,
            ticket: Some(ticket),
        })
    }

    /// Records that the source does not have `report.key`.
    pub fn record_absent(
        &self,
        namespace: &str,
        report: AbsenceReport,
    ) -> Result<Recorded, GateError> {
        self.commit(self.record_absent_logged(namespace, report)?)
    }

    /// [`record_absent`](Self::record_absent) up to the log's commit, which the caller waits for.
    pub fn record_absent_logged(
        &self,
        namespace: &str,
        report: AbsenceReport,
    ) -> Result<Logged<Recorded>, GateError> {
        let namespace = self.absence_request(namespace, &report)?;
        // While loading, the seq is not yet the one a client observed before a restart: refuse as loading.
        let log = self.writable_log()?;
        let latest = namespace.latest_seq();
        if report.observed_seq > latest {
            return Err(GateError::InvalidArgument(format!(
                "observed_seq {} is ahead of namespace {:?}'s latest seq {latest}: it was not observed on \
                 this server (another deployment, or state lost in a restart); look the key up again",
                report.observed_seq,
                namespace.name()
            )));
        }
        let (value, ticket) = namespace.record_absent_appended(report, self.clock.now_ms(), log)?;
        Ok(Logged { value, ticket })
    }

    /// Waits, on this thread, until `logged` is durable; then its answer.
    pub fn commit<T>(&self, logged: Logged<T>) -> Result<T, GateError> {
        if let Some(ticket) = logged.ticket {
            self.writable_log()?
                .commit(ticket)
                .map_err(WriteError::from)?;
        }
        Ok(logged.value)
    }

    /// [`commit`](Self::commit) as a future that needs no thread of its own where the log
    /// [commits without one](Self::commits_without_thread).
    pub fn committed<T: Send + 'static>(
        &self,
        logged: Logged<T>,
    ) -> impl std::future::Future<Output = Result<T, GateError>> + Send + 'static {
        let wait = match (logged.ticket, self.writable_log()) {
            (Some(ticket), Ok(log)) => Some(Ok(log.committed(ticket))),
            (Some(_), Err(e)) => Some(Err(e)),
            (None, _) => None,
        };
        async move {
            if let Some(wait) = wait {
                wait?.await.map_err(WriteError::from)?;
            }
            Ok(logged.value)
        }
    }

    /// Starts rebuilding `namespace`'s filter from keys the caller will stream.
    pub fn begin_rebuild(&self, namespace: &str) -> Result<Rebuild, GateError> {
        let namespace = self.namespace(namespace)?;
        self.writable_log()?;
        namespace
            .begin_rebuild()
            .map_err(WriteError::from)?
            .ok_or_else(|| {
                GateError::Conflict(format!(
                    "a rebuild of namespace {:?} is already running; wait for it to finish",
                    namespace.name()
                ))
            })
    }

    /// Feeds validated keys to a rebuild.
    pub fn feed_rebuild(&self, rebuild: &mut Rebuild, keys: &[Bytes]) -> Result<(), GateError> {
        self.check_keys(keys.iter().map(AsRef::as_ref))?;
        rebuild.insert(keys, self.clock.now_ms());
        Ok(())
    }

    /// Applies mutations read back from a log, in order.
    pub fn replay(&self, mutations: impl IntoIterator<Item = Mutation>) -> Result<(), String> {
        mutations.into_iter().try_for_each(|m| self.replay_one(m))
    }

    /// Applies one mutation read back from a log: skipped if the namespace's state already includes it (a
    /// snapshot covered it), applied if it is the next seq, refused if seqs are missing before it.
    pub fn replay_one(&self, mutation: Mutation) -> Result<(), String> {
        self.apply_logged(mutation, Seqs::Contiguous, NewKeys::Skip)
            .map(drop)
    }

    /// The log, once loading is done; writes before that are refused (their seqs would collide with the
    /// log being replayed).
    fn writable_log(&self) -> Result<&dyn Log, GateError> {
        match self.writes.get() {
            Some(WriteMode::Logged(log)) => Ok(log.as_ref()),
            Some(WriteMode::Published) => Err(GateError::Unavailable(
                "this replica's writes go through its stream, not a local log".to_string(),
            )),
            None => Err(still_loading()),
        }
    }
}
