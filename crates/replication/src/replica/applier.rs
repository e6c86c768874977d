//! The applier: follows the stream after the applied seq and applies each message in order — mutations into
//! the gate, membership records and barriers into the protocol — then settles and reports to the writers of
//! what it applied (see [`Protocol::recipients`](crate::protocol::Protocol::recipients)); a gap in stream
//! seqs is explained (lost by the consumer, purged, or deleted) rather than stepped over.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::{write_id, Replica, FIRST_RETRY_PAUSE, MAX_RETRY_PAUSE};
use crate::core::log::Mutation;
use crate::core::namespace::NewKeys;
use crate::protocol::copy::{self, CopyCheck, MessageDigest};
use crate::protocol::gap::{self, Gap};
use crate::protocol::{Recipients, WriteRead};
use crate::snapshot_store::IndexRead;
use crate::stream::{StreamError, Streamed};

/// How long the applier waits for a message, while the stream is known to hold more, before it follows
/// the stream again with a new consumer. A replica paused longer than the server keeps an idle ordered
/// consumer finds it gone, and this is how long it then fails open before it catches up: with 2 s, a
/// replica stopped for 70 s took 2.1 s to catch up on 4,000 Adds (`cargo bench --bench replicated`); a
/// needless re-follow costs one consumer creation.
const STALL: Duration = Duration::from_millis(500);
/// Messages the applier takes from the stream at once when they are waiting (at most one report per batch).
const APPLY_BATCH: usize = 256;

impl Replica {
    /// Applies the stream from where the replica stands until `stop` resolves, following again after a
    /// read error; returns early (recording why) only if a message cannot be applied at all.
    pub async fn apply(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let mut pause = FIRST_RETRY_PAUSE;
        loop {
            let followed = tokio::select! {
                () = &mut stop => return,
                followed = self.follow_once() => followed,
            };
            match followed {
                Err(StreamError::Read(reason)) | Err(StreamError::Unreachable(reason)) => {
                    tracing::warn!(%reason, applied = self.applied_seq(), "following the stream again");
                    self.metrics.read_failures.increment(1);
                }
                Err(fatal) => {
                    let reason = fatal.to_string();
                    tracing::error!(%reason, "this replica stops applying the stream; restart it");
                    *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
                    return;
                }
                Ok(()) => pause = FIRST_RETRY_PAUSE,
            }
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(MAX_RETRY_PAUSE);
        }
    }

    /// Follows the stream after the applied seq until it ends or fails — from the message read last, if
    /// this process has read one, which the new consumer must deliver first ([`copy`]).
    async fn follow_once(&self) -> Result<(), StreamError> {
        let mut last_read = self.last_read();
        let after = last_read.map_or(self.applied_seq(), |(seq, _)| seq - 1);
        let follow = self.stream.follow(after).await?;
        let mut batches = std::pin::pin!(follow.ready_chunks(APPLY_BATCH));
        loop {
            let batch = match tokio::time::timeout(STALL, batches.next()).await {
                Ok(Some(batch)) => batch,
                Ok(None) => return Ok(()),
                Err(_) => {
                    self.check_not_stalled()?;
                    continue;
                }
            };
            if let (Some(last_read), Some(Ok(first))) = (last_read.take(), batch.first()) {
                self.check_copy(last_read, first)?;
            }
            let mut reads = writes_read(&batch);
            let adds = adds_read(&batch);
            let applying = self.applying.lock().await;
            let gap = self.apply_in_order(batch)?;
            drop(applying);
            self.settle();
            self.judge_history();
            self.check_not_diverged()?;
            let applied = self.applied_seq();
            reads.retain(|read| read.seq <= applied);
            let recipients = self
                .protocol()
                .recipients(reads.iter().map(|read| read.write.writer));
            self.report_once_mirrored(recipients, reads, adds, applied)
                .await;
            self.report_history().await;
            if let Some(missing) = gap {
                return Err(self.explain_gap(missing).await);
            }
        }
    }

    /// After `STALL` without a message: an error (so the stream is followed again with a new consumer) if
    /// the stream is known to hold more than was applied. A consumer whose server died (a NATS leader lost)
    /// can otherwise stay silent for many heartbeats.
    fn check_not_stalled(&self) -> Result<(), StreamError> {
        let (applied, stream) = (self.applied_seq(), self.stream_seq.load(Ordering::Acquire));
        if stream <= applied {
            return Ok(());
        }
        Err(StreamError::Read(format!(
            "the stream's consumer delivered nothing for {STALL:?} while the stream holds seq {stream} and \
             this replica has applied {applied}"
        )))
    }

    /// An error that stops the applier if this replica's copy of the stream was found to differ from the
    /// quorum's (see [`protocol`](crate::protocol)): it has applied a history that is not the stream's, and
    /// takes no lease from it; only a restart (reading from a sound server) mends it.
    fn check_not_diverged(&self) -> Result<(), StreamError> {
        let Some(seq) = self.protocol().diverged() else {
            return Ok(());
        };
        if let Some(reason) = self
            .stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Err(StreamError::Setup(reason)); // given up by its history's comparison
        }
        Err(StreamError::Setup(format!(
            "what this replica read at seq {seq} of the JetStream stream {:?} is not what the quorum stored \
             there (one of its own barriers, writes or joins was acknowledged at that seq but it read something \
             else, or a new consumer's copy holds another message there than the one it read): a NATS server \
             it read from holds a copy of the stream that differs from the quorum's (seen with nats-server \
             2.9.10 after a stream leader was cut off). It answers no ABSENT from that history, and has \
             discarded its own snapshots, which may hold it. Check the stream's replicas on each server (`nats \
             stream info`), remove the divergent one (`nats stream cluster peer-remove`), then restart this \
             replica",
            self.stream.name()
        )))
    }

    /// Checks the copy a new consumer reads by its first message, `first`, against the message read last
    /// ([`copy::check`]): another message there is a divergence (no lease from this history, ever; the
    /// applier stops); the message gone leaves nothing to compare, and the applier stops too.
    fn check_copy(
        &self,
        last_read: (u64, MessageDigest),
        first: &Streamed,
    ) -> Result<(), StreamError> {
        match copy::check(last_read, (first.seq, first.digest)) {
            CopyCheck::Same => Ok(()),
            CopyCheck::Differs => {
                self.protocol().copy_differs(last_read.0);
                self.settle();
                self.check_not_diverged()
            }
            CopyCheck::Gone => Err(StreamError::Setup(format!(
                "the copy of the JetStream stream {:?} that this replica's new consumer reads no longer holds \
                 seq {}, the message it read last (deleted, or purged below a shared snapshot since), and \
                 starts at seq {}: whether that copy's history is the one applied cannot be checked. It \
                 answers no ABSENT; restart it (it loads the newest snapshot)",
                self.stream.name(),
                last_read.0,
                first.seq
            ))),
        }
    }

    /// Applies `batch` in order; stops at a gap in stream seqs, returning the seqs missing (first, last).
    fn apply_in_order(
        &self,
        batch: Vec<Result<Streamed, StreamError>>,
    ) -> Result<Option<(u64, u64)>, StreamError> {
        for read in batch {
            let read = read?;
            let next = self.applied_seq() + 1;
            if read.seq > next {
                return Ok(Some((next, read.seq - 1)));
            }
            self.apply_one(read)?;
        }
        Ok(None)
    }

    /// Why the stream skipped `first..=last`, and what to do ([`gap::judge`]): read again if the stream
    /// holds a skipped seq or the answering server cannot show the gap is gone (it may be stale); stop if the
    /// seqs were purged — purges reach only seqs at or below the oldest snapshot the bucket retains, and that
    /// index is written before the purge — since only a newer snapshot can replace them; pass over seqs
    /// deleted one by one (junk an operator removed), as every replica does. "Deleted" rests on the index
    /// read being current — a stale server's older index names older snapshots, and would pass a purge off
    /// as a deletion, skipping `Add`s — so it is first proved current ([`IndexRead::confirm`]), else read
    /// again.
    async fn explain_gap(&self, (first, last): (u64, u64)) -> StreamError {
        let judged = async {
            let next_held = self.stream.next_held(first).await?;
            let index = IndexRead::of(&self.stream).await?;
            let verdict = match gap::judge(first, last, next_held, index.oldest()) {
                Gap::Deleted if !index.confirm(&self.stream).await? => Gap::ReadAgain,
                verdict => verdict,
            };
            Ok::<_, StreamError>((next_held, verdict))
        };
        match judged.await {
            Ok((next_held, Gap::ReadAgain)) => StreamError::Read(format!(
                "the stream's consumer skipped seqs {first} to {last}; the first message held at or after {first} \
                 is {next_held:?}, and either a skipped seq is still held, or the answering server may be \
                 behind, or the snapshots' index it answered with was not the newest: reading again"
            )),
            Ok((_, Gap::Purged)) => StreamError::Setup(format!(
                "the JetStream stream {:?} no longer holds seq {first}: the mutations after seq {} were purged \
                 (covered by a shared snapshot) before this replica applied them; restart it to load the newest \
                 snapshot",
                self.stream.name(),
                first - 1
            )),
            Ok((_, Gap::Deleted)) => {
                self.pass_over_deleted(first, last);
                StreamError::Read(format!(
                    "seqs {first} to {last} were deleted from the stream (not purged: no retained snapshot \
                     covers them); passed over, following on"
                ))
            }
            Err(error) => error,
        }
    }

    /// Counts `first..=last`, deleted from the stream, as applied.
    fn pass_over_deleted(&self, first: u64, last: u64) {
        self.metrics.skipped.increment(last - first + 1);
        tracing::error!(first, last, "messages deleted from the stream; passed over");
        self.protocol().pass_over(last);
        self.history().passed_over(last);
        self.applied.send_replace(last);
    }

    /// Applies the message after the applied seq (an earlier one, read again, is skipped).
    fn apply_one(&self, read: Streamed) -> Result<(), StreamError> {
        if read.seq <= self.applied_seq() {
            return Ok(());
        }
        if let Some(junk) = &read.junk {
            // Every replica reads the same message and passes it over alike: the state stays the same everywhere.
            self.metrics.skipped.increment(1);
            tracing::error!(
                seq = read.seq,
                %junk,
                "passed over a message of the stream that no existence-gate replica wrote; only replicas \
                 should have publish rights on the stream's subjects (docs/deployment.md)"
            );
        }
        let write = read
            .mutation
            .as_ref()
            .and(read.id.as_deref())
            .and_then(write_id);
        let mutation_digest = read.mutation.is_some().then_some(read.digest);
        let new_keys = read.id.as_ref().map_or(NewKeys::Skip, |id| {
            let waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            waiting
                .get(id)
                .map_or(NewKeys::Skip, |(_, new_keys)| *new_keys)
        });
        let outcome = match read.mutation {
            Some(mutation) => {
                self.metrics.applied.increment(1);
                self.gate
                    .apply_streamed_with(mutation, read.stored_at_ms, new_keys)
                    .map_err(|reason| {
                        StreamError::Setup(format!("message {}: {reason}", read.seq))
                    })?
            }
            None => {
                self.gate.stream_time_passed(read.stored_at_ms);
                None
            }
        };
        if read.member.is_some() {
            tracing::info!(seq = read.seq, record = ?read.member, "membership changed");
        }
        let own_barrier = read.barrier.filter(|(nonce, _)| *nonce == self.nonce());
        let mut protocol = self.protocol();
        if let Some((_, sent_at)) = own_barrier {
            protocol.read_own_barrier(read.seq, sent_at);
        }
        if let Some(write) = write {
            protocol.read_write(read.seq, write);
        }
        protocol.apply(read.seq, read.member.as_ref(), self.lease.now());
        self.hand_lease(&protocol);
        drop(protocol);
        *self.last_read.lock().unwrap_or_else(|e| e.into_inner()) = Some((read.seq, read.digest));
        self.history_applied(read.seq, mutation_digest);
        self.applied.send_replace(read.seq);
        if let Some(waiter) = read.id.and_then(|id| {
            self.waiting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id)
        }) {
            let _ = waiter.0.send(outcome);
        }
        Ok(())
    }

    /// [`report`](Self::report)s `reads` once this replica's mirrors count the `Add`s among them (`adds`,
    /// those applied through `applied`) as applied: rule 3 of [`crate::core::sublease`], so a writer counting
    /// this report counts the mirrors with it. At once when they do (no mirror attached, or all caught up);
    /// else from a task of its own, so the applier goes on meanwhile: a silent mirror holds the report back
    /// until its sub-lease ends, at most one sub-lease.
    async fn report_once_mirrored(
        &self,
        recipients: Recipients,
        reads: Vec<WriteRead>,
        adds: Vec<(Arc<str>, u64)>,
        applied: u64,
    ) {
        let waits = match self.mirrors.get() {
            Some(mirrors) if !matches!(recipients, Recipients::Nobody) => {
                latest_per_namespace(adds, applied)
                    .into_iter()
                    .filter(|(namespace, seq)| !mirrors.counted(namespace, *seq))
                    .collect()
            }
            _ => Vec::new(),
        };
        let (Some(replica), Some(mirrors), false) =
            (self.this.upgrade(), self.mirrors.get(), waits.is_empty())
        else {
            return self.report(recipients, reads).await;
        };
        let mirrors = Arc::clone(mirrors);
        tokio::spawn(async move {
            for (namespace, seq) in waits {
                mirrors.applied(&namespace, seq).await;
            }
            replica.report(recipients, reads).await;
        });
    }

    /// Tells `recipients` how far this one has applied, and which writes it read where (`reads`, the
    /// writes of the batch just applied: what a writer's acknowledgement counts). A report that fails to
    /// leave is logged and counted by its absence: its writers wait the fallback.
    pub(super) async fn report(&self, recipients: Recipients, reads: Vec<WriteRead>) {
        let (to, sent_count) = match recipients {
            Recipients::Nobody => return,
            Recipients::Writer(nonce) => (Some(nonce), &self.metrics.reports_to_writer),
            Recipients::Everyone => (None, &self.metrics.reports_to_all),
        };
        let sent = self
            .stream
            .report_applied(
                &self.options.id,
                self.nonce(),
                self.applied_seq(),
                &reads,
                to,
            )
            .await;
        match sent {
            Ok(()) => sent_count.increment(1),
            Err(error) => tracing::debug!(%error, "an applied-seq report was not sent"),
        }
    }

    /// After a batch (or a barrier's acknowledgement): the protocol grants what it now may, and writers
    /// waiting to acknowledge look again.
    pub(super) fn settle(&self) {
        let mut protocol = self.protocol();
        protocol.settle(self.lease.now());
        self.hand_lease(&protocol);
        drop(protocol);
        if self.lease.holds_at(self.lease.now()) {
            self.gate.lease_granted();
        }
        let last_barrier = *self.last_barrier.lock().unwrap_or_else(|e| e.into_inner());
        match last_barrier {
            Some((at, seq)) if seq <= self.applied_seq() => {
                *self.caught_up_at.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                let mut fresh = self.fresh_at.lock().unwrap_or_else(|e| e.into_inner());
                *fresh = Some(fresh.map_or(at, |earlier| earlier.max(at)));
            }
            Some(_) => {}
            None => *self.caught_up_at.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now(),
        }
        self.progress.notify_waiters();
    }
}

/// The writes in `batch` (mutations under a message id of this build's shape), each with the seq read at.
fn writes_read(batch: &[Result<Streamed, StreamError>]) -> Vec<WriteRead> {
    batch
        .iter()
        .flatten()
        .filter(|read| read.mutation.is_some())
        .filter_map(|read| {
            let write = write_id(read.id.as_deref()?)?;
            Some(WriteRead {
                seq: read.seq,
                write,
            })
        })
        .collect()
}

/// The `Add`s in `batch`, each with its namespace and seq: what this replica's mirrors must have applied
/// before a report of the batch leaves.
fn adds_read(batch: &[Result<Streamed, StreamError>]) -> Vec<(Arc<str>, u64)> {
    batch
        .iter()
        .flatten()
        .filter_map(|read| match &read.mutation {
            Some(Mutation::Add { namespace, .. }) => Some((Arc::clone(namespace), read.seq)),
            _ => None,
        })
        .collect()
}

/// The latest of `adds` per namespace, leaving out those after `applied` (not applied yet): mirrors apply in
/// seq order, so counting the latest counts every earlier one.
fn latest_per_namespace(adds: Vec<(Arc<str>, u64)>, applied: u64) -> Vec<(Arc<str>, u64)> {
    let mut latest: Vec<(Arc<str>, u64)> = Vec::new();
    for (namespace, seq) in adds.into_iter().filter(|(_, seq)| *seq <= applied) {
        match latest.iter_mut().find(|(n, _)| *n == namespace) {
            Some((_, latest_seq)) => *latest_seq = (*latest_seq).max(seq),
            None => latest.push((namespace, seq)),
        }
    }
    latest
}
