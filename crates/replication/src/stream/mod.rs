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
//! every replica alike ([`Streamed::junk`]), never applied and never a reason to stop. The records are
//! sealed (a magic, a version and a checksum: [`framing`]), so junk on a record's subject is not taken for
//! the record either.
//!
//! Limits: stream names are NATS's (no spaces, `.`, `*` or `>`); a namespace name may contain `.`, which
//! only adds subject tokens (`existence.a.b`), still under `existence.>`. A message holds at most the
//! server's `max_payload` (1 MiB by default): an `Add` larger than that is refused by the publish.
//!
//! The files: this one opens the stream (options, errors, what a read yields); [`mutations`] publishes,
//! follows and purges the log; [`records`] keeps the identity and sizings; [`membership`] the membership
//! records and barriers; [`framing`] how those records are told from junk; [`reports`] the applied-seq
//! reports; [`concurrent_setup`] opens what a replica
//! started at the same moment may be creating.

mod concurrent_setup;
pub mod framing;
mod membership;
mod mutations;
mod records;
mod reports;

pub(crate) use concurrent_setup::open_or_create;
pub use framing::{Framing, Record};
pub use reports::{AppliedReport, Heard};

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{self, stream};
use async_nats::ServerAddr;

use super::protocol::copy::MessageDigest;
use super::protocol::MemberRecord;
use crate::core::log::Mutation;
use crate::storage::codec::KeyLengths;

/// How long a first connection may take before the replica gives up with an error (it does not wait
/// forever for a NATS that may never come: the operator sees why it did not start).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests that open the stream, tried before giving up when they time out.
const SETUP_ATTEMPTS: u32 = 5;
/// How long a retried publish with the same `Nats-Msg-Id` is recognised as a duplicate.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

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
    /// Use a nats-server older than [`SYNCED_NATS`], which cannot sync its store before acknowledging
    /// (tests of such servers only: see [`check_server_version`]).
    pub allow_unsynced: bool,
}

/// The first nats-server release with a JetStream fsync setting (`sync_interval`, 2.10.0): an older server
/// acknowledges writes it has not written to disk, and never syncs them on its own schedule either.
pub const SYNCED_NATS: (u64, u64) = (2, 10);

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
            allow_unsynced: false,
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
    /// If it is a lease barrier: the nonce of the process that sent it, and when (on that process's clock).
    pub barrier: Option<(u64, u64)>,
    /// What tells this message apart from another stored at `seq` on another copy of the stream
    /// ([`copy`](crate::protocol::copy)).
    pub digest: MessageDigest,
    /// Unix ms when the stream's leader stored it (its clock, not the writer's): every copy holds the same
    /// stamp, so every replica agrees a mutation's times with it alike ([`Mutation::agreed`]).
    pub stored_at_ms: u64,
}

/// The mutation stream, open: publish to it, read it from any seq.
#[derive(Debug, Clone)]
pub struct MutationStream {
    jetstream: jetstream::Context,
    stream: stream::Stream,
    name: String,
    seed: [u8; 32],
    /// How this stream's mutations frame their keys (its identity's format says).
    key_lengths: KeyLengths,
    /// How this stream's own records are framed (its identity's format says).
    framing: Framing,
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
    /// (seen with two replicas started together on a loaded 2-core machine), and a server of a cluster can
    /// answer a request about a stream created a moment before through another with "stream not found"
    /// (nats-server 2.15, three replicas started together on an R3 cluster): opening is then tried again,
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
                        || e.contains("stream not found")
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
        let stream = open_or_create(
            || async { jetstream.get_stream(&options.stream).await.ok() },
            || jetstream.create_stream(config),
        )
        .await
        .map_err(|e| {
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
            key_lengths: KeyLengths::Varint,
            framing: Framing::Legacy,
        };
        (opened.seed, opened.key_lengths, opened.framing) = opened.identity().await?;
        Ok(opened)
    }

    /// The deployment's hash seed, as the stream keeps it.
    pub fn seed(&self) -> [u8; 32] {
        self.seed
    }

    /// The seq of the first message at or after `seq` held by the server that answers (the one that believes
    /// it leads the stream, possibly stale: see [`protocol::gap`](crate::protocol::gap) for what the answer
    /// proves); `None` if it holds none.
    pub async fn next_held(&self, seq: u64) -> Result<Option<u64>, StreamError> {
        let every_subject = format!("{}.>", self.name);
        match self
            .stream
            .get_first_raw_message_by_subject(every_subject, seq)
            .await
        {
            Ok(message) => Ok(Some(message.sequence)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(StreamError::Read(format!(
                "cannot read the first message at or after seq {seq} of the JetStream stream {:?}: {e}",
                self.name
            ))),
        }
    }

    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The subject a namespace's mutations are published on.
    pub fn subject(&self, namespace: &str) -> String {
        format!("{}.{namespace}", self.name)
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

    /// The JetStream context, for the object store of snapshots.
    pub(super) fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    /// Whether the client is connected to a NATS server now (it reconnects by itself when not).
    pub fn connected(&self) -> bool {
        self.jetstream.client().connection_state() == async_nats::connection::State::Connected
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
    let client = connect.connect(servers).await.map_err(|e| {
        StreamError::Unreachable(format!(
            "cannot reach NATS at {}: {e}; check --nats and that the servers run",
            options.servers.join(",")
        ))
    })?;
    let info = client.server_info();
    check_server_version(&info.version, &info.server_name, options.allow_unsynced)?;
    Ok(client)
}

/// Refuses a nats-server older than [`SYNCED_NATS`] unless `allow_unsynced`.
///
/// The stream is the deployment's only log: an `Add` is acknowledged once the stream's quorum stored it,
/// and a key whose `Add` the stream loses is answered `ABSENT` by every replica. A server that has not
/// synced what it stored loses it in a power loss of its host, and a power loss of every server's host
/// (one rack, one zone) loses it for good — seen with NATS 2.12's default two-minute sync. Servers older
/// than 2.10 cannot be told to sync before acknowledging at all (Debian 12's 2.9.10 never calls fsync on
/// its own: none in 3,000 Adds under strace), so they are refused, naming the way out.
pub fn check_server_version(
    version: &str,
    server: &str,
    allow_unsynced: bool,
) -> Result<(), StreamError> {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|part| part.parse::<u64>().ok());
    let (major, minor) = (parts.next().flatten(), parts.next().flatten());
    let synced =
        matches!((major, minor), (Some(major), Some(minor)) if (major, minor) >= SYNCED_NATS);
    if synced || allow_unsynced {
        return Ok(());
    }
    Err(StreamError::Config(format!(
        "nats-server {server:?} runs version {version:?}, older than {}.{}: it cannot sync JetStream's store \
         before acknowledging a write, so a power loss of the NATS hosts can lose acknowledged Adds, which \
         every replica then answers ABSENT for. Run nats-server 2.10 or later with `jetstream {{ \
         sync_interval: always }}` (docs/deployment.md); --nats-allow-unsynced starts anyway, for tests of \
         older servers only",
        SYNCED_NATS.0, SYNCED_NATS.1
    )))
}

#[cfg(test)]
mod version_tests {
    use super::check_server_version;

    #[test]
    fn servers_older_than_2_10_are_refused_unless_allowed() {
        for synced in ["2.10.0", "2.15.1", "v2.11.3", "3.0.0-beta.1"] {
            assert!(
                check_server_version(synced, "n0", false).is_ok(),
                "{synced}"
            );
        }
        for unsynced in ["2.9.10", "2.2.6", "", "junk"] {
            let refused = check_server_version(unsynced, "n0", false)
                .unwrap_err()
                .to_string();
            assert!(refused.contains("sync_interval: always"), "{refused}");
            assert!(refused.contains("--nats-allow-unsynced"), "{refused}");
            assert!(
                !refused.contains("  "),
                "one space between words: {refused:?}"
            );
            assert!(check_server_version(unsynced, "n0", true).is_ok());
        }
    }
}
