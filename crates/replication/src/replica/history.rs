//! The replica's side of [`history`](crate::protocol::history): what it applied enters its digest, the
//! digest goes out about once a second, the others' are compared as they arrive, and a replica that every
//! other one differs from gives up its history — no lease, its snapshots discarded, the applier stopped
//! with a message saying whom it differs from and what to do.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Replica;
use crate::protocol::copy::MessageDigest;
use crate::protocol::history::{History, HistoryReport, Verdict};

/// How often a replica tells the others its history digest, at most (once per batch applied, so an idle
/// replica sends one per barrier: every probe).
pub(super) const HISTORY_EVERY: Duration = Duration::from_secs(1);

impl Replica {
    pub(super) fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enters seq `seq` into the history: a mutation with message digest `mutation`, or anything else.
    pub(super) fn history_applied(&self, seq: u64, mutation: Option<MessageDigest>) {
        self.history().applied(seq, mutation);
    }

    /// Another replica's report (or this one's own, ignored). Only a member's counts (its id and nonce in
    /// the membership): a report from anything else on the subject — a process that never joined, a forged
    /// one — must not be able to make a sound replica give up its history.
    pub(super) fn heard_history(&self, report: &HistoryReport) {
        let member = self
            .protocol()
            .members()
            .iter()
            .any(|(id, m)| *id == report.replica && m.nonce == report.nonce);
        if !member {
            return;
        }
        let (now, me) = (self.lease.now(), self.nonce());
        self.history().heard(report, me, now);
        self.judge_history();
    }

    /// Tells the others this replica's digest through its applied seq, if the last time was
    /// [`HISTORY_EVERY`] ago or more. A report that fails to leave is followed by the next.
    pub(super) async fn report_history(&self) {
        let now = self.lease.now();
        let last = self.history_reported_at.load(Ordering::Acquire);
        let due = last == 0 || now.saturating_sub(last) >= HISTORY_EVERY.as_nanos() as u64;
        if !due {
            return;
        }
        self.history_reported_at
            .store(now.max(1), Ordering::Release);
        let report = HistoryReport {
            replica: self.options.id.clone(),
            nonce: self.nonce(),
            seq: self.applied_seq(),
            digest: self.history().digest(),
        };
        if let Err(error) = self.stream.report_history(&report).await {
            tracing::debug!(%error, "a history report was not sent");
        }
    }

    /// Gives up this replica's history if every other replica heard from differs from it
    /// ([`History::judge`]): no lease from it from now on (the protocol's divergence), and the applier
    /// stops with the reason.
    pub(super) fn judge_history(&self) {
        let now = self.lease.now();
        let (judged, (same, differing)) = {
            let history = self.history();
            (history.judge(now), history.compared(now))
        };
        self.metrics.histories_same.set(same as f64);
        self.metrics.histories_differing.set(differing as f64);
        let Some(differing) = judged else {
            return;
        };
        let seq = differing
            .iter()
            .map(|(_, verdict)| match verdict {
                Verdict::Same { seq } | Verdict::Differs { seq, .. } => *seq,
            })
            .min()
            .unwrap_or(0);
        let mut protocol = self.protocol();
        if protocol.diverged().is_some() {
            return;
        }
        protocol.history_differs(seq);
        self.hand_lease(&protocol);
        drop(protocol);
        let reason = self.history_reason(&differing);
        tracing::error!(%reason, "this replica gives up its history");
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
        self.progress.notify_waiters();
    }

    fn history_reason(&self, differing: &[(String, Verdict)]) -> String {
        let named: Vec<String> = differing
            .iter()
            .filter_map(|(id, verdict)| match verdict {
                Verdict::Differs { seq, mine, theirs } => Some(format!(
                    "{id:?} (at seq {seq}: theirs {theirs:016x}, this one's {mine:016x})"
                )),
                Verdict::Same { .. } => None,
            })
            .collect();
        format!(
            "the history this replica applied differs from that of every other replica heard from — {} — \
             and none agrees with it: it read a copy of the JetStream stream {:?} that differs from the \
             quorum's (a NATS server's copy diverged), or loaded a snapshot taken from one. It answers no \
             ABSENT, and has discarded its own snapshots. Check the stream's replicas on each server (`nats \
             stream info`), remove a divergent one (`nats stream cluster peer-remove`), then restart this \
             replica (it loads the newest shared snapshot; one shared from this history stops it again with \
             this message)",
            named.join(", "),
            self.stream.name(),
        )
    }
}
