package io.existencegate.client;

import java.util.Arrays;

/**
 * A mirror's copy of a namespace's filter, kept as the gate keeps its own
 * ({@code crates/core/src/filter/windowed.rs}): time windows of {@code ⌊ms / span⌋}, the newest taking the
 * keys; an {@code Add} at a time past the newest window opens a new one (rotation); a window whose newest
 * layer is full grows a layer twice as large at half the rate, unless that would take the filter past the
 * gate's {@code max_filter_bytes} (then the window is saturated and takes keys into its full layer); windows
 * older than the live ones are dropped. Only what applying the gate's stream needs is here: every rule the
 * gate applies to an {@code Add} is applied the same way, so the copy's bits stay the gate's bits.
 *
 * <p>Where a copy can differ from the gate's: near the growth cap. Whether a full layer grows or its window
 * saturates depends on the bytes of the windows still held, and the gate drops dead windows on its own
 * schedule while a mirror drops them at each grant; so there one may grow where the other saturates. Every key
 * is still inserted into the newest window (no key is lost); only the layer it lands in, and with it the false
 * positives, differ until that window expires.
 *
 * <p>One writer (the keeper) and many readers: the window list is an immutable array replaced whole (a
 * volatile field), so a reader sees one consistent list, and the layers' words only gain bits
 * ({@link BloomLayer}).
 */
final class WindowedFilter {
  /**
   * One window: its id and layers (oldest first). Immutable, like the list: growth and saturation make a new
   * window.
   */
  record Window(long id, BloomLayer[] layers, boolean saturated) {
    BloomLayer newest() {
      return layers[layers.length - 1];
    }
  }

  /**
   * The sizing the gate sent (its header).
   *
   * @param retentionMs 0 for retention "forever" (one window, never rotated)
   * @param windows live windows when the retention is finite
   * @param maxBytes the gate's growth cap ({@code max_filter_bytes} of the namespace)
   */
  record Spec(long expectedKeys, double falsePositiveRate, long retentionMs, int windows, long maxBytes) {
    int liveWindows() {
      return retentionMs == 0 ? 1 : windows;
    }

    /** A window's span in ms (0: one window for ever). */
    long spanMs() {
      if (retentionMs == 0) {
        return 0;
      }
      long span = ceilDivide(retentionMs, windows - 1L);
      return span == 0 ? 1 : span;
    }

    BloomGeometry baseGeometry() {
      long keysPerWindow = retentionMs == 0 ? expectedKeys : ceilDivide(expectedKeys, windows - 1L);
      return BloomGeometry.forTarget(keysPerWindow, falsePositiveRate / liveWindows());
    }

    private static long ceilDivide(long dividend, long divisor) {
      long quotient = Long.divideUnsigned(dividend, divisor);
      return Long.remainderUnsigned(dividend, divisor) == 0 ? quotient : quotient + 1;
    }
  }

  private final Spec spec;
  private final BloomGeometry base;
  private volatile Window[] windows;

  WindowedFilter(Spec spec, Window[] windows) {
    this.spec = spec;
    this.base = spec.baseGeometry();
    this.windows = windows;
  }

  Spec spec() {
    return spec;
  }

  /** The windows, oldest first (the array is not to be changed). */
  Window[] windows() {
    return windows;
  }

  long bytes() {
    return bytesOf(windows);
  }

  private static long bytesOf(Window[] list) {
    long total = 0;
    for (Window window : list) {
      for (BloomLayer layer : window.layers) {
        total += layer.bytes();
      }
    }
    return total;
  }

  private long windowId(long ms) {
    long span = spec.spanMs();
    return span == 0 ? 0 : Long.divideUnsigned(ms, span);
  }

  /** The oldest window live at {@code nowMs}: the newest {@code liveWindows} windows by time, no more. */
  long oldestLiveId(long nowMs) {
    long id = windowId(nowMs);
    long older = spec.liveWindows() - 1L;
    return Long.compareUnsigned(id, older) <= 0 ? 0 : id - older;
  }

  /** Whether a key of {@code hash} may be in a window live at {@code nowMs}. */
  boolean contains(long hash, long nowMs) {
    Window[] list = windows;
    long oldest = oldestLiveId(nowMs);
    for (int w = list.length - 1; w >= 0 && Long.compareUnsigned(list[w].id, oldest) >= 0; w--) {
      for (BloomLayer layer : list[w].layers) {
        if (layer.contains(hash)) {
          return true;
        }
      }
    }
    return false;
  }

  /** Keys a batched lookup loads the blocks of before probing them. */
  private static final int GROUP = 8;

  /**
   * Sets {@code present[i]} to {@code contains(hashes[i], nowMs)} for each {@code i}, a group of keys at a
   * time: the blocks a group's keys fall in are loaded first, with no branch between the loads, so that their
   * cache misses overlap, then probed. Probed one by one, each key's early exit is a branch the CPU guesses
   * half the time wrong, and the miss after it waits. Returns the loaded words folded, for the caller to keep
   * (a load whose value nothing uses may be left out by the compiler).
   */
  long containsMany(long[] hashes, long nowMs, boolean[] present) {
    Window[] list = windows;
    long oldest = oldestLiveId(nowMs);
    int first = list.length;
    while (first > 0 && Long.compareUnsigned(list[first - 1].id, oldest) >= 0) {
      first--;
    }
    long touched = 0;
    for (int start = 0; start < hashes.length; start += GROUP) {
      int end = Math.min(start + GROUP, hashes.length);
      for (int w = first; w < list.length; w++) {
        for (BloomLayer layer : list[w].layers) {
          for (int i = start; i < end; i++) {
            touched ^= layer.touch(hashes[i]);
          }
        }
      }
      for (int i = start; i < end; i++) {
        present[i] = anyContains(list, first, hashes[i]);
      }
    }
    return touched;
  }

  /** Whether a layer of {@code list}'s windows from {@code first} on contains {@code hash}. */
  private static boolean anyContains(Window[] list, int first, long hash) {
    for (int w = first; w < list.length; w++) {
      for (BloomLayer layer : list[w].layers) {
        if (layer.contains(hash)) {
          return true;
        }
      }
    }
    return false;
  }

  /** Inserts the keys of one {@code Add} at {@code atMs}: into the newest window, opening one first if needed. */
  void insertAll(long[] hashes, long atMs) {
    Window[] list = windows;
    long target = windowId(atMs);
    if (list.length == 0 || Long.compareUnsigned(list[list.length - 1].id, target) < 0) {
      list = Arrays.copyOf(list, list.length + 1);
      list[list.length - 1] = new Window(target, new BloomLayer[] {new BloomLayer(base)}, false);
      windows = list;
    }
    for (long hash : hashes) {
      insert(hash);
    }
  }

  /**
   * One key into the newest window's newest layer, unless an older layer of that window holds it already
   * (the gate counts it nowhere then); a layer filled by it grows the window.
   */
  private void insert(long hash) {
    Window[] list = windows;
    Window window = list[list.length - 1];
    BloomLayer[] layers = window.layers;
    for (int i = 0; i < layers.length - 1; i++) {
      if (layers[i].contains(hash)) {
        return;
      }
    }
    BloomLayer newest = window.newest();
    if (newest.insert(hash) && !window.saturated && newest.isFull()) {
      grow(list);
    }
  }

  /**
   * The newest window's next layer: twice the capacity of the base layer per layer it has, at half the rate,
   * so the window's rate stays bounded; or, past the gate's cap, the window saturated.
   */
  private void grow(Window[] list) {
    int position = list.length - 1;
    Window window = list[position];
    int growth = window.layers.length;
    BloomGeometry geometry =
        BloomGeometry.forTarget(
            base.capacity() << Math.min(growth, 32),
            spec.falsePositiveRate() / spec.liveWindows() / (double) (1L << Math.min(growth, 30)));
    Window[] next = list.clone();
    if (Long.compareUnsigned(bytesOf(list) + geometry.bytes(), spec.maxBytes()) > 0) {
      next[position] = new Window(window.id, window.layers, true);
    } else {
      BloomLayer[] layers = Arrays.copyOf(window.layers, growth + 1);
      layers[growth] = new BloomLayer(geometry);
      next[position] = new Window(window.id, layers, false);
    }
    windows = next;
  }

  /**
   * Drops the windows no longer live at {@code nowMs} (the gate's time at a grant), freeing their memory as
   * the gate does; the rest start unsaturated again, as the gate's do, since dropping made room.
   */
  void expire(long nowMs) {
    Window[] list = windows;
    long oldest = oldestLiveId(nowMs);
    int dead = 0;
    while (dead < list.length && Long.compareUnsigned(list[dead].id, oldest) < 0) {
      dead++;
    }
    if (dead == 0) {
      return;
    }
    Window[] next = new Window[list.length - dead];
    for (int i = 0; i < next.length; i++) {
      Window kept = list[dead + i];
      next[i] = new Window(kept.id, kept.layers, false);
    }
    windows = next;
  }
}
