//! Where a layer's bits live: a zeroed array of blocks, on Linux in its own mapping advised for transparent
//! huge pages once it spans one.
//!
//! Why: every insert and lookup of a key touches one random block, so a layer of `B` bytes in 4 KiB pages
//! needs `B / 4 KiB` TLB entries to avoid a page walk per key — 6,144 for a 24 MB layer, more than a CPU's
//! second-level TLB holds (1,536–3,072 entries on current x86-64), and far more once the NATS server, the
//! other replicas and the kernel share the core. In 2 MiB pages the same layer needs 12. Measured with three
//! replicas and a NATS server on 2 cores, 1,000-key `Add`s into a 24 MB layer (a throwaway harness, seven
//! pairs of 8 s runs alternating the builds): the replicas' CPU per `Add` fell by 17–25% in six pairs (e.g.
//! 634 → 479 µs, 794 → 622 µs) and did not move in one (745 vs 748 µs). A single-threaded microbenchmark of a
//! 12 MB layer showed no gain: alone on a core, its page walks hit the caches; nor did the side-by-side
//! `compare` bench, whose layers are 4.8 MB (1,200 pages of 4 KiB: within the TLB).
//!
//! The advice is a request: with transparent huge pages off (`/sys/kernel/mm/transparent_hugepage/enabled`
//! at `never`) or no 2 MiB page free, the kernel backs the mapping with 4 KiB pages and nothing else changes.
//! The mapping starts on a 2 MiB boundary (so that every whole 2 MiB of the layer can be one page) and ends
//! at the layer's last 4 KiB page (so that the last, partial 2 MiB costs no more than its bytes). Smaller
//! layers, and every layer off Linux, stay on the heap.

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};

/// `u64` words per block: 64 bytes, one cache line.
pub(super) const WORDS_PER_BLOCK: usize = 8;

/// One cache line of filter bits: what a key's probes touch, and the unit a layer's memory is made of.
#[repr(C, align(64))]
#[derive(Default)]
pub(super) struct Block(pub(super) [AtomicU64; WORDS_PER_BLOCK]);

/// Bytes of filter layers in mappings of their own, over the whole process.
static MAPPED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes of filter layers held in mappings of their own rather than on the heap: what a count of the
/// heap (the allocator's) leaves out of the filters' bytes.
pub fn mapped_bytes() -> u64 {
    MAPPED_BYTES.load(Ordering::Relaxed)
}

/// A transparent huge page on x86-64 and most aarch64 kernels; layers smaller than this stay on the heap.
const HUGE_PAGE: usize = 2 << 20;

/// A layer's blocks, all zero when created.
pub(super) struct BlockMemory(Backing);

enum Backing {
    Heap(Box<[Block]>),
    #[cfg(target_os = "linux")]
    Mapped(mapped::Mapping),
}

impl BlockMemory {
    /// `len` zeroed blocks (`len` ≥ 1).
    pub(super) fn zeroed(len: usize) -> Self {
        #[cfg(target_os = "linux")]
        if len.saturating_mul(std::mem::size_of::<Block>()) >= HUGE_PAGE {
            if let Some(mapping) = mapped::Mapping::zeroed(len) {
                return Self(Backing::Mapped(mapping));
            }
        }
        Self(Backing::Heap((0..len).map(|_| Block::default()).collect()))
    }
}

impl Deref for BlockMemory {
    type Target = [Block];

    fn deref(&self) -> &[Block] {
        match &self.0 {
            Backing::Heap(blocks) => blocks,
            #[cfg(target_os = "linux")]
            Backing::Mapped(mapping) => mapping.blocks(),
        }
    }
}

#[cfg(target_os = "linux")]
mod mapped {
    use std::ptr::NonNull;

    use rustix::mm::{madvise, mmap_anonymous, munmap, Advice, MapFlags, ProtFlags};

    use super::{Block, HUGE_PAGE};

    /// A private anonymous mapping holding `len` blocks from its first byte, 2 MiB-aligned.
    pub(super) struct Mapping {
        start: NonNull<Block>,
        len: usize,
        /// Bytes mapped from `start`: the blocks' bytes rounded up to whole 4 KiB pages.
        mapped: usize,
    }

    // SAFETY: a `Mapping` owns its pages alone, as a `Box<[Block]>` owns its allocation (nothing else holds
    // `start`; `Drop` unmaps them once), and `Block` is `Send + Sync` (atomic words), so sending the owner to
    // another thread or sharing `&Mapping` (which hands out only `&[Block]`) is as safe as for the box.
    unsafe impl Send for Mapping {}
    // SAFETY: see `Send` above.
    unsafe impl Sync for Mapping {}

    impl Mapping {
        /// `len` blocks in a fresh mapping (zero-filled by the kernel), advised for huge pages; `None` if
        /// the kernel refuses the mapping (the caller falls back to the heap).
        pub(super) fn zeroed(len: usize) -> Option<Self> {
            let bytes = len.checked_mul(std::mem::size_of::<Block>())?;
            let page = rustix::param::page_size();
            let mapped = bytes.checked_next_multiple_of(page)?;
            let padded = mapped.checked_add(HUGE_PAGE)?;
            // SAFETY: a new private anonymous mapping at an address the kernel picks overlaps no memory in use.
            let base = unsafe {
                mmap_anonymous(
                    std::ptr::null_mut(),
                    padded,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::PRIVATE,
                )
            }
            .ok()? as usize;
            let start = base.next_multiple_of(HUGE_PAGE);
            let (head, tail) = (start - base, base + padded - (start + mapped));
            // SAFETY: `[base, start)` and `[start + mapped, base + padded)` lie inside the mapping just made,
            // are page-aligned (`base`, `start` and `mapped` are multiples of the page size) and hold nothing
            // yet. A failure leaves address space mapped, never memory in use unmapped.
            unsafe {
                if head > 0 {
                    let _ = munmap(base as *mut _, head);
                }
                if tail > 0 {
                    let _ = munmap((start + mapped) as *mut _, tail);
                }
            }
            // SAFETY: advice about pages of our own mapping changes how they are backed, never their content.
            // Refused (a kernel without transparent huge pages), the mapping keeps 4 KiB pages.
            let _ = unsafe { madvise(start as *mut _, mapped, Advice::LinuxHugepage) };
            let start = NonNull::new(start as *mut Block)?;
            super::MAPPED_BYTES.fetch_add(bytes as u64, super::Ordering::Relaxed);
            Some(Self { start, len, mapped })
        }

        pub(super) fn blocks(&self) -> &[Block] {
            // SAFETY: `start` is 2 MiB-aligned (more than `Block`'s 64) and the `len` blocks after it lie in
            // our mapping, readable and writable until `drop`; the kernel zero-fills it and all-zero words are
            // a valid `Block`; after that the words are only reached through `&Block` (atomics), so no
            // `&mut` ever aliases this slice.
            unsafe { std::slice::from_raw_parts(self.start.as_ptr(), self.len) }
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: `[start, start + mapped)` is exactly what `zeroed` kept mapped, and no reference into
            // it outlives `self` (`blocks` borrows `self`).
            let _ = unsafe { munmap(self.start.as_ptr().cast(), self.mapped) };
            let bytes = self.len * std::mem::size_of::<Block>();
            super::MAPPED_BYTES.fetch_sub(bytes as u64, super::Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    /// The flags the kernel shows for the mapping holding `address` (`/proc/self/smaps`'s `VmFlags`).
    fn mapping_flags(address: usize) -> Vec<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((from, to)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
                let range = (
                    usize::from_str_radix(from, 16),
                    usize::from_str_radix(to, 16),
                );
                inside = matches!(range, (Ok(from), Ok(to)) if (from..to).contains(&address));
            } else if let Some(flags) = line.strip_prefix("VmFlags:").filter(|_| inside) {
                return flags.split_whitespace().map(str::to_string).collect();
            }
        }
        panic!("no mapping holds {address:#x}")
    }

    #[test]
    fn a_layer_of_a_huge_page_or_more_is_aligned_and_advised_for_huge_pages() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            eprintln!("this kernel has no transparent huge pages: nothing to check");
            return;
        }
        let memory = BlockMemory::zeroed(3 * HUGE_PAGE / std::mem::size_of::<Block>() + 5);
        let start = memory.as_ptr() as usize;
        assert_eq!(
            start % HUGE_PAGE,
            0,
            "a mapped layer starts on a 2 MiB boundary"
        );
        assert!(
            mapping_flags(start).iter().any(|flag| flag == "hg"),
            "the layer's mapping is not advised for huge pages: {:?}",
            mapping_flags(start)
        );
        assert!(
            mapped_bytes() >= memory.len() as u64 * 64,
            "counted as mapped"
        );
        let last = memory.last().expect("blocks");
        assert!(memory
            .iter()
            .all(|block| block.0.iter().all(|w| w.load(Ordering::Relaxed) == 0)));
        last.0[7].store(u64::MAX, Ordering::Relaxed);
        assert_eq!(
            last.0[7].load(Ordering::Relaxed),
            u64::MAX,
            "the last block is writable"
        );
    }

    #[test]
    fn a_small_layer_stays_on_the_heap() {
        let memory = BlockMemory::zeroed(HUGE_PAGE / std::mem::size_of::<Block>() - 1);
        assert!(matches!(memory.0, Backing::Heap(_)));
        assert_eq!(memory.len(), HUGE_PAGE / 64 - 1);
    }
}
