package io.existencegate.client;

/**
 * The gate's answer for one key.
 *
 * @param mayExist false means the key does not exist (skip the source); true means "ask the source"
 * @param observedSeq the namespace's seq the answer was computed at (pass it to {@code recordAbsent})
 * @param warming the gate was still loading its state: the answer is MAY_EXIST whatever the key
 * @param address the gate address that answered ({@code host:port}); a {@code recordAbsent} after this
 *     lookup goes there first. For a local answer, the address the mirror is attached to
 * @param local a {@link Mirror} answered ABSENT in-process under its sub-lease, with no call (basis FILTER;
 *     {@code observedSeq} is then the seq the mirror had applied)
 */
public record Lookup(boolean mayExist, long observedSeq, boolean warming, String address, boolean local) {
  /** An answer from the gate ({@code local} false). */
  public Lookup(boolean mayExist, long observedSeq, boolean warming, String address) {
    this(mayExist, observedSeq, warming, address, false);
  }
}
