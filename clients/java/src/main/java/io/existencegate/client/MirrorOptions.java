package io.existencegate.client;

/**
 * What a {@link Mirror} may hold.
 *
 * @param maxFilterBytes the most filter bytes it holds (0: no limit). The gate refuses a larger filter
 *     (RESOURCE_EXHAUSTED) before sending any, a copy that grows past it is dropped, and the mirror then
 *     answers nothing locally (it tries again, backing off to every 5 s). The filter's bytes are the mirror's
 *     memory: the gate's {@code existence_filter_bytes} of the namespace.
 */
public record MirrorOptions(long maxFilterBytes) {
  /** The default of {@link #maxFilterBytes}: 1 GiB. */
  public static final long DEFAULT_MAX_FILTER_BYTES = 1L << 30;

  public MirrorOptions {
    if (maxFilterBytes < 0) {
      throw new IllegalArgumentException("maxFilterBytes must not be negative");
    }
  }

  /** The defaults: at most 1 GiB of filter. */
  public static MirrorOptions defaults() {
    return new MirrorOptions(DEFAULT_MAX_FILTER_BYTES);
  }
}
