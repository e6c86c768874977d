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
    out.reserve(items.len());
    visit_prefetched_ahead(
        items,
        out,
        |_, item| prefetch(item),
        |out, i, item| out.push(answer(i, item)),
    );
}

/// Calls `visit(state, i, item)` for every item in order, having asked `prefetch(state, item)` for the item
/// [`LOOKAHEAD`] places ahead first. `state` is what both need and `visit` may change (a batched insert
/// reloads the filter's layers when one grows, and then prefetches into the new ones).
#[inline]
pub fn visit_prefetched_ahead<S, T>(
    items: &[T],
    state: &mut S,
    prefetch: impl Fn(&S, &T),
    mut visit: impl FnMut(&mut S, usize, &T),
) {
    items
        .iter()
        .take(LOOKAHEAD)
        .for_each(|item| prefetch(state, item));
    for (i, item) in items.iter().enumerate() {
        if let Some(ahead) = items.get(i + LOOKAHEAD) {
            prefetch(state, ahead);
        }
        visit(state, i, item);
    }
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
