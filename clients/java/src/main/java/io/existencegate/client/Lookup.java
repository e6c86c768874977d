package io.existencegate.client;

/**
 * The gate's answer for one key.
 *
 * @param mayExist false means the key does not exist (skip the source); true means "ask the source"
 * @param observedSeq the namespace's seq the answer was computed at (pass it to {@code recordAbsent})
 * @param warming the gate was still loading its state: the answer is MAY_EXIST whatever the key
 * @param address the gate address that answered ({@code host:port}); a {@code recordAbsent} after this
 *     lookup goes there first
 */
public record Lookup(boolean mayExist, long observedSeq, boolean warming, String address) {}
