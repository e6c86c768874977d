//! What the service asks of the replicated mode beyond its writes ([`Writes`](crate::writes::Writes)): the
//! members, an operator's removal of one, and a rebuild published through the shared log. The replicated
//! mode implements it (`replication::replica::Replica`); the service holds a `dyn Replicas` and never that
//! type, so the service does not depend on the replicated mode — nor, through it, on NATS.

use std::sync::Arc;

use bytes::Bytes;

use crate::gate::GateError;
use crate::namespace::Rebuilt;
use crate::writes::Pending;

/// A member as a replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    /// Its `--replica-id`.
    pub id: String,
    /// Its process's nonce.
    pub nonce: u64,
    /// The seq of its join.
    pub joined: u64,
    /// Where it runs.
    pub origin: String,
    /// The applied seq it last reported here.
    pub reported: u64,
    /// Whether it is this replica.
    pub this_replica: bool,
}

/// A replica of a shared log, as the Admin service uses it.
pub trait Replicas: Send + Sync + std::fmt::Debug {
    /// The log seq this replica has applied through.
    fn applied_seq(&self) -> u64;

    /// The members as of the applied seq.
    fn members(&self) -> Vec<MemberView>;

    /// Publishes an operator's removal of member `id`; the seq it was stored at.
    fn remove_member<'a>(&'a self, id: &'a str) -> Pending<'a, Result<u64, GateError>>;

    /// Begins a rebuild of `namespace` on every replica, through the log.
    fn begin_rebuild(
        self: Arc<Self>,
        namespace: String,
    ) -> Pending<'static, Result<Box<dyn LoggedRebuild>, GateError>>;
}

/// A rebuild published through the log, fed in steps. Dropped before [`commit`](Self::commit) — the call
/// failed or was cancelled — it is aborted on every replica.
pub trait LoggedRebuild: Send {
    /// Publishes the next keys.
    fn feed(&mut self, keys: Vec<Bytes>) -> Pending<'_, Result<(), GateError>>;

    /// Publishes the commit, once every key fed is stored: the rebuilt filter replaces the live one
    /// everywhere.
    fn commit(self: Box<Self>) -> Pending<'static, Result<Rebuilt, GateError>>;
}
