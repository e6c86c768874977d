//! Applied-seq reports: each replica says how far it has applied, and which writes it read at which seqs,
//! on a core NATS subject outside the stream (lossy, unordered across replicas; the protocol counts on
//! neither).

use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use super::{MutationStream, StreamError};
use crate::protocol::{WriteId, WriteRead};

/// The start of an applied-seq report: then the seq and the nonce (u64 LE each), the number of writes read
/// (u32 LE) and each (seq, writer nonce, counter: u64 LE each), then the replica id. A report of the
/// previous format (`EXGREPT2`, without the writes) is not read: its writer's `Add`s wait the fallback.
const REPORT_MAGIC: &[u8; 8] = b"EXGREPT3";
/// Bytes per write read in a report.
const READ_BYTES: usize = 24;

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

    /// Tells the replicas watching [`applied_reports`](Self::applied_reports) that `replica` has applied
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
        let client = self.jetstream.client();
        let failed = |e: &dyn std::fmt::Display| {
            StreamError::Publish(format!(
                "reporting the applied seq of replica {replica:?} to NATS failed: {e}"
            ))
        };
        let subject = match to {
            Some(to) => self.reports_subject_to(to),
            None => self.reports_subject(),
        };
        client
            .publish(subject, Bytes::from(payload))
            .await
            .map_err(|e| failed(&e))?;
        client.flush().await.map_err(|e| failed(&e))
    }

    /// The applied-seq reports meant for the process with nonce `me` from now on, as they arrive: those
    /// sent to every replica (this replica's own included) and those sent to it alone. The subscriptions
    /// are live once this returns: a report sent after that is seen.
    pub async fn applied_reports(
        &self,
        me: u64,
    ) -> Result<impl Stream<Item = AppliedReport> + Send + 'static, StreamError> {
        let client = self.jetstream.client();
        let watch = |subject: String| {
            let client = client.clone();
            async move {
                client.subscribe(subject).await.map_err(|e| {
                    StreamError::Read(format!(
                        "cannot watch the replicas' applied seqs on NATS: {e}"
                    ))
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
fn parse_report(payload: &[u8]) -> Option<AppliedReport> {
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
