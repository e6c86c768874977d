package io.existencegate.client;

/**
 * The answer to a {@code RecordAbsent}.
 *
 * @param outcome what the gate did
 * @param seq the tombstone's seq when {@link RecordOutcome#RECORDED}; otherwise the namespace's latest seq
 * @param expiresInMs the TTL applied, in milliseconds (0 unless recorded)
 * @param address the gate address that answered
 */
public record RecordResult(RecordOutcome outcome, long seq, long expiresInMs, String address) {}
