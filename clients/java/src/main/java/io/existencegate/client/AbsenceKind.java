package io.existencegate.client;

/** Why the source says a key does not exist. */
public enum AbsenceKind {
  /** No such row. */
  MISSING,
  /** The row existed and was deleted (the gate keeps such tombstones longer). */
  DELETED
}
