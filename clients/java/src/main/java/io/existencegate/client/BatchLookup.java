package io.existencegate.client;

import java.util.List;

/**
 * The gate's answers for many keys, in the order asked.
 *
 * @param mayExist one answer per key: false means the key does not exist
 * @param observedSeq the smallest seq among the batches the keys were split into (the conservative one to
 *     record an absence with)
 * @param warming true if any part was answered by a gate still loading its state
 */
public record BatchLookup(List<Boolean> mayExist, long observedSeq, boolean warming) {
  public BatchLookup {
    mayExist = List.copyOf(mayExist);
  }
}
