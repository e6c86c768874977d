//! The log itself: mutations published under a message id and acknowledged with their seq, followed in
//! stream order from any seq by an ordered consumer, and purged below a shared snapshot.

use async_nats::jetstream::{self, consumer};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use super::framing::{Framing, Record};
use super::membership::{parse_barrier, parse_member};
use super::{MutationStream, Published, StreamError, Streamed};
use crate::core::log::Mutation;
use crate::protocol::copy::MessageDigest;
use crate::protocol::MemberRecord;
use crate::storage::codec;

impl MutationStream {
    /// Publishes `mutation` (its seq is ignored: the stream assigns it) with message id `id`, and waits for
    /// the stream's acknowledgement.
    pub async fn publish(&self, mutation: &Mutation, id: &str) -> Result<Published, StreamError> {
        let mut payload = Vec::new();
        codec::encode_with_seq(mutation, 0, self.key_lengths, &mut payload);
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

    /// Every message stored after `after_seq`, in stream order, each mutation with its stream sequence as
    /// seq; it waits for new ones at the end. An ordered consumer: the server keeps no state for it, and the
    /// client recreates it from the last sequence seen if it misses a message, so nothing is skipped or
    /// repeated — but the new consumer may read another server's copy of the stream, so the first message
    /// it delivers ends the stream with a read error instead: the caller follows again from the message
    /// read last, and checks that copy against it ([`copy`](crate::protocol::copy)).
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
        let framing = self.framing;
        let mut consumer = None;
        Ok(messages.map(move |message| {
            fail::fail_point!("stream-consumer", |_| Err(StreamError::Read(format!(
                "the consumer of the JetStream stream {name:?} failed: injected by fault point stream-consumer"
            ))));
            decode(&name, (&control, framing), &mut consumer, message)
        }))
    }

    /// Removes the lease barriers below `seq` (they carry no state; a retained snapshot is past them).
    pub async fn purge_barriers_below(&self, seq: u64) -> Result<u64, StreamError> {
        self.purge_subject_below(&format!("{}.{}", self.name, Record::Barrier.token()), seq)
            .await
    }

    /// Removes `namespace`'s mutations below `seq` from the stream (a retained snapshot covers them). The
    /// stream's own records (identity, sizing, membership) stay.
    pub async fn purge_below(&self, namespace: &str, seq: u64) -> Result<u64, StreamError> {
        self.purge_subject_below(&self.subject(namespace), seq)
            .await
    }

    pub(super) async fn purge_subject_below(
        &self,
        subject: &str,
        seq: u64,
    ) -> Result<u64, StreamError> {
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
}

/// A message read from the stream: a mutation at its stream sequence, or one of the stream's own records
/// (subjects under `control`, framed as `framing` says). `consumer` is the name of the consumer that
/// delivered the messages before; a message from another one (the client created it again) is a read error
/// (see [`MutationStream::follow`]).
fn decode(
    name: &str,
    (control, framing): (&str, Framing),
    consumer: &mut Option<String>,
    message: Result<jetstream::Message, impl std::fmt::Display>,
) -> Result<Streamed, StreamError> {
    let message = message.map_err(|e| {
        StreamError::Read(format!("reading the JetStream stream {name:?} failed: {e}"))
    })?;
    let info = message
        .info()
        .map_err(|e| StreamError::Read(format!("a message of stream {name:?} has no info: {e}")))?;
    let seq = info.stream_sequence;
    let stored_at_ms =
        u64::try_from(info.published.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
    match consumer {
        Some(before) if before != info.consumer => {
            return Err(StreamError::Read(format!(
                "the client created the consumer of the JetStream stream {name:?} again ({before} became {}, \
                 delivering seq {seq}); it may read another server's copy: following again, from the \
                 message read last, to check that copy",
                info.consumer
            )));
        }
        Some(_) => {}
        None => *consumer = Some(info.consumer.to_string()),
    }
    let id = message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
        .map(|id| id.as_str().to_string());
    let subject = message.subject.as_str();
    let digest = digest(subject, id.as_deref(), &message.payload);
    let passed_over = |member: Option<MemberRecord>, junk: Option<String>| Streamed {
        seq,
        mutation: None,
        member,
        junk,
        id: id.clone(),
        barrier: None,
        digest,
        stored_at_ms,
    };
    if let Some(token) = subject.strip_prefix(control) {
        return Ok(
            match control_record(framing, seq, token, &message.payload) {
                Ok((member, barrier)) => Streamed {
                    barrier,
                    ..passed_over(member, None)
                },
                Err(why) => passed_over(None, Some(format!("subject {subject}: {why}"))),
            },
        );
    }
    match codec::decode_shared(&message.payload) {
        Ok(mutation) if format!("{name}.{}", mutation.namespace()) == subject => {
            // As if this copy of the stream held another message here: one that changes nothing.
            fail::fail_point!("stream-read-other", |_| {
                Ok(Streamed {
                digest: digest ^ 1,
                ..passed_over(
                    None,
                    Some(format!(
                        "subject {subject}: another message, injected by fault point stream-read-other"
                    ))
                )
            })
            });
            Ok(Streamed {
                seq,
                mutation: Some(mutation.with_seq(seq)),
                member: None,
                junk: None,
                id,
                barrier: None,
                digest,
                stored_at_ms,
            })
        }
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

/// A membership change, and a lease barrier's nonce and send time, that a record holds (either, or neither).
type RecordMeaning = (Option<MemberRecord>, Option<(u64, u64)>);

/// What the stream's own record at `seq` on subject `STREAM.$token` means to the applier — a membership
/// change, a lease barrier (nonce, send time), or nothing — or why it is junk, which every replica counts
/// and logs alike.
fn control_record(
    framing: Framing,
    seq: u64,
    token: &str,
    payload: &[u8],
) -> Result<RecordMeaning, String> {
    let kind = token.split('.').next().unwrap_or(token);
    let record = match kind {
        // The identity is written once, into the empty stream: what comes later on its subject is junk.
        "identity" if seq == 1 => return Ok((None, None)),
        "identity" => return Err("a second identity (the stream's is its first message)".into()),
        "member" => return parse_member(framing, payload).map(|member| (member, None)),
        "barrier" => return parse_barrier(framing, payload).map(|barrier| (None, Some(barrier))),
        "sizing" if token.len() > kind.len() => Record::Sizing,
        "timing" => Record::Timing,
        "snapshots" => Record::SnapshotIndex,
        _ => return Err("no record of the stream's is kept on this subject".into()),
    };
    framing.body(record, payload).map(|_| (None, None))
}

/// A stored message's [`MessageDigest`]: its subject, message id and payload, hashed (xxh3: about a
/// microsecond for a 1,000-key `Add`).
fn digest(subject: &str, id: Option<&str>, payload: &[u8]) -> MessageDigest {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for part in [subject.as_bytes(), id.unwrap_or("").as_bytes()] {
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    hasher.update(payload);
    hasher.digest()
}
