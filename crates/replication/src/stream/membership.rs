//! Membership and barriers on the stream: joins, leaves, removals and the hello a starting replica reads
//! the membership up to (never purged), and the lease barriers only a leader with quorum acknowledges.

use async_nats::jetstream;
use bytes::Bytes;

use super::{MutationStream, StreamError, BARRIER, MEMBER};
use crate::protocol::{MemberRecord, Membership};

/// The start of a membership record: then a kind byte, the nonce (u64 LE), the id's length (u16 LE), the
/// id, and for a join the origin.
const MEMBER_MAGIC: &[u8; 8] = b"EXGMEMB1";

/// A barrier's nonce and send time, from its payload as [`MutationStream::publish_barrier`] writes it
/// (`None` if it is too short to hold them).
pub(super) fn parse_barrier(payload: &[u8]) -> Option<(u64, u64)> {
    let nonce = payload.get(..8)?.try_into().ok()?;
    let sent_at = payload.get(8..16)?.try_into().ok()?;
    Some((u64::from_le_bytes(nonce), u64::from_le_bytes(sent_at)))
}

impl MutationStream {
    /// Publishes a lease barrier for incarnation `nonce` of `replica`, sent at `sent_at` on its clock; the seq
    /// the stream stored it at. Only a stream leader with a quorum acknowledges it, so every message
    /// acknowledged before it was sent is below that seq — a read of the stream's end that an isolated leader
    /// cannot answer stale. The payload (nonce, send time, replica id) names it, so that the replica can check
    /// that what it reads at that seq is this barrier ([`protocol`](crate::protocol)).
    pub async fn publish_barrier(
        &self,
        replica: &str,
        nonce: u64,
        sent_at: u64,
    ) -> Result<u64, StreamError> {
        let mut payload = nonce.to_le_bytes().to_vec();
        payload.extend_from_slice(&sent_at.to_le_bytes());
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
    /// on the membership subject, then reads that subject from its start until its own hello comes back at
    /// the seq it was stored at. The hello was acknowledged by a quorum, so every record stored before it has
    /// been read — a stale server cannot serve a shorter history without withholding the hello too (the read
    /// then times out and is tried again), and a copy that differs from the quorum's holds something else at
    /// the hello's seq (an error; tried again).
    pub async fn membership_through(
        &self,
        seq: u64,
        replica: &str,
        nonce: u64,
    ) -> Result<Membership, StreamError> {
        let subject = format!("{}.{MEMBER}", self.name);
        let hello = encode_member(None, (replica, nonce));
        let at = self.publish_record(MEMBER, hello.clone()).await?;
        let mut members = Membership::default();
        self.read_subject_before(&subject, (at, &hello), |at, payload| match parse_member(payload) {
            Ok(Some(record)) if at <= seq => drop(members.apply(at, &record)),
            Ok(_) => {}
            Err(why) => {
                tracing::error!(seq = at, %subject, %why, "a membership record is junk; passed over")
            }
        })
        .await?;
        Ok(members)
    }
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
pub(super) fn parse_member(payload: &[u8]) -> Result<Option<MemberRecord>, String> {
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
