//! Fences: for each delete the feed sends, a gate seq that precedes it, so that the gate refuses
//! (`SUPERSEDED`) a tombstone which an `Add` made after the delete has made stale.
//!
//! **The race it closes.** The feed lags; a row is deleted (committed); the application adds the key
//! again (`Add`, acknowledged at seq A) and inserts the row again; then the feed sends the old delete. Sent
//! without a fence (`observed_seq` 0: no race check) the tombstone is stored, and the key answers `ABSENT`
//! while its row exists — until the feed reaches the insert, or for good if that insert is lost.
//!
//! **How.** The fencer reads each followed namespace's seq `g` from the gate (`CurrentSeq`), and only
//! then writes a fence into the WAL: `pg_logical_emit_message(false, 'existence-gate/fence/SLOT',
//! 'NAMESPACE=g…')`. A non-transactional message is decoded at its own WAL position, so the slot's stream
//! delivers it before every transaction that commits after it. Each delete is sent with the seq of the
//! newest fence the stream delivered before its transaction. **Why that is safe**: an `Add` made after the
//! delete committed was applied after that commit, hence after the fence was written, hence after `g`
//! was read — so its seq is above `g`, and the gate refuses the tombstone. Any older fence is safe too:
//! it only refuses more tombstones, which costs a read of the source, never a false `ABSENT`.
//!
//! **Limits.** Only fences delivered in the current replication session count: one seen before a
//! reconnect may lie past the slot's confirmed position, after changes the new session replays. A delete
//! with no fence before it in its session (a session starts by asking for one, so: those committed just
//! before it, replayed) is not sent, and is counted in `existence_feed_unfenced_deletes_total`. An `Add`
//! made *before* the delete committed — a writer racing the deleter on the same row — is ordered before
//! it: that tombstone stands until the feed sends the writer's insert.
//!
//! **Cost.** One `CurrentSeq` per followed namespace and one WAL record (~100 bytes) per fence, every
//! [`FENCE_EVERY`] while the gate's seqs move and whenever a session asks; none while they stand still
//! (the last fence is then as good as a new one).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio_postgres::Client;

use crate::client::connection::GateClient;
use crate::client::failure;
use crate::proto::CurrentSeqRequest;

/// How often the fencer looks at the gate's seqs. A delete carries a fence at most this much older than
/// its commit (plus the gate's reply); a key added within that span before it was deleted keeps no
/// tombstone (`SUPERSEDED`).
pub const FENCE_EVERY: Duration = Duration::from_millis(100);

/// The message prefix of the fences of `slot`: each feed reads only its own.
pub fn prefix(slot: &str) -> String {
    format!("existence-gate/fence/{slot}")
}

/// Writes fences into the WAL (see the module docs).
pub struct Fencer {
    gate: GateClient,
    client: Arc<Client>,
    prefix: String,
    namespaces: Vec<String>,
    /// Rung by a session that needs a fence in its stream now (it started, or a delete had none).
    wanted: Arc<Notify>,
}

impl Fencer {
    /// A fencer of `namespaces` for the feed of `slot`; `wanted` asks it for a fence now.
    pub fn new(
        gate: GateClient,
        client: Arc<Client>,
        slot: &str,
        namespaces: impl IntoIterator<Item = String>,
        wanted: Arc<Notify>,
    ) -> Self {
        let mut namespaces: Vec<String> = namespaces.into_iter().collect();
        namespaces.sort();
        namespaces.dedup();
        Self {
            gate,
            client,
            prefix: prefix(slot),
            namespaces,
            wanted,
        }
    }

    /// Reads the gate's seqs, then writes them as a fence; returns them. The one place the order of the
    /// two steps is kept: the seqs must be read before the fence enters the WAL.
    pub async fn fence(&self) -> Result<Vec<u64>, String> {
        let seqs = self.seqs().await?;
        self.write(&seqs).await?;
        Ok(seqs)
    }

    /// Writes `seqs`, read from the gate just before, as a fence.
    async fn write(&self, seqs: &[u64]) -> Result<(), String> {
        let content = self
            .namespaces
            .iter()
            .zip(seqs)
            .map(|(namespace, seq)| format!("{namespace}={seq}\n"))
            .collect::<String>();
        self.client
            .execute(
                "SELECT pg_logical_emit_message(false, $1, $2::text)",
                &[&self.prefix, &content],
            )
            .await
            .map_err(|e| {
                format!(
                    "cannot write a fence into the WAL (pg_logical_emit_message): {}; the feed's user \
                     needs EXECUTE on it (GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, \
                     text, text) TO ...)",
                    super::setup::said(&e)
                )
            })?;
        metrics::counter!("existence_feed_fences_total").increment(1);
        for (namespace, seq) in self.namespaces.iter().zip(seqs) {
            metrics::gauge!("existence_feed_fenced_seq", "namespace" => namespace.clone())
                .set(*seq as f64);
        }
        Ok(())
    }

    /// Each namespace's latest seq on the gate.
    async fn seqs(&self) -> Result<Vec<u64>, String> {
        let mut seqs = Vec::with_capacity(self.namespaces.len());
        for namespace in &self.namespaces {
            seqs.push(current_seq(&self.gate, namespace).await?);
        }
        Ok(seqs)
    }

    /// Fences every [`FENCE_EVERY`] while the seqs move, and at once when asked; a failure is logged once
    /// until a fence succeeds again (deletes meanwhile carry the last fence, or wait for the next one).
    pub async fn run(self, mut last: Vec<u64>) {
        let mut failing = false;
        loop {
            let asked = tokio::select! {
                () = self.wanted.notified() => true,
                () = tokio::time::sleep(FENCE_EVERY) => false,
            };
            let written = match self.seqs().await {
                Ok(seqs) if !asked && seqs == last => continue,
                Ok(seqs) => self.write(&seqs).await.map(|()| seqs),
                Err(reason) => Err(reason),
            };
            match written {
                Ok(seqs) => {
                    if failing {
                        tracing::info!("fences are written again");
                    }
                    (last, failing) = (seqs, false);
                }
                Err(reason) if !failing => {
                    tracing::warn!(%reason, "cannot fence deletes; they wait for the next fence");
                    failing = true;
                }
                Err(_) => {}
            }
        }
    }
}

/// The fences a replication session has delivered so far: each namespace's seq from the newest one.
#[derive(Debug)]
pub struct Fences {
    prefix: String,
    seqs: HashMap<String, u64>,
}

impl Fences {
    /// No fence yet, for the feed of `slot`.
    pub fn new(slot: &str) -> Self {
        Self {
            prefix: prefix(slot),
            seqs: HashMap::new(),
        }
    }

    /// Takes in a logical message of the stream: a fence of this feed replaces the seqs; others (another
    /// feed's fences, an application's messages) are passed over. A malformed fence of this feed's prefix
    /// is an error: someone else writes with it.
    pub fn observe(&mut self, prefix: &str, content: &Bytes) -> Result<(), String> {
        if prefix != self.prefix {
            return Ok(());
        }
        let malformed = || {
            format!(
                "a logical message with this feed's prefix {prefix:?} that is not a fence: {:?}; only \
                 the feed of this slot may write with it",
                String::from_utf8_lossy(content)
            )
        };
        let text = std::str::from_utf8(content).map_err(|_| malformed())?;
        let mut seqs = HashMap::new();
        for line in text.lines() {
            let (namespace, seq) = line.rsplit_once('=').ok_or_else(malformed)?;
            let seq = seq.parse().map_err(|_| malformed())?;
            seqs.insert(namespace.to_string(), seq);
        }
        self.seqs = seqs;
        Ok(())
    }

    /// The seq a delete in `namespace` delivered now carries as its `observed_seq`, if a fence came first.
    pub fn seq(&self, namespace: &str) -> Option<u64> {
        self.seqs.get(namespace).copied()
    }
}

/// `namespace`'s latest seq on the gate (either role the feed may hold can read it).
pub async fn current_seq(gate: &GateClient, namespace: &str) -> Result<u64, String> {
    let request = CurrentSeqRequest {
        namespace: namespace.to_string(),
    };
    let reply = gate
        .clone()
        .current_seq(request)
        .await
        .map_err(|status| failure::refused("CurrentSeq", &status))?;
    Ok(reply.into_inner().seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_feeds_fences_count_and_the_newest_wins() {
        let mut fences = Fences::new("slot_a");
        assert_eq!(fences.seq("users"), None);
        let fence = |text: &str| Bytes::copy_from_slice(text.as_bytes());
        fences
            .observe("existence-gate/fence/slot_a", &fence("users=7\nod=d=9\n"))
            .unwrap();
        assert_eq!(
            (fences.seq("users"), fences.seq("od=d")),
            (Some(7), Some(9))
        );
        fences
            .observe("existence-gate/fence/slot_b", &fence("users=100\n"))
            .unwrap();
        fences.observe("app", &fence("anything")).unwrap();
        assert_eq!(fences.seq("users"), Some(7));
        fences
            .observe("existence-gate/fence/slot_a", &fence("users=8\n"))
            .unwrap();
        assert_eq!((fences.seq("users"), fences.seq("od=d")), (Some(8), None));
        let error = fences
            .observe("existence-gate/fence/slot_a", &fence("users:8"))
            .unwrap_err();
        assert!(error.contains("not a fence"), "{error}");
    }
}
