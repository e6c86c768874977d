//! [`GateClient`]: the gate's calls for one namespace, with single-key lookups coalesced into packed
//! `BatchMayExist` calls and every call sent to one of several addresses.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use tonic::metadata::AsciiMetadataValue;
use tonic::{Request, Status};

use crate::coalesce::{Coalescer, InFlight, Keys, Waiter, MAX_BATCH_KEYS};
use crate::endpoints::Endpoints;
pub use crate::endpoints::InvalidAddress;
use crate::options::ClientOptions;
use crate::proto;
use crate::stats::{count, Counters, Stats};

/// The answer to one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup {
    /// False: the key does not exist (within its retention). True: it may.
    pub may_exist: bool,
    /// The namespace's latest applied seq when the answer was computed: pass it to `record_absent`.
    pub observed_seq: u64,
    /// The gate is still loading its state and answers "may exist" for everything; a key then found at
    /// the source should be added once it is warm.
    pub warming: bool,
    /// A [mirror](crate::Mirror) answered `ABSENT` in-process under its sub-lease, with no call (its
    /// `observed_seq` is then the seq the mirror had applied).
    pub local: bool,
    /// Which address answered (an index into the client's addresses).
    pub(crate) address: usize,
}

/// The answers to a batch of keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLookup {
    /// One per key, in order: false = absent.
    pub may_exist: Vec<bool>,
    /// The smallest `observed_seq` of the calls that answered (the conservative one to record with).
    pub observed_seq: u64,
    /// Some part was answered by a gate still loading its state.
    pub warming: bool,
}

/// What `RecordAbsent` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// `RECORDED`, `REDUNDANT`, `SUPERSEDED` or `THROTTLED`.
    pub outcome: proto::RecordOutcome,
    /// The tombstone's seq (when recorded).
    pub seq: u64,
    /// How long the tombstone lives.
    pub expires_in: Duration,
}

/// A coalesced caller's share of a batch's answer: its keys are bits `offset..` of `bitmap`.
#[derive(Debug, Clone)]
struct Share {
    bitmap: Bytes,
    offset: usize,
    observed_seq: u64,
    warming: bool,
    address: usize,
}

type Answer = Result<Share, Status>;

/// The client tonic generated from the contract, on one endpoint's channel.
type GeneratedClient =
    proto::existence_gate_client::ExistenceGateClient<crate::whole_request::WholeRequests>;

/// Sends the calls: shared by the client and the batches its coalescer hands over.
pub(crate) struct Calls {
    pub endpoints: Endpoints,
    pub options: ClientOptions,
    pub counters: Arc<Counters>,
    pub addresses: Vec<String>,
    token: Option<AsciiMetadataValue>,
}

/// A client of one namespace of the gate. Cheap to clone (clones share channels, coalescer and counters).
#[derive(Clone)]
pub struct GateClient {
    calls: Arc<Calls>,
    coalescer: Option<Arc<Coalescer<Answer>>>,
}

impl GateClient {
    /// A client of `addresses` (`host:port` of replicas of one deployment), connected on first use. Must be
    /// called within a tokio runtime, which sends the coalesced batches.
    pub fn new(
        addresses: impl IntoIterator<Item = impl Into<String>>,
        options: ClientOptions,
    ) -> Result<Self, InvalidAddress> {
        let addresses: Vec<String> = addresses.into_iter().map(Into::into).collect();
        let token = match &options.token {
            None => None,
            Some(token) => Some(
                format!("Bearer {token}")
                    .parse::<AsciiMetadataValue>()
                    .map_err(|_| InvalidAddress("the token is not printable ASCII".to_string()))?,
            ),
        };
        let endpoints = Endpoints::new(addresses.clone(), options.address_policy, &options)?;
        let calls = Arc::new(Calls {
            endpoints,
            options,
            counters: Arc::default(),
            addresses,
            token,
        });
        let coalescer = (!calls.options.coalesce_window.is_zero()).then(|| {
            let runtime = tokio::runtime::Handle::current();
            let sending = calls.clone();
            Arc::new(Coalescer::start(
                calls.options.coalesce_window,
                calls.options.coalesce_max_keys,
                Box::new(move |batch, in_flight| {
                    runtime.spawn(sending.clone().answer_batch(batch, in_flight));
                }),
            ))
        });
        Ok(Self { calls, coalescer })
    }

    /// Whether `key` may exist. Concurrent calls share one packed `BatchMayExist` (see
    /// [`ClientOptions::coalesce_window`]); the error is the gate's status, or `DEADLINE_EXCEEDED`.
    pub async fn may_exist(&self, key: impl Into<Bytes>) -> Result<Lookup, Status> {
        let key = key.into();
        let calls = &self.calls;
        count(&calls.counters.lookups, 1);
        match &self.coalescer {
            Some(coalescer) if self.coalescable(&key) => {
                let share = shared_call(coalescer, Keys::One(key)).await?;
                Ok(Lookup {
                    may_exist: bit(&share.bitmap, share.offset),
                    observed_seq: share.observed_seq,
                    warming: share.warming,
                    local: false,
                    address: share.address,
                })
            }
            _ => calls.unary(key).await,
        }
    }

    /// Whether each of `keys` may exist, in order: packed batches of at most [`MAX_BATCH_KEYS`] keys, which
    /// concurrent batches and single-key lookups share when coalescing is on.
    pub async fn may_exist_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<BatchLookup, Status> {
        let mut answers = BatchLookup {
            may_exist: Vec::with_capacity(keys.len()),
            observed_seq: u64::MAX,
            warming: false,
        };
        for part in keys.chunks(MAX_BATCH_KEYS) {
            let (packed, len) = pack(part.iter().map(AsRef::as_ref));
            let share = match &self.coalescer {
                Some(coalescer) if part.iter().all(|key| self.coalescable(key.as_ref())) => {
                    shared_call(coalescer, Keys::Packed { packed, count: len }).await?
                }
                _ => self.calls.batch(packed, len, Instant::now()).await?,
            };
            let bits = share.offset..share.offset + len;
            answers
                .may_exist
                .extend(bits.map(|i| bit(&share.bitmap, i)));
            answers.observed_seq = answers.observed_seq.min(share.observed_seq);
            answers.warming |= share.warming;
        }
        if keys.is_empty() {
            answers.observed_seq = 0;
        }
        Ok(answers)
    }

    /// Whether `key` may share a batch: the gate would refuse an empty or over-long key with
    /// `INVALID_ARGUMENT` for the whole batch, so such a key is sent alone and its caller alone is refused.
    fn coalescable(&self, key: &[u8]) -> bool {
        !key.is_empty() && key.len() <= self.calls.options.max_key_bytes
    }

    /// Adds `keys` (a writer calls this before inserting the rows): the seq that covers them.
    pub async fn add<K: Into<Bytes>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<u64, Status> {
        let message = proto::AddRequest {
            namespace: self.calls.options.namespace.clone(),
            keys: keys.into_iter().map(Into::into).collect(),
            // Not `packed_keys`: a gate from before it ignores the field and refuses the Add as empty.
            packed_keys: Bytes::new(),
        };
        let (response, _) = self
            .calls
            .send(None, message, |mut client, request| async move {
                client.add(request).await
            })
            .await?;
        Ok(response.seq)
    }

    /// Records that the source does not have `key` (`kind`: missing or deleted), as observed at
    /// `observed_seq` (from the lookup that preceded the source read).
    pub async fn record_absent(
        &self,
        key: impl Into<Bytes>,
        kind: proto::AbsenceKind,
        observed_seq: u64,
    ) -> Result<Recorded, Status> {
        self.record_absent_at(None, key.into(), kind, observed_seq)
            .await
    }

    /// [`GateClient::record_absent`], first to the address that answered `lookup` (a replica's seq may lag
    /// another's).
    pub(crate) async fn record_absent_after(
        &self,
        lookup: &Lookup,
        key: Bytes,
        kind: proto::AbsenceKind,
    ) -> Result<Recorded, Status> {
        self.record_absent_at(Some(lookup.address), key, kind, lookup.observed_seq)
            .await
    }

    async fn record_absent_at(
        &self,
        address: Option<usize>,
        key: Bytes,
        kind: proto::AbsenceKind,
        observed_seq: u64,
    ) -> Result<Recorded, Status> {
        let message = proto::RecordAbsentRequest {
            namespace: self.calls.options.namespace.clone(),
            key,
            kind: kind as i32,
            observed_seq,
            ttl_seconds: 0,
        };
        let (response, _) = self
            .calls
            .send(address, message, |mut client, request| async move {
                client.record_absent(request).await
            })
            .await?;
        Ok(Recorded {
            outcome: response.outcome(),
            seq: response.seq,
            expires_in: Duration::from_millis(response.expires_in_ms),
        })
    }

    /// The counters so far (shared with a [`crate::GatedReader`] built on this client).
    pub fn stats(&self) -> Stats {
        self.calls.counters.snapshot()
    }

    /// The options this client was built with.
    pub fn options(&self) -> &ClientOptions {
        &self.calls.options
    }

    pub(crate) fn calls(&self) -> &Arc<Calls> {
        &self.calls
    }
}

impl Calls {
    /// A request for `message` with the deadline `timeout` (sent as `grpc-timeout`) and the token.
    pub fn request<T>(&self, message: T, timeout: Duration) -> Request<T> {
        let mut request = self.request_without_deadline(message);
        request.set_timeout(timeout);
        request
    }

    /// A request for `message` with the token: for the invalidation stream, which lasts.
    pub fn request_without_deadline<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        request
    }

    /// [`Endpoints::call`] with this client's deadline counted from `since`, counting retries.
    async fn call<T, F, Fut>(
        &self,
        first: Option<usize>,
        since: Instant,
        call: F,
    ) -> Result<(T, usize), Status>
    where
        F: FnMut(GeneratedClient, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let retried = || count(&self.counters.retries, 1);
        self.endpoints
            .call(first, self.options.deadline, since, retried, call)
            .await
    }

    /// Sends `message` with [`call`](Self::call)'s retries, each attempt a copy of it with the deadline
    /// left and the token; `rpc` is the method of the generated client to call. The message and address
    /// that answered.
    async fn send<M, T, Fut>(
        &self,
        first: Option<usize>,
        message: M,
        rpc: impl Fn(GeneratedClient, Request<M>) -> Fut,
    ) -> Result<(T, usize), Status>
    where
        M: Clone,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.send_since(first, Instant::now(), message, rpc).await
    }

    /// [`send`](Self::send) with the deadline counted from `since`.
    async fn send_since<M, T, Fut>(
        &self,
        first: Option<usize>,
        since: Instant,
        message: M,
        rpc: impl Fn(GeneratedClient, Request<M>) -> Fut,
    ) -> Result<(T, usize), Status>
    where
        M: Clone,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let (response, address) = self
            .call(first, since, |client, timeout| {
                rpc(client, self.request(message.clone(), timeout))
            })
            .await?;
        Ok((response.into_inner(), address))
    }

    /// One unary `MayExist`.
    async fn unary(&self, key: Bytes) -> Result<Lookup, Status> {
        count(&self.counters.gate_calls, 1);
        let message = proto::MayExistRequest {
            namespace: self.options.namespace.clone(),
            key,
        };
        let (response, address) = self
            .send(None, message, |mut client, request| async move {
                client.may_exist(request).await
            })
            .await?;
        Ok(Lookup {
            may_exist: response.answer() != proto::Answer::Absent,
            observed_seq: response.observed_seq,
            warming: response.basis() == proto::Basis::Warming,
            local: false,
            address,
        })
    }

    /// One packed `BatchMayExist` of `len` keys, answered as a share from bit 0, given up at the client's
    /// deadline counted from `since`.
    async fn batch(&self, packed: Bytes, len: usize, since: Instant) -> Answer {
        count(&self.counters.gate_calls, 1);
        let message = proto::BatchMayExistRequest {
            namespace: self.options.namespace.clone(),
            packed_keys: packed,
            ..Default::default()
        };
        let (response, address) = self
            .send_since(None, since, message, |mut client, request| async move {
                client.batch_may_exist(request).await
            })
            .await?;
        if response.may_exist_bitmap.len() < len.div_ceil(8) {
            return Err(Status::internal(format!(
                "the gate answered {len} packed keys with a {}-byte bitmap",
                response.may_exist_bitmap.len()
            )));
        }
        Ok(Share {
            bitmap: response.may_exist_bitmap,
            offset: 0,
            observed_seq: response.observed_seq,
            warming: response.warming,
            address,
        })
    }

    /// Sends a coalesced batch and answers each of its callers: its own keys' bits, or the batch's status.
    async fn answer_batch(
        self: Arc<Self>,
        batch: Vec<Waiter<Answer>>,
        in_flight: InFlight<Answer>,
    ) {
        // The batch is its waiters' keys, packed end to end.
        let mut packed = BytesMut::with_capacity(batch.iter().map(|w| w.keys.packed_len()).sum());
        batch
            .iter()
            .for_each(|waiter| waiter.keys.pack_into(&mut packed));
        let len = batch.iter().map(|waiter| waiter.keys.count()).sum();
        count(&self.counters.batched_keys, len as u64);
        // Waiters are queued oldest first: giving up at the first one's deadline answers every one of them
        // within its own.
        let oldest = batch
            .first()
            .map_or_else(Instant::now, |waiter| waiter.arrived);
        let answer = self.batch(packed.freeze(), len, oldest).await;
        let mut offset = 0;
        for waiter in batch {
            let share = answer.clone().map(|share| Share { offset, ..share });
            offset += waiter.keys.count();
            let _ = waiter.reply.send(share);
        }
        // The gatherer hears that the batch is back only once the callers just answered have had a turn to
        // queue their next lookups, so the next batch carries them. Told first, it sent the next batch with
        // only the lookups that arrived during the round trip: 64 callers on a current-thread runtime made
        // 40 keys per call instead of 64, and cost 3.5-3.9 µs of CPU per lookup instead of 2.5-2.65
        // (multi-thread: 48 keys, 3.85-4.35 µs against 60, 3.70-3.90; `cargo bench --bench load -- clients
        // rust`, old and new interleaved). A lone caller is not held back: it is answered before the yield.
        tokio::task::yield_now().await;
        drop(in_flight);
    }
}

/// The share of the coalesced batch that carries `keys`. No timer of its own: the batch leaves within the
/// window and gives up at its oldest caller's deadline (see [`Calls::answer_batch`]).
async fn shared_call(coalescer: &Coalescer<Answer>, keys: Keys) -> Result<Share, Status> {
    match coalescer.submit(keys).await {
        Ok(answer) => answer,
        Err(_) => Err(Status::cancelled("the gate client was closed")),
    }
}

/// Keys as `packed_keys` wants them (each preceded by its length as a varint), and how many.
fn pack<'a>(keys: impl Iterator<Item = &'a [u8]>) -> (Bytes, usize) {
    let mut packed = BytesMut::new();
    let mut len = 0;
    for key in keys {
        prost::encoding::encode_varint(key.len() as u64, &mut packed);
        packed.put_slice(key);
        len += 1;
    }
    (packed.freeze(), len)
}

/// Bit `i` of a `may_exist_bitmap` (byte i / 8, least significant bit first).
fn bit(bitmap: &[u8], i: usize) -> bool {
    bitmap[i / 8] >> (i % 8) & 1 == 1
}
