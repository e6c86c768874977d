//! `Admin.Rebuild` on a replica: the rebuild travels through the stream, so every replica builds the same
//! filter and swaps it in at the same point of the stream.
//!
//! ```text
//!  Rebuild RPC ─▶ publish Begin (stream seq B) ─▶ every replica: empty filter beside the live one;
//!                                                  Adds applied after B go to both
//!              ─▶ publish Keys{B, ≤ 256 KiB of keys} × n (8 acks awaited together)
//!              ─▶ publish Commit{B} ─▶ every replica swaps the rebuilt filter in, at the same seq
//!  the call fails or is cancelled ─▶ publish Abort{B} (every replica drops the rebuilt filter)
//! ```
//!
//! A rebuild is named by its `Begin`'s seq, and the steps are applied in stream order, so a replica that
//! restarts from a snapshot taken half-way (the snapshot holds the filter being rebuilt) goes on with it
//! like the others: every replica ends with the same filter, which their state digests show.
//!
//! One rebuild of a namespace runs at a time: a `Begin` is refused (`FAILED_PRECONDITION`) while another
//! took a step within [`IDLE`]. Should its replica die between `Begin` and `Commit` (no `Abort` then), the
//! rebuilt filter stays allocated on every replica until the next rebuild of the namespace replaces it,
//! which it may do once the dead one has been idle for `IDLE`.
//!
//! As with a single node, the keys streamed must include every key that exists when the rebuild begins:
//! `Add`s applied before `Begin` reach only the live filter, which the commit replaces.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::replica::Replica;
use crate::core::gate::GateError;
use crate::core::log::{Mutation, RebuildStep};
use crate::core::namespace::{Applied, Rebuilt};
use crate::core::replicas::LoggedRebuild;
use crate::core::writes::Pending;

/// How long a rebuild may go without a step before another may replace it (its replica presumed gone).
pub const IDLE: Duration = Duration::from_secs(120);
/// Key bytes (with their 4-byte lengths) per published step: well under NATS's default 1 MiB payload.
const STEP_BYTES: usize = 256 << 10;
/// Steps whose publish acknowledgements are awaited together.
const IN_FLIGHT: usize = 8;

/// A rebuild of one namespace published through the stream. Dropped before [`commit`](Self::commit) — the
/// call failed or was cancelled — it publishes an `Abort`, in the background and best effort (if that is
/// lost too, the next rebuild replaces this one after [`IDLE`]).
pub struct ReplicatedRebuild {
    replica: Arc<Replica>,
    namespace: String,
    began: u64,
    publishing: JoinSet<Result<(), GateError>>,
    open: bool,
}

impl ReplicatedRebuild {
    /// Publishes the `Begin` and waits until this replica has applied it.
    ///
    /// A task of its own publishes it and hands the rebuild over. The `Begin` is stored some time before
    /// the caller could hold the rebuild — after this replica applies it, the write waits up to the read
    /// lease for the others — and a caller cancelled in between would leave a begun rebuild nobody aborts:
    /// the namespace refused rebuilds for [`IDLE`]. With the task, a hand-over that finds the caller gone
    /// drops the rebuild there, and the drop publishes the `Abort`.
    pub async fn begin(replica: Arc<Replica>, namespace: &str) -> Result<Self, GateError> {
        let begin = replica.gate().prepare_rebuild(namespace, IDLE)?;
        let namespace = namespace.to_string();
        let (hand_over, taken) = oneshot::channel();
        tokio::spawn(async move {
            // An `Err` gives the rebuild back when the caller is gone; ignoring it drops it, which aborts it.
            let _ = hand_over.send(Self::publish_begin(replica, namespace, begin).await);
        });
        taken.await.unwrap_or_else(|_| {
            Err(GateError::Unavailable(
                "the rebuild's start was not confirmed: the server is shutting down; retry the rebuild"
                    .to_string(),
            ))
        })
    }

    async fn publish_begin(
        replica: Arc<Replica>,
        namespace: String,
        begin: Mutation,
    ) -> Result<Self, GateError> {
        let (began, applied) = replica.publish_and_apply(begin).await?;
        match applied {
            Some(Applied::RebuildBegun { .. }) => Ok(Self {
                replica,
                namespace,
                began,
                publishing: JoinSet::new(),
                open: true,
            }),
            other => Err(GateError::Unavailable(format!(
                "the rebuild's start (stream seq {began}) applied as {other:?}; retry the rebuild"
            ))),
        }
    }

    /// Validates `keys` and publishes them, at most [`IN_FLIGHT`] steps awaiting acknowledgement at once.
    pub async fn feed(&mut self, keys: Vec<Bytes>) -> Result<(), GateError> {
        for keys in steps(keys) {
            let step = RebuildStep::Keys {
                began: self.began,
                keys,
            };
            let mutation = self
                .replica
                .gate()
                .prepare_rebuild_step(&self.namespace, step)?;
            while self.publishing.len() >= IN_FLIGHT {
                self.next_acknowledged().await?;
            }
            let replica = Arc::clone(&self.replica);
            self.publishing
                .spawn(async move { replica.publish_unapplied(&mutation).await });
        }
        Ok(())
    }

    /// Waits for every step's acknowledgement, then publishes the `Commit` and waits until this replica has
    /// applied it: the rebuilt filter is live here, and in stream order on every replica.
    pub async fn commit(mut self) -> Result<Rebuilt, GateError> {
        while !self.publishing.is_empty() {
            self.next_acknowledged().await?;
        }
        let commit = RebuildStep::Commit { began: self.began };
        let mutation = self
            .replica
            .gate()
            .prepare_rebuild_step(&self.namespace, commit)?;
        // Should this fail, the commit may or may not be stored; dropping `self` then publishes an abort,
        // which either ends the rebuild or, after a stored commit, changes nothing.
        let (seq, applied) = self.replica.publish_and_apply(mutation).await?;
        self.open = false;
        match applied {
            Some(Applied::Rebuilt(rebuilt)) => Ok(rebuilt),
            _ => Err(GateError::Conflict(format!(
                "the rebuild of namespace {:?} that began at stream seq {} was replaced by another rebuild \
                 before its commit (seq {seq}); the live filter is the other rebuild's — run one rebuild \
                 at a time",
                self.namespace, self.began
            ))),
        }
    }

    async fn next_acknowledged(&mut self) -> Result<(), GateError> {
        match self.publishing.join_next().await {
            Some(Ok(published)) => published,
            Some(Err(failed)) => Err(GateError::Unavailable(format!(
                "publishing a rebuild step failed: {failed}"
            ))),
            None => Ok(()),
        }
    }
}

impl Drop for ReplicatedRebuild {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        let abort = RebuildStep::Abort { began: self.began };
        let Ok(mutation) = self
            .replica
            .gate()
            .prepare_rebuild_step(&self.namespace, abort)
        else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let replica = Arc::clone(&self.replica);
        let (namespace, began) = (self.namespace.clone(), self.began);
        runtime.spawn(async move {
            match replica.publish_unapplied(&mutation).await {
                Ok(()) => tracing::info!(%namespace, began, "rebuild abandoned; the live filter stays"),
                Err(error) => tracing::warn!(
                    %namespace, began, %error,
                    "could not publish the abort of an abandoned rebuild; the next rebuild replaces it"
                ),
            }
        });
    }
}

/// `keys` cut into steps of at most [`STEP_BYTES`] (a single larger key gets a step of its own).
fn steps(keys: Vec<Bytes>) -> Vec<Vec<Bytes>> {
    let mut steps = vec![Vec::new()];
    let mut bytes = 0;
    for key in keys {
        let size = key.len() + 4;
        if bytes + size > STEP_BYTES && !steps.last().expect("one").is_empty() {
            steps.push(Vec::new());
            bytes = 0;
        }
        bytes += size;
        steps.last_mut().expect("one").push(key);
    }
    steps.retain(|step| !step.is_empty());
    steps
}

/// The Admin service's handle on a rebuild through the stream.
impl LoggedRebuild for ReplicatedRebuild {
    fn feed(&mut self, keys: Vec<Bytes>) -> Pending<'_, Result<(), GateError>> {
        Box::pin(ReplicatedRebuild::feed(self, keys))
    }

    fn commit(self: Box<Self>) -> Pending<'static, Result<Rebuilt, GateError>> {
        Box::pin(ReplicatedRebuild::commit(*self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_stay_under_the_payload_bound_and_keep_every_key_in_order() {
        let keys: Vec<Bytes> = (0..100_000u32)
            .map(|i| Bytes::from(format!("key-{i}")))
            .collect();
        let cut = steps(keys.clone());
        assert!(cut.len() > 1);
        for step in &cut {
            assert!(step.iter().map(|k| k.len() + 4).sum::<usize>() <= STEP_BYTES);
        }
        assert_eq!(cut.concat(), keys);
        assert!(steps(Vec::new()).is_empty());
        let big = Bytes::from(vec![7u8; STEP_BYTES]);
        assert_eq!(steps(vec![big.clone()]), vec![vec![big]]);
    }
}
