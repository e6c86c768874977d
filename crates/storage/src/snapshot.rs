//! Snapshots: the whole state as checksummed frames, so that a restart loads bit arrays at disk speed instead
//! of replaying every `Add` ever made.
//!
//! ```text
//! header     "EXGSNAP1", u32 version, [u8; 32] hash seed, u64 hash check, u64 covered segment, u32 namespaces
//! per namespace:
//!   namespace  name, u64 sizing fingerprint, u64 seq, u64 keys added, u32 windows
//!   per window:  u64 id, u32 layers
//!     per layer: u64 blocks, u32 probes, u64 capacity, u64 inserted; then bit words in chunks of ≤ 1 MiB
//!   tombstones   chunks of (u32 tag, u64 × 2 strong hash, u64 expires_at_ms, u8 kind), then an empty chunk
//!   recent adds  u64 floor; then chunks of (u32 cell, u64 seq) for the cells that are not 0, then an empty
//!                chunk (format 3 on)
//!   rebuild      u64 began (0 = none), u64 keys, u64 last step ms, u32 windows; then its windows as above
//!                (format 4 on: a logged rebuild in progress, which replicas carry on after a restore)
//! footer     "EXGSNEND", u32 namespaces
//! ```
//!
//! A snapshot covers every log segment up to the number in its name. It is written beside the live one as
//! `.tmp`, fsynced, renamed into place and the directory fsynced: a crash leaves either the old snapshot or
//! the new one, never a mix. It is taken without stopping reads or writes: each namespace's seq is read
//! under its writer lock, then its bits are copied while writes continue; on restore the log is replayed from
//! that seq, and replay is idempotent (Bloom bits are OR-ed, tombstone inserts and removals re-applied in
//! order), so whatever part of later writes the copy caught is harmless.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::frame::{self, put_absence_kind, put_string, Fields, Next};
use super::{sync_dir, PersistenceError};
use crate::core::filter::{BloomLayer, Geometry};
use crate::core::gate::Gate;
use crate::core::hashing::StrongKey;
use crate::core::namespace::{NamespaceImage, RebuildImage, WindowImage};
use crate::core::recent_adds::{RecentAdds, RecentAddsImage};
use crate::core::tombstones::{Tombstone, TombstoneKey};

const HEADER_MAGIC: &[u8; 8] = b"EXGSNAP1";
const FOOTER_MAGIC: &[u8; 8] = b"EXGSNEND";
/// The format this build writes. Version 1 counted each namespace's seqs from 0, version 2 from
/// [`GENESIS_SEQ`](crate::core::log::GENESIS_SEQ) = 1 (a version-1 seq is read as one higher); version 3
/// adds each namespace's memory of recent adds, so that a restored namespace decides `SUPERSEDED` exactly as
/// the one that wrote it (before, it was read back as a floor at the snapshot's seq); version 4 adds the
/// logged rebuild in progress, if any. All are read.
const VERSION: u32 = 4;
/// Recent-add cells per chunk frame.
const CELLS_PER_CHUNK: usize = 1 << 16;
/// Bit words per chunk frame (1 MiB).
const WORDS_PER_CHUNK: usize = 1 << 17;
/// Tombstones per chunk frame.
const TOMBSTONES_PER_CHUNK: usize = 1 << 15;

/// The path of the snapshot covering segments up to `covered`.
pub fn snapshot_path(dir: &Path, covered: u64) -> PathBuf {
    dir.join(format!("snapshot-{covered:020}.snap"))
}

/// The newest snapshot in `dir`: `(covered segment, path)`.
pub fn newest(dir: &Path) -> Result<Option<(u64, PathBuf)>, PersistenceError> {
    let newest = std::fs::read_dir(dir)
        .map_err(|e| PersistenceError::io(dir, "list", e))?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let covered: u64 = name
                .strip_prefix("snapshot-")?
                .strip_suffix(".snap")?
                .parse()
                .ok()?;
            Some((covered, entry.path()))
        })
        .max_by_key(|(covered, _)| *covered);
    Ok(newest)
}

/// Writes frames to a file, counting bytes.
struct FrameWriter {
    out: BufWriter<File>,
    payload: Vec<u8>,
    framed: Vec<u8>,
    bytes: u64,
}

impl FrameWriter {
    fn frame(&mut self, build: impl FnOnce(&mut Vec<u8>)) -> std::io::Result<()> {
        self.payload.clear();
        build(&mut self.payload);
        self.framed.clear();
        frame::encode(&self.payload, &mut self.framed);
        self.bytes += self.framed.len() as u64;
        self.out.write_all(&self.framed)
    }
}

/// Figures about a snapshot written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Where it was published.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
}

/// What a snapshot holds besides its header.
pub struct Contents<I> {
    /// The hasher's check value.
    pub hash_check: u64,
    /// How many namespaces `images` yields.
    pub count: usize,
    /// The namespaces' images, in order.
    pub images: I,
}

/// Writes the gate's state as the snapshot covering segments up to `covered`, atomically. Each namespace is
/// exported as it is written, sharing its filter with the live one (see the module docs on consistency).
pub fn write(
    dir: &Path,
    covered: u64,
    gate: &Gate,
    seed: [u8; 32],
) -> Result<Written, PersistenceError> {
    let (namespaces, now) = (gate.namespaces(), gate.read_time());
    let contents = Contents {
        hash_check: gate.hash_check(),
        count: namespaces.len(),
        images: namespaces
            .iter()
            .map(|n| n.export(now).map_err(std::io::Error::other)),
    };
    write_contents(dir, covered, contents, seed)
}

/// Writes `images` as the snapshot covering `covered`, atomically: for images taken as one consistent cut
/// beforehand (a replica's, see [`NamespaceImage::detached`]).
pub fn write_images(
    dir: &Path,
    covered: u64,
    images: Vec<NamespaceImage>,
    hash_check: u64,
    seed: [u8; 32],
) -> Result<Written, PersistenceError> {
    let contents = Contents {
        hash_check,
        count: images.len(),
        images: images.into_iter().map(Ok),
    };
    write_contents(dir, covered, contents, seed)
}

fn write_contents(
    dir: &Path,
    covered: u64,
    contents: Contents<impl Iterator<Item = std::io::Result<NamespaceImage>>>,
    seed: [u8; 32],
) -> Result<Written, PersistenceError> {
    let path = snapshot_path(dir, covered);
    let temp = path.with_extension("snap.tmp");
    let written = write_temp(&temp, covered, contents, seed).and_then(|bytes| {
        io_fault_point!("snapshot-rename", &path, "publish");
        std::fs::rename(&temp, &path).map_err(|e| PersistenceError::io(&path, "publish", e))?;
        Ok(bytes)
    });
    match written {
        Ok(bytes) => {
            io_fault_point!("snapshot-dir-fsync", dir, "fsync");
            sync_dir(dir)?;
            Ok(Written { path, bytes })
        }
        Err(error) => {
            // A half-written snapshot holds disk space the log may need (a full disk is the likely cause).
            let _ = std::fs::remove_file(&temp);
            Err(error)
        }
    }
}

/// The bytes a snapshot of `gate` will take, about: every filter layer and live tombstone, and framing.
/// (A tombstone takes 37 bytes in a snapshot; 4 KiB covers each namespace's headers and chunk frames.)
pub fn estimated_bytes(gate: &Gate) -> u64 {
    gate.stats()
        .iter()
        .map(|n| n.filter.bytes + n.tombstones * 40 + 4_096)
        .sum::<u64>()
        + 4_096
}

/// Writes the whole snapshot to `temp` and fsyncs it; returns its size.
fn write_temp(
    temp: &Path,
    covered: u64,
    contents: Contents<impl Iterator<Item = std::io::Result<NamespaceImage>>>,
    seed: [u8; 32],
) -> Result<u64, PersistenceError> {
    let file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(temp)
        .map_err(|e| PersistenceError::io(temp, "create", e))?;
    io_fault_point!("snapshot-write", temp, "write");
    let mut writer = FrameWriter {
        out: BufWriter::with_capacity(1 << 20, file),
        payload: Vec::new(),
        framed: Vec::new(),
        bytes: 0,
    };
    write_frames(&mut writer, covered, contents, seed)
        .map_err(|e| PersistenceError::io(temp, "write", e))?;
    let file = writer
        .out
        .into_inner()
        .map_err(|e| PersistenceError::io(temp, "write", e.into_error()))?;
    file.sync_all()
        .map_err(|e| PersistenceError::io(temp, "fsync", e))?;
    Ok(writer.bytes)
}

fn write_frames(
    writer: &mut FrameWriter,
    covered: u64,
    contents: Contents<impl Iterator<Item = std::io::Result<NamespaceImage>>>,
    seed: [u8; 32],
) -> std::io::Result<()> {
    let count = contents.count as u32;
    writer.frame(|p| {
        p.extend_from_slice(HEADER_MAGIC);
        p.extend_from_slice(&VERSION.to_le_bytes());
        p.extend_from_slice(&seed);
        p.extend_from_slice(&contents.hash_check.to_le_bytes());
        p.extend_from_slice(&covered.to_le_bytes());
        p.extend_from_slice(&count.to_le_bytes());
    })?;
    for image in contents.images {
        let image = image?;
        writer.frame(|p| {
            put_string(p, &image.name);
            p.extend_from_slice(&image.fingerprint.to_le_bytes());
            p.extend_from_slice(&image.seq.to_le_bytes());
            p.extend_from_slice(&image.keys_added.to_le_bytes());
            p.extend_from_slice(&(image.windows.len() as u32).to_le_bytes());
        })?;
        write_windows(writer, &image.windows)?;
        write_chunked(writer, &image.tombstones, TOMBSTONES_PER_CHUNK, |p, t| {
            p.extend_from_slice(&t.key.tag.to_le_bytes());
            p.extend_from_slice(&t.key.strong.0[0].to_le_bytes());
            p.extend_from_slice(&t.key.strong.0[1].to_le_bytes());
            p.extend_from_slice(&t.expires_at_ms.to_le_bytes());
            put_absence_kind(p, t.kind);
        })?;
        write_recent_adds(writer, &image.recent_adds)?;
        write_rebuild(writer, image.rebuild.as_ref())?;
    }
    writer.frame(|p| {
        p.extend_from_slice(FOOTER_MAGIC);
        p.extend_from_slice(&count.to_le_bytes());
    })
}

fn write_windows(writer: &mut FrameWriter, windows: &[WindowImage]) -> std::io::Result<()> {
    for (id, layers) in windows {
        writer.frame(|p| {
            p.extend_from_slice(&id.to_le_bytes());
            p.extend_from_slice(&(layers.len() as u32).to_le_bytes());
        })?;
        for layer in layers {
            write_layer(writer, layer)?;
        }
    }
    Ok(())
}

fn write_rebuild(writer: &mut FrameWriter, rebuild: Option<&RebuildImage>) -> std::io::Result<()> {
    let (began, keys, last_step_ms, windows) = rebuild.map_or((0, 0, 0, &[][..]), |r| {
        (r.began, r.keys, r.last_step_ms, &r.windows[..])
    });
    writer.frame(|p| {
        p.extend_from_slice(&began.to_le_bytes());
        p.extend_from_slice(&keys.to_le_bytes());
        p.extend_from_slice(&last_step_ms.to_le_bytes());
        p.extend_from_slice(&(windows.len() as u32).to_le_bytes());
    })?;
    write_windows(writer, windows)
}

fn write_recent_adds(writer: &mut FrameWriter, recent: &RecentAddsImage) -> std::io::Result<()> {
    writer.frame(|p| p.extend_from_slice(&recent.floor.to_le_bytes()))?;
    write_chunked(writer, &recent.cells, CELLS_PER_CHUNK, |p, (cell, seq)| {
        p.extend_from_slice(&cell.to_le_bytes());
        p.extend_from_slice(&seq.to_le_bytes());
    })
}

/// Writes `items` as frames of at most `per_chunk`, each a u32 count and the items, then an empty frame.
fn write_chunked<T>(
    writer: &mut FrameWriter,
    items: &[T],
    per_chunk: usize,
    put: impl Fn(&mut Vec<u8>, &T),
) -> std::io::Result<()> {
    for chunk in items.chunks(per_chunk).chain(std::iter::once(&[][..])) {
        writer.frame(|p| {
            p.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
            chunk.iter().for_each(|item| put(p, item));
        })?;
    }
    Ok(())
}

/// Reads what [`write_chunked`] wrote, each item with `parse`.
fn read_chunked<T>(
    reader: &mut ImageReader,
    what: &str,
    mut parse: impl FnMut(&mut Fields<'_>) -> Result<T, frame::Malformed>,
) -> Result<Vec<T>, PersistenceError> {
    let mut items = Vec::new();
    loop {
        let chunk = reader.next(what, |f| {
            let count = f.u32()? as usize;
            (0..count).map(|_| parse(f)).collect::<Result<Vec<_>, _>>()
        })?;
        if chunk.is_empty() {
            return Ok(items);
        }
        items.extend(chunk);
    }
}

fn write_layer(writer: &mut FrameWriter, layer: &Arc<BloomLayer>) -> std::io::Result<()> {
    let geometry = layer.geometry();
    writer.frame(|p| {
        p.extend_from_slice(&(geometry.blocks as u64).to_le_bytes());
        p.extend_from_slice(&geometry.probes.to_le_bytes());
        p.extend_from_slice(&geometry.capacity.to_le_bytes());
        p.extend_from_slice(&layer.inserted().to_le_bytes());
    })?;
    let mut words = layer.words().peekable();
    while words.peek().is_some() {
        writer.frame(|p| {
            for word in words.by_ref().take(WORDS_PER_CHUNK) {
                p.extend_from_slice(&word.to_le_bytes());
            }
        })?;
    }
    Ok(())
}

/// A snapshot read back.
pub struct Image {
    /// The hash seed it was written with.
    pub seed: [u8; 32],
    /// The hasher's check value when it was written.
    pub hash_check: u64,
    /// The last log segment it covers.
    pub covered: u64,
    /// Its namespaces.
    pub namespaces: Vec<NamespaceImage>,
}

/// Reads frame payloads in order, turning every kind of damage into an error that names file and offset.
struct ImageReader {
    frames: frame::Reader<BufReader<File>>,
    path: PathBuf,
    offset: u64,
}

impl ImageReader {
    fn corrupt(&self, problem: impl Into<String>) -> PersistenceError {
        PersistenceError::Corrupt {
            file: self.path.clone(),
            offset: self.offset,
            problem: problem.into(),
        }
    }

    /// Decodes the next frame with `parse`.
    fn next<T>(
        &mut self,
        what: &str,
        parse: impl FnOnce(&mut Fields<'_>) -> Result<T, frame::Malformed>,
    ) -> Result<T, PersistenceError> {
        let next = self
            .frames
            .next_frame()
            .map_err(|e| PersistenceError::io(&self.path, "read", e))?;
        let (offset, payload) = match next {
            Next::Frame(offset, payload) => (offset, payload),
            Next::End => {
                return Err(PersistenceError::Corrupt {
                    file: self.path.clone(),
                    offset: self.frames.offset(),
                    problem: format!("the snapshot ends where {what} should follow (truncated)"),
                })
            }
            Next::Damaged(damage) => {
                return Err(PersistenceError::Corrupt {
                    file: self.path.clone(),
                    offset: damage.offset,
                    problem: format!("damaged snapshot frame ({what}): {}", damage.reason),
                })
            }
        };
        self.offset = offset;
        let mut fields = Fields::new(payload);
        let value = parse(&mut fields).map_err(|m| PersistenceError::Corrupt {
            file: self.path.clone(),
            offset,
            problem: format!("malformed {what}: {}", m.0),
        })?;
        fields.finish().map_err(|m| PersistenceError::Corrupt {
            file: self.path.clone(),
            offset,
            problem: format!("malformed {what}: {}", m.0),
        })?;
        Ok(value)
    }
}

/// Reads and verifies a snapshot.
pub fn read(path: &Path) -> Result<Image, PersistenceError> {
    let file = File::open(path).map_err(|e| PersistenceError::io(path, "open", e))?;
    let len = file
        .metadata()
        .map_err(|e| PersistenceError::io(path, "stat", e))?
        .len();
    let mut reader = ImageReader {
        frames: frame::Reader::new(BufReader::with_capacity(1 << 20, file), len),
        path: path.to_path_buf(),
        offset: 0,
    };
    let header = reader.next("the header", |f| {
        if f.take(8)? != HEADER_MAGIC {
            return Err(frame::Malformed("not a snapshot (bad magic)".into()));
        }
        let version = f.u32()?;
        if version > VERSION {
            // Not damage: the rest is a format this build does not know, so it is not parsed.
            f.skip_rest();
            return Ok(Err(version));
        }
        if version == 0 {
            return Err(frame::Malformed("snapshot format 0 does not exist".into()));
        }
        let seed: [u8; 32] = f.take(32)?.try_into().expect("32 bytes");
        Ok(Ok((version, seed, f.u64()?, f.u64()?, f.u32()?)))
    });
    let (version, seed, hash_check, covered, count) = match header {
        Ok(Ok(header)) => header,
        Ok(Err(newer)) => {
            return Err(PersistenceError::Mismatch(format!(
            "{} was written by a newer existence-gate (snapshot format {newer}; this build reads \
                 formats 1 to {VERSION}): run that version or a newer one",
            path.display()
        )))
        }
        Err(damaged) => return Err(damaged),
    };
    let namespaces = (0..count)
        .map(|_| read_namespace(&mut reader, version))
        .collect::<Result<Vec<_>, _>>()?;
    let footer_count = reader.next("the footer", |f| {
        if f.take(8)? != FOOTER_MAGIC {
            return Err(frame::Malformed("bad footer magic".into()));
        }
        f.u32()
    })?;
    if footer_count != count {
        return Err(reader.corrupt(format!(
            "footer counts {footer_count} namespaces, header {count}"
        )));
    }
    Ok(Image {
        seed,
        hash_check,
        covered,
        namespaces,
    })
}

fn read_namespace(
    reader: &mut ImageReader,
    version: u32,
) -> Result<NamespaceImage, PersistenceError> {
    let (name, fingerprint, stored_seq, keys_added, window_count) =
        reader.next("a namespace header", |f| {
            Ok((
                f.string()?.to_string(),
                f.u64()?,
                f.u64()?,
                f.u64()?,
                f.u32()?,
            ))
        })?;
    if stored_seq >= 1 << 62 {
        return Err(reader.corrupt(format!("namespace {name:?} claims seq {stored_seq}")));
    }
    let seq = if version == 1 {
        stored_seq + 1
    } else {
        stored_seq
    };
    let windows = read_windows(reader, window_count)?;
    let tombstones = read_chunked(reader, "a tombstone chunk", |f| {
        let key = TombstoneKey {
            tag: f.u32()?,
            strong: StrongKey([f.u64()?, f.u64()?]),
        };
        Ok(Tombstone {
            key,
            expires_at_ms: f.u64()?,
            kind: f.absence_kind()?,
        })
    })?;
    let recent_adds = if version >= 3 {
        read_recent_adds(reader)?
    } else {
        RecentAddsImage {
            floor: seq,
            cells: Vec::new(),
        }
    };
    let rebuild = if version >= 4 {
        read_rebuild(reader)?
    } else {
        None
    };
    Ok(NamespaceImage {
        name,
        fingerprint,
        seq,
        keys_added,
        windows,
        tombstones,
        recent_adds,
        rebuild,
    })
}

fn read_windows(
    reader: &mut ImageReader,
    count: u32,
) -> Result<Vec<WindowImage>, PersistenceError> {
    let mut windows = Vec::new();
    for _ in 0..count {
        let (id, layer_count) = reader.next("a window header", |f| Ok((f.u64()?, f.u32()?)))?;
        if layer_count == 0 {
            return Err(reader.corrupt("a window without layers"));
        }
        let layers = (0..layer_count)
            .map(|_| read_layer(reader))
            .collect::<Result<Vec<_>, _>>()?;
        windows.push((id, layers));
    }
    Ok(windows)
}

fn read_rebuild(reader: &mut ImageReader) -> Result<Option<RebuildImage>, PersistenceError> {
    let (began, keys, last_step_ms, window_count) = reader.next("the rebuild header", |f| {
        Ok((f.u64()?, f.u64()?, f.u64()?, f.u32()?))
    })?;
    let windows = read_windows(reader, window_count)?;
    if began == 0 {
        return match windows.is_empty() {
            true => Ok(None),
            false => Err(reader.corrupt("rebuild windows without a rebuild")),
        };
    }
    Ok(Some(RebuildImage {
        began,
        keys,
        last_step_ms,
        windows,
    }))
}

fn read_recent_adds(reader: &mut ImageReader) -> Result<RecentAddsImage, PersistenceError> {
    let floor = reader.next("the recent-adds floor", |f| f.u64())?;
    let cells = read_chunked(reader, "a recent-adds chunk", |f| Ok((f.u32()?, f.u64()?)))?;
    let image = RecentAddsImage { floor, cells };
    // Written in cell order, each cell once and never 0: anything else is not what a namespace exported.
    let in_order = image.cells.windows(2).all(|pair| pair[0].0 < pair[1].0);
    if !in_order || image.cells.iter().any(|&(_, seq)| seq == 0) {
        return Err(reader.corrupt("recent-adds cells out of order, repeated or 0"));
    }
    if RecentAdds::restore(&image).is_none() {
        return Err(reader.corrupt("a recent-adds cell out of range"));
    }
    Ok(image)
}

fn read_layer(reader: &mut ImageReader) -> Result<Arc<BloomLayer>, PersistenceError> {
    let (blocks, probes, capacity, inserted) = reader.next("a layer header", |f| {
        Ok((f.u64()?, f.u32()?, f.u64()?, f.u64()?))
    })?;
    let total_words = blocks
        .checked_mul(8)
        .filter(|w| *w <= 1 << 40)
        .ok_or_else(|| reader.corrupt("absurd layer size"))?;
    let mut words: Vec<u64> = Vec::new();
    while (words.len() as u64) < total_words {
        let chunk = reader.next("layer bits", |f| {
            let mut chunk = Vec::new();
            while let Ok(word) = f.u64() {
                chunk.push(word);
            }
            Ok(chunk)
        })?;
        if chunk.is_empty() || words.len() as u64 + chunk.len() as u64 > total_words {
            return Err(reader.corrupt("layer bits do not add up to the layer's size"));
        }
        words.extend(chunk);
    }
    let geometry = Geometry {
        blocks: blocks as usize,
        probes,
        capacity,
    };
    BloomLayer::from_words(geometry, inserted, &words)
        .map(Arc::new)
        .map_err(|problem| reader.corrupt(problem))
}

/// Loads one namespace of a snapshot into `gate`, after checking that it fits: the namespace is configured
/// and its filter sizing is the one the image was written under (bits of another sizing would answer for
/// the wrong keys). The error says what to do.
pub fn restore(gate: &Gate, image: NamespaceImage) -> Result<(), String> {
    let namespace = gate.namespace(&image.name).map_err(|_| {
        format!(
            "it holds namespace {:?}, which is not configured; add it back to the configuration (or move \
             the data directory aside to start without it)",
            image.name
        )
    })?;
    if image.fingerprint != namespace.settings().filter_spec().fingerprint() {
        return Err(format!(
            "namespace {:?} was written with another filter sizing (expected_keys, false_positive_rate, \
             retention or windows changed); changing sizing needs a rebuild: start with an empty data \
             directory and re-derive the keys with the Admin Rebuild call, or restore the old settings",
            image.name
        ));
    }
    namespace
        .restore(image, gate.read_time())
        .map_err(|stopped| stopped.to_string())
}
