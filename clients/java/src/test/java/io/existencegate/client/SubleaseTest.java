package io.existencegate.client;

import static org.junit.Assert.assertEquals;

import java.util.concurrent.TimeUnit;
import org.junit.Test;

/**
 * The mirror's side of the sub-lease rules (crates/core/src/sublease.rs), on its own clock: the end is
 * {@code asked + length × (1 − ρ) − margin}, it holds only once {@code from_seq} is applied, a late answer to
 * an older request does not shorten it, and dropping it ends it at once. No gate needed: these are the
 * numbers a lookup compares its clock with.
 */
public class SubleaseTest {
  private static final long MS = TimeUnit.MILLISECONDS.toNanos(1);
  /** ρ = 1 %, a margin of 2 ms: a grant of 300 ms holds 297 ms − 2 ms from when it was asked. */
  private static final long DRIFT_PPM = 10_000;
  private static final long MARGIN = 2 * MS;

  @Test
  public void aGrantEndsItsLengthShrunkByTheDriftAndTheMarginAfterItWasAsked() {
    Sublease sublease = new Sublease(DRIFT_PPM, MARGIN);
    sublease.granted(1_000 * MS, 300 * MS, 7);
    assertEquals(1_000 * MS + 297 * MS - MARGIN, sublease.holdingUntil(7));
  }

  @Test
  public void itHoldsOnlyOnceTheGrantsFromSeqIsApplied() {
    Sublease sublease = new Sublease(DRIFT_PPM, MARGIN);
    sublease.granted(0, 300 * MS, 7);
    assertEquals("the gate had acknowledged Adds the copy lacks", 0, sublease.holdingUntil(6));
    assertEquals(295 * MS, sublease.holdingUntil(8));
  }

  @Test
  public void aLateAnswerToAnOlderRequestChangesNothing() {
    Sublease sublease = new Sublease(DRIFT_PPM, MARGIN);
    sublease.granted(100 * MS, 300 * MS, 9);
    sublease.granted(50 * MS, 300 * MS, 12);
    assertEquals(395 * MS, sublease.holdingUntil(9));
  }

  @Test
  public void droppedItHoldsNoMoreUntilTheNextGrant() {
    Sublease sublease = new Sublease(DRIFT_PPM, MARGIN);
    sublease.granted(0, 300 * MS, 1);
    sublease.drop();
    assertEquals(0, sublease.holdingUntil(1));
    sublease.granted(400 * MS, 300 * MS, 1);
    assertEquals(695 * MS, sublease.holdingUntil(1));
  }

  @Test
  public void theDriftIsTakenOffExactlyAsTheGatesIntegerArithmeticDoes() {
    Sublease sublease = new Sublease(333_333, 0);
    long length = 999_999_999_999L;
    sublease.granted(0, length, 0);
    assertEquals(java.math.BigInteger.valueOf(length).multiply(java.math.BigInteger.valueOf(666_667))
        .divide(java.math.BigInteger.valueOf(1_000_000)).longValueExact(), sublease.holdingUntil(0));
  }
}
