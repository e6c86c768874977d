package io.existencegate.client;

import com.google.protobuf.ByteString;
import io.grpc.StatusRuntimeException;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.LongAdder;

/**
 * An in-process copy of one namespace's filter that answers ABSENT with no call while it holds a sub-lease
 * from the gate it is attached to; every other answer comes from the gate (docs/mirrors.md).
 *
 * <pre>{@code
 * try (GateClient gate = GateClient.builder("10.0.0.1:50051").namespace("users").build();
 *     Mirror users = gate.mirror(MirrorOptions.defaults())) {
 *   Lookup answer = users.mayExist("user:42"); // a local ABSENT, or the gate's answer (coalesced)
 *   boolean absentHere = users.absentLocally("user:43"); // no call: true only when ABSENT
 * }
 * }</pre>
 *
 * <p>A thread of its own ({@link MirrorKeeper}) keeps the copy: it attaches ({@code Mirror.Attach}) to the
 * client's first address that is up, downloads the filter as of a seq, applies every later {@code Add} in seq
 * order and acknowledges each, and asks for a sub-lease every quarter of one. The gate acknowledges an
 * {@code Add} only once every mirror holding a sub-lease has applied it (or that sub-lease has ended), so
 * under a sub-lease a key the copy does not hold was never acknowledged: ABSENT is the gate's own answer.
 * When the stream ends (the gate restarted, a RESYNC after a rebuild or a lag) the sub-lease is dropped at
 * once and the thread attaches again, backing off from 200 ms to 5 s; meanwhile lookups go to the gate.
 *
 * <p>Memory: the filter's bytes, refused before the download when over {@link MirrorOptions#maxFilterBytes}
 * and dropped when Adds grow it past that.
 *
 * <p>Memory ordering, which is what makes a local ABSENT safe while the keeper writes: the keeper changes the
 * filter first and only then stores {@link #holdsUntil} (a volatile store: a release), and a lookup loads
 * {@code holdsUntil} (a volatile load: an acquire) before it reads the filter. A lookup that sees a sub-lease
 * covering seq N therefore sees every bit the {@code Add}s through N set; reading the filter first could pair
 * an old filter with a newer sub-lease. The copy itself is replaced whole on a new attach (a volatile
 * reference), and its words only ever gain bits ({@link BloomLayer}). Thread-safe.
 */
public final class Mirror implements AutoCloseable {
  /** The filter and its hash: replaced together, whole, on every attach. */
  record Copy(WindowedFilter filter, FilterHash hash) {}

  /** The client's counters of its mirrors ({@link Stats}). */
  static final class Counters {
    final LongAdder answers = new LongAdder();
    final LongAdder grants = new LongAdder();
    final LongAdder attaches = new LongAdder();
    final LongAdder resyncs = new LongAdder();
  }

  private static final long GENESIS_SEQ = 1;

  private final GateClient client;
  private final long zero = System.nanoTime();
  private final MirrorKeeper keeper;

  // What lookups read and the keeper writes.
  /**
   * The sub-lease's end on {@link #clock()}, 0 while none holds (none granted, {@code from_seq} not yet
   * applied, dropped). Stored after the filter changes it covers, loaded before the filter.
   */
  volatile long holdsUntil;
  /** The copy (null until downloaded, and while detached). */
  volatile Copy copy;
  /** The gate's time (unix ms) at the latest grant: the windows live then are the ones consulted. */
  volatile long nowMs;
  /** The seq the copy has applied through. */
  volatile long applied;
  /** The highest seq a local answer may claim as observed, from the latest grant (0: no bound). */
  volatile long observableBound;
  /** The address the stream goes to. */
  volatile String address;
  /** Whether the copy is downloaded and following the gate (it may still hold no sub-lease). */
  volatile boolean attached;
  /** The status the latest stream ended with; null once a download succeeded. */
  volatile StatusRuntimeException lastError;
  /**
   * What a batched lookup's early loads read ({@link WindowedFilter#containsMany}), kept so that the compiler
   * keeps the loads; plain, since no one reads it.
   */
  @SuppressWarnings("unused")
  private long touched;

  Mirror(GateClient client, MirrorOptions options) {
    this.client = client;
    this.keeper = new MirrorKeeper(this, client, options);
    keeper.start();
  }

  /** Nanoseconds since the mirror was made, on the monotonic clock the sub-lease is measured on. */
  long clock() {
    return System.nanoTime() - zero;
  }

  /**
   * Whether {@code key} is absent by the local copy under a live sub-lease: true means ABSENT (basis FILTER),
   * with no call; false means only that the gate must be asked.
   */
  public boolean absentLocally(byte[] key) {
    if (clock() >= holdsUntil) { // the sub-lease first: see the class comment
      return false;
    }
    Copy held = copy;
    return held != null && !held.filter().contains(held.hash().hash(key), nowMs);
  }

  /**
   * {@link #absentLocally(byte[])} for each of {@code keys}, in order, with one reading of the sub-lease and
   * of the clock for them all. The clock is read after the probes, so the answers hold at that later moment
   * too; read once per batch, its fence (the TSC read waits for every load before it) no longer keeps the CPU
   * from overlapping one key's cache miss with the next's. The blocks of 8 keys at a time are loaded before
   * they are probed ({@link WindowedFilter#containsMany}), so that their misses overlap.
   */
  public boolean[] absentLocally(byte[][] keys) {
    boolean[] absent = new boolean[keys.length];
    long until = holdsUntil; // the sub-lease first: see the class comment
    Copy held = copy;
    if (held == null || until == 0) {
      return absent;
    }
    long[] hashes = new long[keys.length];
    for (int i = 0; i < keys.length; i++) {
      hashes[i] = held.hash().hash(keys[i]);
    }
    touched = held.filter().containsMany(hashes, nowMs, absent);
    for (int i = 0; i < absent.length; i++) {
      absent[i] = !absent[i];
    }
    return clock() < until ? absent : new boolean[keys.length];
  }

  /** {@link #absentLocally(byte[])} of {@code key}'s UTF-8 bytes. */
  public boolean absentLocally(String key) {
    return absentLocally(key.getBytes(StandardCharsets.UTF_8));
  }

  /** Whether {@code key} (UTF-8) may exist: a local ABSENT when the copy can say so, else the gate's answer. */
  public Lookup mayExist(String key) {
    return mayExist(key.getBytes(StandardCharsets.UTF_8));
  }

  /** Whether {@code key} may exist: a local ABSENT ({@link Lookup#local}) when the copy can say so, else the
   * gate's answer through the client (coalesced); blocks for at most the client's deadline. */
  public Lookup mayExist(byte[] key) {
    Lookup local = localAnswer(key);
    return local != null ? local : client.mayExist(key);
  }

  /** {@link #mayExist(String)}, asynchronously (a local answer is a completed future). */
  public CompletableFuture<Lookup> mayExistAsync(String key) {
    return mayExistAsync(key.getBytes(StandardCharsets.UTF_8));
  }

  /** {@link #mayExist(byte[])}, asynchronously (a local answer is a completed future). */
  public CompletableFuture<Lookup> mayExistAsync(byte[] key) {
    Lookup local = localAnswer(key);
    return local != null
        ? CompletableFuture.completedFuture(local)
        : client.mayExistAsync(ByteString.copyFrom(key));
  }

  /**
   * The local ABSENT for {@code key}, counted, or null. Its observed seq is what the copy applied, read before
   * the filter (the keeper stores it after the filter changes it covers), so the probe saw every Add through
   * it: read after, it could name an Add applied after the probe, one the answer never saw. And no more than
   * the grant's bound: a replica vouches for its copy of the log only that far, and a seq claimed beyond it
   * could let a RecordAbsent stand over a later Add (a lower one only loses a tombstone).
   */
  private Lookup localAnswer(byte[] key) {
    long seq = applied;
    if (!absentLocally(key)) {
      return null;
    }
    client.lookups.increment();
    client.mirrorCounters.answers.increment();
    long bound = observableBound;
    if (bound != 0 && Long.compareUnsigned(bound, seq) < 0) {
      seq = bound;
    }
    long observed = Long.compareUnsigned(seq, GENESIS_SEQ) < 0 ? GENESIS_SEQ : seq;
    return new Lookup(false, observed, false, address, true);
  }

  /** Whether the copy is downloaded and following the gate (it may still hold no sub-lease). */
  public boolean isAttached() {
    return attached;
  }

  /** Whether a sub-lease holds now: lookups the copy answers ABSENT need no call. */
  public boolean holdsSublease() {
    return clock() < holdsUntil;
  }

  /**
   * Why the mirror is not attached, as the gate said it (PERMISSION_DENIED without the {@code mirror} role,
   * RESOURCE_EXHAUSTED over {@code maxFilterBytes} or {@code max_per_namespace}, FAILED_PRECONDITION with
   * mirrors off, ...): the status its latest stream ended with, or null once a download succeeded.
   */
  public StatusRuntimeException lastError() {
    return lastError;
  }

  /** The bytes the copy holds now (0 while none is downloaded): the mirror's memory. */
  public long filterBytes() {
    Copy held = copy;
    return held == null ? 0 : held.filter().bytes();
  }

  /** The gate client behind it. */
  public GateClient client() {
    return client;
  }

  /** Closes the stream and drops the copy; lookups then go to the gate. The client stays open. */
  @Override
  public void close() {
    keeper.close();
    client.forget(this);
  }
}
