//! A replica's writes: prepared against its gate, published under a message id no other write uses
//! (retried under it, so stored once), applied here, then acknowledged as the protocol's safety rule
//! requires.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::core::keys::PackedKeys;
use tokio::sync::oneshot;

use super::add_queue::{Batch, QueuedAdd, Stored};
use super::{unavailable, Replica, APPLY_WAIT, FIRST_RETRY_PAUSE, MAX_RETRY_PAUSE};
use crate::core::gate::GateError;
use crate::core::log::Mutation;
use crate::core::namespace::{
    Absence, AbsenceReport, Added, Applied, NewKeys, RecordOutcome, Recorded,
};
use crate::core::writes::{Pending, Writes};
use crate::protocol::{Ack, Acked, WriteId};
use crate::stream::StreamError;

/// How long a publish is retried (with the same message id, so it is stored once) before the write is
/// refused: covers a stream leader election (a few seconds on a LAN).
const PUBLISH_RETRY_FOR: Duration = Duration::from_secs(8);

impl Replica {
    /// `Add`: published (with the `Add`s that arrive at this replica meanwhile: see [`add_queue`]),
    /// applied here, and acknowledged under the safety rule.
    ///
    /// [`add_queue`]: super::add_queue
    pub async fn add(
        &self,
        namespace: &str,
        keys: PackedKeys,
        new_keys: NewKeys,
    ) -> Result<Added, GateError> {
        self.until_ready().await;
        let Mutation::Add {
            namespace,
            at_ms,
            keys,
            ..
        } = self.gate.prepare_add(namespace, keys)?
        else {
            unreachable!("prepare_add prepares an Add")
        };
        let (answer, answered) = oneshot::channel();
        let queued = QueuedAdd {
            namespace,
            at_ms,
            keys,
            new_keys,
            answer,
        };
        if let Some(batch) = self.adds.push(queued) {
            // A free slot means nothing was waiting: this `Add` leaves alone, published by this call as
            // if there were no queue (a caller that goes away takes only its own publish with it).
            if let Some(replica) = self.this.upgrade() {
                replica.publish_batch(batch).await;
            }
        }
        answered.await.unwrap_or_else(|_| {
            Err(GateError::Unavailable(
                "the replica stopped before the write was acknowledged; it may or may not be stored, and \
                 retrying is safe"
                    .to_string(),
            ))
        })
    }

    /// Publishes `batch` as one message, then answers its callers. The publish slot it holds passes to the
    /// next batch as soon as the stream has acknowledged this one.
    async fn publish_batch(self: Arc<Self>, batch: Batch) {
        self.metrics.adds_per_message.record(batch.len() as f64);
        let slot = batch.slotted.then(|| Slot(Arc::clone(&self)));
        let outcome = self
            .publish_and_apply_releasing(batch.mutation(), slot, batch.len(), batch.new_keys())
            .await
            .map(|(seq, applied)| match applied {
                Some(Applied::Added { cleared, new }) => Stored { seq, cleared, new },
                _ => Stored {
                    seq,
                    ..Stored::default()
                },
            });
        batch.answer(outcome);
    }

    /// `RecordAbsent`: decided here where it can be (`REDUNDANT`, `SUPERSEDED`, `THROTTLED` publish
    /// nothing), else published, and `RECORDED` or `SUPERSEDED` as applying it in stream order decides.
    pub async fn record_absent(
        &self,
        namespace: &str,
        report: AbsenceReport,
    ) -> Result<Recorded, GateError> {
        self.until_ready().await;
        let mut latest_known = self.stream_seq.load(Ordering::Acquire);
        if report.observed_seq > latest_known {
            // Observed on a replica that sampled the stream more recently: ask the stream itself.
            latest_known = self.stream.last_seq().await.map_err(unavailable)?;
        }
        let (mutation, recorded) =
            match self.gate.prepare_absence(namespace, report, latest_known)? {
                Absence::Answered(recorded) => return Ok(recorded),
                Absence::Store { mutation, recorded } => (mutation, recorded),
            };
        let (seq, applied) = self.publish_and_apply(mutation).await?;
        Ok(match applied {
            Some(Applied::Superseded) => Recorded {
                outcome: RecordOutcome::Superseded,
                seq,
                expires_in_ms: 0,
            },
            _ => Recorded { seq, ..recorded },
        })
    }

    /// Waits, at most [`APPLY_WAIT`], for this replica to have caught up and opened its writes: a write
    /// routed to a replica still loading (a balancer that has not yet seen it restart) waits for it rather
    /// than fail "still loading".
    async fn until_ready(&self) {
        if !self.gate.is_ready() {
            let _ = tokio::time::timeout(APPLY_WAIT, self.gate.until_ready()).await;
        }
    }

    /// Publishes `mutation`, waits until this replica has applied it, then for the safety rule (and, an
    /// `Add`, for this replica's mirrors: rule 3 of [`crate::core::sublease`]); returns its seq and what
    /// applying it did. Each wait has its histogram (publish acknowledgement, applied here,
    /// the members' reports), so a slow `Add` says whether NATS, this replica or another member held it.
    pub(crate) async fn publish_and_apply(
        &self,
        mutation: Mutation,
    ) -> Result<(u64, Option<Applied>), GateError> {
        self.publish_and_apply_releasing(mutation, (), 1, NewKeys::Skip)
            .await
    }

    /// [`publish_and_apply`](Self::publish_and_apply) of a message that answers `calls` write calls,
    /// dropping `held` as soon as the publish is over (acknowledged or failed), before the waits for the
    /// replicas; applied here reporting its new keys if `new_keys` asks.
    async fn publish_and_apply_releasing<Held>(
        &self,
        mutation: Mutation,
        held: Held,
        calls: usize,
        new_keys: NewKeys,
    ) -> Result<(u64, Option<Applied>), GateError> {
        let (id, write) = self.message_id()?;
        let mirrored = match &mutation {
            Mutation::Add { namespace, .. } => Some(Arc::clone(namespace)),
            _ => None,
        };
        let (applied_tx, applied_rx) = oneshot::channel();
        let waiting = Waiting::register(&self.waiting, id.clone(), (applied_tx, new_keys));
        let published = self.publish_retrying(&mutation, &id).await;
        drop(held);
        let (published, attempts) = published?;
        self.acknowledged(published, write);
        let acked = Acked {
            at: self.lease.now(),
            attempts,
        };
        let stored_at = Instant::now();
        let applied = tokio::time::timeout(APPLY_WAIT, applied_rx)
            .await
            .ok()
            .and_then(Result::ok);
        // Recorded whether or not it applied in time: a replica that gives up shows its wait too.
        let applied_at = Instant::now();
        self.metrics
            .apply_wait
            .record(applied_at.duration_since(stored_at).as_secs_f64());
        let applied = applied.ok_or_else(|| {
                GateError::Unavailable(format!(
                    "the write is stored in the JetStream stream {:?} at seq {} but this replica has not \
                     applied it within {APPLY_WAIT:?} (it is behind or cut off from NATS); it will apply \
                     everywhere, and retrying is safe",
                    self.stream.name(),
                    published
                ))
            })?;
        drop(waiting);
        let mirrors = async {
            if let (Some(mirrors), Some(namespace)) = (self.mirrors.get(), &mirrored) {
                mirrors.applied(namespace, published).await;
            }
        };
        tokio::join!(
            self.wait_for_replicas(published, write, acked, calls),
            mirrors
        );
        self.metrics
            .members_wait
            .record(applied_at.elapsed().as_secs_f64());
        Ok((published, applied))
    }

    /// Tells the protocol that the stream stored `write` at `seq`: what this replica reads there is checked
    /// against it (a copy of the stream that differs stops its lease at once).
    fn acknowledged(&self, seq: u64, write: WriteId) {
        let mut protocol = self.protocol();
        protocol.write_acked(seq, write);
        self.hand_lease(&protocol);
    }

    /// Publishes `mutation` without waiting for any replica to apply it: for a step of a larger write whose
    /// last step is waited for.
    pub(crate) async fn publish_unapplied(&self, mutation: &Mutation) -> Result<(), GateError> {
        let (id, _) = self.message_id()?;
        self.publish_retrying(mutation, &id).await.map(drop)
    }

    /// A message id no other write of any replica uses, and the write it names; or `UNAVAILABLE` while NATS
    /// is unreachable.
    fn message_id(&self) -> Result<(String, WriteId), GateError> {
        if !self.stream.connected() {
            return Err(GateError::Unavailable(format!(
                "NATS is unreachable: the write was not published to the JetStream stream {:?}; retry \
                 (lookups are still answered)",
                self.stream.name()
            )));
        }
        let counter = self.next_id.fetch_add(1, Ordering::Relaxed);
        let write = WriteId {
            writer: self.nonce(),
            counter,
        };
        Ok((format!("{}:{counter}", self.id_prefix), write))
    }

    /// Publishes with retries under one message id (a retry of a publish that was stored is dropped as a
    /// duplicate by the stream), for up to `PUBLISH_RETRY_FOR`: the seq it was stored at, and how many
    /// times it was published.
    async fn publish_retrying(
        &self,
        mutation: &Mutation,
        id: &str,
    ) -> Result<(u64, u32), GateError> {
        let give_up = Instant::now() + PUBLISH_RETRY_FOR;
        let mut pause = FIRST_RETRY_PAUSE;
        let mut attempts = 0;
        loop {
            let started = Instant::now();
            attempts += 1;
            match self.stream.publish(mutation, id).await {
                Ok(published) => {
                    self.stream_seq.fetch_max(published.seq, Ordering::AcqRel);
                    self.metrics
                        .publish_ack
                        .record(started.elapsed().as_secs_f64());
                    return Ok((published.seq, attempts));
                }
                Err(StreamError::Publish(reason)) if Instant::now() + pause < give_up => {
                    tracing::debug!(%reason, "publish failed; retrying");
                    self.metrics.publish_retries.increment(1);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_RETRY_PAUSE);
                }
                Err(error) => return Err(unavailable(error)),
            }
        }
    }

    /// Waits until the protocol lets `write`, stored at `seq`, be acknowledged: every member reported
    /// reading it there, or the fallback passed since its publish was `acked` (then counted for the `calls`
    /// it answers).
    async fn wait_for_replicas(&self, seq: u64, write: WriteId, acked: Acked, calls: usize) {
        let mut counted_grace = false;
        loop {
            let changed = self.progress.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            let now = self.lease.now();
            let until = match self.protocol().ack(seq, write, acked, now) {
                Ack::Early => return,
                Ack::ByFallback => {
                    self.metrics.acked_by_lease.increment(calls as u64);
                    return;
                }
                Ack::Wait(until) => until,
            };
            if !counted_grace && self.protocol().held_by_grace(seq, write, now) {
                self.metrics.grace_waits.increment(calls as u64);
                counted_grace = true;
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep(Duration::from_nanos(until.saturating_sub(now))) => {}
            }
        }
    }
}

/// A replica's writes are published to its stream and acknowledged as the replication protocol requires.
impl Writes for Replica {
    fn add<'a>(
        &'a self,
        namespace: &'a str,
        keys: PackedKeys,
        new_keys: NewKeys,
    ) -> Pending<'a, Result<Added, GateError>> {
        Box::pin(Replica::add(self, namespace, keys, new_keys))
    }

    fn record_absent<'a>(
        &'a self,
        namespace: &'a str,
        report: AbsenceReport,
    ) -> Pending<'a, Result<Recorded, GateError>> {
        Box::pin(Replica::record_absent(self, namespace, report))
    }

    fn reach(&self, seq: u64, bound: Duration) -> Pending<'_, bool> {
        Box::pin(self.wait_applied(seq, bound))
    }

    fn vouch(&self, bound: Duration) -> Pending<'_, bool> {
        let applied = self.applied_seq();
        // Asking for the lease wakes the lease keeper, whose next barrier vouches for what came before it.
        self.lease.holds();
        Box::pin(self.vouched_through(applied, bound))
    }
}

/// A publish slot of the `Add` queue, held by a batch until its publish is over; freeing it publishes the
/// `Add`s that gathered meanwhile, as one message, on a task of their own (none of their callers is the one
/// to wait on it: any of them may go away).
struct Slot(Arc<Replica>);

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(next) = self.0.adds.published() else {
            return;
        };
        // With the runtime gone (shutting down), dropping the batch tells its callers.
        let runtime =
            (self.0.runtime.clone()).or_else(|| tokio::runtime::Handle::try_current().ok());
        if let Some(runtime) = runtime {
            runtime.spawn(Arc::clone(&self.0).publish_batch(next));
        }
    }
}

/// A write's place among those waiting to be applied, removed when the write stops waiting.
struct Waiting<'a> {
    waiting: &'a Mutex<HashMap<String, super::Waiter>>,
    id: String,
}

impl<'a> Waiting<'a> {
    fn register(
        waiting: &'a Mutex<HashMap<String, super::Waiter>>,
        id: String,
        waiter: super::Waiter,
    ) -> Self {
        waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), waiter);
        Self { waiting, id }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}
