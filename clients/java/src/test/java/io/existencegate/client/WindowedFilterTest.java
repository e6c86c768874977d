package io.existencegate.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import java.util.Random;
import org.junit.Test;

/** The mirror's filter on its own, with no gate: what a batched lookup answers. */
public class WindowedFilterTest {
  /**
   * {@code containsMany} answers as {@code contains} does, key for key, whatever the batch's length (its
   * groups of eight included): over windows that rotated, grew layers and partly expired as of the lookup.
   */
  @Test
  public void containsManyAnswersAsContainsDoes() {
    WindowedFilter filter = new WindowedFilter(
        new WindowedFilter.Spec(1_000, 0.01, 3_000, 4, 1L << 30), new WindowedFilter.Window[0]);
    Random random = new Random(7);
    long[] inserted = new long[6_000];
    for (int batch = 0; batch < 12; batch++) {
      long[] hashes = new long[500];
      for (int i = 0; i < hashes.length; i++) {
        hashes[i] = random.nextLong();
      }
      filter.insertAll(hashes, batch * 500L);
      System.arraycopy(hashes, 0, inserted, batch * 500, hashes.length);
    }
    int windows = filter.windows().length;
    int layers = 0;
    for (WindowedFilter.Window window : filter.windows()) {
      layers += window.layers().length;
    }
    assertTrue(windows + " windows, " + layers + " layers: the check needs several and a grown one",
        windows >= 4 && layers > windows);
    for (long nowMs : new long[] {5_999, 7_500, 9_000}) {
      for (int round = 0; round < 200; round++) {
        long[] hashes = new long[1 + random.nextInt(25)];
        for (int i = 0; i < hashes.length; i++) {
          hashes[i] = random.nextBoolean() ? inserted[random.nextInt(inserted.length)] : random.nextLong();
        }
        boolean[] present = new boolean[hashes.length];
        filter.containsMany(hashes, nowMs, present);
        for (int i = 0; i < hashes.length; i++) {
          assertEquals("at " + nowMs + " ms, key " + i + " of " + hashes.length,
              filter.contains(hashes[i], nowMs), present[i]);
        }
      }
    }
  }
}
