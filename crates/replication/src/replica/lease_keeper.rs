//! The lease keeper: every quarter lease it reports, publishes a barrier when the read lease is wanted (or
//! to join, or as a probe), joins once caught up, and at a graceful stop leaves the membership.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Replica, APPLY_WAIT, PROBE};
use crate::protocol::{MemberRecord, Recipients, Standing};

/// How long after the last lookup that asked for the lease it is still renewed every quarter lease: a caller
/// with a lookup every few seconds finds it held, and an idle replica publishes only the probe.
const IN_USE: Duration = Duration::from_secs(30);
/// How long a graceful stop waits for its leave to be stored.
const LEAVE_WAIT: Duration = Duration::from_secs(2);

impl Replica {
    /// Every lease/4 until `stop`: report; publish a barrier when the lease is wanted (see [`Self::renew`]);
    /// join once caught up. At `stop`, leave.
    pub async fn keep_lease(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let mut ticks = tokio::time::interval(self.options.read_lease / 4);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut stop => return self.leave().await,
                _ = ticks.tick() => {}
                () = self.wanted.notified() => {}
            }
            self.report(Recipients::Everyone, Vec::new()).await;
            if self.wants_barrier() {
                self.renew().await;
            }
            self.join_if_caught_up().await;
        }
    }

    /// Whether to publish a barrier now: while lookups have asked for the lease within [`IN_USE`] and less
    /// than three quarters of it are left (every tick: a renewal delayed by a busy machine still lands
    /// before the lease ends — renewing at half the lease let 0.2-0.9% of batch lookups fail open with both
    /// cores saturated), while not a member yet (to catch up and join), and once per [`PROBE`] in any case.
    fn wants_barrier(&self) -> bool {
        let mut last_asked = self.last_asked.lock().unwrap_or_else(|e| e.into_inner());
        if self.lease.take_asked() {
            *last_asked = Some(Instant::now());
        }
        let asked = last_asked.is_some_and(|at| at.elapsed() < IN_USE);
        drop(last_asked);
        let protocol = self.protocol();
        let renew_below = protocol.timing().lease / 4 * 3;
        let short = protocol.lease_until() < self.lease.now().saturating_add(renew_below);
        let joining = *protocol.standing() == Standing::Joining;
        drop(protocol);
        let probe_due = self
            .last_barrier
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none_or(|(at, _)| at.elapsed() >= PROBE);
        (asked && short) || joining || probe_due
    }

    /// Publishes a barrier and hands its seq to the protocol, which grants the lease once it is applied.
    async fn renew(&self) {
        let sent = self.lease.now();
        let barrier = self
            .stream
            .publish_barrier(&self.options.id, self.nonce(), sent);
        match tokio::time::timeout(self.options.read_lease, barrier).await {
            Ok(Ok(seq)) => {
                self.stream_seq.fetch_max(seq, Ordering::AcqRel);
                *self.last_barrier.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((Instant::now(), seq));
                self.protocol().barrier_acked(sent, seq, self.lease.now());
                self.settle();
            }
            Ok(Err(error)) => tracing::debug!(%error, "no lease barrier: the publish failed"),
            Err(_) => tracing::debug!("no lease barrier: not acknowledged within the read lease"),
        }
    }

    /// Publishes this process's join once it has caught up with the stream (applied a barrier).
    async fn join_if_caught_up(&self) {
        if !self.protocol().should_join() {
            return;
        }
        let record = MemberRecord::Join {
            id: self.options.id.clone(),
            nonce: self.nonce(),
            origin: self.options.origin.clone(),
        };
        match self.stream.publish_member(&record).await {
            Ok(seq) => {
                tracing::info!(seq, replica = %self.options.id, "joined the replicas");
                {
                    // Its join read anywhere else than `seq` is a divergence, which ends the lease at once.
                    let mut protocol = self.protocol();
                    protocol.join_acked(seq);
                    self.hand_lease(&protocol);
                }
                // Applied by the applier like any message; until then the join is retried each tick only if
                // it is still not a member, which a second stored join of the same nonce does not change.
                let _ = self.wait_applied(seq, APPLY_WAIT).await;
            }
            Err(error) => tracing::warn!(%error, "the join was not published; trying again"),
        }
    }

    /// A graceful stop: answer no `ABSENT` from now on, then publish the leave, and go on applying (and
    /// reporting what was applied) until the leave itself is applied here. Writers then wait for this
    /// process neither for the writes before its leave (reported) nor for those after (once they have
    /// applied the leave: [`Protocol::apply`](crate::protocol::Protocol::apply)); before, every `Add` in the
    /// fallback after a graceful stop waited the fallback (~100 ms). The applier stops once this is done
    /// ([`left`](Self::left)).
    async fn leave(&self) {
        let record = {
            let mut protocol = self.protocol();
            let record = protocol.leave();
            self.hand_lease(&protocol);
            record
        };
        if let Some(record) = record {
            if let Some(mirrors) = self.mirrors.get() {
                // Its lease given up, it grants no more; the sub-leases it granted must end before writers
                // stop waiting for it (rule 1 of the sub-leases rests on the protocol's case 5).
                mirrors.all_ended().await;
            }
            match tokio::time::timeout(LEAVE_WAIT, self.stream.publish_member(&record)).await {
                Ok(Ok(seq)) => {
                    tracing::info!(seq, "left the replicas");
                    if !self.wait_applied(seq, LEAVE_WAIT).await {
                        tracing::warn!(seq, "the leave was not applied here within {LEAVE_WAIT:?}");
                    }
                }
                Ok(Err(error)) => tracing::warn!(%error, "the leave was not published: writers wait the fallback for this replica until it restarts or is removed"),
                Err(_) => tracing::warn!("the leave was not acknowledged within {LEAVE_WAIT:?}: writers wait the fallback for this replica until it restarts or is removed"),
            }
        }
        self.left.send_replace(true);
    }

    /// Returns once a graceful stop is over (see [`leave`](Self::leave)): what the applier waits for
    /// after the shutdown signal before it stops.
    pub async fn left(&self) {
        let mut left = self.left.subscribe();
        let _ = left.wait_for(|left| *left).await;
    }
}
