//! Membership and barriers on the stream: joins, leaves, removals and the hello a starting replica reads
//! the membership up to (never purged), and the lease barriers only a leader with quorum acknowledges.

use async_nats::jetstream;
use bytes::Bytes;

use super::framing::{Framing, Record};
use super::{MutationStream, StreamError};
use crate::protocol::{MemberRecord, Membership};

/// A barrier's nonce and send time, from its payload as [`MutationStream::publish_barrier`] writes it, or
/// why the payload is not a barrier.
pub(super) fn parse_barrier(framing: Framing, payload: &[u8]) -> Result<(u64, u64), String> {
    let body = framing.body(Record::Barrier, payload)?;
    let field = |at: usize| {
        body.get(at..at + 8)
            .map(|bytes| u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
            .ok_or_else(|| format!("a lease barrier of {} bytes, too short", payload.len()))
    };
    Ok((field(0)?, field(8)?))
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
        let mut body = nonce.to_le_bytes().to_vec();
        body.extend_from_slice(&sent_at.to_le_bytes());
        body.extend_from_slice(replica.as_bytes());
        self.publish_record(Record::Barrier, &body)
            .await
            .map(|(seq, _)| seq)
    }

    /// Publishes a membership record; the seq it was stored at.
    pub async fn publish_member(&self, record: &MemberRecord) -> Result<u64, StreamError> {
        let body = encode_member(Some(record), ("", 0));
        self.publish_record(Record::Member, &body)
            .await
            .map(|(seq, _)| seq)
    }

    /// Publishes `record` holding `body`: the seq it was stored at, and the payload as framed.
    async fn publish_record(
        &self,
        record: Record,
        body: &[u8],
    ) -> Result<(u64, Bytes), StreamError> {
        let subject = format!("{}.{}", self.name, record.token());
        let failed = |e: &dyn std::fmt::Display| {
            StreamError::Publish(format!(
                "cannot publish {subject} to the JetStream stream {:?}: {e}",
                self.name
            ))
        };
        let payload = Bytes::from(self.framing.frame(record, body));
        let message = jetstream::message::PublishMessage::build().payload(payload.clone());
        let ack = self
            .jetstream
            .send_publish(subject.clone(), message)
            .await
            .map_err(|e| failed(&e))?
            .await
            .map_err(|e| failed(&e))?;
        Ok((ack.sequence, payload))
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
        let subject = format!("{}.{}", self.name, Record::Member.token());
        let hello = encode_member(None, (replica, nonce));
        let (at, hello) = self.publish_record(Record::Member, &hello).await?;
        let mut members = Membership::default();
        let framing = self.framing;
        self.read_subject_before(&subject, (at, &hello), |at, payload| match parse_member(framing, payload) {
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

/// The body of a membership record (`None`: a hello from `id`, `nonce`): a kind byte, the nonce (u64 LE), the
/// id's length (u16 LE), the id, and for a join the origin.
fn encode_member(record: Option<&MemberRecord>, hello: (&str, u64)) -> Vec<u8> {
    let (kind, id, nonce, origin) = match record {
        Some(MemberRecord::Join { id, nonce, origin }) => {
            (JOIN, id.as_str(), *nonce, origin.as_str())
        }
        Some(MemberRecord::Leave { id, nonce }) => (LEAVE, id.as_str(), *nonce, ""),
        Some(MemberRecord::Remove { id }) => (REMOVE, id.as_str(), 0, ""),
        None => (HELLO, hello.0, hello.1, ""),
    };
    let mut payload = vec![kind];
    payload.extend_from_slice(&nonce.to_le_bytes());
    let id_len = u16::try_from(id.len()).unwrap_or(u16::MAX);
    payload.extend_from_slice(&id_len.to_le_bytes());
    payload.extend_from_slice(&id.as_bytes()[..usize::from(id_len)]);
    payload.extend_from_slice(origin.as_bytes());
    payload
}

/// A membership record (`Ok(None)`: a hello), or why the payload is not one.
pub(super) fn parse_member(
    framing: Framing,
    payload: &[u8],
) -> Result<Option<MemberRecord>, String> {
    let malformed = || {
        format!(
            "a membership record of {} bytes that does not parse",
            payload.len()
        )
    };
    let rest = framing.body(Record::Member, payload)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership_records_and_barriers_read_back_in_either_framing_and_junk_does_not() {
        let join = MemberRecord::Join {
            id: "r1".into(),
            nonce: 7,
            origin: "host:1".into(),
        };
        for framing in [Framing::Legacy, Framing::Sealed] {
            let record = framing.frame(Record::Member, &encode_member(Some(&join), ("", 0)));
            assert_eq!(parse_member(framing, &record), Ok(Some(join.clone())));
            let hello = framing.frame(Record::Member, &encode_member(None, ("r2", 9)));
            assert_eq!(parse_member(framing, &hello), Ok(None));
            let barrier = framing.frame(Record::Barrier, &[[3; 8], [4; 8]].concat());
            assert_eq!(
                parse_barrier(framing, &barrier),
                Ok((u64::from_le_bytes([3; 8]), u64::from_le_bytes([4; 8])))
            );
        }
        // Sixteen bytes or more made a barrier before barriers were sealed; a sealed stream's are not fooled.
        assert!(parse_barrier(Framing::Sealed, &[0xA5; 32]).is_err());
        assert!(parse_member(Framing::Sealed, &[0xA5; 32]).is_err());
        let legacy = Framing::Legacy.frame(Record::Member, &encode_member(Some(&join), ("", 0)));
        assert!(parse_member(Framing::Sealed, &legacy).is_err());
    }
}
