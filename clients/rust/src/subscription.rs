//! Keeps `SubscribeInvalidations` open for a reader, on channels of its own (a stream must not share a
//! connection's flow-control window with the lookups), and applies what it says to the local absences.
//!
//! When the stream ends (a restart, a dropped connection, a replica going away) it resubscribes on the next
//! address with `after_seq` = the last seq applied, so an `Add` made meanwhile is still delivered (the gate
//! answers `RESYNC` when it no longer holds that far back). Retries back off from 200 ms to 5 s.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::cache::Absences;
use crate::client::Calls;
use crate::endpoints::Endpoints;
use crate::proto;
use crate::stats::count;

const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Starts the subscription task (ended by aborting the handle).
pub(crate) fn spawn(
    calls: Arc<Calls>,
    absences: Arc<Absences>,
) -> Result<JoinHandle<()>, crate::InvalidAddress> {
    let endpoints = Endpoints::new(
        calls.addresses.clone(),
        crate::AddressPolicy::RoundRobin,
        &calls.options,
    )?;
    Ok(tokio::spawn(run(calls, endpoints, absences)))
}

async fn run(calls: Arc<Calls>, endpoints: Endpoints, absences: Arc<Absences>) {
    let mut after_seq = 0;
    let mut backoff = FIRST_BACKOFF;
    let mut opened = false;
    loop {
        let address = endpoints.order()[0];
        if opened {
            count(&calls.counters.resubscribes, 1);
        }
        opened = true;
        match follow(&calls, &endpoints, address, &absences, &mut after_seq).await {
            Ok(true) => backoff = FIRST_BACKOFF,
            Ok(false) => {}
            Err(status) => {
                tracing::debug!(address = endpoints.name(address), %status, "invalidation stream failed");
            }
        }
        absences.went_down();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Follows one stream from `address` until it ends: whether it delivered anything.
async fn follow(
    calls: &Calls,
    endpoints: &Endpoints,
    address: usize,
    absences: &Absences,
    after_seq: &mut u64,
) -> Result<bool, tonic::Status> {
    let request = calls.request_without_deadline(proto::SubscribeInvalidationsRequest {
        namespace: calls.options.namespace.clone(),
        after_seq: *after_seq,
    });
    let mut stream = endpoints
        .client(address)
        .subscribe_invalidations(request)
        .await
        .inspect_err(|status| endpoints.mark_if_unavailable(address, status))?
        .into_inner();
    absences.went_live(*after_seq == 0);
    let mut delivered = false;
    while let Some(invalidation) = stream.message().await? {
        match invalidation.cause() {
            proto::InvalidationCause::Resync => {
                absences.resync(invalidation.seq);
                count(&calls.counters.invalidations, 1);
            }
            _ => {
                absences.added(&invalidation.keys, invalidation.seq);
                count(
                    &calls.counters.invalidations,
                    invalidation.keys.len() as u64,
                );
            }
        }
        // A RESYNC's seq may be below the last one (a gate with a shorter log): the stream goes on from it.
        *after_seq = invalidation.seq;
        delivered = true;
    }
    Ok(delivered)
}
