//! The `snapshot` target: a snapshot file read, restored into a gate, served from and written back; and
//! [`ImageSummary`], what a snapshot holds in a form two images can be compared by.

use std::collections::BTreeSet;
use std::path::Path;

use existence_gate::core::gate::Gate;
use existence_gate::core::namespace::WindowImage;
use existence_gate::core::recent_adds::RecentAddsImage;
use existence_gate::core::tombstones::AbsenceKind;
use existence_gate::storage::snapshot::{self, Image};

use crate::shared::{exercise, fix_checksums, new_gate, scratch, CONFIG, START_MS};

/// Reads `data` as a snapshot file (as it is, and with its checksums fixed); restores whatever reads into a
/// fresh gate and serves from it; and for a snapshot whose namespaces all restore, checks that writing the
/// restored gate's snapshot and reading it back gives the same image.
pub fn snapshot(data: &[u8]) {
    let dir = scratch();
    read_snapshot(dir.path(), data);
    let mut fixed = data.to_vec();
    if fix_checksums(&mut fixed) {
        read_snapshot(dir.path(), &fixed);
    }
}

/// Whether restoring kept every tombstone of the image: a key may live only in its 16-slot bucket, so an
/// image (crafted, or from a store of another shape) with more than 16 tombstones for one bucket loses the
/// extra ones on restore, as the store's eviction rule says.
fn kept_every_tombstone(gate: &Gate, summary: &ImageSummary) -> bool {
    gate.stats().iter().all(|stats| {
        summary
            .namespaces
            .iter()
            .filter(|n| *n.name == *stats.name)
            .all(|n| stats.tombstones == n.tombstones.len() as u64)
    })
}

/// Reads, restores and serves one snapshot file's bytes.
pub fn read_snapshot(dir: &Path, data: &[u8]) {
    let path = snapshot::snapshot_path(dir, 1);
    std::fs::write(&path, data).expect("write the snapshot");
    let Ok(image) = snapshot::read(&path) else {
        return;
    };
    let (gate, _clock) = new_gate(CONFIG);
    let summary = ImageSummary::of(&image);
    let mut all_restored = true;
    for namespace in image.namespaces {
        all_restored &= snapshot::restore(&gate, namespace).is_ok();
    }
    if all_restored && summary.round_trips() && kept_every_tombstone(&gate, &summary) {
        let out = scratch();
        let written = snapshot::write(out.path(), image.covered, &gate, image.seed)
            .expect("write a snapshot of a restored gate");
        let back = snapshot::read(&written.path).expect("a snapshot just written reads back");
        assert_eq!(ImageSummary::of(&back).namespaces, summary.namespaces);
        assert_eq!((back.covered, back.seed), (image.covered, image.seed));
    }
    exercise(&gate);
}

/// A layer of a snapshot: `(blocks, probes, capacity, inserted, words)`.
pub type LayerSummary = (usize, u32, u64, u64, Vec<u64>);

/// What a namespace of a snapshot holds, comparable.
#[derive(Debug, PartialEq, Eq)]
pub struct NamespaceSummary {
    pub name: String,
    pub fingerprint: u64,
    pub seq: u64,
    pub keys_added: u64,
    pub windows: Vec<WindowSummary>,
    /// `(tag, strong hash, expires_at_ms, deleted)`, sorted.
    pub tombstones: Vec<(u32, [u64; 2], u64, bool)>,
    pub recent_adds: RecentAddsImage,
    /// `(began, keys, last step ms, windows)` of a logged rebuild in progress.
    pub rebuild: Option<(u64, u64, u64, Vec<WindowSummary>)>,
}

/// A window of a snapshot: `(id, layers)`.
pub type WindowSummary = (u64, Vec<LayerSummary>);

fn summarize_windows(windows: &[WindowImage]) -> Vec<WindowSummary> {
    windows
        .iter()
        .map(|(id, layers)| {
            let layers = layers
                .iter()
                .map(|l| {
                    let g = l.geometry();
                    (
                        g.blocks,
                        g.probes,
                        g.capacity,
                        l.inserted(),
                        l.words().collect(),
                    )
                })
                .collect();
            (*id, layers)
        })
        .collect()
}

/// What a snapshot holds, comparable.
#[derive(Debug, PartialEq, Eq)]
pub struct ImageSummary {
    pub namespaces: Vec<NamespaceSummary>,
}

impl ImageSummary {
    pub fn of(image: &Image) -> Self {
        let namespaces = image
            .namespaces
            .iter()
            .map(|n| {
                let mut tombstones: Vec<_> = n
                    .tombstones
                    .iter()
                    .map(|t| {
                        (
                            t.key.tag,
                            t.key.strong.0,
                            t.expires_at_ms,
                            t.kind == AbsenceKind::Deleted,
                        )
                    })
                    .collect();
                tombstones.sort_unstable();
                NamespaceSummary {
                    recent_adds: n.recent_adds.clone(),
                    name: n.name.clone(),
                    fingerprint: n.fingerprint,
                    seq: n.seq,
                    keys_added: n.keys_added,
                    windows: summarize_windows(&n.windows),
                    tombstones,
                    rebuild: n.rebuild.as_ref().map(|r| {
                        (
                            r.began,
                            r.keys,
                            r.last_step_ms,
                            summarize_windows(&r.windows),
                        )
                    }),
                }
            })
            .collect();
        Self { namespaces }
    }

    /// Whether restoring and writing again must reproduce this image exactly: every namespace of
    /// [`CONFIG`] appears exactly once, in name order (as snapshots are written), and every tombstone is
    /// distinct and live at [`START_MS`] (restore keeps only those; the store's own limits keep them all).
    fn round_trips(&self) -> bool {
        let names: Vec<&str> = self.namespaces.iter().map(|n| n.name.as_str()).collect();
        names == ["default", "users"]
            && self.namespaces.iter().all(|n| {
                let distinct: BTreeSet<_> = n.tombstones.iter().map(|t| (t.0, t.1)).collect();
                distinct.len() == n.tombstones.len()
                    && n.tombstones.len() <= if n.name == "users" { 100 } else { 1_000 }
                    && n.tombstones.iter().all(|t| t.2 > START_MS)
            })
    }
}
