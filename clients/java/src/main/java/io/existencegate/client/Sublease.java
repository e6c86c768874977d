package io.existencegate.client;

/**
 * A mirror's sub-lease as it holds it: the mirror side of the gate's rules ({@code crates/core/src/sublease.rs}).
 *
 * <p>A grant of {@code length} ns on the gate's clock, answering a request the mirror sent at {@code asked}
 * on its own monotonic clock, holds until {@code asked + length × (1 − ρ) − margin}: the request travelled
 * before the gate granted, so counting from when it was sent puts the travel against the mirror; a mirror
 * clock up to ρ fast still reaches that end no later than the gate reaches its own (after which the gate
 * acknowledges {@code Add}s without this mirror); the margin covers how coarsely either clock is read.
 * Counted from the grant's arrival instead, or without ρ or the margin, the mirror could still answer
 * ABSENT after the gate acknowledged an {@code Add} it never saw. And it holds only once the mirror has
 * applied the grant's {@code from_seq}: before that, the gate acknowledged {@code Add}s the copy lacks.
 *
 * <p>Used by the keeper's thread alone.
 */
final class Sublease {
  private static final long MILLION = 1_000_000;

  private final long driftPpm;
  private final long marginNanos;
  /** The newest grant's end on the mirror's clock (0: none). */
  private long end;
  /** The seq the mirror must have applied before the newest grant holds. */
  private long fromSeq;

  Sublease(long driftPpm, long marginNanos) {
    this.driftPpm = Long.compareUnsigned(driftPpm, MILLION) > 0 ? MILLION : driftPpm;
    this.marginNanos = marginNanos;
  }

  /**
   * The gate granted {@code lengthNanos} from {@code grantFromSeq} to the request sent at {@code askedNanos}.
   * A grant ending sooner than the one held (an answer to an older request) changes nothing.
   */
  void granted(long askedNanos, long lengthNanos, long grantFromSeq) {
    long newEnd = saturatingSubtract(saturatingAdd(askedNanos, shrunk(lengthNanos)), marginNanos);
    if (Long.compareUnsigned(newEnd, end) > 0) {
      end = newEnd;
      fromSeq = Long.compareUnsigned(grantFromSeq, fromSeq) > 0 ? grantFromSeq : fromSeq;
    }
  }

  /** Gives the sub-lease up: no local ABSENT until the next grant. */
  void drop() {
    end = 0;
  }

  /**
   * The end on the mirror's clock until which it holds, having applied through {@code applied} (0: it does
   * not hold): what lookups read, alone.
   */
  long holdingUntil(long applied) {
    return Long.compareUnsigned(applied, fromSeq) >= 0 ? end : 0;
  }

  /** {@code length × (1 − ρ)}, exactly as the gate's 128-bit product and division round it. */
  private long shrunk(long length) {
    long kept = MILLION - driftPpm;
    long millions = Long.divideUnsigned(length, MILLION);
    long rest = Long.remainderUnsigned(length, MILLION);
    return millions * kept + rest * kept / MILLION;
  }

  /** {@code a + b}, at most {@link Long#MAX_VALUE} (ends are non-negative nanoseconds). */
  private static long saturatingAdd(long a, long b) {
    long sum = a + b;
    return sum < 0 ? Long.MAX_VALUE : sum;
  }

  private static long saturatingSubtract(long a, long b) {
    return Long.compareUnsigned(a, b) <= 0 ? 0 : a - b;
  }
}
