//! The stream's own records every replica must agree on, each on a subject no namespace can have: the
//! deployment's identity (hash seed) at seq 1 and each namespace's sizing, written with an expected last
//! sequence so exactly one of several starting replicas wins; junk on their subjects is read past.

use std::time::Duration;

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::{self, consumer};
use bytes::Bytes;
use futures_util::StreamExt;

use super::framing::{Framing, Record};
use super::{MutationStream, StreamError};
use crate::core::filter::FilterSpec;
use crate::core::hashing::KeyHasher;
use crate::storage::codec::KeyLengths;

/// The subject token of the deployment identity.
const IDENTITY: &str = "$identity";
/// The start of an identity message, then a u32 format and the 32-byte seed (and from format 4 the CRC-32C
/// of all before it).
const IDENTITY_MAGIC: &[u8; 8] = b"EXGIDNT1";
/// The stream format this build writes into a new stream's identity: 4, the stream's own records sealed
/// ([`Framing::Sealed`]), and an `Add` whose keys all have one length giving it once, other keys a varint
/// length each ([`KeyLengths::Uniform`], from format 3). A stream set up in an older format is still read
/// and written in it — format 3 with legacy records, format 2 also with varint lengths only, format 1 with
/// u32 lengths — which every older replica following it reads; a build older than a stream's format
/// refuses that stream at start (it would otherwise take each new mutation, or record, for junk and pass
/// it over: its keys would answer `ABSENT`).
const IDENTITY_FORMAT: u32 = 4;
/// How long reading one of the stream's record subjects from its start may take (the membership at start,
/// a record's history past junk).
const SUBJECT_READ: Duration = Duration::from_secs(10);
/// Junk messages read past, at most, before the first valid sizing of a namespace: beyond, the start is
/// refused with the remedy (purge the subject) rather than read for ever.
const MAX_JUNK_BEFORE_SIZING: usize = 1_000;
/// How long a write waits before trying again when the stream's leader cannot check its expected sequence
/// yet (it was just elected).
const NOT_READY_PAUSE: Duration = Duration::from_millis(50);
/// How every sizing record starts ([`FilterSpec::describe`]).
const SIZING_START: &str = "expected_keys = ";

impl MutationStream {
    /// Reads the identity — the hash seed, and how the stream's mutations frame their keys — publishing
    /// one (at seq 1) into an empty stream.
    pub(super) async fn identity(&self) -> Result<([u8; 32], KeyLengths, Framing), StreamError> {
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
        payload.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
        let first = jetstream::message::PublishMessage::build()
            .payload(Bytes::from(payload))
            .expected_last_sequence(0);
        let found = self.write_first(&subject, first).await?;
        self.parse_identity(&found)
    }

    fn parse_identity(
        &self,
        message: &StreamMessage,
    ) -> Result<([u8; 32], KeyLengths, Framing), StreamError> {
        let payload = &message.payload;
        let format = payload
            .get(8..12)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
        let lengths = match format {
            Some(1) => KeyLengths::Fixed,
            Some(2) => KeyLengths::Varint,
            _ => KeyLengths::Uniform,
        };
        let framing = Framing::of_format(format.unwrap_or(0));
        // From format 4 a checksum follows the seed.
        let sealed_len = match framing {
            Framing::Legacy => 44,
            Framing::Sealed => 48,
        };
        let intact = payload.len() == sealed_len
            && (framing == Framing::Legacy
                || crc32c::crc32c(&payload[..44]).to_le_bytes() == payload[44..48]);
        match (payload.get(..8), format) {
            (Some(magic), Some(1..=IDENTITY_FORMAT)) if magic == IDENTITY_MAGIC && intact => Ok((
                payload[12..44].try_into().expect("32 bytes"),
                lengths,
                framing,
            )),
            (Some(magic), Some(format)) if magic == IDENTITY_MAGIC => Err(StreamError::Setup(format!(
                "the JetStream stream {:?} was set up by a newer existence-gate (identity format {format}; \
                 this build reads 1 to {IDENTITY_FORMAT}): run that version or a newer one",
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
    /// first to serve it. Refused with both sizings when they differ. The first sizing record on the
    /// subject counts; junk before it (anything that is not a sizing) is passed over, and junk alone is
    /// written after, so junk published before a namespace's first replica starts stops no start.
    pub async fn agree_sizing(
        &self,
        namespace: &str,
        spec: &FilterSpec,
    ) -> Result<(), StreamError> {
        let subject = format!("{}.{}.{namespace}", self.name, Record::Sizing.token());
        let mine = spec.describe();
        let recorded = loop {
            let (found, last_junk) = self.first_sizing(&subject).await?;
            if let Some(found) = found {
                break found;
            }
            let first = jetstream::message::PublishMessage::build()
                .payload(Bytes::from(
                    self.framing.frame(Record::Sizing, mine.as_bytes()),
                ))
                .expected_last_subject_sequence(last_junk);
            // Written, or another replica's sizing came first: read again either way.
            self.write_once(&subject, first).await?;
        };
        let theirs = String::from_utf8_lossy(&recorded);
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

    /// Checks that this replica runs the deployment's read lease and clock drift, recording `read_lease` and
    /// `drift_ppm` if it is the first replica of this build on the stream. Refused with both values when
    /// they differ.
    ///
    /// A writer waits out other replicas' leases by its own: with the fallback `read_lease × (1 + ρ)` of a
    /// replica at 100 ms, another at 5 s could answer `ABSENT` for 4.9 s after an `Add` was acknowledged
    /// (659 such answers in 8 of 10 rounds, the writer's replica silenced). So the first replica writes its
    /// timing into the stream (`STREAM.$timing`), and every later one must match it. Junk on the subject is passed
    /// over ([`record`](Self::record)); two replicas recording different timings at once race on an expected
    /// last sequence, and the loser reads the winner's and is refused.
    pub async fn agree_timing(
        &self,
        read_lease: Duration,
        drift_ppm: u64,
    ) -> Result<(), StreamError> {
        let mine = describe_timing(read_lease, drift_ppm);
        loop {
            let (at, recorded) = self
                .record(Record::Timing, |_, p| parse_timing(p).is_some())
                .await?;
            let Some(recorded) = recorded else {
                let written = self
                    .replace_record(Record::Timing, mine.as_bytes(), at)
                    .await?;
                if written.is_some() {
                    return Ok(());
                }
                continue; // another replica recorded first: compare with its timing
            };
            let (lease_ns, drift) = parse_timing(&recorded).expect("validated by record");
            if (lease_ns, drift) == (read_lease.as_nanos() as u64, drift_ppm) {
                return Ok(());
            }
            return Err(StreamError::Setup(format!(
                "this replica runs --read-lease {:?} --max-clock-drift {drift_ppm}ppm, but the JetStream \
                 stream {:?} records --read-lease {:?} --max-clock-drift {drift}ppm (its first replica's): a \
                 writer waits out the others' leases by its own, so every replica of a stream must run the \
                 same. Start this one with the stream's values (to change them, move every replica to a new \
                 stream with --nats-stream)",
                read_lease,
                self.name,
                Duration::from_nanos(lease_ns),
            )));
        }
    }

    /// The stream's own `record` (subject `NAME.$record`), replaced over time: the stream seq of the last
    /// message on the subject (0: none; what a replacement must expect), and the body of the newest one
    /// that is such a record and that `valid` accepts — a message that is not one (junk published there) is
    /// passed over in favour of the one before.
    pub(crate) async fn record(
        &self,
        record: Record,
        valid: impl Fn(u64, &[u8]) -> bool,
    ) -> Result<(u64, Option<Bytes>), StreamError> {
        let subject = format!("{}.{}", self.name, record.token());
        let framing = self.framing;
        let body = |seq: u64, payload: &[u8]| match framing.body(record, payload) {
            Ok(body) if valid(seq, body) => Some(Bytes::copy_from_slice(body)),
            Ok(_) => {
                tracing::error!(seq, %subject, "junk where a record belongs (its body does not parse); passed over");
                None
            }
            Err(why) => {
                tracing::error!(seq, %subject, %why, "junk where a record belongs; passed over");
                None
            }
        };
        let Some(last) = self.last_on(&subject).await? else {
            return Ok((0, None));
        };
        if let Some(found) = body(last.sequence, &last.payload) {
            return Ok((last.sequence, Some(found)));
        }
        let mut newest_valid = None;
        self.read_subject_before(&subject, (last.sequence, &last.payload), |seq, payload| {
            if let Some(found) = body(seq, payload) {
                newest_valid = Some(found);
            }
        })
        .await?;
        Ok((last.sequence, newest_valid))
    }

    /// Calls `each(seq, payload)` for every message on `subject` below stream seq `end`, in order, where
    /// `end` and its payload are known (a message on `subject` that a quorum stored): reading until that
    /// very message comes back proves none before it was missed. The copy read may be any server's, so it
    /// must be that message — another one at `end` (a copy that differs from the quorum's), or none, means
    /// the records before may not be the quorum's either: an error, read again. Bounded by
    /// [`SUBJECT_READ`].
    pub(super) async fn read_subject_before(
        &self,
        subject: &str,
        (end, expected): (u64, &[u8]),
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
                if at == end && as_held(message.payload.clone()) == expected {
                    return Ok(());
                }
                if at >= end {
                    return Err(failed(&format!(
                        "the copy read holds another message at seq {at} than the one stored there, or none \
                         (a copy that differs from the quorum's)"
                    )));
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

    /// Removes the messages of `record` below stream seq `seq` (the replaced ones).
    pub(crate) async fn purge_record_below(
        &self,
        record: Record,
        seq: u64,
    ) -> Result<u64, StreamError> {
        self.purge_subject_below(&format!("{}.{}", self.name, record.token()), seq)
            .await
    }

    /// Replaces `record` with one holding `body` if the last message on its subject is still the one at
    /// stream seq `expected` (0: none yet): the seq it was stored at, or `None` if another replica replaced
    /// it first (read it again and retry).
    pub(crate) async fn replace_record(
        &self,
        record: Record,
        body: &[u8],
        expected: u64,
    ) -> Result<Option<u64>, StreamError> {
        let subject = format!("{}.{}", self.name, record.token());
        let message = jetstream::message::PublishMessage::build()
            .payload(Bytes::from(self.framing.frame(record, body)))
            .expected_last_subject_sequence(expected);
        let acked = match self.jetstream.send_publish(subject.clone(), message).await {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match acked {
            Ok(ack) => Ok(Some(ack.sequence)),
            Err(e) if expectation_failed(&e).await => Ok(None),
            Err(e) => Err(StreamError::Publish(format!(
                "cannot write {subject} into the JetStream stream {:?}: {e}",
                self.name
            ))),
        }
    }

    /// The body of the first sizing record on `subject`, if there is one, and the seq of the last junk
    /// message read before it (0: none), which a sizing written after it must expect.
    async fn first_sizing(&self, subject: &str) -> Result<(Option<Bytes>, u64), StreamError> {
        let mut from = 1;
        let mut last_junk = 0;
        for _ in 0..=MAX_JUNK_BEFORE_SIZING {
            let Some(found) = self.first_on_from(subject, from).await? else {
                return Ok((None, last_junk));
            };
            match self.framing.body(Record::Sizing, &found.payload) {
                Ok(body) if body.starts_with(SIZING_START.as_bytes()) => {
                    return Ok((Some(Bytes::copy_from_slice(body)), last_junk));
                }
                Ok(_) => {
                    tracing::error!(seq = found.sequence, %subject, "junk where a sizing belongs (not a sizing); passed over")
                }
                Err(why) => {
                    tracing::error!(seq = found.sequence, %subject, %why, "junk where a sizing belongs; passed over")
                }
            }
            last_junk = found.sequence;
            from = found.sequence + 1;
        }
        Err(StreamError::Setup(format!(
            "{subject} in the JetStream stream {:?} holds more than {MAX_JUNK_BEFORE_SIZING} messages that \
             are not sizing records before any that is: purge the subject (`nats stream purge {} --subject \
             {subject}`) and start again; only replicas should have publish rights on the stream's subjects",
            self.name, self.name
        )))
    }

    /// The first message on `subject`, if there is one: for the records written once, by the first writer
    /// (an expected sequence lets only it store), the one that counts — anything published on the subject
    /// later is junk and changes nothing.
    async fn first_on(&self, subject: &str) -> Result<Option<StreamMessage>, StreamError> {
        self.first_on_from(subject, 1).await
    }

    /// The first message on `subject` at or after stream seq `from`, if there is one.
    async fn first_on_from(
        &self,
        subject: &str,
        from: u64,
    ) -> Result<Option<StreamMessage>, StreamError> {
        match self
            .stream
            .get_first_raw_message_by_subject(subject, from)
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
        self.write_once(subject, message).await?;
        self.first_on(subject).await?.ok_or_else(|| {
            StreamError::Setup(format!(
                "{subject} vanished from the JetStream stream {:?} right after it was written",
                self.name
            ))
        })
    }

    /// Publishes a message whose expected sequence lets only one writer store it; losing that race is no
    /// error (read what won).
    async fn write_once(
        &self,
        subject: &str,
        message: jetstream::message::PublishMessage,
    ) -> Result<(), StreamError> {
        let acked = match self
            .jetstream
            .send_publish(subject.to_string(), message)
            .await
        {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match acked {
            Ok(_) => Ok(()),
            Err(e) if expectation_failed(&e).await => Ok(()),
            Err(e) => Err(StreamError::Setup(format!(
                "cannot write {subject} into the JetStream stream {:?}: {e}",
                self.name
            ))),
        }
    }
}

/// Whether a publish with an expected last sequence was refused for it: another write came first (read
/// again: the caller's loop does), or — on a cluster whose stream leader just changed — the leader cannot
/// check the expectation yet, which is waited out a moment before the caller reads and tries again. Besides
/// the error async-nats names (code 10071), nats-server 2.15 answers a clustered stream's lost race with
/// code 10164, which the client passes on as any other error: taken for a failure, it stopped a replica
/// starting beside others ("wrong last sequence (code 400, error code 10164)" writing a sizing).
async fn expectation_failed(error: &PublishError) -> bool {
    if error.kind() == PublishErrorKind::WrongLastSequence {
        return true;
    }
    let code = std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<jetstream::Error>())
        .map(jetstream::Error::error_code);
    match code {
        Some(ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT) => true,
        Some(ErrorCode::STREAM_EXPECTED_LAST_SEQ_PER_SUBJECT_NOT_READY) => {
            tokio::time::sleep(NOT_READY_PAUSE).await;
            true
        }
        _ => false,
    }
}

/// The payload of a message read at the end of a subject's read, as this copy holds it — or, under fault
/// point `stream-subject-other`, another one, as a copy that differs from the quorum's would hold there.
fn as_held(payload: Bytes) -> Bytes {
    #[cfg(feature = "fault-points")]
    if fail::eval("stream-subject-other", |_| ()).is_some() {
        return Bytes::from_static(
            b"another message, injected by fault point stream-subject-other",
        );
    }
    payload
}

/// A timing record's body, as a person reads it too (a legacy record is `existence-gate timing v1:` and
/// this).
fn describe_timing(read_lease: Duration, drift_ppm: u64) -> String {
    format!(
        " read_lease_ns={} max_clock_drift_ppm={drift_ppm}",
        read_lease.as_nanos()
    )
}

/// The read lease (ns) and drift (ppm) a timing record's body names; `None` for anything else (junk).
fn parse_timing(body: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(body).ok()?;
    let mut fields = text.split_whitespace();
    let lease = fields
        .next()?
        .strip_prefix("read_lease_ns=")?
        .parse()
        .ok()?;
    let drift = fields
        .next()?
        .strip_prefix("max_clock_drift_ppm=")?
        .parse()
        .ok()?;
    fields.next().is_none().then_some((lease, drift))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A publish refused by the server with JetStream error code `code`, as the client reports it.
    fn refused(code: u64) -> PublishError {
        let error: jetstream::Error = serde_json::from_str(&format!(
            r#"{{"code": 400, "err_code": {code}, "description": "wrong last sequence"}}"#
        ))
        .unwrap();
        PublishError::with_source(PublishErrorKind::Other, error)
    }

    #[tokio::test]
    async fn a_lost_race_is_one_whichever_code_the_server_gives_it() {
        assert!(expectation_failed(&PublishError::new(PublishErrorKind::WrongLastSequence)).await);
        assert!(
            expectation_failed(&refused(10164)).await,
            "nats-server 2.15, clustered"
        );
        assert!(
            expectation_failed(&refused(10163)).await,
            "the leader not ready to check"
        );
        assert!(
            !expectation_failed(&refused(10077)).await,
            "another refusal is an error"
        );
        assert!(!expectation_failed(&PublishError::new(PublishErrorKind::TimedOut)).await);
    }

    #[test]
    fn a_timing_record_reads_back_and_junk_does_not() {
        let written = describe_timing(Duration::from_millis(100), 10_000);
        assert_eq!(
            parse_timing(written.as_bytes()),
            Some((100_000_000, 10_000))
        );
        for junk in [
            &b"junk"[..],
            b"",
            b" read_lease_ns=x max_clock_drift_ppm=1",
            b" read_lease_ns=1 max_clock_drift_ppm=1 more",
        ] {
            assert_eq!(parse_timing(junk), None);
        }
    }
}
