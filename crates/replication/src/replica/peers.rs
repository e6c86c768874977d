//! What the other replicas report, heard on a core NATS subject: their applied seqs, kept per id for
//! purges and snapshot sharing, and handed to the protocol for acknowledgements.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::{Replica, MAX_RETRY_PAUSE};
use crate::stream::{AppliedReport, Heard};

/// A replica not heard from for this long is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// What the other replicas last said, by replica id: applied seq and when it was heard.
#[derive(Debug, Default)]
pub(super) struct Peers {
    heard: Mutex<HashMap<String, (u64, Instant)>>,
    /// Since when the reports have been heard without a break.
    pub(super) listening_since: Mutex<Option<Instant>>,
}

impl Peers {
    fn heard(&self, report: AppliedReport) {
        let now = Instant::now();
        let mut heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        // Overwritten, not raised: one replica's reports arrive in order, and a restarted replica reports
        // from where it starts again (0 while it loads, which must hold back purges).
        heard.insert(report.replica, (report.seq, now));
        heard.retain(|_, (_, at)| now.duration_since(*at) < FORGET_AFTER);
    }

    /// Records since when reports are heard without a break (`None`: they are not).
    fn listening(&self, since: Option<Instant>) {
        *self
            .listening_since
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = since;
    }

    /// The replicas heard from within `within`: (id, applied seq).
    fn within(&self, within: Duration) -> Vec<(String, u64)> {
        let now = Instant::now();
        let heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        heard
            .iter()
            .filter(|(_, (_, at))| now.duration_since(*at) < within)
            .map(|(id, (applied, _))| (id.clone(), *applied))
            .collect()
    }

    /// The least applied seq heard from within `recent`.
    pub(super) fn slowest(&self, recent: Duration) -> Option<u64> {
        self.within(recent)
            .into_iter()
            .map(|(_, applied)| applied)
            .min()
    }

    /// The smallest id heard from within `recent`.
    pub(super) fn first_recent(&self, recent: Duration) -> Option<String> {
        self.within(recent).into_iter().map(|(id, _)| id).min()
    }
}

impl Replica {
    fn heard(&self, report: AppliedReport) {
        let mut protocol = self.protocol();
        protocol.heard(report.nonce, report.seq);
        protocol.heard_reads(report.nonce, &report.reads);
        drop(protocol);
        self.peers.heard(report);
        self.progress.notify_waiters();
    }

    /// Listens to the other replicas' reports until `stop`.
    pub async fn hear_peers(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        loop {
            let reports = tokio::select! {
                () = &mut stop => return,
                reports = self.stream.reports(self.nonce()) => reports,
            };
            match reports {
                Ok(reports) => {
                    self.peers.listening(Some(Instant::now()));
                    let mut reports = std::pin::pin!(reports);
                    loop {
                        tokio::select! {
                            () = &mut stop => return,
                            report = reports.next() => match report {
                                Some(Heard::Applied(report)) => self.heard(report),
                                Some(Heard::History(report)) => self.heard_history(&report),
                                None => break,
                            },
                        }
                    }
                    self.peers.listening(None);
                }
                Err(error) => tracing::warn!(%error, "cannot hear the other replicas; retrying"),
            }
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(MAX_RETRY_PAUSE) => {}
            }
        }
    }
}
