//! Whether a replica should take traffic: behind the stream, without a read lease (past a short blip),
//! stopped, displaced by a twin or removed — and the gauges that show it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Replica, PROBE};
use crate::protocol::{Cause, Standing};

/// Why a replica should not be sent traffic now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lagging {
    /// Behind the stream by more than `--max-lag`.
    Behind { applied: u64, stream: u64, max: u64 },
    /// No read lease: it cannot confirm it has the stream's end (NATS unreachable, or still catching up).
    NoLease { applied: u64, stream: u64 },
    /// The applier stopped on an error it cannot get past.
    Stopped(String),
    /// Not a member: another process joined with this replica's id.
    Displaced { id: String, seq: u64, by: String },
    /// Not a member: an operator removed it.
    Removed { id: String, seq: u64 },
}

impl std::fmt::Display for Lagging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Behind { applied, stream, max } => write!(
                f,
                "applied through seq {applied}, the stream is at {stream}: {} behind (--max-lag {max})",
                stream - applied
            ),
            Self::NoLease { applied, stream } => write!(
                f,
                "no read lease (applied through seq {applied}, stream last seen at {stream}): lookups fail \
                 open until the replica confirms it has applied the stream's end (still catching up, NATS \
                 unreachable, or too busy to renew the lease)"
            ),
            Self::Stopped(reason) => write!(f, "stopped applying the stream: {reason}"),
            Self::Displaced { id, seq, by } => write!(
                f,
                "another process joined as replica {id:?} at seq {seq} ({by}): two processes use one \
                 --replica-id, so this one answers no ABSENT; give each replica its own id and restart it"
            ),
            Self::Removed { id, seq } => write!(
                f,
                "replica {id:?} was removed from the membership at seq {seq} (existence-gate replicas \
                 remove): it answers no ABSENT; restart it to join again"
            ),
        }
    }
}

impl Replica {
    /// Why the replica should not take traffic now, if it should not; refreshes its gauges.
    pub fn lagging(&self) -> Option<Lagging> {
        let (applied, stream) = (self.applied_seq(), self.stream_seq.load(Ordering::Acquire));
        let stream = stream.max(applied);
        let held = self.lease.holds_at(self.lease.now());
        let lag_time = if stream > applied {
            self.caught_up_at
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .elapsed()
        } else {
            Duration::ZERO
        };
        let (standing, members) = {
            let protocol = self.protocol();
            (
                protocol.standing().clone(),
                protocol.members().iter().count(),
            )
        };
        self.metrics.applied_seq.set(applied as f64);
        self.metrics.lag_seqs.set((stream - applied) as f64);
        self.metrics.lag_seconds.set(lag_time.as_secs_f64());
        self.metrics.lease_held.set(f64::from(u8::from(held)));
        self.metrics.peers.set(members as f64);
        if let Some(reason) = self
            .stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Some(Lagging::Stopped(reason));
        }
        let id = self.options.id.clone();
        match standing {
            Standing::Departed {
                seq,
                cause: Cause::Displaced(by),
            } => return Some(Lagging::Displaced { id, seq, by }),
            Standing::Departed {
                seq,
                cause: Cause::Removed,
            } => return Some(Lagging::Removed { id, seq }),
            Standing::Departed {
                cause: Cause::Left, ..
            } => {
                return Some(Lagging::Stopped(
                    "left the replicas (shutting down)".to_string(),
                ))
            }
            Standing::Joining | Standing::Member { .. } => {}
        }
        if stream - applied > self.options.max_lag {
            return Some(Lagging::Behind {
                applied,
                stream,
                max: self.options.max_lag,
            });
        }
        // Called whether or not the lease holds: that is what ends a blip.
        let blip = self.lease_blip(held);
        let fresh = held || self.recently_fresh();
        (!fresh && !blip).then_some(Lagging::NoLease { applied, stream })
    }

    /// Whether, though no lookup keeps the lease renewed, a member applied through a barrier acknowledged
    /// within the last two probes: it would get a lease at the first lookup.
    fn recently_fresh(&self) -> bool {
        let member = matches!(self.protocol().standing(), Standing::Member { .. });
        let fresh = *self.fresh_at.lock().unwrap_or_else(|e| e.into_inner());
        member && fresh.is_some_and(|at| at.elapsed() < PROBE * 2)
    }

    /// Whether a lease that held before has been lost for less than one lease length: the renewal is late
    /// (a busy machine), which lookups answer by failing open, but which is not worth turning a load
    /// balancer away for. Before the first lease there is no blip: the replica is not caught up.
    fn lease_blip(&self, held: bool) -> bool {
        let mut lost_at = self.lease_lost_at.lock().unwrap_or_else(|e| e.into_inner());
        if held {
            *lost_at = None;
            return false;
        }
        let since = *lost_at.get_or_insert_with(Instant::now);
        self.lease.ever_held() && since.elapsed() < self.options.read_lease
    }
}
