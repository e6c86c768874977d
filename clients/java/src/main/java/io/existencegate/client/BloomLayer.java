package io.existencegate.client;

/**
 * One layer of a mirror's filter, as the gate lays it out ({@code crates/core/src/filter/bloom.rs}): 512-bit
 * blocks of eight 64-bit words; a key's block is picked by the upper 32 bits of its hash, its probes' bits
 * (all in that block) by the lower 32, remixed between probes.
 *
 * <p>One writer (the mirror's keeper) and any number of readers, with no lock: the words are plain
 * {@code long}s that only ever gain bits. A reader that raced a write sees each word as before or after it
 * (even a word torn in halves, where the JVM may tear a {@code long}, holds only bits of the two), so it never
 * sees fewer bits than were set before the sub-lease it read (a volatile store after them, see
 * {@link Mirror}) — which is all an ABSENT answer needs.
 */
final class BloomLayer {
  static final int WORDS_PER_BLOCK = BloomGeometry.BLOCK_BITS / 64;
  /** The most blocks a layer holds here: its words are one Java array (16 GiB). */
  static final long MAX_BLOCKS = (Integer.MAX_VALUE - 8) / WORDS_PER_BLOCK;
  private static final int REMIX = 0x9E37_79B9;

  private final BloomGeometry geometry;
  private final long[] words;
  /**
   * Keys that set at least one bit (what decides {@code isFull}, as the gate counts them). Written by the
   * keeper alone; volatile so that a copy compared from another thread reads the latest count.
   */
  private volatile long inserted;

  /** An empty layer. */
  BloomLayer(BloomGeometry geometry) {
    this(geometry, 0, new long[wordsOf(geometry)]);
  }

  /** A layer with the gate's words (their count checked by the caller against {@link #wordsOf}). */
  BloomLayer(BloomGeometry geometry, long inserted, long[] words) {
    this.geometry = geometry;
    this.inserted = inserted;
    this.words = words;
  }

  /**
   * The words a layer of {@code geometry} holds; refused when a Java array cannot hold them (a layer over
   * 16 GiB, far past any mirror's memory cap).
   */
  static int wordsOf(BloomGeometry geometry) {
    if (geometry.blocks() <= 0 || geometry.blocks() > MAX_BLOCKS) {
      throw new IllegalArgumentException("a layer of " + geometry.blocks() + " blocks");
    }
    return (int) (geometry.blocks() * WORDS_PER_BLOCK);
  }

  BloomGeometry geometry() {
    return geometry;
  }

  long inserted() {
    return inserted;
  }

  boolean isFull() {
    return Long.compareUnsigned(inserted, geometry.capacity()) >= 0;
  }

  long bytes() {
    return geometry.bytes();
  }

  /** The words themselves, for comparing copies (not to be written). */
  long[] words() {
    return words;
  }

  /** The first word of {@code hash}'s block: the upper 32 bits scaled to the block count, unsigned. */
  private int blockStart(long hash) {
    return (int) (((hash >>> 32) * geometry.blocks()) >>> 32) * WORDS_PER_BLOCK;
  }

  /** The first word of {@code hash}'s block: read ahead of the probes, it brings the block's line in. */
  long touch(long hash) {
    return words[blockStart(hash)];
  }

  boolean contains(long hash) {
    int start = blockStart(hash);
    int state = (int) hash;
    for (int probe = geometry.probes(); probe > 0; probe--) {
      int position = state >>> (32 - 9);
      state *= REMIX;
      if ((words[start + (position >>> 6)] & (1L << position)) == 0) {
        return false;
      }
    }
    return true;
  }

  /** Sets {@code hash}'s bits; whether any was new (only then is the key counted, as the gate counts it). */
  boolean insert(long hash) {
    int start = blockStart(hash);
    long[] masks = new long[WORDS_PER_BLOCK];
    int state = (int) hash;
    for (int probe = geometry.probes(); probe > 0; probe--) {
      int position = state >>> (32 - 9);
      state *= REMIX;
      masks[position >>> 6] |= 1L << position;
    }
    long missing = 0;
    for (int i = 0; i < WORDS_PER_BLOCK; i++) {
      missing |= masks[i] & ~words[start + i];
    }
    if (missing == 0) {
      return false;
    }
    for (int i = 0; i < WORDS_PER_BLOCK; i++) {
      words[start + i] |= masks[i];
    }
    inserted = inserted + 1;
    return true;
  }
}
