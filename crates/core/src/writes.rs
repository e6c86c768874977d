//! Where a write goes, as the service sees it: [`Writes`] takes `Add`s and reported absences and answers
//! once they are acknowledged. Two implementations, chosen once at start: the local gate through its log
//! (`service::writes::LocalWrites`) and a replica publishing to its shared stream
//! (`replication::replica::Replica`). The service calls this trait and never either type, so the gRPC
//! surface does not depend on how a write becomes durable, nor on the replicated mode.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::gate::GateError;
use crate::keys::PackedKeys;
use crate::namespace::{AbsenceReport, Added, NewKeys, Recorded};

/// A write (or a wait) in progress.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the service's writes are sent to.
pub trait Writes: Send + Sync + std::fmt::Debug {
    /// `Add` of `keys` to `namespace`, answered once acknowledged (durable, and on a replica applied as the
    /// replication protocol requires), with its new keys if `new_keys` asks ([`Added::new`]).
    fn add<'a>(
        &'a self,
        namespace: &'a str,
        keys: PackedKeys,
        new_keys: NewKeys,
    ) -> Pending<'a, Result<Added, GateError>>;

    /// A reported absence, answered with its outcome once decided (and, when stored, acknowledged).
    fn record_absent<'a>(
        &'a self,
        namespace: &'a str,
        report: AbsenceReport,
    ) -> Pending<'a, Result<Recorded, GateError>>;

    /// Waits, at most `bound`, until this gate has applied `seq` (a seq a client saw elsewhere); whether it
    /// has. A gate that is its own log never lags one, and answers at once.
    fn reach(&self, seq: u64, bound: Duration) -> Pending<'_, bool>;

    /// Waits, at most `bound`, until everything this gate has applied is known to be the log's, so that the
    /// seqs its answers claim ([`ReadLease::observed_seq`](crate::lease::ReadLease::observed_seq)) reach what
    /// it applied; whether it is. A replica asks for a barrier and waits to read it where the stream stored
    /// it; a gate that is its own log answers at once.
    fn vouch(&self, bound: Duration) -> Pending<'_, bool>;
}
