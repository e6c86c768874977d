//! The replicated log: the core's mutations in one NATS JetStream stream, which every replica publishes to
//! and applies in stream order.
//!
//! ```text
//! replica A ──publish(ns "users", Nats-Msg-Id)──▶ stream "existence"  (subjects existence.>, file storage,
//! replica B ──publish(ns "orders")──────────────▶   R1 or R3: JetStream orders and replicates with Raft)
//!                                                      │ ordered consumer from a seq
//!                         every replica ◀──────────────┘ applies each mutation with seq = stream sequence
//! ```
//!
//! A mutation's seq is its **stream sequence**: the same on every replica, increasing within a namespace but
//! with gaps (other namespaces' mutations take the numbers between). Messages are the log codec's bytes
//! ([`crate::storage::codec`]), written with seq 0 — the stream assigns it — on subject `STREAM.<namespace>`.
//! A publish carries a `Nats-Msg-Id`, so a publish retried after a lost acknowledgement is stored once
//! within the stream's duplicate window (2 minutes).
//!
//! What every replica must share is kept in the stream too, on subjects no namespace can have (`$` is not
//! allowed in namespace names), so a new replica learns it from the stream alone:
//!
//! - `STREAM.$identity` — the deployment's hash seed (filter bits mean something only under the seed they
//!   were set with). The first replica publishes it into the empty stream, so it is **stream seq 1**: every
//!   mutation's seq is then above [`GENESIS_SEQ`](crate::core::log::GENESIS_SEQ), as the core needs. A
//!   stream with mutations but no identity was not written by existence-gate and is refused.
//! - `STREAM.$sizing.<namespace>` — the namespace's filter sizing. The first replica to serve a namespace
//!   records it; a replica configured otherwise refuses to start, naming the namespace and both sizings
//!   (replicas applying one log under different sizings would set different bits).
//!
//! Both are written with an expected last sequence, so when replicas start together exactly one write
//! wins and the others read it.
//!
//! - `STREAM.$member` — membership ([`MemberRecord`]): joins, leaves, operators' removals, and the hello a
//!   starting replica publishes to read the membership up to its snapshot completely. Never purged.
//! - `STREAM.$barrier` — a replica's freshness read: a publish only a leader with a quorum acknowledges (see
//!   [`protocol`](super::protocol)). Purged with the namespaces' mutations below a shared snapshot.
//!
//! A message that is none of these — junk published by anything with publish rights — is passed over by
//! every replica alike ([`Streamed::junk`]), never applied and never a reason to stop.
//!
//! Limits: stream names are NATS's (no spaces, `.`, `*` or `>`); a namespace name may contain `.`, which
//! only adds subject tokens (`existence.a.b`), still under `existence.>`. A message holds at most the
//! server's `max_payload` (1 MiB by default): an `Add` larger than that is refused by the publish.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{self, consumer, stream};
use async_nats::ServerAddr;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use super::protocol::{MemberRecord, Membership};
use crate::core::filter::FilterSpec;
use crate::core::hashing::KeyHasher;
use crate::core::log::Mutation;
use crate::storage::codec;

/// How long a first connection may take before the replica gives up with an error (it does not wait
/// forever for a NATS that may never come: the operator sees why it did not start).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests that open the stream, tried before giving up when they time out.
const SETUP_ATTEMPTS: u32 = 5;
/// How long a retried publish with the same `Nats-Msg-Id` is recognised as a duplicate.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// The subject token of the deployment identity.
const IDENTITY: &str = "$identity";
/// The subject token before a namespace's sizing record.
const SIZING: &str = "$sizing";
/// The start of an identity message, then a u32 format and the 32-byte seed.
const IDENTITY_MAGIC: &[u8; 8] = b"EXGIDNT1";
/// The identity format this build writes and reads.
const IDENTITY_FORMAT: u32 = 1;
/// The subject token of membership records.
const MEMBER: &str = "$member";
/// The subject token of lease barriers.
const BARRIER: &str = "$barrier";
/// The start of a membership record: then a kind byte, the nonce (u64 LE), the id's length (u16 LE), the
/// id, and for a join the origin.
const MEMBER_MAGIC: &[u8; 8] = b"EXGMEMB1";
/// The start of an applied-seq report: then the seq and the nonce (u64 LE each) and the replica id.
const REPORT_MAGIC: &[u8; 8] = b"EXGREPT2";
/// How long reading one of the stream's record subjects from its start may take (the membership at start,
/// a record's history past junk).
const SUBJECT_READ: Duration = Duration::from_secs(10);

/// Where the stream is and how to reach it.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// NATS server URLs, e.g. `nats://127.0.0.1:4222`.
    pub servers: Vec<String>,
    /// A token, for a NATS that requires one.
    pub token: Option<String>,
    /// A `.creds` file (JWT and NKey seed), for a NATS with decentralised auth.
    pub credentials: Option<PathBuf>,
    /// A PEM CA bundle: the servers' certificates must chain to it (TLS required).
    pub tls_ca: Option<PathBuf>,
    /// The stream's name; its subjects are `NAME.>`.
    pub stream: String,
    /// Replicas of the stream when this replica creates it (1, or 3 in production).
    pub replicas: usize,
}

impl StreamOptions {
    /// The stream `stream` on `servers`, unsecured, one replica.
    pub fn new(servers: Vec<String>, stream: &str) -> Self {
        Self {
            servers,
            token: None,
            credentials: None,
            tls_ca: None,
            stream: stream.to_string(),
            replicas: 1,
        }
    }
}

/// Why the stream cannot be used. Each message names NATS, the stream and what to check.
#[derive(Debug)]
pub enum StreamError {
    /// The options cannot work (a bad URL or stream name, an unreadable file).
    Config(String),
    /// No NATS server could be reached.
    Unreachable(String),
    /// The stream could not be found, created, or is not ours.
    Setup(String),
    /// A publish was not acknowledged: the mutation may or may not be stored.
    Publish(String),
    /// Reading the stream failed, or it held a message that is not a mutation.
    Read(String),
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Config(problem)
            | Self::Unreachable(problem)
            | Self::Setup(problem)
            | Self::Publish(problem)
            | Self::Read(problem) => f.write_str(problem),
        }
    }
}

impl std::error::Error for StreamError {}

/// A publish the stream acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The stream sequence the mutation was stored at: its seq.
    pub seq: u64,
    /// The stream had stored this message id already (a retried publish); `seq` is the first one's.
    pub duplicate: bool,
}

/// A replica's word that it has applied the stream up to a seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedReport {
    /// The replica's id (`--replica-id`).
    pub replica: String,
    /// The reporting process's nonce: which incarnation of the id says so.
    pub nonce: u64,
    /// The last stream seq it applied.
    pub seq: u64,
}

/// One message of the stream as a replica reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Streamed {
    /// Its stream sequence.
    pub seq: u64,
    /// The mutation at `seq`; `None` for the stream's own records (identity, sizing, membership,
    /// barriers) and for junk, which a replica passes over but counts as read.
    pub mutation: Option<Mutation>,
    /// The membership record at `seq`.
    pub member: Option<MemberRecord>,
    /// Why the message at `seq` is neither a mutation nor one of the stream's records, if it is not.
    pub junk: Option<String>,
    /// The `Nats-Msg-Id` it was published with, if any: how a publisher recognises its own write.
    pub id: Option<String>,
}

/// The mutation stream, open: publish to it, read it from any seq.
#[derive(Debug, Clone)]
pub struct MutationStream {
    jetstream: jetstream::Context,
    stream: stream::Stream,
    name: String,
    seed: [u8; 32],
}

impl MutationStream {
    /// Connects to NATS and opens the stream, creating it (file storage, `options.replicas` replicas) if it
    /// does not exist. A stream of that name whose subjects are not `NAME.>` belongs to something else and
    /// is refused rather than written into.
    ///
    /// A cluster still electing the stream's leader (replicas starting at once create an R3 stream
    /// together) can time out a request, and a stream just created can refuse the first publish ("no stream
    /// found": seen under load on one server), and of two replicas creating it at once on one server the
    /// second can be refused with "subjects overlap with an existing stream" while the first is being stored
    /// (seen with two replicas started together on a loaded 2-core machine): opening is then tried again,
    /// `SETUP_ATTEMPTS` times in all, a second apart, and finds the stream the other one created. A stream
    /// of another name that really owns the subjects is refused with the same message after those tries.
    pub async fn open(options: &StreamOptions) -> Result<Self, StreamError> {
        validate_stream_name(&options.stream)?;
        let client = connect(options).await?;
        let jetstream = jetstream::new(client);
        let mut attempt = 1;
        loop {
            match Self::open_on(&jetstream, options).await {
                Err(StreamError::Setup(e) | StreamError::Read(e))
                    if (e.contains("timed out")
                        || e.contains("no stream found")
                        || e.contains("subjects overlap"))
                        && attempt < SETUP_ATTEMPTS =>
                {
                    tracing::warn!(error = %e, attempt, "opening the stream failed; trying again");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                opened => return opened,
            }
        }
    }

    async fn open_on(
        jetstream: &jetstream::Context,
        options: &StreamOptions,
    ) -> Result<Self, StreamError> {
        let subjects = format!("{}.>", options.stream);
        let config = stream::Config {
            name: options.stream.clone(),
            subjects: vec![subjects.clone()],
            storage: stream::StorageType::File,
            num_replicas: options.replicas,
            duplicate_window: DUPLICATE_WINDOW,
            allow_direct: true,
            ..Default::default()
        };
        let stream = jetstream.get_or_create_stream(config).await.map_err(|e| {
            StreamError::Setup(format!(
                "cannot open or create the JetStream stream {:?} on {}: {e} (is JetStream enabled on the \
                 servers, and may this account create streams?)",
                options.stream,
                options.servers.join(",")
            ))
        })?;
        let found = &stream.cached_info().config.subjects;
        if found != std::slice::from_ref(&subjects) {
            return Err(StreamError::Setup(format!(
                "the JetStream stream {:?} exists with subjects {found:?}, not [{subjects:?}]: it belongs to \
                 something else. Pick another name with --nats-stream, or remove that stream",
                options.stream
            )));
        }
        let mut opened = Self {
            jetstream: jetstream.clone(),
            stream,
            name: options.stream.clone(),
            seed: [0; 32],
        };
        opened.seed = opened.identity().await?;
        Ok(opened)
    }

    /// The deployment's hash seed, as the stream keeps it.
    pub fn seed(&self) -> [u8; 32] {
        self.seed
    }

    /// Reads the identity, publishing one (at seq 1) into an empty stream.
    async fn identity(&self) -> Result<[u8; 32], StreamError> {
        let subject = format!("{}.{IDENTITY}", self.name);
        // The stream's length first: an identity is always seq 1, so if the stream held anything when its
        // length was read, an identity read after that is there — unless the stream is not ours.
        let stored = self.last_seq().await?;
        if let Some(found) = self.first_on(&subject).await? {
            return self.parse_identity(&found);
        }
        if stored > 0 {
            return Err(StreamError::Setup(format!(
                "the JetStream stream {:?} holds messages but no existence-gate identity: it was written by \
                 something else. Pick another name with --nats-stream, or remove that stream",
                self.name
            )));
        }
        let mut payload = IDENTITY_MAGIC.to_vec();
        payload.extend_from_slice(&IDENTITY_FORMAT.to_le_bytes());
        payload.extend_from_slice(&KeyHasher::random().seed());
        let first = jetstream::message::PublishMessage::build()
            .payload(Bytes::from(payload))
            .expected_last_sequence(0);
        let found = self.write_first(&subject, first).await?;
        self.parse_identity(&found)
    }

    fn parse_identity(&self, message: &StreamMessage) -> Result<[u8; 32], StreamError> {
        let payload = &message.payload;
        let format = payload
            .get(8..12)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
        match (payload.get(..8), format) {
            (Some(magic), Some(IDENTITY_FORMAT)) if magic == IDENTITY_MAGIC && payload.len() == 44 => {
                Ok(payload[12..].try_into().expect("32 bytes"))
            }
            (Some(magic), Some(format)) if magic == IDENTITY_MAGIC => Err(StreamError::Setup(format!(
                "the JetStream stream {:?} was set up by a newer existence-gate (identity format {format}; \
                 this build reads {IDENTITY_FORMAT}): run that version or a newer one",
                self.name
            ))),
            _ => Err(StreamError::Setup(format!(
                "message {} of the JetStream stream {:?} is not an existence-gate identity: something else \
                 writes to {}",
                message.sequence, self.name, message.subject
            ))),
        }
    }

    /// Checks that this replica sizes `namespace` as the deployment does, recording `spec` if it is the
    /// first to serve it. Refused with both sizings when they differ.
    pub async fn agree_sizing(
        &self,
        namespace: &str,
        spec: &FilterSpec,
    ) -> Result<(), StreamError> {
        let subject = format!("{}.{SIZING}.{namespace}", self.name);
        let mine = spec.describe();
        let recorded = match self.first_on(&subject).await? {
            Some(found) => found,
            None => {
                let first = jetstream::message::PublishMessage::build()
                    .payload(Bytes::from(mine.clone()))
                    .expected_last_subject_sequence(0);
                self.write_first(&subject, first).await?
            }
        };
        let theirs = String::from_utf8_lossy(&recorded.payload);
        if theirs != mine {
            return Err(StreamError::Setup(format!(
                "namespace {namespace:?} is sized differently here ({mine}) than in the JetStream stream {:?} \
                 ({theirs}): every replica must size a namespace alike, or they would set different bits. \
                 Use the stream's sizing, or give the new sizing another namespace (or stream) and rebuild",
                self.name
            )));
        }
        Ok(())
    }

    /// The stream's own record `name` (subject `NAME.$name`), replaced over time: the stream seq of the last
    /// message on the subject (0: none; what a replacement must expect), and the newest payload `valid`
    /// accepts — a message that is not one (junk published there) is passed over in favour of the one before.
    pub async fn record(
        &self,
        name: &str,
        valid: impl Fn(&[u8]) -> bool,
    ) -> Result<(u64, Option<Bytes>), StreamError> {
        let subject = format!("{}.${name}", self.name);
        let Some(last) = self.last_on(&subject).await? else {
            return Ok((0, None));
        };
        if valid(&last.payload) {
            return Ok((last.sequence, Some(last.payload)));
        }
        tracing::error!(seq = last.sequence, %subject, "the newest record is junk; reading the ones before it");
        let mut newest_valid = None;
        self.read_subject_before(&subject, last.sequence, |_, payload| {
            if valid(payload) {
                newest_valid = Some(payload.clone());
            }
        })
        .await?;
        Ok((last.sequence, newest_valid))
    }

    /// Calls `each(seq, payload)` for every message on `subject` below stream seq `end`, in order, where the
    /// message at `end` is known to be on `subject`: reading until it comes back proves none before it was
    /// missed (an ordered consumer, served by the stream's leader). Bounded by [`SUBJECT_READ`].
    async fn read_subject_before(
        &self,
        subject: &str,
        end: u64,
        mut each: impl FnMut(u64, &Bytes),
    ) -> Result<(), StreamError> {
        let failed = |e: &dyn std::fmt::Display| {
            StreamError::Read(format!(
                "cannot read {subject} from the JetStream stream {:?}: {e}",
                self.name
            ))
        };
        let consumer = self
            .stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: subject.to_string(),
                ..Default::default()
            })
            .await
            .map_err(|e| failed(&e))?;
        let mut messages = consumer.messages().await.map_err(|e| failed(&e))?;
        let read = async {
            while let Some(message) = messages.next().await {
                let message = message.map_err(|e| failed(&e))?;
                let at = message.info().map_err(|e| failed(&e))?.stream_sequence;
                if at >= end {
                    return Ok(());
                }
                each(at, &message.payload);
            }
            Err(failed(&"the consumer ended"))
        };
        tokio::time::timeout(SUBJECT_READ, read)
            .await
            .map_err(|_| {
                failed(&format!(
                    "seq {end} did not come back within {SUBJECT_READ:?}"
                ))
            })?
    }

    /// Removes the messages of record `name` below stream seq `seq` (the replaced ones).
    pub async fn purge_record_below(&self, name: &str, seq: u64) -> Result<u64, StreamError> {
        self.purge_subject_below(&format!("{}.${name}", self.name), seq)
            .await
    }

    /// Replaces record `name` with `payload` if the last message on its subject is still the one at stream seq
    /// `expected` (0: none yet): the seq it was stored at, or `None` if another replica replaced it first
    /// (read it again and retry).
    pub async fn replace_record(
        &self,
        name: &str,
        payload: Bytes,
        expected: u64,
    ) -> Result<Option<u64>, StreamError> {
        let subject = format!("{}.${name}", self.name);
        let message = jetstream::message::PublishMessage::build()
            .payload(payload)
            .expected_last_subject_sequence(expected);
        let acked = match self.jetstream.send_publish(subject.clone(), message).await {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match acked {
            Ok(ack) => Ok(Some(ack.sequence)),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Ok(None),
            Err(e) => Err(StreamError::Publish(format!(
                "cannot write {subject} into the JetStream stream {:?}: {e}",
                self.name
            ))),
        }
    }

    /// Whether the stream still holds the message at `seq` (it was not purged).
    pub async fn holds(&self, seq: u64) -> Result<bool, StreamError> {
        match self.stream.get_raw_message(seq).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(false),
            Err(e) => Err(StreamError::Read(format!(
                "cannot read message {seq} of the JetStream stream {:?}: {e}",
                self.name
            ))),
        }
    }

    /// The first message on `subject`, if there is one: for the records written once, by the first writer
    /// (an expected sequence lets only it store), the one that counts — anything published on the subject
    /// later is junk and changes nothing.
    async fn first_on(&self, subject: &str) -> Result<Option<StreamMessage>, StreamError> {
        match self
            .stream
            .get_first_raw_message_by_subject(subject, 1)
            .await
        {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(StreamError::Read(format!(
                "cannot read {subject} from the JetStream stream {:?}: {e}",
                self.name
            ))),
        }
    }

    /// The last message on `subject`, if there is one.
    async fn last_on(&self, subject: &str) -> Result<Option<StreamMessage>, StreamError> {
        match self.stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(StreamError::Read(format!(
                "cannot read {subject} from the JetStream stream {:?}: {e}",
                self.name
            ))),
        }
    }

    /// Publishes a message that only the first writer may store (its expected sequence says so), then
    /// returns the first message stored on `subject`: this one, or the one that won the race.
    async fn write_first(
        &self,
        subject: &str,
        message: jetstream::message::PublishMessage,
    ) -> Result<StreamMessage, StreamError> {
        let acked = match self
            .jetstream
            .send_publish(subject.to_string(), message)
            .await
        {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match acked {
            Ok(_) => {}
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {}
            Err(e) => {
                return Err(StreamError::Setup(format!(
                    "cannot write {subject} into the JetStream stream {:?}: {e}",
                    self.name
                )))
            }
        }
        self.first_on(subject).await?.ok_or_else(|| {
            StreamError::Setup(format!(
                "{subject} vanished from the JetStream stream {:?} right after it was written",
                self.name
            ))
        })
    }

    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The subject a namespace's mutations are published on.
    pub fn subject(&self, namespace: &str) -> String {
        format!("{}.{namespace}", self.name)
    }

    /// Publishes `mutation` (its seq is ignored: the stream assigns it) with message id `id`, and waits for
    /// the stream's acknowledgement.
    pub async fn publish(&self, mutation: &Mutation, id: &str) -> Result<Published, StreamError> {
        let mut payload = Vec::new();
        codec::encode(&mutation.clone().with_seq(0), &mut payload);
        let failed = |e: &dyn std::fmt::Display| {
            StreamError::Publish(format!(
                "publishing to the JetStream stream {:?} failed: {e}; the write may or may not be stored, \
                 and retrying it is safe",
                self.name
            ))
        };
        let message = jetstream::message::PublishMessage::build()
            .payload(Bytes::from(payload))
            .message_id(id);
        let ack = self
            .jetstream
            .send_publish(self.subject(mutation.namespace()), message)
            .await
            .map_err(|e| failed(&e))?
            .await
            .map_err(|e| failed(&e))?;
        // The acknowledgement lost after the stream stored the mutation: the caller cannot tell this from a
        // publish that never arrived, which is why the message id makes its retry a duplicate.
        fail::fail_point!("stream-publish-ack", |_| Err(failed(
            &"injected by fault point stream-publish-ack (stored, acknowledgement lost)"
        )));
        Ok(Published {
            seq: ack.sequence,
            duplicate: ack.duplicate,
        })
    }

    /// Publishes a lease barrier for incarnation `nonce` of `replica`; the seq the stream stored it at. Only a
    /// stream leader with a quorum acknowledges it, so every message acknowledged before it was sent is below
    /// that seq — a read of the stream's end that an isolated leader cannot answer stale.
    pub async fn publish_barrier(&self, replica: &str, nonce: u64) -> Result<u64, StreamError> {
        let mut payload = nonce.to_le_bytes().to_vec();
        payload.extend_from_slice(replica.as_bytes());
        self.publish_record(BARRIER, payload).await
    }

    /// Publishes a membership record; the seq it was stored at.
    pub async fn publish_member(&self, record: &MemberRecord) -> Result<u64, StreamError> {
        self.publish_record(MEMBER, encode_member(Some(record), ("", 0)))
            .await
    }

    async fn publish_record(&self, record: &str, payload: Vec<u8>) -> Result<u64, StreamError> {
        let subject = format!("{}.{record}", self.name);
        let failed = |e: &dyn std::fmt::Display| {
            StreamError::Publish(format!(
                "cannot publish {subject} to the JetStream stream {:?}: {e}",
                self.name
            ))
        };
        let message = jetstream::message::PublishMessage::build().payload(Bytes::from(payload));
        let ack = self
            .jetstream
            .send_publish(subject.clone(), message)
            .await
            .map_err(|e| failed(&e))?
            .await
            .map_err(|e| failed(&e))?;
        Ok(ack.sequence)
    }

    /// The membership as of stream seq `seq` (a snapshot's), read completely: this process publishes a hello
    /// on the membership subject, then reads that subject from its start until its own hello comes back. The
    /// hello was acknowledged by a quorum, so every record stored before it has been read — a stale server
    /// cannot serve a shorter history without withholding the hello too (the read then times out and is
    /// tried again).
    pub async fn membership_through(
        &self,
        seq: u64,
        replica: &str,
        nonce: u64,
    ) -> Result<Membership, StreamError> {
        let subject = format!("{}.{MEMBER}", self.name);
        let hello = self
            .publish_record(MEMBER, encode_member(None, (replica, nonce)))
            .await?;
        let mut members = Membership::default();
        self.read_subject_before(&subject, hello, |at, payload| match parse_member(payload) {
            Ok(Some(record)) if at <= seq => drop(members.apply(at, &record)),
            Ok(_) => {}
            Err(why) => {
                tracing::error!(seq = at, %subject, %why, "a membership record is junk; passed over")
            }
        })
        .await?;
        Ok(members)
    }

    /// The core-NATS subject replicas report their applied seqs on: outside the stream (reports are
    /// liveness, not history, and must not take stream sequences).
    fn reports_subject(&self) -> String {
        format!("_existence.{}.applied", self.name)
    }

    /// Tells every replica watching [`applied_reports`](Self::applied_reports) that `replica` has applied
    /// the stream up to `seq`. Flushed before it returns (the client would otherwise hold it in its write
    /// buffer while idle): a report only helps if it leaves now. Not acknowledged: a report lost in a
    /// reconnect is followed by the next one.
    pub async fn report_applied(
        &self,
        replica: &str,
        nonce: u64,
        seq: u64,
    ) -> Result<(), StreamError> {
        let mut payload = REPORT_MAGIC.to_vec();
        payload.extend_from_slice(&seq.to_le_bytes());
        payload.extend_from_slice(&nonce.to_le_bytes());
        payload.extend_from_slice(replica.as_bytes());
        let client = self.jetstream.client();
        let failed = |e: &dyn std::fmt::Display| {
            StreamError::Publish(format!(
                "reporting the applied seq of replica {replica:?} to NATS failed: {e}"
            ))
        };
        client
            .publish(self.reports_subject(), Bytes::from(payload))
            .await
            .map_err(|e| failed(&e))?;
        client.flush().await.map_err(|e| failed(&e))
    }

    /// Every replica's applied-seq reports from now on, as they arrive (this replica's own included). The
    /// subscription is live once this returns: a report sent after that is seen.
    pub async fn applied_reports(
        &self,
    ) -> Result<impl Stream<Item = AppliedReport> + Send + 'static, StreamError> {
        let client = self.jetstream.client();
        let reports = client
            .subscribe(self.reports_subject())
            .await
            .map_err(|e| {
                StreamError::Read(format!(
                    "cannot watch the replicas' applied seqs on NATS: {e}"
                ))
            })?;
        // The server has the subscription once it has answered a request sent after it on the same
        // connection (it reads a connection's commands in order; a flush only empties the client's buffer).
        self.last_seq().await?;
        Ok(reports.filter_map(|message| std::future::ready(parse_report(&message.payload))))
    }

    /// The stream's last sequence now: every mutation up to it is stored.
    pub async fn last_seq(&self) -> Result<u64, StreamError> {
        let info = self.stream.get_info().await.map_err(|e| {
            StreamError::Read(format!(
                "cannot read the state of the JetStream stream {:?}: {e}",
                self.name
            ))
        })?;
        Ok(info.state.last_sequence)
    }

    /// Every message stored after `after_seq`, in stream order, each mutation with its stream sequence as
    /// seq; it waits for new ones at the end. An ordered consumer: the server keeps no state for it, and the
    /// client recreates it from the last sequence seen if it misses a message, so nothing is skipped or
    /// repeated.
    pub async fn follow(
        &self,
        after_seq: u64,
    ) -> Result<impl Stream<Item = Result<Streamed, StreamError>> + Send + 'static, StreamError>
    {
        let failed = |e: &dyn std::fmt::Display| {
            StreamError::Read(format!(
                "cannot read the JetStream stream {:?} after seq {after_seq}: {e}",
                self.name
            ))
        };
        let consumer = self
            .stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: after_seq + 1,
                },
                ..Default::default()
            })
            .await
            .map_err(|e| failed(&e))?;
        let messages = consumer.messages().await.map_err(|e| failed(&e))?;
        let name = self.name.clone();
        let control = format!("{}.$", self.name);
        Ok(messages.map(move |message| {
            fail::fail_point!("stream-consumer", |_| Err(StreamError::Read(format!(
                "the consumer of the JetStream stream {name:?} failed: injected by fault point stream-consumer"
            ))));
            decode(&name, &control, message)
        }))
    }

    /// The JetStream context, for the object store of snapshots.
    pub(super) fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    /// Removes the lease barriers below `seq` (they carry no state; a retained snapshot is past them).
    pub async fn purge_barriers_below(&self, seq: u64) -> Result<u64, StreamError> {
        self.purge_subject_below(&format!("{}.{BARRIER}", self.name), seq)
            .await
    }

    /// Removes `namespace`'s mutations below `seq` from the stream (a retained snapshot covers them). The
    /// stream's own records (identity, sizing, membership) stay.
    pub async fn purge_below(&self, namespace: &str, seq: u64) -> Result<u64, StreamError> {
        self.purge_subject_below(&self.subject(namespace), seq)
            .await
    }

    async fn purge_subject_below(&self, subject: &str, seq: u64) -> Result<u64, StreamError> {
        if seq <= 1 {
            // Nothing is below seq 1 — and the server reads a purge "below" 0 or 1 as no bound at all, and
            // would remove every message on the subject.
            return Ok(0);
        }
        let purged = self
            .stream
            .purge()
            .filter(subject)
            .sequence(seq)
            .await
            .map_err(|e| {
                StreamError::Publish(format!(
                    "cannot purge {subject} below seq {seq} from the JetStream stream {:?}: {e}",
                    self.name
                ))
            })?;
        Ok(purged.purged)
    }

    /// Whether the client is connected to a NATS server now (it reconnects by itself when not).
    pub fn connected(&self) -> bool {
        self.jetstream.client().connection_state() == async_nats::connection::State::Connected
    }
}

/// A message read from the stream: a mutation at its stream sequence, or one of the stream's own records
/// (subjects under `control`).
fn decode(
    name: &str,
    control: &str,
    message: Result<jetstream::Message, impl std::fmt::Display>,
) -> Result<Streamed, StreamError> {
    let message = message.map_err(|e| {
        StreamError::Read(format!("reading the JetStream stream {name:?} failed: {e}"))
    })?;
    let seq = message
        .info()
        .map_err(|e| StreamError::Read(format!("a message of stream {name:?} has no info: {e}")))?
        .stream_sequence;
    let id = message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
        .map(|id| id.as_str().to_string());
    let subject = message.subject.as_str();
    let passed_over = |member: Option<MemberRecord>, junk: Option<String>| Streamed {
        seq,
        mutation: None,
        member,
        junk,
        id: id.clone(),
    };
    if let Some(record) = subject.strip_prefix(control) {
        return Ok(match record {
            _ if record == &MEMBER[1..] => match parse_member(&message.payload) {
                Ok(Some(member)) => passed_over(Some(member), None),
                Ok(None) => passed_over(None, None),
                Err(why) => passed_over(None, Some(format!("subject {subject}: {why}"))),
            },
            _ => passed_over(None, None),
        });
    }
    match codec::decode_shared(&message.payload) {
        Ok(mutation) if format!("{name}.{}", mutation.namespace()) == subject => Ok(Streamed {
            seq,
            mutation: Some(mutation.with_seq(seq)),
            member: None,
            junk: None,
            id,
        }),
        Ok(mutation) => Ok(passed_over(
            None,
            Some(format!(
                "subject {subject}: a mutation of namespace {:?}, which belongs on {name}.{}",
                mutation.namespace(),
                mutation.namespace()
            )),
        )),
        Err(malformed) => Ok(passed_over(
            None,
            Some(format!(
                "subject {subject}: not a mutation: {}",
                malformed.0
            )),
        )),
    }
}

/// A report's payload, or `None` for one this build does not read (another version's, or junk).
fn parse_report(payload: &[u8]) -> Option<AppliedReport> {
    let rest = payload.strip_prefix(REPORT_MAGIC.as_slice())?;
    let seq = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
    let nonce = u64::from_le_bytes(rest.get(8..16)?.try_into().ok()?);
    let replica = std::str::from_utf8(rest.get(16..)?).ok()?.to_string();
    Some(AppliedReport {
        replica,
        nonce,
        seq,
    })
}

/// Membership record kinds.
const JOIN: u8 = 1;
const LEAVE: u8 = 2;
const REMOVE: u8 = 3;
/// A starting replica's hello: no change to membership (see [`MutationStream::membership_through`]).
const HELLO: u8 = 4;

/// Encodes a membership record (`None`: a hello from `id`, `nonce`).
fn encode_member(record: Option<&MemberRecord>, hello: (&str, u64)) -> Vec<u8> {
    let (kind, id, nonce, origin) = match record {
        Some(MemberRecord::Join { id, nonce, origin }) => {
            (JOIN, id.as_str(), *nonce, origin.as_str())
        }
        Some(MemberRecord::Leave { id, nonce }) => (LEAVE, id.as_str(), *nonce, ""),
        Some(MemberRecord::Remove { id }) => (REMOVE, id.as_str(), 0, ""),
        None => (HELLO, hello.0, hello.1, ""),
    };
    let mut payload = MEMBER_MAGIC.to_vec();
    payload.push(kind);
    payload.extend_from_slice(&nonce.to_le_bytes());
    let id_len = u16::try_from(id.len()).unwrap_or(u16::MAX);
    payload.extend_from_slice(&id_len.to_le_bytes());
    payload.extend_from_slice(&id.as_bytes()[..usize::from(id_len)]);
    payload.extend_from_slice(origin.as_bytes());
    payload
}

/// A membership record (`Ok(None)`: a hello), or why the payload is not one.
fn parse_member(payload: &[u8]) -> Result<Option<MemberRecord>, String> {
    let malformed = || {
        format!(
            "a membership record of {} bytes that does not parse",
            payload.len()
        )
    };
    let rest = payload
        .strip_prefix(MEMBER_MAGIC.as_slice())
        .ok_or_else(malformed)?;
    let (&kind, rest) = rest.split_first().ok_or_else(malformed)?;
    let nonce = u64::from_le_bytes(
        rest.get(..8)
            .ok_or_else(malformed)?
            .try_into()
            .map_err(|_| malformed())?,
    );
    let id_len = usize::from(u16::from_le_bytes(
        rest.get(8..10)
            .ok_or_else(malformed)?
            .try_into()
            .map_err(|_| malformed())?,
    ));
    let id = rest.get(10..10 + id_len).ok_or_else(malformed)?;
    let id = std::str::from_utf8(id)
        .map_err(|_| malformed())?
        .to_string();
    let origin = String::from_utf8_lossy(&rest[10 + id_len..]).into_owned();
    match kind {
        JOIN => Ok(Some(MemberRecord::Join { id, nonce, origin })),
        LEAVE => Ok(Some(MemberRecord::Leave { id, nonce })),
        REMOVE => Ok(Some(MemberRecord::Remove { id })),
        HELLO => Ok(None),
        _ => Err(format!("a membership record of unknown kind {kind}")),
    }
}

/// Stream names are single subject tokens in NATS's API.
fn validate_stream_name(name: &str) -> Result<(), StreamError> {
    let bad = name.is_empty()
        || name
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\'));
    if bad {
        return Err(StreamError::Config(format!(
            "{name:?} cannot name a JetStream stream: use letters, digits, '-' and '_' (no spaces, '.', '*', \
             '>', '/' or '\\')"
        )));
    }
    Ok(())
}

/// The first connection, with the options' credentials; later reconnects are the client's own.
async fn connect(options: &StreamOptions) -> Result<async_nats::Client, StreamError> {
    let servers = options
        .servers
        .iter()
        .map(|url| {
            url.parse::<ServerAddr>()
                .map_err(|e| StreamError::Config(format!("{url:?} is not a NATS server URL: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        return Err(StreamError::Config("no NATS server given".to_string()));
    }
    let mut connect = async_nats::ConnectOptions::new()
        .name("existence-gate")
        .connection_timeout(CONNECT_TIMEOUT);
    if let Some(token) = &options.token {
        connect = connect.token(token.clone());
    }
    if let Some(path) = &options.credentials {
        connect = connect.credentials_file(path).await.map_err(|e| {
            StreamError::Config(format!(
                "cannot read the NATS credentials {}: {e}",
                path.display()
            ))
        })?;
    }
    if let Some(ca) = &options.tls_ca {
        connect = connect.add_root_certificates(ca.clone()).require_tls(true);
    }
    connect.connect(servers).await.map_err(|e| {
        StreamError::Unreachable(format!(
            "cannot reach NATS at {}: {e}; check --nats and that the servers run",
            options.servers.join(",")
        ))
    })
}
