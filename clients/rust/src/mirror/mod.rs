//! [`Mirror`]: an in-process copy of one namespace's filter that answers `ABSENT` with no call while it
//! holds a sub-lease from the gate it is attached to; every other answer comes from the gate.
//!
//! A task ([`keeper`]) keeps the copy: it attaches (`Mirror.Attach`) to one gate address, downloads the
//! filter as of a seq, applies every later `Add` in seq order and acknowledges each, and asks for a
//! sub-lease every quarter of one. The rules it keeps, and why they mean it never answers `ABSENT` for an
//! acknowledged key, are the core's (`existence_gate_core::sublease`): its sub-lease ends
//! `asked + length × (1 − ρ) − margin` on this process's monotonic clock ([`clock`]), counted from when it
//! *asked*; it holds only once it has applied the grant's `from_seq`; a lookup reads the sub-lease before the
//! filter. The filter, its hash and the rotation and growth of its windows are the gate's own code
//! (`existence_gate_core::filter`), so the copy's bits are the gate's bits.
//!
//! When the stream ends (the gate restarted, a `RESYNC` after a rebuild or a lag) the sub-lease is dropped
//! at once and the task attaches again, with backoff from 200 ms to 5 s; meanwhile lookups go to the gate.
//! Memory: the filter's bytes (the gate's `Admin.Stats` `filter_bytes` for the namespace), refused before
//! the download when over [`MirrorOptions::max_filter_bytes`].
//!
//! A lookup makes no atomic read-modify-write but the epoch pin (one per lookup, or per batch in
//! [`Mirror::absent_locally_many`]): each is a fence that keeps the CPU from overlapping one lookup's cache
//! misses with the next's, so the copy is read under the filter's own epoch rather than through an
//! `ArcSwap` (whose load is a second one), and the clock is read coarsely ([`clock`]).

mod clock;
mod keeper;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned};
use existence_gate_core::filter::WindowedFilter;
use existence_gate_core::hashing::FilterHasher;
use existence_gate_core::lease::observable_seq;
use tokio::task::JoinHandle;
use tonic::Status;

use crate::client::{GateClient, Lookup};
use crate::endpoints::Endpoints;
use crate::stats::count;
use clock::Clock;
use keeper::Keeper;

/// What a mirror may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MirrorOptions {
    /// The most filter bytes it holds (0: no limit): the gate refuses a larger filter
    /// (`RESOURCE_EXHAUSTED`) before sending any, a copy that grows past it is dropped, and the mirror
    /// then answers nothing locally (it tries again every 5 s). Default 1 GiB.
    pub max_filter_bytes: u64,
}

impl Default for MirrorOptions {
    fn default() -> Self {
        Self {
            max_filter_bytes: 1 << 30,
        }
    }
}

/// A namespace's filter, copied into this process, and the gate client behind it. Cheap to clone; the
/// copy is dropped (and the stream closed) when the last clone is.
#[derive(Clone)]
pub struct Mirror {
    shared: Arc<Shared>,
    gate: GateClient,
    _task: Arc<TaskGuard>,
}

/// What lookups read and the task writes.
struct Shared {
    clock: Clock,
    /// The copy (null until the first download), replaced whole when the task attaches again.
    copy: Atomic<Copy>,
    /// The sub-lease's end on [`clock`](Self::clock), 0 while none holds (none granted, `from_seq` not yet
    /// applied, dropped). Stored with `Release` after the filter changes it covers, read with `Acquire`
    /// before the filter.
    holds_until: AtomicU64,
    /// The gate's time (unix ms) at the latest grant: which windows are live.
    now_ms: AtomicU64,
    /// The seq the copy has applied through: a local answer's `observed_seq`, up to `observable`.
    applied: AtomicU64,
    /// The highest seq a local answer may claim as observed, from the latest grant (`u64::MAX`: no bound, a
    /// single server): a replica's copy of the log is known to be the shared log's only that far.
    observable: AtomicU64,
    /// Whether the copy is attached and downloaded (for callers that want to wait for it).
    attached: AtomicBool,
}

/// The filter and its hash.
struct Copy {
    filter: WindowedFilter,
    hasher: FilterHasher,
}

struct TaskGuard(JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl GateClient {
    /// A mirror of this client's namespace, attached to its first address. Needs the `mirror` role and a
    /// gate with `[mirrors] max_per_namespace` set (a single server or a replica). Must be called within a tokio
    /// runtime.
    pub fn mirror(&self, options: MirrorOptions) -> Result<Mirror, crate::InvalidAddress> {
        let calls = self.calls();
        let endpoints = Endpoints::new(
            calls.addresses.clone(),
            crate::AddressPolicy::PickFirst,
            &calls.options,
        )?;
        let shared = Arc::new(Shared {
            clock: Clock::new(),
            copy: Atomic::null(),
            holds_until: AtomicU64::new(0),
            now_ms: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            observable: AtomicU64::new(0),
            attached: AtomicBool::new(false),
        });
        let keeper = Keeper::new(Arc::clone(&shared), self.clone(), endpoints, options);
        Ok(Mirror {
            shared,
            gate: self.clone(),
            _task: Arc::new(TaskGuard(tokio::spawn(keeper.run()))),
        })
    }
}

impl Mirror {
    /// Whether `key` is absent by the local copy under a live sub-lease: `true` means `ABSENT` (basis
    /// `FILTER`), without a call; `false` means only that the gate must be asked.
    #[inline]
    pub fn absent_locally(&self, key: &[u8]) -> bool {
        if !self.holds_sublease() {
            return false;
        }
        let guard = epoch::pin();
        self.shared.copy(&guard).is_some_and(|copy| {
            let hash = copy.hasher.hash(key);
            !copy.filter.contains_cold(hash, self.now_ms(), &guard)
        })
    }

    /// [`absent_locally`](Self::absent_locally) for each of `keys`, in order: one epoch pin and one reading
    /// of the sub-lease for them all, and each key's blocks prefetched ahead of its probe.
    pub fn absent_locally_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Vec<bool> {
        if !self.holds_sublease() {
            return vec![false; keys.len()];
        }
        let guard = epoch::pin();
        let Some(copy) = self.shared.copy(&guard) else {
            return vec![false; keys.len()];
        };
        let hashes: Vec<_> = keys.iter().map(|k| copy.hasher.hash(k.as_ref())).collect();
        let mut present = Vec::with_capacity(keys.len());
        copy.filter
            .contains_many(&hashes, self.now_ms(), &mut present);
        present.into_iter().map(|p| !p).collect()
    }

    /// Whether `key` may exist: `ABSENT` from the local copy when it can say so (`local` set), else the
    /// gate's answer through the client (coalesced).
    pub async fn may_exist(&self, key: impl Into<Bytes>) -> Result<Lookup, Status> {
        let key = key.into();
        // Read before the probe: the copy then holds every `Add` through it (stored with `Release` after
        // the filter changed). Read after, it could name an `Add` the probe missed, and a `RecordAbsent`
        // carrying it would stand over that `Add` instead of being refused as `SUPERSEDED`.
        let observed = observable_seq(
            self.shared.applied.load(Ordering::Acquire),
            self.shared.observable.load(Ordering::Acquire),
        );
        if self.absent_locally(&key) {
            let calls = self.gate.calls();
            count(&calls.counters.lookups, 1);
            count(&calls.counters.mirror_answers, 1);
            return Ok(Lookup {
                may_exist: false,
                observed_seq: observed,
                warming: false,
                local: true,
                address: 0,
            });
        }
        self.gate.may_exist(key).await
    }

    /// Whether the copy is downloaded and following the gate (it may still hold no sub-lease).
    pub fn is_attached(&self) -> bool {
        self.shared.attached.load(Ordering::Acquire)
    }

    /// Whether a sub-lease holds now: lookups the copy answers `ABSENT` need no call.
    #[inline]
    pub fn holds_sublease(&self) -> bool {
        let until = self.shared.holds_until.load(Ordering::Acquire);
        until != 0 && self.shared.clock.now() < until
    }

    /// The gate client behind it.
    pub fn client(&self) -> &GateClient {
        &self.gate
    }

    fn now_ms(&self) -> u64 {
        self.shared.now_ms.load(Ordering::Relaxed)
    }
}

impl Shared {
    /// The copy, read under `guard`.
    fn copy<'g>(&self, guard: &'g Guard) -> Option<&'g Copy> {
        // SAFETY: a non-null pointer here was stored by `replace_copy` from an `Owned`, and is destroyed only
        // through `defer_destroy` once it was swapped out, i.e. after every guard pinned before the swap —
        // `guard` included — is dropped (or in `drop`, when no reader is left).
        unsafe { self.copy.load(Ordering::Acquire, guard).as_ref() }
    }

    /// Puts a fresh copy in place of the old one, which is freed once no lookup can be reading it.
    fn replace_copy(&self, copy: Copy) {
        let guard = epoch::pin();
        let old = self.copy.swap(Owned::new(copy), Ordering::AcqRel, &guard);
        if !old.is_null() {
            // SAFETY: `old` is unreachable from `self.copy` now; lookups that loaded it hold guards pinned
            // before the swap, which `defer_destroy` waits for.
            unsafe { guard.defer_destroy(old) };
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: the last reference is gone, so no lookup holds the copy and none can load it.
        unsafe {
            let copy = self.copy.load(Ordering::Acquire, epoch::unprotected());
            if !copy.is_null() {
                drop(copy.into_owned());
            }
        }
    }
}
