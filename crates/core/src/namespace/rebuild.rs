//! Rebuilds: a fresh filter filled beside the live one and swapped in, driven in this process or through
//! the log.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::filter::WindowedFilter;
use crate::hashing::KeyHash;
use crate::log::{Mutation, RebuildStep};

/// A rebuild in progress: keys streamed from the source of truth fill a fresh filter, which replaces the
/// live one on [`finish`](Self::finish). Dropped unfinished, it is abandoned and the live filter stays.
pub struct Rebuild {
    namespace: Arc<Namespace>,
    shadow: Arc<WindowedFilter>,
    keys: u64,
    finished: bool,
}

/// What a finished rebuild produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rebuilt {
    /// Keys streamed.
    pub keys: u64,
    /// Bytes of the new filter.
    pub filter_bytes: u64,
    /// The namespace's seq when it was swapped in.
    pub seq: u64,
}

impl Rebuild {
    /// Adds keys that exist (validated by the caller) as of `now_ms`.
    pub fn insert(&mut self, keys: &[Bytes], now_ms: u64) {
        let hashes: Vec<KeyHash> = keys
            .iter()
            .map(|key| self.namespace.hasher.hash(key))
            .collect();
        self.shadow.insert_many(&hashes, now_ms);
        self.keys += keys.len() as u64;
    }

    /// Swaps the rebuilt filter in. Adds applied since the rebuild began are in it too.
    pub fn finish(mut self) -> Result<Rebuilt, WritesStopped> {
        let mut writer = self.namespace.writer()?;
        writer.shadow = None;
        self.namespace.filter.store(Arc::clone(&self.shadow));
        let seq = self.namespace.latest_seq();
        self.namespace.hub.reset(seq);
        self.finished = true;
        Ok(Rebuilt {
            keys: self.keys,
            filter_bytes: self.shadow.bytes(),
            seq,
        })
    }
}

impl Drop for Rebuild {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let Ok(mut writer) = self.namespace.writer() {
            if writer
                .shadow
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(&s.filter, &self.shadow))
            {
                writer.shadow = None;
            }
        }
    }
}

impl Namespace {
    /// Starts rebuilding the filter beside the live one; `None` if a rebuild already runs.
    pub fn begin_rebuild(self: &Arc<Self>) -> Result<Option<Rebuild>, WritesStopped> {
        let mut writer = self.writer()?;
        if writer.shadow.is_some() {
            return Ok(None);
        }
        let shadow = Arc::new(WindowedFilter::new(self.settings.filter_spec()));
        writer.shadow = Some(Shadow {
            filter: Arc::clone(&shadow),
            began: None,
            keys: 0,
            last_step_ms: 0,
        });
        Ok(Some(Rebuild {
            namespace: Arc::clone(self),
            shadow,
            keys: 0,
            finished: false,
        }))
    }

    /// The `Begin` of a logged rebuild at `now_ms` (seq 0 until the log assigns it), or `None` while another
    /// logged rebuild of this namespace took a step within `idle`: its driver is presumably alive, and one
    /// rebuild runs at a time. One idle for longer is presumed abandoned (the replica driving it stopped);
    /// the new `Begin` replaces it wherever it is applied.
    pub fn prepare_rebuild(
        &self,
        now_ms: u64,
        idle: Duration,
    ) -> Result<Option<Mutation>, WritesStopped> {
        let writer = self.writer()?;
        let busy = writer.shadow.as_ref().is_some_and(|s| {
            s.began.is_none() || now_ms.saturating_sub(s.last_step_ms) < idle.as_millis() as u64
        });
        Ok((!busy).then(|| self.rebuild_step(RebuildStep::Begin, now_ms)))
    }

    /// A step of a logged rebuild at `now_ms` (seq 0 until the log assigns it).
    pub fn rebuild_step(&self, step: RebuildStep, now_ms: u64) -> Mutation {
        Mutation::Rebuild {
            namespace: Arc::clone(&self.name),
            seq: 0,
            at_ms: now_ms,
            step,
        }
    }
}
