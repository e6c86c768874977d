//! A gate's writes through a [`Log`] it appends to and applies after — the write-ahead log, or memory —
//! and the mutations read back from one at start. The single server's write path.

use bytes::Bytes;

use super::{still_loading, Gate, GateError, Seqs, WriteMode};
use crate::keys::PackedKeys;
use crate::log::{Log, Mutation};
use crate::namespace::{AbsenceReport, Added, NewKeys, Rebuild, Recorded, WriteError};

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
        let (namespace, keys) = self.add_request(namespace, keys)?;
        let log = self.writable_log()?;
        Ok(namespace.add_with(keys, self.clock.now_ms(), log, new_keys)?)
    }

    /// Records that the source does not have `report.key`.
    pub fn record_absent(
        &self,
        namespace: &str,
        report: AbsenceReport,
    ) -> Result<Recorded, GateError> {
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
        Ok(namespace.record_absent(report, self.clock.now_ms(), log)?)
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
