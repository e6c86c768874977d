//! Reports on a core NATS subject outside the stream (lossy, unordered across replicas; the protocol counts
//! on neither): each replica says how far it has applied and which writes it read at which seqs, and about
//! once a second what its history digests to ([`history`](crate::protocol::history)).

use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use super::{MutationStream, StreamError};
use crate::protocol::history::HistoryReport;
use crate::protocol::{WriteId, WriteRead};

/// The start of an applied-seq report: then the seq and the nonce (u64 LE each), the number of writes read
/// (u32 LE) and each (seq, writer nonce, counter: u64 LE each), then the replica id.
const REPORT_MAGIC: &[u8; 8] = b"EXGREPT3";
/// The previous release's reports: the seq and the nonce, then the replica id, and no writes read. Read
/// still, as how far that replica applied (what purges wait for); they count for no acknowledgement, so
/// during a rolling upgrade each `Add` waits the fallback for the older replicas.
const REPORT_MAGIC_WITHOUT_READS: &[u8; 8] = b"EXGREPT2";
/// Bytes per write read in a report.
const READ_BYTES: usize = 24;
/// The start of a history report: then the seq and the nonce (u64 LE each), 1 and the digest (u64 LE) or 0
/// and nothing for a history without one, then the replica id. An older build passes it over as a report
/// it does not read.
const HISTORY_MAGIC: &[u8; 8] = b"EXGHIST1";

/// A report from a replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// How far it applied, and the writes it read.
    Applied(AppliedReport),
    /// What its history digests to.
    History(HistoryReport),
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
    /// The writes it read in the batch just applied, each with its seq.
    pub reads: Vec<WriteRead>,
}

impl MutationStream {
    /// The core-NATS subject replicas report their applied seqs on: outside the stream (reports are
    /// liveness, not history, and must not take stream sequences).
    fn reports_subject(&self) -> String {
        format!("_existence.{}.applied", self.name)
    }

    /// The subject of reports meant for the process with nonce `to` alone (the writer of what was applied).
    fn reports_subject_to(&self, to: u64) -> String {
        format!("_existence.{}.applied.{to:016x}", self.name)
    }

    /// Tells the replicas watching [`reports`](Self::reports) that `replica` has applied
    /// the stream up to `seq`, having read `reads`: every one of them (`to` = `None`), or only the process
    /// with nonce `to`.
    /// Flushed before it returns (the client would otherwise hold it in its write buffer while idle): a
    /// report only helps if it leaves now. Not acknowledged: a report lost in a reconnect is followed by
    /// the next one.
    pub async fn report_applied(
        &self,
        replica: &str,
        nonce: u64,
        seq: u64,
        reads: &[WriteRead],
        to: Option<u64>,
    ) -> Result<(), StreamError> {
        let mut payload = Vec::with_capacity(32 + reads.len() * READ_BYTES + replica.len());
        payload.extend_from_slice(REPORT_MAGIC);
        payload.extend_from_slice(&seq.to_le_bytes());
        payload.extend_from_slice(&nonce.to_le_bytes());
        let count = u32::try_from(reads.len()).expect("a batch's reads fit a u32");
        payload.extend_from_slice(&count.to_le_bytes());
        for read in reads {
            payload.extend_from_slice(&read.seq.to_le_bytes());
            payload.extend_from_slice(&read.write.writer.to_le_bytes());
            payload.extend_from_slice(&read.write.counter.to_le_bytes());
        }
        payload.extend_from_slice(replica.as_bytes());
        let subject = match to {
            Some(to) => self.reports_subject_to(to),
            None => self.reports_subject(),
        };
        self.send_report(replica, subject, payload).await
    }

    /// Tells every replica what this one's history digests to ([`HistoryReport`]); flushed, not
    /// acknowledged, like [`report_applied`](Self::report_applied).
    pub async fn report_history(&self, report: &HistoryReport) -> Result<(), StreamError> {
        let mut payload = Vec::with_capacity(33 + report.replica.len());
        payload.extend_from_slice(HISTORY_MAGIC);
        payload.extend_from_slice(&report.seq.to_le_bytes());
        payload.extend_from_slice(&report.nonce.to_le_bytes());
        payload.push(u8::from(report.digest.is_some()));
        payload.extend_from_slice(&report.digest.unwrap_or(0).to_le_bytes());
        payload.extend_from_slice(report.replica.as_bytes());
        self.send_report(&report.replica, self.reports_subject(), payload)
            .await
    }

    async fn send_report(
        &self,
        replica: &str,
        subject: String,
        payload: Vec<u8>,
    ) -> Result<(), StreamError> {
        let client = self.jetstream.client();
        let failed = |e: &dyn std::fmt::Display| {
            StreamError::Publish(format!(
                "sending a report of replica {replica:?} to NATS failed: {e}"
            ))
        };
        client
            .publish(subject, Bytes::from(payload))
            .await
            .map_err(|e| failed(&e))?;
        client.flush().await.map_err(|e| failed(&e))
    }

    /// The reports meant for the process with nonce `me` from now on, as they arrive: those sent to every
    /// replica (this replica's own included) and those sent to it alone. The subscriptions are live once
    /// this returns: a report sent after that is seen.
    pub async fn reports(
        &self,
        me: u64,
    ) -> Result<impl Stream<Item = Heard> + Send + 'static, StreamError> {
        let client = self.jetstream.client();
        let watch = |subject: String| {
            let client = client.clone();
            async move {
                client.subscribe(subject).await.map_err(|e| {
                    StreamError::Read(format!("cannot watch the replicas' reports on NATS: {e}"))
                })
            }
        };
        let to_all = watch(self.reports_subject()).await?;
        let to_me = watch(self.reports_subject_to(me)).await?;
        // The server has the subscriptions once it has answered a request sent after them on the same
        // connection (it reads a connection's commands in order; a flush only empties the client's buffer).
        self.last_seq().await?;
        Ok(futures_util::stream::select(to_all, to_me)
            .filter_map(|message| std::future::ready(parse_report(&message.payload))))
    }
}

/// A report's payload, or `None` for one this build does not read (another version's, or junk).
fn parse_report(payload: &[u8]) -> Option<Heard> {
    if let Some(rest) = payload.strip_prefix(HISTORY_MAGIC.as_slice()) {
        return parse_history(rest).map(Heard::History);
    }
    parse_applied(payload).map(Heard::Applied)
}

/// A history report, after its magic.
fn parse_history(rest: &[u8]) -> Option<HistoryReport> {
    let u64_at = |at: usize| Some(u64::from_le_bytes(rest.get(at..at + 8)?.try_into().ok()?));
    let digest = match rest.get(16)? {
        0 => None,
        1 => Some(u64_at(17)?),
        _ => return None,
    };
    Some(HistoryReport {
        seq: u64_at(0)?,
        nonce: u64_at(8)?,
        digest,
        replica: std::str::from_utf8(rest.get(25..)?).ok()?.to_string(),
    })
}

/// An applied-seq report.
fn parse_applied(payload: &[u8]) -> Option<AppliedReport> {
    if let Some(rest) = payload.strip_prefix(REPORT_MAGIC_WITHOUT_READS.as_slice()) {
        return Some(AppliedReport {
            seq: u64::from_le_bytes(rest.get(..8)?.try_into().ok()?),
            nonce: u64::from_le_bytes(rest.get(8..16)?.try_into().ok()?),
            replica: std::str::from_utf8(rest.get(16..)?).ok()?.to_string(),
            reads: Vec::new(),
        });
    }
    let rest = payload.strip_prefix(REPORT_MAGIC.as_slice())?;
    let u64_at = |at: usize| Some(u64::from_le_bytes(rest.get(at..at + 8)?.try_into().ok()?));
    let (seq, nonce) = (u64_at(0)?, u64_at(8)?);
    let count = u32::from_le_bytes(rest.get(16..20)?.try_into().ok()?) as usize;
    let names_at = count.checked_mul(READ_BYTES)?.checked_add(20)?;
    let reads = (0..count)
        .map(|i| {
            let at = 20 + i * READ_BYTES;
            Some(WriteRead {
                seq: u64_at(at)?,
                write: WriteId {
                    writer: u64_at(at + 8)?,
                    counter: u64_at(at + 16)?,
                },
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let replica = std::str::from_utf8(rest.get(names_at..)?).ok()?.to_string();
    Some(AppliedReport {
        replica,
        nonce,
        seq,
        reads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_back_with_its_writes_and_the_previous_releases_without() {
        let mut current = REPORT_MAGIC.to_vec();
        for word in [9u64, 2] {
            current.extend_from_slice(&word.to_le_bytes());
        }
        current.extend_from_slice(&1u32.to_le_bytes());
        for word in [8u64, 1, 5] {
            current.extend_from_slice(&word.to_le_bytes());
        }
        current.extend_from_slice(b"gate:50051");
        let read = WriteRead {
            seq: 8,
            write: WriteId {
                writer: 1,
                counter: 5,
            },
        };
        assert_eq!(
            parse_applied(&current),
            Some(AppliedReport {
                replica: "gate:50051".into(),
                nonce: 2,
                seq: 9,
                reads: vec![read],
            })
        );
        assert_eq!(parse_applied(&current[..40]), None, "a write cut short");
        let mut previous = REPORT_MAGIC_WITHOUT_READS.to_vec();
        for word in [9u64, 2] {
            previous.extend_from_slice(&word.to_le_bytes());
        }
        previous.extend_from_slice(b"old");
        assert_eq!(
            parse_applied(&previous).map(|r| (r.seq, r.nonce, r.reads.len())),
            Some((9, 2, 0))
        );
    }

    #[test]
    fn a_history_report_reads_back_with_or_without_its_digest_and_junk_does_not() {
        for digest in [Some(0xfeed_beef), None] {
            let report = HistoryReport {
                replica: "gate:50051".into(),
                nonce: 3,
                seq: 12,
                digest,
            };
            let mut payload = HISTORY_MAGIC.to_vec();
            for word in [12u64, 3] {
                payload.extend_from_slice(&word.to_le_bytes());
            }
            payload.push(u8::from(digest.is_some()));
            payload.extend_from_slice(&digest.unwrap_or(0).to_le_bytes());
            payload.extend_from_slice(b"gate:50051");
            assert_eq!(parse_report(&payload), Some(Heard::History(report)));
            payload[24] = 2;
            assert_eq!(parse_report(&payload), None, "neither with nor without");
            assert_eq!(parse_report(&payload[..20]), None, "cut short");
        }
    }
}
