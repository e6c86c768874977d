//! The replicas' shared snapshots: a JetStream object store bucket (`STREAM-snapshots`) of snapshot files,
//! each named by the stream seq it covers (`snapshot-00000000000000012345`). A new or wiped replica starts
//! from the newest one and applies the stream after it, instead of applying the stream from its start; the
//! stream's mutations below a retained snapshot can then be purged.
//!
//! The files are the local snapshot format ([`super::snapshot`]) unchanged: checksummed frames, the hash seed
//! in the header (checked against the stream's before anything is restored), each namespace's seq, sizing
//! fingerprint, filter bits, tombstones and memory of recent adds. A snapshot covering seq S holds every
//! mutation up to S (it may hold parts of later ones, which applying them again does not change).

use std::path::Path;

use async_nats::jetstream::object_store::{self, ObjectStore};
use futures_util::StreamExt;

use super::stream::{MutationStream, StreamError};

/// The prefix of every snapshot object's name; the covered seq follows, zero-padded to sort.
const PREFIX: &str = "snapshot-";

/// The snapshot bucket of one stream.
#[derive(Clone)]
pub struct SnapshotStore {
    store: ObjectStore,
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
        let store = match jetstream.get_object_store(&bucket).await {
            Ok(store) => store,
            Err(_) => jetstream
                .create_object_store(object_store::Config {
                    bucket: bucket.clone(),
                    description: Some("existence-gate snapshots".to_string()),
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| {
                    StreamError::Setup(format!(
                        "cannot open or create the JetStream object store {bucket:?} for snapshots: {e} (may \
                         this account create streams? a stream name of letters, digits, '-' and '_' makes a \
                         valid bucket name)"
                    ))
                })?,
        };
        Ok(Self { store, bucket })
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The seqs covered by the snapshots the bucket holds, oldest first.
    pub async fn covered(&self) -> Result<Vec<u64>, StreamError> {
        let failed = |e: &dyn std::fmt::Display| {
            StreamError::Read(format!(
                "cannot list the snapshots in {:?}: {e}",
                self.bucket
            ))
        };
        let mut list = self.store.list().await.map_err(|e| failed(&e))?;
        let mut seqs = Vec::new();
        while let Some(info) = list.next().await {
            let info = info.map_err(|e| failed(&e))?;
            let seq = info.name.strip_prefix(PREFIX).and_then(|s| s.parse().ok());
            if let (false, Some(seq)) = (info.deleted, seq) {
                seqs.push(seq);
            }
        }
        seqs.sort_unstable();
        Ok(seqs)
    }

    /// Copies the snapshot covering `seq` into the file `to`.
    pub async fn download(&self, seq: u64, to: &Path) -> Result<u64, StreamError> {
        let name = object_name(seq);
        let failed = |e: &dyn std::fmt::Display| {
            StreamError::Read(format!(
                "cannot download {name} from {:?} to {}: {e}",
                self.bucket,
                to.display()
            ))
        };
        let mut object = self.store.get(&name).await.map_err(|e| failed(&e))?;
        let mut file = tokio::fs::File::create(to).await.map_err(|e| failed(&e))?;
        let bytes = tokio::io::copy(&mut object, &mut file)
            .await
            .map_err(|e| failed(&e))?;
        file.sync_all().await.map_err(|e| failed(&e))?;
        Ok(bytes)
    }

    /// Uploads the snapshot file `from`, covering `seq`.
    pub async fn upload(&self, seq: u64, from: &Path) -> Result<(), StreamError> {
        let name = object_name(seq);
        let failed = |e: &dyn std::fmt::Display| {
            StreamError::Publish(format!(
                "cannot upload {} as {name} to {:?}: {e}",
                from.display(),
                self.bucket
            ))
        };
        let mut file = tokio::fs::File::open(from).await.map_err(|e| failed(&e))?;
        self.store
            .put(name.as_str(), &mut file)
            .await
            .map_err(|e| failed(&e))?;
        Ok(())
    }

    /// Deletes all but the newest `keep` snapshots; returns the oldest seq still covered, if any.
    pub async fn retain(&self, keep: usize) -> Result<Option<u64>, StreamError> {
        let covered = self.covered().await?;
        let cut = covered.len().saturating_sub(keep);
        for seq in &covered[..cut] {
            self.store.delete(object_name(*seq)).await.map_err(|e| {
                StreamError::Publish(format!(
                    "cannot delete {} from {:?}: {e}",
                    object_name(*seq),
                    self.bucket
                ))
            })?;
        }
        Ok(covered.get(cut).copied())
    }
}

fn object_name(seq: u64) -> String {
    format!("{PREFIX}{seq:020}")
}
