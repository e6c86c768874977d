package io.existencegate.client;

/** Which gate address a call goes to. */
public enum AddressPolicy {
  /** Each call or batch to the next address that is up. */
  ROUND_ROBIN,
  /** The first address (in the order given) that is up. */
  PICK_FIRST
}
