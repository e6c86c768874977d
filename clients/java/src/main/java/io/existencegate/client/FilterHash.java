package io.existencegate.client;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;

/**
 * The gate's fast keyed hash of a key (its {@code FilterHasher}: foldhash 0.2.0, fast variant,
 * {@code FixedState::with_seed(seed).hash_one(key)}), which every filter probe derives from. A mirror's
 * copy holds the gate's bits, so it must hash exactly as the gate does: one differing bit and a key the gate
 * added is looked for in the wrong block, and answered ABSENT. {@code clients/testdata/filter-hash.txt}
 * holds the gate's values; a test keeps this class equal to them.
 *
 * <p>All arithmetic is on unsigned 64-bit values held in {@code long}s: additions, multiplications and
 * rotations wrap as Rust's {@code wrapping_*} do.
 */
final class FilterHash {
  private static final long ARBITRARY3 = 0x082efa98ec4e6c89L;
  /** foldhash's fixed shared seeds (ARBITRARY6 to ARBITRARY11), what {@code FixedState} hashes with. */
  private static final long S0 = 0xc0ac29b7c97c50ddL;
  private static final long S1 = 0x3f84d5b5b5470917L;
  private static final long S2 = 0x9216d5d98979fb1bL;
  private static final long S3 = 0xd1310ba698dfb5acL;
  private static final long S4 = 0x2ffd72dbd01adfb7L;
  private static final long S5 = 0xb8e1afed6a267e96L;
  private static final VarHandle LONG_LE =
      MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
  private static final VarHandle INT_LE =
      MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);

  private final long perHasherSeed;

  FilterHash(long seed) {
    this.perHasherSeed = seed ^ ARBITRARY3;
  }

  /**
   * The hash of {@code key}: Rust's {@code Hash} for a byte slice writes its length (a {@code usize}, which
   * foldhash keeps in its sponge) and then its bytes; {@code finish} folds the sponge into the accumulator.
   */
  long hash(byte[] key) {
    int length = key.length;
    long accumulator = Long.rotateRight(perHasherSeed, length);
    accumulator = length <= 16 ? hashShort(key, accumulator) : hashLong(key, accumulator);
    return foldedMultiply(length ^ accumulator, S0);
  }

  /** The low and high halves of the 128-bit product of two unsigned values, xored. */
  static long foldedMultiply(long x, long y) {
    long high = Math.multiplyHigh(x, y) + ((x >> 63) & y) + ((y >> 63) & x);
    return (x * y) ^ high;
  }

  private static long hashShort(byte[] key, long accumulator) {
    int length = key.length;
    long s0 = accumulator;
    long s1 = S1;
    if (length >= 8) {
      s0 ^= load64(key, 0);
      s1 ^= load64(key, length - 8);
    } else if (length >= 4) {
      s0 ^= load32(key, 0);
      s1 ^= load32(key, length - 4);
    } else if (length > 0) {
      long low = key[0] & 0xff;
      long middle = key[length / 2] & 0xff;
      long high = key[length - 1] & 0xff;
      s0 ^= low;
      s1 ^= (high << 8) | middle;
    }
    return foldedMultiply(s0, s1);
  }

  /** foldhash's {@code hash_bytes_long}, its slice {@code v} being {@code key[from..]}. */
  private static long hashLong(byte[] key, long accumulator) {
    long s0 = accumulator;
    long s1 = s0 + S1;
    int from = 0;
    int left = key.length;
    if (left > 128) {
      long s2 = s0 + S2;
      long s3 = s0 + S3;
      if (left > 256) {
        long s4 = s0 + S4;
        long s5 = s0 + S5;
        do {
          s0 = foldedMultiply(load64(key, from) ^ s0, load64(key, from + 48) ^ S0);
          s1 = foldedMultiply(load64(key, from + 8) ^ s1, load64(key, from + 56) ^ S0);
          s2 = foldedMultiply(load64(key, from + 16) ^ s2, load64(key, from + 64) ^ S0);
          s3 = foldedMultiply(load64(key, from + 24) ^ s3, load64(key, from + 72) ^ S0);
          s4 = foldedMultiply(load64(key, from + 32) ^ s4, load64(key, from + 80) ^ S0);
          s5 = foldedMultiply(load64(key, from + 40) ^ s5, load64(key, from + 88) ^ S0);
          from += 96;
          left -= 96;
        } while (left > 256);
        s0 ^= s4;
        s1 ^= s5;
      }
      do {
        s0 = foldedMultiply(load64(key, from) ^ s0, load64(key, from + 32) ^ S0);
        s1 = foldedMultiply(load64(key, from + 8) ^ s1, load64(key, from + 40) ^ S0);
        s2 = foldedMultiply(load64(key, from + 16) ^ s2, load64(key, from + 48) ^ S0);
        s3 = foldedMultiply(load64(key, from + 24) ^ s3, load64(key, from + 56) ^ S0);
        from += 64;
        left -= 64;
      } while (left > 128);
      s0 ^= s2;
      s1 ^= s3;
    }
    int end = from + left;
    s0 = foldedMultiply(load64(key, from) ^ s0, load64(key, end - 16) ^ S0);
    s1 = foldedMultiply(load64(key, from + 8) ^ s1, load64(key, end - 8) ^ S0);
    if (left >= 32) {
      s0 = foldedMultiply(load64(key, from + 16) ^ s0, load64(key, end - 32) ^ S0);
      s1 = foldedMultiply(load64(key, from + 24) ^ s1, load64(key, end - 24) ^ S0);
      if (left >= 64) {
        s0 = foldedMultiply(load64(key, from + 32) ^ s0, load64(key, end - 48) ^ S0);
        s1 = foldedMultiply(load64(key, from + 40) ^ s1, load64(key, end - 40) ^ S0);
        if (left >= 96) {
          s0 = foldedMultiply(load64(key, from + 48) ^ s0, load64(key, end - 64) ^ S0);
          s1 = foldedMultiply(load64(key, from + 56) ^ s1, load64(key, end - 56) ^ S0);
        }
      }
    }
    return s0 ^ s1;
  }

  private static long load64(byte[] bytes, int offset) {
    return (long) LONG_LE.get(bytes, offset);
  }

  private static long load32(byte[] bytes, int offset) {
    return ((int) INT_LE.get(bytes, offset)) & 0xffff_ffffL;
  }
}
