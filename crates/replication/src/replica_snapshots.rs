//! Where a replica's state starts from and what it leaves for others: the newest snapshot, local (its data
//! directory) or shared (the stream's object store bucket), and the snapshots it takes.
//!
//! Start: the newer of the local and the shared snapshot is loaded (a wiped replica has only the shared one;
//! a restarted one usually has its own, and downloads only if the bucket holds a newer one), then the
//! replica applies the stream after the seq it covers. Without either, it applies the stream from its start.
//!
//! Every `--snapshot-interval`, a replica with a data directory writes a snapshot covering the stream seq it
//! had applied when it began (a fast restart needs nothing else). One replica also shares it: the one whose
//! `--replica-id` sorts first among those heard from recently — every replica computes the same choice from
//! the same reports, and when that one stops reporting the next one takes over; two that briefly both think
//! it theirs upload two snapshots, which is harmless. The sharer keeps the newest [`KEEP`] snapshots in the
//! bucket and purges the stream's mutations below the oldest of them, so the stream holds what a new replica
//! needs after any retained snapshot, and no more. A replica that was stopped for so long that mutations it
//! had not applied were purged notices the gap in stream seqs and stops (see `Replica::apply`); restarted,
//! it loads the newest shared snapshot.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::protocol::copy::MessageDigest;
use super::protocol::history::{self, HistoryDigest};
use super::snapshot_store::SnapshotStore;
use super::stream::MutationStream;
use crate::core::gate::Gate;
use crate::core::namespace::NamespaceImage;
use crate::storage::snapshot;
use crate::storage::{DataDir, PersistenceError};

/// Snapshots kept in the bucket: the newest, and one before it for a replica still downloading that one
/// while a newer one is shared.
pub const KEEP: usize = 2;
/// Downloads tried again after a failure before a replica gives up starting.
const DOWNLOAD_ATTEMPTS: u32 = 3;

/// Where a loaded state came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// No snapshot: the stream from its start.
    Empty,
    /// The replica's own data directory, and where it stood in the stream when it wrote it.
    Local(PathBuf, ReadPoint),
    /// The shared bucket (downloaded), and the history digest the sharer recorded with it.
    Shared(u64, Option<HistoryDigest>),
}

impl Origin {
    /// Where the replica stands in the stream after loading from here.
    pub fn read_point(&self) -> ReadPoint {
        match self {
            Self::Empty => ReadPoint {
                last_read: None,
                history: Some(history::EMPTY),
            },
            Self::Local(_, point) => *point,
            Self::Shared(_, history) => ReadPoint {
                last_read: None,
                history: *history,
            },
        }
    }
}

/// Where a replica stood in the stream when a snapshot was taken, recorded beside its local snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadPoint {
    /// The message read last (seq and digest; `None`: none read yet, or a snapshot of an earlier release):
    /// the first follow checks the copy it reads against it ([`copy`](crate::protocol::copy)).
    pub last_read: Option<(u64, MessageDigest)>,
    /// The history digest at the covered seq ([`history`]; `None`: unknown).
    pub history: Option<HistoryDigest>,
}

/// What sharing a snapshot needs besides it.
pub struct Sharing<'a> {
    /// The stream to purge.
    pub stream: &'a MutationStream,
    /// The namespaces whose mutations are purged (the stream's own records stay).
    pub namespaces: Vec<String>,
    /// The least seq every replica heard from recently has applied, read when the purge is decided —
    /// after the snapshot is written and uploaded, not before: a replica that started meanwhile, and
    /// loaded the snapshot before this one, reports seq 0 while it catches up, which must hold this
    /// purge back (a purge bound read before the upload once left such a replica stopped on a purged seq).
    pub applied_everywhere: &'a (dyn Fn() -> u64 + Sync),
}

impl std::fmt::Debug for Sharing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sharing")
            .field("namespaces", &self.namespaces)
            .finish_non_exhaustive()
    }
}

/// A replica's snapshots: its data directory (if it keeps one) and the shared bucket.
#[derive(Debug)]
pub struct ReplicaSnapshots {
    dir: Option<Arc<DataDir>>,
    store: SnapshotStore,
    seed: [u8; 32],
}

impl ReplicaSnapshots {
    /// The snapshots of a replica with `dir` (or none), sharing through `store`, under hash seed `seed`.
    pub fn new(dir: Option<Arc<DataDir>>, store: SnapshotStore, seed: [u8; 32]) -> Self {
        Self { dir, store, seed }
    }

    /// Whether this replica keeps snapshots of its own.
    pub fn takes_snapshots(&self) -> bool {
        self.dir.is_some()
    }

    /// Loads the newest snapshot, local or shared, into `gate`; returns the stream seq it covers (0 for
    /// none) and where it came from.
    pub async fn load(&self, gate: &Arc<Gate>) -> Result<(u64, Origin), String> {
        let local = match &self.dir {
            Some(dir) => snapshot::newest(dir.path()).map_err(|e| e.to_string())?,
            None => None,
        };
        let local_seq = local.as_ref().map_or(0, |(seq, _)| *seq);
        match (local, self.download_newer(local_seq).await?) {
            (_, Some((seq, path, history))) => {
                self.restore(gate, &path).await?;
                if self.dir.is_none() {
                    let _ = std::fs::remove_file(&path);
                }
                Ok((seq, Origin::Shared(seq, history)))
            }
            (Some((seq, path)), _) => {
                let point = read_point(&path)?;
                self.restore(gate, &path).await?;
                Ok((seq, Origin::Local(path, point)))
            }
            (None, _) => Ok((0, Origin::Empty)),
        }
    }

    /// Downloads the newest shared snapshot if it covers more than `than`. A download that fails because a
    /// replica sharing a newer snapshot deleted it meanwhile is retried with the newer one; one that keeps
    /// failing (the object missing from the bucket, damaged) falls back to the older snapshot the index
    /// names, which is as good a start: the stream is purged only below the oldest one retained. Every
    /// named snapshot failing is an error unless the replica has a snapshot of its own: the mutations below
    /// them may be purged.
    async fn download_newer(
        &self,
        than: u64,
    ) -> Result<Option<(u64, PathBuf, Option<HistoryDigest>)>, String> {
        let mut failures: Vec<(u64, u32)> = Vec::new();
        let mut last_error = None;
        loop {
            let covered = self.store.covered().await.map_err(|e| e.to_string())?;
            let failed = |seq: u64| {
                failures
                    .iter()
                    .find(|(s, _)| *s == seq)
                    .map_or(0, |(_, n)| *n)
            };
            let next = covered
                .iter()
                .rev()
                .copied()
                .filter(|seq| *seq > than)
                .find(|seq| failed(*seq) < DOWNLOAD_ATTEMPTS);
            let Some(seq) = next else {
                // None newer left to try: the replica's own snapshot, if it has one, else the failure. (A
                // local one older than what was purged is caught at the gap, as any stale start is.)
                return match last_error {
                    Some(error) if than == 0 => Err(error),
                    _ => Ok(None),
                };
            };
            match self.download(seq).await {
                Ok((path, history)) => return Ok(Some((seq, path, history))),
                Err(error) => {
                    tracing::warn!(%error, seq, "a shared snapshot failed to download; trying again, then an older one");
                    match failures.iter_mut().find(|(s, _)| *s == seq) {
                        Some((_, n)) => *n += 1,
                        None => failures.push((seq, 1)),
                    }
                    last_error = Some(error);
                }
            }
        }
    }

    /// Downloads the shared snapshot covering `seq` beside the local ones (or into the temporary directory);
    /// where it went, and the history digest it carries.
    async fn download(&self, seq: u64) -> Result<(PathBuf, Option<HistoryDigest>), String> {
        let (dir, name) = match &self.dir {
            Some(dir) => (dir.path().to_path_buf(), None),
            None => (std::env::temp_dir(), Some(std::process::id())),
        };
        let path = match name {
            Some(pid) => dir.join(format!("existence-gate-{pid}-snapshot-{seq}.snap")),
            None => snapshot::snapshot_path(&dir, seq),
        };
        let temp = path.with_extension("snap.tmp");
        let (bytes, history) = self
            .store
            .download(seq, &temp)
            .await
            .map_err(|e| e.to_string())?;
        std::fs::rename(&temp, &path)
            .map_err(|e| format!("cannot move {} into place: {e}", temp.display()))?;
        tracing::info!(
            seq,
            bytes,
            bucket = self.store.bucket(),
            "downloaded the shared snapshot"
        );
        Ok((path, history))
    }

    /// Reads the snapshot at `path` and restores every namespace of it into `gate`.
    async fn restore(&self, gate: &Arc<Gate>, path: &Path) -> Result<(), String> {
        let (gate, path, seed) = (Arc::clone(gate), path.to_path_buf(), self.seed);
        tokio::task::spawn_blocking(move || {
            let image = snapshot::read(&path).map_err(|e| e.to_string())?;
            if image.seed != seed {
                return Err(format!(
                    "{} was written under another hash seed than the stream's: it belongs to another \
                     deployment; remove it",
                    path.display()
                ));
            }
            image
                .namespaces
                .into_iter()
                .try_for_each(|namespace| snapshot::restore(&gate, namespace))
                .map_err(|reason| format!("{}: {reason}", path.display()))
        })
        .await
        .map_err(|panic| format!("restoring the snapshot failed: {panic}"))?
    }

    /// Removes every local snapshot: they may hold a history that is not the stream's (the replica read a
    /// diverged copy of it), and a restart must not load it. Failing, it says which file to remove.
    pub async fn discard_local(&self) {
        let Some(dir) = self.dir.as_ref().map(Arc::clone) else {
            return;
        };
        let removed = tokio::task::spawn_blocking(move || {
            crate::storage::remove_older_snapshots(dir.path(), u64::MAX)
        })
        .await;
        match removed {
            Ok(Ok(())) => tracing::error!(
                "this replica's snapshots were removed: it read a copy of the stream that is not the \
                 quorum's, and they may hold it"
            ),
            Ok(Err(error)) => tracing::error!(
                %error,
                "this replica read a copy of the stream that is not the quorum's; remove its snapshots \
                 (the snapshot-* files in its data directory) before restarting it"
            ),
            Err(panic) => tracing::error!(%panic, "removing this replica's snapshots failed"),
        }
    }

    /// Writes a local snapshot of `images` (every namespace exactly as of stream seq `covered`, see
    /// [`Gate::export_detached`]) with where the replica stood then (`point`),
    /// removing older local ones; if `share`, uploads it, keeps the newest
    /// [`KEEP`] in the bucket and purges the stream below the oldest kept — or below what the slowest
    /// replica heard from has applied, if that is less: a live replica must never find a gap. Returns the
    /// seq below which the stream was purged, if it was.
    pub async fn take(
        &self,
        covered: u64,
        point: ReadPoint,
        images: Vec<NamespaceImage>,
        hash_check: u64,
        share: Option<Sharing<'_>>,
    ) -> Result<Option<u64>, String> {
        let Some(dir) = &self.dir else {
            return Ok(None);
        };
        let (writer_dir, seed) = (Arc::clone(dir), self.seed);
        let written = tokio::task::spawn_blocking(move || {
            let dir = writer_dir.path();
            // Before the snapshot: a snapshot in place always has the record of where the replica stood.
            write_read_point(dir, covered, point)?;
            let written = snapshot::write_images(dir, covered, images, hash_check, seed)?;
            crate::storage::remove_older_snapshots(dir, covered)?;
            Ok::<_, crate::storage::PersistenceError>(written)
        })
        .await
        .map_err(|panic| format!("the snapshot task failed: {panic}"))?
        .map_err(|e| e.to_string())?;
        tracing::info!(covered, bytes = written.bytes, "snapshot written");
        metrics::gauge!("existence_replica_snapshot_seq").set(covered as f64);
        metrics::gauge!("existence_replica_snapshot_bytes").set(written.bytes as f64);
        let Some(sharing) = share else {
            return Ok(None);
        };
        let oldest = self
            .store
            .share(covered, &written.path, point.history, KEEP)
            .await
            .map_err(|e| e.to_string())?;
        // The message each replica read last stays: following again, a replica's new consumer starts there,
        // to check the copy it reads (`protocol::copy`).
        let below = (oldest + 1).min((sharing.applied_everywhere)());
        let mut purged = 0;
        for namespace in &sharing.namespaces {
            purged += sharing
                .stream
                .purge_below(namespace, below)
                .await
                .map_err(|e| e.to_string())?;
        }
        purged += sharing
            .stream
            .purge_barriers_below(below)
            .await
            .map_err(|e| e.to_string())?;
        metrics::gauge!("existence_replica_snapshot_shared_seq").set(covered as f64);
        tracing::info!(
            covered,
            bucket = self.store.bucket(),
            purged_below = below,
            purged,
            "snapshot shared"
        );
        Ok(Some(below))
    }
}

/// Where the read point is recorded beside the local snapshot covering `covered`.
fn read_point_path(dir: &Path, covered: u64) -> PathBuf {
    snapshot::snapshot_path(dir, covered).with_extension("read")
}

/// Records `point` beside the snapshot covering `covered`, as one line: the message read last, `<seq>
/// <digest, 16 hex digits>` (`- -` for none), then the history digest in 16 hex digits if known (an
/// earlier release wrote the first two fields alone). Written whole: a temporary file renamed into place.
fn write_read_point(dir: &Path, covered: u64, point: ReadPoint) -> Result<(), PersistenceError> {
    let path = read_point_path(dir, covered);
    let temp = path.with_extension("read.tmp");
    let mut line = match point.last_read {
        Some((seq, digest)) => format!("{seq} {digest:016x}"),
        None => "- -".to_string(),
    };
    if let Some(history) = point.history {
        line.push_str(&format!(" {history:016x}"));
    }
    std::fs::write(&temp, format!("{line}\n"))
        .map_err(|e| PersistenceError::io(&temp, "write", e))?;
    std::fs::rename(&temp, &path).map_err(|e| PersistenceError::io(&path, "rename", e))
}

/// The read point recorded beside the local snapshot at `snapshot` (nothing known if none is: a snapshot
/// of an earlier release); an unreadable record is an error naming the file and the remedy.
fn read_point(snapshot: &Path) -> Result<ReadPoint, String> {
    let path = snapshot.with_extension("read");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(ReadPoint {
                last_read: None,
                history: None,
            })
        }
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    parse_read_point(&text).ok_or_else(|| {
        format!(
            "{} does not hold `<seq> <digest> [<history>]` (it records where this replica stood in the \
             stream); remove it and {} to start from the shared snapshot or the stream",
            path.display(),
            snapshot.display()
        )
    })
}

fn parse_read_point(text: &str) -> Option<ReadPoint> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    let last_read = match fields.get(..2)? {
        ["-", "-"] => None,
        [seq, digest] => Some((
            seq.parse().ok()?,
            MessageDigest::from_str_radix(digest, 16).ok()?,
        )),
        _ => return None,
    };
    let history = match fields.get(2..)? {
        [] => None,
        [history] => Some(HistoryDigest::from_str_radix(history, 16).ok()?),
        _ => return None,
    };
    Some(ReadPoint { last_read, history })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_point_is_found_beside_its_snapshot_and_goes_with_it() {
        let dir = std::env::temp_dir().join(format!("read-point-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let snapshot = snapshot::snapshot_path(&dir, 40);
        let unknown = ReadPoint {
            last_read: None,
            history: None,
        };
        assert_eq!(
            read_point(&snapshot),
            Ok(unknown),
            "a snapshot of an earlier release"
        );
        let point = ReadPoint {
            last_read: Some((39, 0x0123_4567_89ab_cdef)),
            history: Some(0xfeed),
        };
        write_read_point(&dir, 40, point).unwrap();
        assert_eq!(read_point(&snapshot), Ok(point));
        let nothing_read = ReadPoint {
            last_read: None,
            ..point
        };
        write_read_point(&dir, 40, nothing_read).unwrap();
        assert_eq!(read_point(&snapshot), Ok(nothing_read));
        std::fs::write(read_point_path(&dir, 40), "39 0123456789abcdef\n").unwrap();
        assert_eq!(
            read_point(&snapshot),
            Ok(ReadPoint {
                history: None,
                ..point
            }),
            "an earlier release's record"
        );
        std::fs::write(read_point_path(&dir, 40), "39\n").unwrap();
        let error = read_point(&snapshot).unwrap_err();
        assert!(
            error.contains("snapshot-00000000000000000040.read"),
            "{error}"
        );
        crate::storage::remove_older_snapshots(&dir, 41).unwrap();
        assert!(
            !read_point_path(&dir, 40).exists(),
            "removed with its snapshot"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
