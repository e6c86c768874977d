//! A hint to start loading a cache line: how batched lookups (filter blocks, tombstone tags) overlap their
//! cache misses instead of paying them one after another.

/// How many keys ahead a batch prefetches: enough lines in flight to cover memory latency, few enough to
/// stay in L1 until they are used.
pub const LOOKAHEAD: usize = 16;

/// Appends `answer(i, item)` for every item to `out`, in order, having asked `prefetch` for the item
/// [`LOOKAHEAD`] places ahead of each one answered (and for the first `LOOKAHEAD` before starting): the loop
/// every batched lookup shares, so that each item's cache lines are on their way before they are read.
#[inline]
pub fn prefetched_ahead<T, R>(
    items: &[T],
    out: &mut Vec<R>,
    prefetch: impl Fn(&T),
    mut answer: impl FnMut(usize, &T) -> R,
) {
    items.iter().take(LOOKAHEAD).for_each(&prefetch);
    out.extend(items.iter().enumerate().map(|(i, item)| {
        if let Some(ahead) = items.get(i + LOOKAHEAD) {
            prefetch(ahead);
        }
        answer(i, item)
    }));
}

/// Asks the CPU to start loading the cache line holding `value` into all cache levels. A hint with no
/// effect on results; a no-op off x86-64.
#[inline]
pub fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let line = value as *const T as *const i8;
        // SAFETY: prefetching is a hint with no architectural effect; `line` comes from a reference, so it
        // points into a live allocation (and a prefetch of any address cannot fault).
        unsafe { _mm_prefetch(line, _MM_HINT_T0) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
