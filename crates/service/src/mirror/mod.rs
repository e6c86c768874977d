//! `Mirror.Attach`: a client library's in-process copy of a namespace's filter, fed from here — the filter
//! as of a seq, then every later `Add` — and the sub-leases under which it answers `ABSENT` without a call
//! ([`crate::core::sublease`] has the rules and why they keep P1; [`registry`] keeps them for this gate).
//!
//! One stream per mirror. What it costs the gate: a copy of the filter while it is sent (taken under the
//! namespace's writer lock, so `Add`s wait for a memory copy), a cursor into the invalidation buffer, and on
//! every `Add` the wait for this mirror's acknowledgement while it holds a sub-lease.

pub mod registry;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::access::{authorization, Access};
use crate::auth::Scope;
use crate::core::config::Role;
use crate::core::filter::BloomLayer;
use crate::core::gate::Gate;
use crate::core::invalidations::{Delivery, Invalidation};
use crate::core::namespace::{MirrorImage, WindowImage};
use crate::grpc::{resolve_namespace, status};
use crate::proto;
use crate::proto::mirror_request::Request as Asked;
use crate::proto::mirror_update::Update;
pub use registry::{Attachment, MirrorRegistry, OwnLease};

/// How long a mirror may take to send its `open` once its stream is up.
const OPEN_WAIT: Duration = Duration::from_secs(10);
/// Blocks of the filter per message: 1 MiB, well under the 4 MiB a gRPC client accepts by default.
const BLOCKS_PER_MESSAGE: usize = 1 << 14;

/// Where this gate keeps its mirrors' sub-leases, or why it takes no mirrors (said to each that tries).
pub type Mirroring = Result<Arc<MirrorRegistry>, String>;

/// The stream a mirror reads.
pub type MirrorStream = Pin<Box<dyn Stream<Item = Result<proto::MirrorUpdate, Status>> + Send>>;

/// The `Mirror` service.
#[derive(Debug, Clone)]
pub struct MirrorService {
    gate: Arc<Gate>,
    access: Arc<Access>,
    /// Where sub-leases are kept, or why this gate grants none.
    registry: Mirroring,
}

impl MirrorService {
    /// Mirrors of `gate`'s namespaces, their sub-leases kept by `registry` (`Err`: why this gate takes no
    /// mirrors, said to each that tries).
    pub fn new(gate: Arc<Gate>, access: Arc<Access>, registry: Mirroring) -> Self {
        Self {
            gate,
            access,
            registry,
        }
    }
}

#[tonic::async_trait]
impl proto::mirror_server::Mirror for MirrorService {
    type AttachStream = MirrorStream;

    async fn attach(
        &self,
        request: Request<Streaming<proto::MirrorRequest>>,
    ) -> Result<Response<MirrorStream>, Status> {
        let token = authorization(&request).map(str::to_owned);
        let registry = self.registry.clone().map_err(Status::failed_precondition)?;
        let mut inbound = request.into_inner();
        let open = first_open(&mut inbound).await?;
        let (feed, image, header) = self.attach_to(&registry, token.as_deref(), open)?;
        let shutdown = self.access.shutdown().clone();
        let MirrorImage {
            windows,
            mut subscription,
            ..
        } = image;
        let stream = async_stream::stream! {
            yield Ok(update(Update::Header(header)));
            for words in FilterWords::new(windows) {
                yield Ok(update(Update::Words(proto::FilterWords { words })));
            }
            loop {
                tokio::select! {
                    biased;
                    () = shutdown.wait() => {
                        yield Err(Status::unavailable("the server is shutting down; attach the mirror again"));
                        break;
                    }
                    asked = inbound.message() => match asked {
                        Ok(Some(proto::MirrorRequest { request: Some(asked) })) => match feed.answer(asked) {
                            Ok(Some(reply)) => yield Ok(update(reply)),
                            Ok(None) => {}
                            Err(refused) => {
                                yield Err(refused);
                                break;
                            }
                        },
                        Ok(Some(proto::MirrorRequest { request: None })) => {}
                        // The mirror closed its side, or its connection broke.
                        Ok(None) | Err(_) => break,
                    },
                    delivery = subscription.next() => match delivery {
                        Delivery::Added(added) => yield Ok(update(Update::Added(mirrored(&added)))),
                        Delivery::Resync { seq } => {
                            yield Ok(update(Update::Resync(proto::MirrorResync { seq })));
                            break;
                        }
                    },
                }
            }
        };
        Ok(Response::new(Box::pin(stream)))
    }
}

impl MirrorService {
    /// Admits the mirror `open` describes, takes its place, then its copy: the checks and the place first,
    /// so that a mirror refused costs no copy of the filter (made under the namespace's writer lock).
    fn attach_to(
        &self,
        registry: &Arc<MirrorRegistry>,
        token: Option<&str>,
        mut open: proto::MirrorOpen,
    ) -> Result<(Feed, MirrorImage, proto::MirrorHeader), Status> {
        resolve_namespace(&mut open.namespace);
        self.access
            .admit_with(token, Role::Mirror, Scope::Namespace(&open.namespace))?;
        let found = self.gate.namespace(&open.namespace).map_err(status)?;
        // Its live windows now, or those it makes soon when nothing was added lately.
        let bytes = (found.stats(self.gate.read_time()).filter.bytes)
            .max(found.settings().filter_spec().initial_bytes());
        if open.max_filter_bytes != 0 && bytes > open.max_filter_bytes {
            return Err(Status::resource_exhausted(format!(
                "the filter of namespace {:?} takes {bytes} bytes, more than this mirror's \
                 max_filter_bytes ({})",
                found.name(),
                open.max_filter_bytes
            )));
        }
        let attachment = registry
            .attach(found.name())
            .map_err(Status::resource_exhausted)?;
        let (namespace, hasher, image) = self.gate.mirror_image(found.name()).map_err(status)?;
        let header = header(&namespace, hasher.seed(), &image, registry.terms());
        let feed = Feed {
            gate: Arc::clone(&self.gate),
            namespace,
            attachment,
        };
        Ok((feed, image, header))
    }
}

/// One attached mirror's requests, answered.
struct Feed {
    gate: Arc<Gate>,
    namespace: Arc<str>,
    attachment: Attachment,
}

impl Feed {
    /// The reply to `asked`, if it has one.
    fn answer(&self, asked: Asked) -> Result<Option<Update>, Status> {
        match asked {
            Asked::Open(_) => Err(Status::invalid_argument(
                "`open` comes once, as the stream's first message",
            )),
            Asked::Applied(applied) => {
                self.attachment.acknowledged(applied.seq);
                Ok(None)
            }
            Asked::Ask(ask) => {
                // The latest `Add`, not the latest seq: the mirror is sent `Add`s only, so a tombstone's seq
                // after it would keep the grant from ever holding.
                let namespace = self.gate.namespace(&self.namespace).map_err(status)?;
                let (applied, grant) = self.attachment.grant(|| namespace.latest_add_seq());
                Ok(Some(Update::Grant(proto::LeaseGrant {
                    id: ask.id,
                    length_ns: grant.map_or(0, |g| g.length),
                    from_seq: grant.map_or(applied, |g| g.from_seq),
                    now_ms: self.gate.read_time().windows_ms,
                    observable_seq: self.attachment.observable_seq(),
                })))
            }
        }
    }
}

/// The stream's first message, which must be `open`.
async fn first_open(
    inbound: &mut Streaming<proto::MirrorRequest>,
) -> Result<proto::MirrorOpen, Status> {
    let first = tokio::time::timeout(OPEN_WAIT, inbound.message())
        .await
        .map_err(|_| {
            Status::invalid_argument(format!(
                "no `open` within {OPEN_WAIT:?}: a mirror's first message names its namespace"
            ))
        })??;
    match first.and_then(|m| m.request) {
        Some(Asked::Open(open)) => Ok(open),
        Some(_) => Err(Status::invalid_argument(
            "a mirror's first message must be `open`, naming the namespace",
        )),
        None => Err(Status::invalid_argument(
            "the stream ended (or sent an empty message) before `open`",
        )),
    }
}

fn update(update: Update) -> proto::MirrorUpdate {
    proto::MirrorUpdate {
        update: Some(update),
    }
}

/// The filter's sizing, hash, shape and the sub-leases' terms.
fn header(
    namespace: &str,
    hash_seed: u64,
    image: &MirrorImage,
    terms: crate::core::sublease::Terms,
) -> proto::MirrorHeader {
    let spec = image.spec;
    let filter_windows = image
        .windows
        .iter()
        .map(|(id, layers)| proto::FilterWindow {
            id: *id,
            layers: layers
                .iter()
                .map(|layer| {
                    let geometry = layer.geometry();
                    proto::FilterLayer {
                        blocks: geometry.blocks as u64,
                        probes: geometry.probes,
                        capacity: geometry.capacity,
                        inserted: layer.inserted(),
                    }
                })
                .collect(),
        })
        .collect();
    proto::MirrorHeader {
        namespace: namespace.to_string(),
        seq: image.seq,
        hash_seed,
        expected_keys: spec.expected_keys,
        false_positive_rate: spec.false_positive_rate,
        retention_ms: match spec.retention {
            crate::core::filter::Retention::Forever => 0,
            crate::core::filter::Retention::Millis(ms) => ms,
        },
        windows: spec.windows,
        max_filter_bytes: spec.max_bytes,
        fingerprint: spec.fingerprint(),
        filter_windows,
        sublease_ns: terms.length,
        max_clock_drift_ppm: terms.drift_ppm,
        margin_ns: terms.margin,
    }
}

/// The layers' words in messages of at most [`BLOCKS_PER_MESSAGE`] blocks, little-endian, layer after
/// layer.
struct FilterWords {
    layers: Vec<Arc<BloomLayer>>,
    /// The next block to send: of which layer, and where in it.
    layer: usize,
    block: usize,
}

impl FilterWords {
    fn new(windows: Vec<WindowImage>) -> Self {
        Self {
            layers: windows.into_iter().flat_map(|(_, layers)| layers).collect(),
            layer: 0,
            block: 0,
        }
    }
}

impl Iterator for FilterWords {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let layer = self.layers.get(self.layer)?;
        let blocks = self.block..self.block + BLOCKS_PER_MESSAGE;
        let mut chunk = BytesMut::with_capacity(BLOCKS_PER_MESSAGE * 64);
        for word in layer.words_of_blocks(blocks) {
            chunk.put_u64_le(word);
        }
        self.block += BLOCKS_PER_MESSAGE;
        if self.block >= layer.geometry().blocks {
            (self.layer, self.block) = (self.layer + 1, 0);
        }
        Some(chunk.freeze())
    }
}

fn mirrored(added: &Invalidation) -> proto::MirroredAdd {
    proto::MirroredAdd {
        seq: added.seq,
        at_ms: added.at_ms,
        keys: added.keys.slices().map(Bytes::copy_from_slice).collect(),
    }
}
