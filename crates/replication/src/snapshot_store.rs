//! The replicas' shared snapshots: a JetStream object store bucket (`STREAM-snapshots`) of snapshot files,
//! each named by the stream seq it covers (`snapshot-00000000000000012345`). A new or wiped replica starts
//! from the newest one and applies the stream after it, instead of applying the stream from its start; the
//! stream's mutations below a retained snapshot can then be purged.
//!
//! The files are the local snapshot format ([`crate::storage::snapshot`]) unchanged: checksummed frames, the hash seed
//! in the header (checked against the stream's before anything is restored), each namespace's seq, sizing
//! fingerprint, filter bits, tombstones and memory of recent adds. A snapshot covering seq S holds every
//! mutation up to S, and nothing after.
//!
//! Which snapshots the bucket holds is kept in the stream, as the record `STREAM.$snapshots` (the covered
//! seqs, oldest first), not read by listing the bucket: a listing is an ordered consumer that waits for the
//! metadata it counted when it began, and another replica's upload or deletion meanwhile can leave it
//! waiting for ever. The record is replaced only if it is still the one read (an expected last subject
//! sequence), so replicas sharing at once each add their snapshot; objects are uploaded before the record
//! names them and deleted after it stops naming them.
//!
//! Each object's metadata carries the sharer's [history digest](crate::protocol::history) at the covered
//! seq (`history`, 16 hex digits), so a replica that loads it goes on with that chain; an object shared by
//! an earlier release has none.

use std::path::Path;

use bytes::Bytes;

use super::protocol::history::HistoryDigest;
use super::protocol::index::{covered_seqs, valid_index};
use super::stream::{open_or_create, MutationStream, Record, StreamError};
use async_nats::jetstream::object_store::{self, ObjectMetadata, ObjectStore};

/// The prefix of every snapshot object's name; the covered seq follows, zero-padded to sort.
const PREFIX: &str = "snapshot-";
/// The object metadata key of the history digest at the covered seq.
const HISTORY: &str = "history";

/// The snapshot bucket of one stream.
#[derive(Clone)]
pub struct SnapshotStore {
    store: ObjectStore,
    stream: MutationStream,
    bucket: String,
}

impl std::fmt::Debug for SnapshotStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotStore")
            .field("bucket", &self.bucket)
            .finish_non_exhaustive()
    }
}

impl SnapshotStore {
    /// The bucket of `stream`'s snapshots, created (file storage, `replicas` copies) if missing.
    pub async fn open(stream: &MutationStream, replicas: usize) -> Result<Self, StreamError> {
        let bucket = format!("{}-snapshots", stream.name());
        let jetstream = stream.jetstream();
        let store = open_or_create(
            || async { jetstream.get_object_store(&bucket).await.ok() },
            || {
                jetstream.create_object_store(object_store::Config {
                    bucket: bucket.clone(),
                    description: Some("existence-gate snapshots".to_string()),
                    num_replicas: replicas,
                    ..Default::default()
                })
            },
        )
        .await
        .map_err(|e| {
            StreamError::Setup(format!(
                "cannot open or create the JetStream object store {bucket:?} for snapshots: {e} (may this \
                 account create streams? a stream name of letters, digits, '-' and '_' makes a valid bucket \
                 name)"
            ))
        })?;
        Ok(Self {
            store,
            stream: stream.clone(),
            bucket,
        })
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The index record: the covered seqs, oldest first, and the record's stream seq (0: none yet).
    async fn index(&self) -> Result<(Vec<u64>, u64), StreamError> {
        let (at, payload) = self
            .stream
            .record(Record::SnapshotIndex, valid_index)
            .await?;
        Ok((payload.map_or_else(Vec::new, |p| covered_seqs(&p)), at))
    }

    /// The seqs covered by the snapshots the bucket holds, oldest first.
    pub async fn covered(&self) -> Result<Vec<u64>, StreamError> {
        Ok(self.index().await?.0)
    }

    /// Copies the snapshot covering `seq` into the file `to`; returns its size and the history digest it
    /// carries (`None`: none, or one that does not parse).
    pub async fn download(
        &self,
        seq: u64,
        to: &Path,
    ) -> Result<(u64, Option<HistoryDigest>), StreamError> {
        let name = object_name(seq);
        let failed = |e: &dyn std::fmt::Display| {
            StreamError::Read(format!(
                "cannot download {name} from {:?} to {}: {e}",
                self.bucket,
                to.display()
            ))
        };
        fail::fail_point!("object-store-get", |_| Err(failed(
            &"injected by fault point object-store-get"
        )));
        let mut object = self.store.get(&name).await.map_err(|e| failed(&e))?;
        let history = object
            .info
            .metadata
            .get(HISTORY)
            .and_then(|hex| HistoryDigest::from_str_radix(hex, 16).ok());
        let mut file = tokio::fs::File::create(to).await.map_err(|e| failed(&e))?;
        let bytes = tokio::io::copy(&mut object, &mut file)
            .await
            .map_err(|e| failed(&e))?;
        file.sync_all().await.map_err(|e| failed(&e))?;
        Ok((bytes, history))
    }

    /// Uploads the snapshot file `from`, covering `seq`, with the history digest there (if known), names it
    /// in the index with at most `keep - 1` older ones, and deletes the objects the index stopped naming.
    /// Returns the oldest seq still covered.
    pub async fn share(
        &self,
        seq: u64,
        from: &Path,
        history: Option<HistoryDigest>,
        keep: usize,
    ) -> Result<u64, StreamError> {
        let name = object_name(seq);
        fail::fail_point!("object-store-put", |_| Err(upload_failed(
            &name,
            &self.bucket,
            &"injected by fault point object-store-put"
        )));
        let mut file = tokio::fs::File::open(from)
            .await
            .map_err(|e| upload_failed(&name, &self.bucket, &e))?;
        let metadata = ObjectMetadata {
            name: name.clone(),
            metadata: history
                .map(|digest| (HISTORY.to_string(), format!("{digest:016x}")))
                .into_iter()
                .collect(),
            ..Default::default()
        };
        self.store
            .put(metadata, &mut file)
            .await
            .map_err(|e| upload_failed(&name, &self.bucket, &e))?;
        let (dropped, kept) = loop {
            let (before, at) = self.index().await?;
            let mut kept = before.clone();
            kept.push(seq);
            kept.sort_unstable();
            kept.dedup();
            let dropped: Vec<u64> = kept.drain(..kept.len().saturating_sub(keep)).collect();
            let payload: Vec<u8> = kept.iter().flat_map(|s| s.to_le_bytes()).collect();
            if let Some(written) = self
                .stream
                .replace_record(Record::SnapshotIndex, &payload, at)
                .await?
            {
                // The index's earlier versions are of no use: the subject keeps this one (and what follows).
                if let Err(error) = self
                    .stream
                    .purge_record_below(Record::SnapshotIndex, written)
                    .await
                {
                    tracing::debug!(%error, "the index's earlier versions were not purged");
                }
                break (dropped, kept);
            }
        };
        for old in dropped {
            // Another replica sharing at once may have deleted it already.
            if let Err(error) = self.store.delete(object_name(old)).await {
                tracing::debug!(%error, old, "an old snapshot was not deleted");
            }
        }
        Ok(kept[0])
    }
}

/// The index record as one server answered: it may be a stale server's (no read of a NATS stream is
/// linearizable), so an older version than the quorum's, naming older snapshots.
#[derive(Debug, Clone)]
pub struct IndexRead {
    /// The stream seq of the last message on the record's subject (0: none).
    at: u64,
    /// The newest valid payload at or before `at` (`None`: none).
    payload: Option<Bytes>,
}

impl IndexRead {
    /// Reads the index of `stream`'s snapshot bucket.
    pub async fn of(stream: &MutationStream) -> Result<Self, StreamError> {
        let (at, payload) = stream.record(Record::SnapshotIndex, valid_index).await?;
        Ok(Self { at, payload })
    }

    /// The oldest seq a snapshot named by this version covers (`None`: it names none). Every purge of the
    /// stream is at or below the oldest snapshot of the version current when it was made: that version is
    /// written before the purge. Versions only ever name newer oldest snapshots (see [`SnapshotStore::share`]).
    pub fn oldest(&self) -> Option<u64> {
        self.payload
            .as_deref()
            .and_then(|p| covered_seqs(p).first().copied())
    }

    /// Proves this version current: writes it again, expecting the subject's last message to be still the
    /// one read. The stream checks that expectation where it stores the message, in the quorum's order, so
    /// success means no newer version existed when it was stored — whatever server answered the read — and
    /// a purge committed before this call was made under this version or an older one. `false`: a newer
    /// version exists (the read was stale, or a replica shared a snapshot meanwhile): read again. A server cut
    /// off from the quorum cannot store it: an error, read again later. The versions it leaves behind go
    /// with the next share's purge (purging them here would open gaps ahead of the replica, each confirmed
    /// in turn).
    pub async fn confirm(&self, stream: &MutationStream) -> Result<bool, StreamError> {
        let body = self.payload.clone().unwrap_or_default();
        Ok(stream
            .replace_record(Record::SnapshotIndex, &body, self.at)
            .await?
            .is_some())
    }
}

fn upload_failed(name: &str, bucket: &str, e: &dyn std::fmt::Display) -> StreamError {
    StreamError::Publish(format!("cannot upload {name} to {bucket:?}: {e}"))
}

fn object_name(seq: u64) -> String {
    format!("{PREFIX}{seq:020}")
}
