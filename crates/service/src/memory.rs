//! Where the process's memory goes: the namespaces' parts, the rest of the heap, the program.
//!
//! Why: after 10M keys a gate's RSS was 56.6 MB for a 12.4 MB filter, and the figures it reported (filter,
//! tombstones, replay buffer) explained 29 MB of it. The rest could only be guessed at. Here the heap is
//! taken from the allocator itself (glibc's `mallinfo2`: bytes in use and bytes held free), the namespaces'
//! parts from the gate, and the program's pages from `/proc/self/status`, so RSS lies between the parts'
//! sum without the allocator's free bytes and with them (an upper bound on their resident share), and
//! "other heap" (connections, buffers, calls in flight) is a measured figure, not a remainder of RSS. Filter
//! layers of 2 MiB or more live in mappings of their own (huge pages: `core::filter::memory`), outside the
//! allocator's count, so only the filters' heap part is taken from it. What the sum leaves out is thread
//! stacks and other memory mapped outside the allocator.

use crate::core::answer::NamespaceStats;

/// The process's memory, part by part (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident set size.
    pub resident: u64,
    /// Filters, tombstone tables, memories of recent adds and replay buffers, over every namespace.
    pub filters: u64,
    pub tombstones: u64,
    pub recent_adds: u64,
    pub replay_buffers: u64,
    /// The heap in use beyond the namespaces' parts: connections, buffers, calls in flight, the runtime.
    pub other_heap: u64,
    /// Heap the allocator holds free: an upper bound on its resident share.
    pub allocator_free: u64,
    /// The program's and its libraries' resident pages (file-backed).
    pub program: u64,
    /// Whether the allocator could be asked (glibc's malloc); if not, `other_heap` and `allocator_free`
    /// are 0.
    pub heap_measured: bool,
}

impl Memory {
    /// Measures it now, with `namespaces` as the gate reports them.
    pub fn measure(namespaces: &[NamespaceStats]) -> Self {
        let process = Process::read();
        let mut memory = Self {
            resident: process.resident,
            program: process.file,
            ..Self::default()
        };
        for n in namespaces {
            memory.filters += n.filter.bytes;
            memory.tombstones += n.tombstone_bytes;
            memory.recent_adds += n.recent_adds_bytes as u64;
            memory.replay_buffers += n.replay_buffer_bytes as u64;
        }
        if let Some(heap) = Heap::read() {
            memory.heap_measured = true;
            let on_heap = memory
                .namespaces()
                .saturating_sub(crate::core::filter::mapped_bytes());
            memory.other_heap = heap.in_use.saturating_sub(on_heap);
            memory.allocator_free = heap.free;
        }
        memory
    }

    /// The namespaces' parts together.
    pub fn namespaces(&self) -> u64 {
        self.filters + self.tombstones + self.recent_adds + self.replay_buffers
    }

    /// The parts as `(name, bytes)`, in the order docs/metrics.md lists them (the `part` label
    /// of `existence_memory_bytes`).
    pub fn labelled(&self) -> [(&'static str, u64); 7] {
        [
            ("filters", self.filters),
            ("tombstones", self.tombstones),
            ("recent_adds", self.recent_adds),
            ("replay_buffers", self.replay_buffers),
            ("other_heap", self.other_heap),
            ("allocator_free", self.allocator_free),
            ("program", self.program),
        ]
    }
}

/// What `/proc/self/status` says of the process's resident memory.
#[derive(Debug, Default)]
struct Process {
    /// `VmRSS`.
    resident: u64,
    /// `RssFile`: file-backed pages (the program and its libraries).
    file: u64,
}

impl Process {
    /// Zeroes where `/proc` is not there (not Linux): the figures then say nothing rather than fail.
    fn read() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let kib = |field: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(field))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .map_or(0, |kib| kib * 1024)
        };
        Self {
            resident: kib("VmRSS:"),
            file: kib("RssFile:"),
        }
    }
}

/// The allocator's own count of the heap.
struct Heap {
    /// Bytes handed out and not freed (small allocations in arenas, large ones mapped on their own).
    in_use: u64,
    /// Bytes in the arenas that are free.
    free: u64,
}

impl Heap {
    #[cfg(all(target_os = "linux", target_env = "gnu", not(feature = "mimalloc")))]
    fn read() -> Option<Self> {
        // SAFETY: mallinfo2 takes no arguments and returns a struct by value; glibc locks each arena while
        // it sums it, so it is safe to call from any thread at any time.
        let info = unsafe { libc::mallinfo2() };
        Some(Self {
            in_use: (info.uordblks + info.hblkhd) as u64,
            free: info.fordblks as u64,
        })
    }

    #[cfg(not(all(target_os = "linux", target_env = "gnu", not(feature = "mimalloc"))))]
    fn read() -> Option<Self> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Other tests of this binary allocate and free beside it, so the checks leave them 16 MiB of room.
    #[test]
    fn the_heap_counts_what_is_allocated_and_frees_it_again() {
        let before = Heap::read().expect("glibc's malloc").in_use;
        let block = vec![1u8; 64 << 20];
        let during = Heap::read().unwrap().in_use;
        assert!(during >= before + (48 << 20), "{before} -> {during}");
        drop(block);
        let after = Heap::read().unwrap().in_use;
        assert!(after + (48 << 20) <= during, "{during} -> {after}");
    }

    #[test]
    fn resident_memory_includes_the_program() {
        let process = Process::read();
        assert!(process.resident > 0 && process.file > 0);
        assert!(process.file < process.resident);
    }
}
