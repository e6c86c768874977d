package io.existencegate.client;

/**
 * A filter layer's shape, as the gate computes it ({@code crates/core/src/filter/bloom.rs},
 * {@code Geometry::for_target}): a mirror sizes the layers it grows itself, and a layer sized one block
 * differently places every later key in another block than the gate's does. The floating-point steps are the
 * gate's, in its order ({@code powi} as repeated squaring, as Rust's runtime computes it), so the results are
 * equal to the bit.
 *
 * @param blocks 512-bit blocks
 * @param probes bits set per key, all in one block
 * @param capacity keys the layer is sized for (unsigned): it is full, and the window grows, at this many
 */
record BloomGeometry(long blocks, int probes, long capacity) {
  static final int BLOCK_BITS = 512;
  static final int MAX_PROBES = 24;
  /** Rust's {@code std::f64::consts::LN_2}. */
  private static final double LN_2 = 0.6931471805599453;

  /**
   * The smallest layer whose false-positive rate at {@code capacity} keys (unsigned) is at most
   * {@code target}.
   */
  static BloomGeometry forTarget(long capacity, double target) {
    long keys = capacity == 0 ? 1 : capacity;
    double bitsPerKey = bitsPerKeyFor(target);
    int probes = bestProbes(bitsPerKey).probes;
    double bits = Math.ceil(unsignedToDouble(keys) * bitsPerKey);
    long blocks = Math.max(1, (long) Math.ceil(bits / BLOCK_BITS));
    return new BloomGeometry(blocks, probes, keys);
  }

  long bytes() {
    return blocks * (BLOCK_BITS / 8);
  }

  /**
   * The blocked filter's false-positive rate at {@code bitsPerKey} with {@code probes} probes: the keys per
   * block are Poisson distributed, and a block with more keys has more bits set.
   */
  static double blockedFalsePositiveRate(double bitsPerKey, int probes) {
    double block = BLOCK_BITS;
    double lambda = block / bitsPerKey;
    double keyMissesBit = powi(1.0 - 1.0 / block, probes);
    int last = (int) saturatingToUnsigned32(lambda + 12.0 * Math.sqrt(lambda) + 20.0);
    double poisson = Math.exp(-lambda);
    double allKeysMissBit = 1.0;
    double rate = 0.0;
    for (int keysInBlock = 0; keysInBlock <= last; keysInBlock++) {
      rate += poisson * powi(1.0 - allKeysMissBit, probes);
      poisson *= lambda / (keysInBlock + 1.0);
      allKeysMissBit *= keyMissesBit;
    }
    return rate;
  }

  private record Best(double rate, int probes) {}

  /** The probe count with the lowest rate near the classic optimum (the first of equal ones). */
  private static Best bestProbes(double bitsPerKey) {
    int classic = (int) saturatingToUnsigned32(Math.round(bitsPerKey * LN_2));
    int most = Math.min(classic + 3, MAX_PROBES);
    int fewest = Math.min(Math.max(classic - 3, 1), most);
    Best best = null;
    for (int k = fewest; k <= most; k++) {
      double rate = blockedFalsePositiveRate(bitsPerKey, k);
      if (best == null || Double.compare(rate, best.rate) < 0) {
        best = new Best(rate, k);
      }
    }
    return best;
  }

  /** Bisection, 40 steps, for the fewest bits per key that reach {@code target}. */
  private static double bitsPerKeyFor(double target) {
    double low = 0.5;
    double high = 128.0;
    for (int step = 0; step < 40; step++) {
      double middle = (low + high) / 2.0;
      if (bestProbes(middle).rate <= target) {
        high = middle;
      } else {
        low = middle;
      }
    }
    return high;
  }

  /** {@code x} to the power {@code n} as Rust's {@code powi} computes it at run time (compiler-rt's
   * {@code __powidf2}): squaring, so the rounding is its rounding, not {@link Math#pow}'s. */
  static double powi(double x, int n) {
    boolean reciprocal = n < 0;
    long power = Math.abs((long) n);
    double base = x;
    double product = 1.0;
    while (true) {
      if ((power & 1) != 0) {
        product *= base;
      }
      power >>>= 1;
      if (power == 0) {
        break;
      }
      base *= base;
    }
    return reciprocal ? 1.0 / product : product;
  }

  /** Rust's {@code value as u32} (saturating, NaN to 0), returned widened. */
  private static long saturatingToUnsigned32(double value) {
    if (!(value > 0)) {
      return 0;
    }
    return value >= 4_294_967_295.0 ? 4_294_967_295L : (long) value;
  }

  /** Rust's {@code value as f64} of an unsigned 64-bit value (round to nearest). */
  static double unsignedToDouble(long value) {
    if (value >= 0) {
      return value;
    }
    // Halve (keeping the lowest bit, so the rounding is the same), convert, double.
    return ((value >>> 1) | (value & 1)) * 2.0;
  }
}
