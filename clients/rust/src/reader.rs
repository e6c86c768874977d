//! [`GatedReader`]: the read path in front of a source (`clients/README.md`).
//!
//! `get(key)`: a local absence → "does not exist", no call; else the (coalesced) lookup: absent → "does
//! not exist"; may exist → the source, through a per-key single flight; found → the value; missing or
//! deleted → `RecordAbsent` so the next reader is answered by the gate. The gate is an optimisation, never
//! a dependency: when a lookup fails, the source is read (fail-open), so a gate outage never turns into
//! "does not exist".

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use tokio::task::JoinHandle;
use tonic::Status;

use crate::cache::{Absences, Ticket};
use crate::client::{GateClient, Lookup};
use crate::endpoints::lock;
use crate::options::ReaderOptions;
use crate::proto::{AbsenceKind, RecordOutcome};
use crate::stats::{count, Stats};

/// At most this many keys found while the gate was warming wait to be added (one `Add`'s worth).
const MAX_PENDING_ADDS: usize = 10_000;

/// What the source says of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceRead<V> {
    /// It exists: its value.
    Found(V),
    /// It does not exist (recorded as `MISSING`).
    Missing,
    /// It existed and was deleted (recorded as `DELETED`, kept longer).
    Deleted,
}

/// A source error, shared by every caller of the single flight that met it.
pub type ReadError<E> = Arc<E>;

type Read<V, E> = Result<SourceRead<V>, ReadError<E>>;
type Flight<V, E> = Shared<BoxFuture<'static, Read<V, E>>>;
type Source<V, E> = dyn Fn(Bytes) -> BoxFuture<'static, Result<SourceRead<V>, E>> + Send + Sync;

/// The read path for one namespace. Cheap to clone; the subscription ends with the last clone (or
/// [`GatedReader::close`]).
pub struct GatedReader<V, E> {
    inner: Arc<Inner<V, E>>,
}

impl<V, E> Clone for GatedReader<V, E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<V, E> {
    client: GateClient,
    absences: Arc<Absences>,
    source: Box<Source<V, E>>,
    flights: Mutex<HashMap<Bytes, Flight<V, E>>>,
    pending_adds: Mutex<Vec<Bytes>>,
    subscription: Option<JoinHandle<()>>,
}

impl<V, E> Drop for Inner<V, E> {
    fn drop(&mut self) {
        if let Some(subscription) = &self.subscription {
            subscription.abort();
        }
    }
}

impl<V, E> GatedReader<V, E>
where
    V: Clone + Send + Sync + 'static,
    E: Send + Sync + 'static,
{
    /// A reader in front of `source` (the database read of one key), through `client`. With
    /// `options.subscribe`, starts the invalidation subscription (must be called within a tokio runtime).
    pub fn new<F, Fut>(client: GateClient, options: ReaderOptions, source: F) -> Self
    where
        F: Fn(Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<SourceRead<V>, E>> + Send + 'static,
    {
        let absences = Arc::new(Absences::new(options.cache_capacity, options.cache_ttl));
        let subscription = options.subscribe.then(|| {
            crate::subscription::spawn(client.calls().clone(), absences.clone())
                .expect("the client's addresses were checked when it was built")
        });
        Self {
            inner: Arc::new(Inner {
                client,
                absences,
                source: Box::new(move |key| source(key).boxed()),
                flights: Mutex::default(),
                pending_adds: Mutex::default(),
                subscription,
            }),
        }
    }

    /// The value of `key`, or `None` when it does not exist. Errors are the source's only: the gate's are
    /// answered by reading the source.
    pub async fn get(&self, key: impl Into<Bytes>) -> Result<Option<V>, ReadError<E>> {
        let key = key.into();
        let inner = &self.inner;
        let counters = &inner.client.calls().counters;
        if inner.absences.contains(&key) {
            count(&counters.cache_hits, 1);
            return Ok(None);
        }
        let ticket = inner.absences.ticket();
        let lookup = match inner.client.may_exist(key.clone()).await {
            Ok(lookup) => Some(lookup),
            Err(status) => {
                count(&counters.fail_opens, 1);
                tracing::debug!(%status, "gate lookup failed: reading the source");
                None
            }
        };
        if let Some(lookup) = &lookup {
            if !lookup.warming {
                self.add_pending();
            }
            if !lookup.may_exist {
                if let Some(ticket) = ticket {
                    inner.absences.insert(ticket, key, lookup.observed_seq);
                }
                return Ok(None);
            }
        }
        match self.read_once(key.clone()).await? {
            SourceRead::Found(value) => {
                if lookup.is_some_and(|lookup| lookup.warming) {
                    self.pend_add(key);
                }
                Ok(Some(value))
            }
            SourceRead::Missing => {
                self.record(lookup, ticket, key, AbsenceKind::Missing).await;
                Ok(None)
            }
            SourceRead::Deleted => {
                self.record(lookup, ticket, key, AbsenceKind::Deleted).await;
                Ok(None)
            }
        }
    }

    /// Adds `keys` (call it before inserting the rows). Its errors are returned: a writer that cannot add
    /// must not insert, or readers would be told the new rows do not exist.
    pub async fn add<K: Into<Bytes>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<u64, Status> {
        self.inner.client.add(keys).await
    }

    /// The counters so far (the client's, shared).
    pub fn stats(&self) -> Stats {
        self.inner.client.stats()
    }

    /// The client this reader looks keys up with.
    pub fn client(&self) -> &GateClient {
        &self.inner.client
    }

    /// How many local absences are kept.
    pub fn cached_absences(&self) -> usize {
        self.inner.absences.len()
    }

    /// Ends the subscription now (it also ends when the last clone is dropped); lookups go on uncached.
    pub fn close(&self) {
        if let Some(subscription) = &self.inner.subscription {
            subscription.abort();
        }
        self.inner.absences.went_down();
    }

    /// The source read of `key`, shared with every concurrent caller for the same key.
    fn read_once(&self, key: Bytes) -> Flight<V, E> {
        let mut flights = lock(&self.inner.flights);
        if let Some(flight) = flights.get(&key) {
            return flight.clone();
        }
        let inner = Arc::downgrade(&self.inner);
        let read = (self.inner.source)(key.clone());
        let counters = self.inner.client.calls().counters.clone();
        let landing = key.clone();
        let flight = async move {
            count(&counters.source_reads, 1);
            let result = read.await.map_err(Arc::new);
            if let Some(inner) = inner.upgrade() {
                lock(&inner.flights).remove(&landing);
            }
            result
        }
        .boxed()
        .shared();
        flights.insert(key, flight.clone());
        flight
    }

    /// Records the source's "not found" with the gate, and caches it locally when the gate did.
    async fn record(
        &self,
        lookup: Option<Lookup>,
        ticket: Option<Ticket>,
        key: Bytes,
        kind: AbsenceKind,
    ) {
        let Some(lookup) = lookup else {
            return; // the gate failed: nothing to record against
        };
        let client = &self.inner.client;
        match client.record_absent_after(&lookup, key.clone(), kind).await {
            Ok(recorded) if recorded.outcome == RecordOutcome::Recorded => {
                count(&client.calls().counters.absences_recorded, 1);
                if let Some(ticket) = ticket {
                    self.inner.absences.insert(ticket, key, recorded.seq);
                }
            }
            Ok(_) => {}
            Err(status) => tracing::debug!(%status, "RecordAbsent failed; nothing cached"),
        }
    }

    /// Queues `key`, found while the gate was warming, to be added once it is warm.
    fn pend_add(&self, key: Bytes) {
        let mut pending = lock(&self.inner.pending_adds);
        if pending.len() < MAX_PENDING_ADDS {
            pending.push(key);
        } else {
            tracing::warn!(
                "{MAX_PENDING_ADDS} keys already wait for the gate to warm; one more is not added"
            );
        }
    }

    /// Adds the keys found while the gate was warming (now that it is not), in the background; a failed
    /// `Add` queues them again.
    fn add_pending(&self) {
        let keys = std::mem::take(&mut *lock(&self.inner.pending_adds));
        if keys.is_empty() {
            return;
        }
        let reader = self.clone();
        tokio::spawn(async move {
            if let Err(status) = reader.inner.client.add(keys.clone()).await {
                tracing::warn!(%status, keys = keys.len(), "adding keys found while the gate was warming failed; will retry");
                for key in keys {
                    reader.pend_add(key);
                }
            }
        });
    }
}
