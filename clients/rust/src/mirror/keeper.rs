//! The task that keeps a mirror's copy: attach, download, follow, and attach again when the stream ends.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_epoch as epoch;
use existence_gate_core::filter::{
    BloomLayer, FilterSpec, Geometry, Retention, WindowedFilter, MAX_LAYER_BYTES,
};
use existence_gate_core::hashing::FilterHasher;
use existence_gate_core::sublease::{Grant, Nanos, Sublease, Terms};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::{Copy, MirrorOptions, Shared};
use crate::client::GateClient;
use crate::endpoints::Endpoints;
use crate::proto;
use crate::proto::mirror_client::MirrorClient;
use crate::proto::mirror_update::Update;
use crate::stats::count;

const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The task that keeps the copy.
pub(super) struct Keeper {
    shared: Arc<Shared>,
    gate: GateClient,
    endpoints: Endpoints,
    options: MirrorOptions,
}

impl Keeper {
    pub(super) fn new(
        shared: Arc<Shared>,
        gate: GateClient,
        endpoints: Endpoints,
        options: MirrorOptions,
    ) -> Self {
        Self {
            shared,
            gate,
            endpoints,
            options,
        }
    }

    pub(super) async fn run(self) {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let address = self.endpoints.order()[0];
            match self.follow(address).await {
                Ok(()) => backoff = FIRST_BACKOFF,
                Err(status) => {
                    self.endpoints.mark_if_unavailable(address, &status);
                    tracing::debug!(address = self.endpoints.name(address), %status, "mirror stream ended");
                }
            }
            self.shared.holds_until.store(0, Ordering::Release);
            self.shared.attached.store(false, Ordering::Release);
            count(&self.gate.calls().counters.mirror_attaches, 1);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Attaches to `address` and follows its stream until it ends; `Ok` when it ended after a download.
    async fn follow(&self, address: usize) -> Result<(), Status> {
        let calls = self.gate.calls();
        let (sender, requests) = mpsc::channel(64);
        let open = proto::MirrorOpen {
            namespace: calls.options.namespace.clone(),
            max_filter_bytes: self.options.max_filter_bytes,
        };
        let _ = sender.try_send(request(proto::mirror_request::Request::Open(open)));
        let mut stream = MirrorClient::new(self.endpoints.channel(address))
            .attach(calls.request_without_deadline(ReceiverStream::new(requests)))
            .await?
            .into_inner();
        let (header, copy) = download(&mut stream, self.options.max_filter_bytes).await?;
        // The gate's margin, and two grains of this process's coarse clock ([`super::clock`]).
        let terms = Terms {
            length: header.sublease_ns,
            drift_ppm: header.max_clock_drift_ppm,
            margin: header.margin_ns + 2 * self.shared.clock.grain(),
        };
        self.shared.replace_copy(copy);
        // The copy is the gate's filter as of the header's seq: acknowledged like an applied `Add`, since
        // the gate grants again only once the previous grant's seq is acknowledged.
        let mut acks = Acks {
            sender: sender.clone(),
            unsent: None,
        };
        acks.applied(header.seq);
        self.shared.attached.store(true, Ordering::Release);
        let mut following = Following {
            shared: &self.shared,
            sender,
            acks,
            sublease: Sublease::new(terms),
            applied: header.seq,
            asked: Vec::new(),
            next_ask: 0,
            ask_every: quarter(terms.length),
            max_filter_bytes: match self.options.max_filter_bytes {
                0 => u64::MAX,
                cap => cap,
            },
        };
        following.run(&mut stream).await
    }
}

/// One attachment's state: what it applied and its sub-lease.
struct Following<'a> {
    shared: &'a Shared,
    sender: mpsc::Sender<proto::MirrorRequest>,
    acks: Acks,
    sublease: Sublease,
    applied: u64,
    /// Requests for sub-leases not yet answered: their ids and when they were sent.
    asked: Vec<(u64, Nanos)>,
    next_ask: u64,
    /// A quarter of the latest grant's length (at first, of the longest the gate grants): a replica grants
    /// no longer than its own read lease has left, often much less than `[mirrors] sublease`.
    ask_every: Duration,
    /// [`MirrorOptions::max_filter_bytes`] (0: no limit).
    max_filter_bytes: u64,
}

impl Following<'_> {
    async fn run(&mut self, stream: &mut Streaming<proto::MirrorUpdate>) -> Result<(), Status> {
        let mut next_ask = tokio::time::Instant::now();
        let room = self.sender.clone();
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next_ask) => {
                    self.ask();
                    next_ask = tokio::time::Instant::now() + self.ask_every;
                }
                Ok(permit) = room.reserve(), if self.acks.unsent.is_some() => self.acks.send_unsent(permit),
                update = stream.message() => match update?.and_then(|u| u.update) {
                    Some(Update::Added(added)) => self.apply(&added)?,
                    Some(Update::Grant(grant)) => self.granted(&grant),
                    Some(Update::Resync(_)) | None => return Ok(()),
                    Some(Update::Header(_) | Update::Words(_)) => {
                        return Err(Status::internal("the gate sent a second filter on one stream"));
                    }
                },
            }
        }
    }

    fn ask(&mut self) {
        self.next_ask += 1;
        let id = self.next_ask;
        let ask = proto::mirror_request::Request::Ask(proto::LeaseAsk { id });
        if self.sender.try_send(request(ask)).is_ok() {
            // Unanswered requests of a gate that stopped granting are forgotten after a few.
            if self.asked.len() >= 16 {
                self.asked.remove(0);
            }
            self.asked.push((id, self.shared.clock.now()));
        }
    }

    fn apply(&mut self, added: &proto::MirroredAdd) -> Result<(), Status> {
        let guard = epoch::pin();
        if let Some(copy) = self.shared.copy(&guard) {
            let hashes: Vec<_> = added.keys.iter().map(|k| copy.hasher.hash(k)).collect();
            copy.filter.insert_many(&hashes, added.at_ms);
            if copy.filter.bytes() > self.max_filter_bytes {
                return Err(Status::resource_exhausted(format!(
                    "the mirror's filter grew to {} bytes, more than its max_filter_bytes ({})",
                    copy.filter.bytes(),
                    self.max_filter_bytes
                )));
            }
        }
        self.applied = added.seq;
        self.publish();
        self.acks.applied(added.seq);
        Ok(())
    }

    fn granted(&mut self, grant: &proto::LeaseGrant) {
        let Some(position) = self.asked.iter().position(|(id, _)| *id == grant.id) else {
            return;
        };
        let (_, asked) = self.asked[position];
        self.asked.drain(..=position);
        if grant.length_ns == 0 {
            return;
        }
        self.ask_every = quarter(grant.length_ns);
        self.shared.now_ms.store(grant.now_ms, Ordering::Relaxed);
        // Before the sub-lease is published: a lookup that sees it holding sees this grant's bound. An older
        // grant arriving late lowers it, which claims less: a lost tombstone, never a wrong one.
        let observable = match grant.observable_seq {
            0 => u64::MAX,
            bound => bound,
        };
        self.shared.observable.store(observable, Ordering::Release);
        if let Some(copy) = self.shared.copy(&epoch::pin()) {
            // Windows no longer live at the gate's time free their memory, as the gate's do.
            copy.filter.expire(grant.now_ms);
        }
        self.sublease.granted(
            asked,
            Grant {
                length: grant.length_ns,
                from_seq: grant.from_seq,
            },
        );
        self.publish();
    }

    /// Makes the sub-lease visible to lookups as it now stands.
    fn publish(&self) {
        self.shared.applied.store(self.applied, Ordering::Release);
        let until = self.sublease.holding_until(self.applied);
        self.shared.holds_until.store(until, Ordering::Release);
    }
}

/// Acknowledgements to the gate. Each says "applied through `seq`", so only the newest counts: one that
/// finds the queue to the gate full is kept (in place of any older one kept) and sent as soon as there is
/// room. Dropped, the last one before a pause in `Add`s would hold that `Add` until this mirror's sub-lease
/// ended on the gate, which would not grant it again meanwhile (it grants only once the previous grant's
/// seq is acknowledged): one `Add` a sub-lease late, and a sub-lease lost, for a full queue.
struct Acks {
    sender: mpsc::Sender<proto::MirrorRequest>,
    /// The newest seq applied whose acknowledgement is not yet queued.
    unsent: Option<u64>,
}

impl Acks {
    /// Acknowledges everything through `seq`, now or once the queue has room.
    fn applied(&mut self, seq: u64) {
        let sent = self.sender.try_send(request(applied(seq)));
        self.unsent = sent.err().map(|_| seq);
    }

    /// Queues the kept acknowledgement in the room `permit` holds.
    fn send_unsent(&mut self, permit: mpsc::Permit<'_, proto::MirrorRequest>) {
        if let Some(seq) = self.unsent.take() {
            permit.send(request(applied(seq)));
        }
    }
}

fn applied(seq: u64) -> proto::mirror_request::Request {
    proto::mirror_request::Request::Applied(proto::MirrorApplied { seq })
}

fn request(request: proto::mirror_request::Request) -> proto::MirrorRequest {
    proto::MirrorRequest {
        request: Some(request),
    }
}

/// Reads the header and the filter's words: the copy as of the header's seq. A filter the header announces
/// over `max_filter_bytes` (0: no limit) is refused before any of it is allocated: the gate refuses one
/// itself, but the cap is this process's memory, so it does not rest on the gate alone.
async fn download(
    stream: &mut Streaming<proto::MirrorUpdate>,
    max_filter_bytes: u64,
) -> Result<(proto::MirrorHeader, Copy), Status> {
    let header = match stream.message().await?.and_then(|u| u.update) {
        Some(Update::Header(header)) => header,
        _ => {
            return Err(Status::internal(
                "the gate's mirror stream did not begin with its header",
            ))
        }
    };
    let spec = spec_of(&header)?;
    let announced = header
        .filter_windows
        .iter()
        .flat_map(|window| &window.layers)
        .fold(0u64, |bytes, layer| {
            bytes.saturating_add(layer.blocks.saturating_mul(64))
        });
    if max_filter_bytes != 0 && announced > max_filter_bytes {
        return Err(Status::resource_exhausted(format!(
            "the gate's filter takes {announced} bytes, more than this mirror's max_filter_bytes \
             ({max_filter_bytes})"
        )));
    }
    let mut windows = Vec::with_capacity(header.filter_windows.len());
    let mut pending = Vec::new();
    for window in &header.filter_windows {
        let mut layers = Vec::with_capacity(window.layers.len());
        for layer in &window.layers {
            let words = words_of(layer)?;
            while pending.len() < words {
                match stream.message().await?.and_then(|u| u.update) {
                    Some(Update::Words(chunk)) => {
                        pending.extend(
                            chunk
                                .words
                                .chunks_exact(8)
                                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))),
                        );
                    }
                    _ => {
                        return Err(Status::internal(
                            "the gate's filter ended before its words did",
                        ))
                    }
                }
            }
            let rest = pending.split_off(words);
            let geometry = Geometry {
                blocks: layer.blocks as usize,
                probes: layer.probes,
                capacity: layer.capacity,
            };
            let restored = BloomLayer::from_words(geometry, layer.inserted, &pending)
                .map_err(|problem| Status::internal(format!("the gate sent {problem}")))?;
            layers.push(Arc::new(restored));
            pending = rest;
        }
        windows.push((window.id, layers));
    }
    let copy = Copy {
        filter: WindowedFilter::from_windows(spec, windows),
        hasher: FilterHasher::from_seed(header.hash_seed),
    };
    Ok((header, copy))
}

/// The words a layer's header announces, refused when absurd.
fn words_of(layer: &proto::FilterLayer) -> Result<usize, Status> {
    let bytes = layer.blocks.saturating_mul(64);
    if bytes == 0 || bytes > MAX_LAYER_BYTES {
        return Err(Status::internal(format!(
            "the gate announced a layer of {} blocks",
            layer.blocks
        )));
    }
    Ok((bytes / 8) as usize)
}

/// The sizing the header carries, checked against its fingerprint.
fn spec_of(header: &proto::MirrorHeader) -> Result<FilterSpec, Status> {
    let spec = FilterSpec {
        expected_keys: header.expected_keys,
        false_positive_rate: header.false_positive_rate,
        retention: match header.retention_ms {
            0 => Retention::Forever,
            ms => Retention::Millis(ms),
        },
        windows: header.windows,
        max_bytes: header.max_filter_bytes,
    };
    let plausible = spec.false_positive_rate > 0.0
        && spec.false_positive_rate < 1.0
        && (spec.retention == Retention::Forever || spec.windows >= 2);
    if !plausible || spec.fingerprint() != header.fingerprint {
        return Err(Status::internal(format!(
            "the gate's filter sizing does not match its fingerprint ({})",
            spec.describe()
        )));
    }
    Ok(spec)
}

/// A quarter of a sub-lease of `length` ns, at least a millisecond: how often a mirror asks to keep it.
fn quarter(length: Nanos) -> Duration {
    Duration::from_nanos(length / 4).max(Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acknowledged(request: Option<proto::MirrorRequest>) -> Option<u64> {
        match request?.request? {
            proto::mirror_request::Request::Applied(applied) => Some(applied.seq),
            _ => None,
        }
    }

    #[tokio::test]
    async fn an_acknowledgement_that_finds_the_queue_full_is_sent_once_there_is_room() {
        let (sender, mut queue) = mpsc::channel(1);
        let mut acks = Acks {
            sender: sender.clone(),
            unsent: None,
        };
        acks.applied(1);
        acks.applied(2);
        acks.applied(3);
        assert_eq!(
            acks.unsent,
            Some(3),
            "the newest is kept, the older one it covers is not"
        );
        assert_eq!(acknowledged(queue.recv().await), Some(1));
        acks.send_unsent(sender.reserve().await.expect("room"));
        assert_eq!(acks.unsent, None);
        assert_eq!(acknowledged(queue.recv().await), Some(3));
    }
}
