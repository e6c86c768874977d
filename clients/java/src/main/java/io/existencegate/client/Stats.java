package io.existencegate.client;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A snapshot of a client's (and its reader's) monotonically increasing counters. A {@link GateClient}'s
 * snapshot has the reader counters at 0; a {@link GatedReader}'s includes its client's counters (shared by
 * every reader of that client).
 *
 * @param lookups single-key lookups asked of the client
 * @param gateCalls lookup RPCs sent ({@code MayExist} or {@code BatchMayExist}), retries included
 * @param batchedKeys keys sent in coalesced batches ({@code batchedKeys / gateCalls} = mean batch size)
 * @param retries calls retried on another address
 * @param cacheHits {@code get}s answered by the local absence cache
 * @param failOpens {@code get}s that read the source because the gate failed
 * @param sourceReads source reads (after single flight)
 * @param absencesRecorded {@code RecordAbsent} answered RECORDED
 * @param invalidations ADDED keys applied, plus one per RESYNC
 * @param resubscribes subscriptions reopened
 * @param warmingAddsDropped keys found while the gate was warming that could not wait to be added (more
 *     than 10,000 waiting)
 * @param mirrorAnswers lookups a {@link Mirror} answered ABSENT in-process, with no call (also counted in
 *     {@code lookups}; the mirror's other lookups are the client's, counted as usual)
 * @param mirrorGrants sub-leases granted to the client's mirrors
 * @param mirrorAttaches filters the client's mirrors downloaded (the first attach and every one after)
 * @param mirrorResyncs mirror streams the gate ended with RESYNC (a rebuild, a restore, a mirror left
 *     behind): each is followed by a fresh attach
 */
public record Stats(
    long lookups,
    long gateCalls,
    long batchedKeys,
    long retries,
    long cacheHits,
    long failOpens,
    long sourceReads,
    long absencesRecorded,
    long invalidations,
    long resubscribes,
    long warmingAddsDropped,
    long mirrorAnswers,
    long mirrorGrants,
    long mirrorAttaches,
    long mirrorResyncs) {

  /** The counters of a client without mirrors (the mirror counters at 0). */
  public Stats(
      long lookups,
      long gateCalls,
      long batchedKeys,
      long retries,
      long cacheHits,
      long failOpens,
      long sourceReads,
      long absencesRecorded,
      long invalidations,
      long resubscribes,
      long warmingAddsDropped) {
    this(lookups, gateCalls, batchedKeys, retries, cacheHits, failOpens, sourceReads, absencesRecorded,
        invalidations, resubscribes, warmingAddsDropped, 0, 0, 0, 0);
  }

  /** The counters by their contract names ({@code gate_calls}, ...), in a stable order. */
  public Map<String, Long> toMap() {
    Map<String, Long> out = new LinkedHashMap<>();
    out.put("lookups", lookups);
    out.put("gate_calls", gateCalls);
    out.put("batched_keys", batchedKeys);
    out.put("retries", retries);
    out.put("cache_hits", cacheHits);
    out.put("fail_opens", failOpens);
    out.put("source_reads", sourceReads);
    out.put("absences_recorded", absencesRecorded);
    out.put("invalidations", invalidations);
    out.put("resubscribes", resubscribes);
    out.put("warming_adds_dropped", warmingAddsDropped);
    out.put("mirror_answers", mirrorAnswers);
    out.put("mirror_grants", mirrorGrants);
    out.put("mirror_attaches", mirrorAttaches);
    out.put("mirror_resyncs", mirrorResyncs);
    return out;
  }

  @Override
  public String toString() {
    return toMap().toString();
  }
}
