package io.existencegate.client;

/** What the gate did with a {@code RecordAbsent}. */
public enum RecordOutcome {
  /** A tombstone was stored: the gate answers ABSENT for the key until it expires or the key is added. */
  RECORDED,
  /** The filter alone already answers ABSENT for the key: nothing stored. */
  REDUNDANT,
  /** An Add of the key may have been applied after the observed seq: nothing stored. */
  SUPERSEDED,
  /** The namespace's tombstone admission rate was exceeded: nothing stored. */
  THROTTLED,
  /** An outcome this client does not know (a newer server). */
  UNKNOWN
}
