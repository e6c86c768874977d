package io.existencegate.client;

import com.google.protobuf.ByteString;
import io.existencegate.v1.ExistenceGateGrpc;
import io.existencegate.v1.Invalidation;
import io.existencegate.v1.InvalidationCause;
import io.existencegate.v1.SubscribeInvalidationsRequest;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.ForwardingClientCallListener;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.LongAdder;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * The existence gate's read path in front of a source of truth (a database, a cache loader).
 *
 * <pre>{@code
 * GatedReader<User> users = new GatedReader<>(gate, key -> {
 *   User u = db.findUser(key);
 *   return u != null ? SourceRow.found(u) : SourceRow.missing();
 * });
 * Optional<User> user = users.get("user:42"); // empty: the key does not exist
 * }</pre>
 *
 * <p>{@link #get}: a local absence cache hit answers at once; otherwise the (coalesced) lookup: ABSENT
 * answers "does not exist" and is cached; MAY_EXIST reads the source through a per-key single flight, and a
 * key the source lacks is recorded at the gate ({@code RecordAbsent}) and cached when RECORDED. Any gate
 * failure reads the source instead (fail open): a gate outage never makes {@code get} answer "does not
 * exist".
 *
 * <p>A background {@code SubscribeInvalidations} (on its own channel) drops cached absences that became
 * wrong and resumes by seq when it breaks. An absence is cached only if the same subscription was live from
 * before the lookup until the cache write and applied no seq beyond the answer's; applying an invalidation
 * and writing the cache are ordered by one lock.
 */
public final class GatedReader<V> implements AutoCloseable {
  private static final Logger LOG = Logger.getLogger(GatedReader.class.getName());

  /** At most this many keys found while the gate was warming wait to be added (one Add's worth). */
  static final int MAX_PENDING_ADDS = GateClient.MAX_BATCH_KEYS;

  /** What the source of truth says about a key. */
  public enum SourceStatus {
    FOUND,
    /** No such row: recorded as {@link AbsenceKind#MISSING}. */
    MISSING,
    /** The row existed and was deleted: recorded as {@link AbsenceKind#DELETED}. */
    DELETED
  }

  /** One row read from the source: its status and, when found, its value. */
  public record SourceRow<V>(SourceStatus status, V value) {
    public SourceRow {
      Objects.requireNonNull(status);
    }

    public static <V> SourceRow<V> found(V value) {
      return new SourceRow<>(SourceStatus.FOUND, value);
    }

    public static <V> SourceRow<V> missing() {
      return new SourceRow<>(SourceStatus.MISSING, null);
    }

    public static <V> SourceRow<V> deleted() {
      return new SourceRow<>(SourceStatus.DELETED, null);
    }
  }

  /** Reads one key from the source of truth; its exceptions reach {@link #get}'s caller as they are. */
  @FunctionalInterface
  public interface Source<V> {
    SourceRow<V> load(String key) throws Exception;
  }

  /** The reader's options; the defaults are the client contract's. */
  public static final class Options {
    int cacheCapacity = 100_000;
    Duration cacheTtl = Duration.ofSeconds(5);
    boolean subscribe = true;
    Duration reconnectDelay = Duration.ofMillis(200);
    Duration maxReconnectDelay = Duration.ofSeconds(5);

    /** Local absences kept, least recently used dropped first (default 100,000). */
    public Options cacheCapacity(int capacity) {
      if (capacity < 1) {
        throw new IllegalArgumentException("cacheCapacity must be positive");
      }
      this.cacheCapacity = capacity;
      return this;
    }

    /** How long a local absence is trusted (default 5 s). */
    public Options cacheTtl(Duration ttl) {
      this.cacheTtl = Objects.requireNonNull(ttl);
      return this;
    }

    /** Keep the invalidation subscription (default true); false = no local cache at all. */
    public Options subscribe(boolean subscribe) {
      this.subscribe = subscribe;
      return this;
    }

    /** The resubscription backoff: from {@code first} doubling to {@code max} (default 200 ms to 5 s). */
    public Options reconnectDelay(Duration first, Duration max) {
      this.reconnectDelay = Objects.requireNonNull(first);
      this.maxReconnectDelay = Objects.requireNonNull(max);
      return this;
    }
  }

  private final GateClient client;
  private final Source<V> source;
  private final Options options;
  private final ConcurrentHashMap<String, CompletableFuture<Optional<V>>> flights = new ConcurrentHashMap<>();
  private final ScheduledExecutorService scheduler;
  private final CountDownLatch firstLive = new CountDownLatch(1);
  /** Keys found while the gate was warming, added with the next answer that is not. */
  private final Set<String> pendingAdds = ConcurrentHashMap.newKeySet();
  private final AtomicBoolean flushing = new AtomicBoolean();
  /** The subscription's own channels, by address index, made when first used. */
  private final ManagedChannel[] channels;

  private final LongAdder cacheHits = new LongAdder();
  private final LongAdder failOpens = new LongAdder();
  private final LongAdder sourceReads = new LongAdder();
  private final LongAdder absencesRecorded = new LongAdder();
  private final LongAdder invalidations = new LongAdder();
  private final LongAdder resubscribes = new LongAdder();
  private final LongAdder warmingAddsDropped = new LongAdder();

  // Guarded by `lock`: the cache and the subscription's state, so that applying an invalidation and caching
  // an absence are ordered.
  private final Object lock = new Object();
  private final LinkedHashMap<String, Long> absent; // key -> expiry (System.nanoTime), LRU order
  private long cursor; // the last seq applied from the stream
  private boolean live;
  private long epoch; // changes whenever a subscription goes up or down
  private ClientCallStreamObserver<SubscribeInvalidationsRequest> stream;
  private boolean closed;
  private long delayMillis;
  private int addressIndex = -1; // the address of the current (or last) subscription
  private boolean subscribedOnce;

  /** A reader with the default options. */
  public GatedReader(GateClient client, Source<V> source) {
    this(client, source, new Options());
  }

  /** A reader; the subscription starts at once (see {@link #awaitLive}). */
  public GatedReader(GateClient client, Source<V> source, Options options) {
    this.client = Objects.requireNonNull(client);
    this.source = Objects.requireNonNull(source);
    this.options = Objects.requireNonNull(options);
    this.channels = new ManagedChannel[client.addresses().size()];
    this.delayMillis = options.reconnectDelay.toMillis();
    int capacity = options.cacheCapacity;
    this.absent =
        new LinkedHashMap<>(16, 0.75f, true) {
          private static final long serialVersionUID = 1L;

          @Override
          protected boolean removeEldestEntry(Map.Entry<String, Long> eldest) {
            return size() > capacity;
          }
        };
    this.scheduler =
        Executors.newSingleThreadScheduledExecutor(
            r -> {
              Thread t = new Thread(r, "existence-gate-invalidations");
              t.setDaemon(true);
              return t;
            });
    if (options.subscribe) {
      scheduler.execute(this::subscribe);
    }
  }

  /**
   * Waits up to {@code timeout} for the subscription to be live (absences are cached only while it is);
   * reads work either way. False on timeout or when subscribing is off.
   */
  public boolean awaitLive(Duration timeout) throws InterruptedException {
    return options.subscribe && firstLive.await(timeout.toNanos(), TimeUnit.NANOSECONDS);
  }

  /** The source's value of {@code key}, or empty when it does not exist (or was deleted). */
  public Optional<V> get(String key) throws Exception {
    long epochBefore = 0;
    boolean liveBefore = false;
    if (options.subscribe) {
      synchronized (lock) {
        Long expiry = absent.get(key);
        if (expiry != null && expiry - System.nanoTime() > 0) {
          cacheHits.increment();
          return Optional.empty();
        }
        if (expiry != null) {
          absent.remove(key);
        }
        epochBefore = epoch;
        liveBefore = live;
      }
    }
    Lookup answer;
    try {
      answer = client.mayExist(key);
    } catch (RuntimeException e) {
      // Fail open: without the gate every read goes to the source.
      failOpens.increment();
      LOG.log(Level.FINE, "lookup of {0} failed ({1}); reading the source",
          new Object[] {key, Status.fromThrowable(e).getCode()});
      answer = null;
    }
    if (answer != null && !answer.warming() && !pendingAdds.isEmpty()) {
      flushPendingAdds();
    }
    if (answer != null && !answer.mayExist()) {
      if (liveBefore) {
        rememberAbsent(key, answer.observedSeq(), epochBefore);
      }
      return Optional.empty();
    }
    Lookup lookup = answer;
    long epochAtLookup = epochBefore;
    boolean liveAtLookup = liveBefore;
    return singleFlight(key, () -> loadAndReport(key, lookup, epochAtLookup, liveAtLookup));
  }

  /**
   * Reads the source for {@code key} as {@link #get} does once a lookup answered {@code lookup} (MAY_EXIST),
   * without caching anything locally: records an absence at the gate, or queues the key for an Add when the
   * answer was warming. For tools and self-checks that hold such an answer.
   */
  public Optional<V> readSource(String key, Lookup lookup) throws Exception {
    return singleFlight(key, () -> loadAndReport(key, lookup, 0, false));
  }

  /**
   * The writer's helper: {@code Add}s the keys (UTF-8) before the rows are inserted, returning the Add's
   * seq. Errors are raised: a writer that cannot Add must not insert.
   */
  public long add(Collection<String> keys) {
    return client.add(keys);
  }

  private interface Load<T> {
    T call() throws Exception;
  }

  /** One load per key at a time; concurrent callers of the key share its result or error. */
  private Optional<V> singleFlight(String key, Load<Optional<V>> load) throws Exception {
    CompletableFuture<Optional<V>> mine = new CompletableFuture<>();
    CompletableFuture<Optional<V>> running = flights.putIfAbsent(key, mine);
    if (running != null) {
      try {
        return running.get();
      } catch (ExecutionException e) {
        throw e.getCause() instanceof Exception cause ? cause : e;
      }
    }
    try {
      Optional<V> value = load.call();
      mine.complete(value);
      return value;
    } catch (Exception e) {
      mine.completeExceptionally(e);
      throw e;
    } catch (Error e) {
      mine.completeExceptionally(e);
      throw e;
    } finally {
      flights.remove(key, mine);
    }
  }

  /** Reads the source for a key the gate passed ({@code lookup} null: the gate failed) and reports it. */
  private Optional<V> loadAndReport(String key, Lookup lookup, long epochBefore, boolean liveBefore)
      throws Exception {
    sourceReads.increment();
    SourceRow<V> row = source.load(key);
    if (row.status() == SourceStatus.FOUND) {
      if (lookup != null && lookup.warming()) {
        // A gate still loading may not know this key, and refuses writes until it is ready.
        if (pendingAdds.size() < MAX_PENDING_ADDS) {
          pendingAdds.add(key);
        } else {
          warmingAddsDropped.increment();
        }
      }
      return Optional.ofNullable(row.value());
    }
    if (lookup != null) {
      AbsenceKind kind = row.status() == SourceStatus.DELETED ? AbsenceKind.DELETED : AbsenceKind.MISSING;
      try {
        RecordResult recorded = client.recordAbsent(key, kind, lookup.observedSeq(), lookup.address());
        if (recorded.outcome() == RecordOutcome.RECORDED) {
          absencesRecorded.increment();
          if (liveBefore) {
            rememberAbsent(key, recorded.seq(), epochBefore);
          }
        }
        // REDUNDANT, SUPERSEDED (an Add raced this read), THROTTLED: nothing stored, nothing cached.
      } catch (StatusRuntimeException e) {
        // INVALID_ARGUMENT (an observed_seq ahead of a lagging replica) and every other failure: nothing
        // cached, the answer stands.
        LOG.log(Level.FINE, "RecordAbsent of {0} failed: {1}", new Object[] {key, e.getStatus()});
      }
    }
    return Optional.empty();
  }

  /** Adds the keys found while the gate was warming, in the background. */
  private void flushPendingAdds() {
    if (!flushing.compareAndSet(false, true)) {
      return;
    }
    List<String> keys = new ArrayList<>();
    for (String key : pendingAdds) {
      if (pendingAdds.remove(key)) {
        keys.add(key);
      }
    }
    if (keys.isEmpty()) {
      flushing.set(false);
      return;
    }
    client
        .addAsync(keys)
        .whenComplete(
            (seq, error) -> {
              if (error != null) {
                Status status = Status.fromThrowable(error);
                LOG.log(Level.WARNING, "Add of {0} keys found while the gate was warming failed: {1}",
                    new Object[] {keys.size(), status});
                if (status.getCode() == Status.Code.UNAVAILABLE
                    || status.getCode() == Status.Code.DEADLINE_EXCEEDED
                    || status.getCode() == Status.Code.FAILED_PRECONDITION) {
                  for (String key : keys) {
                    if (pendingAdds.size() < MAX_PENDING_ADDS) {
                      pendingAdds.add(key);
                    } else {
                      warmingAddsDropped.increment();
                    }
                  }
                }
              }
              flushing.set(false);
            });
  }

  private void rememberAbsent(String key, long seq, long epochBefore) {
    synchronized (lock) {
      // Only if the same live subscription covers everything after `seq`: otherwise an invalidation of this
      // key may already have been applied (or missed), and the entry could outlive the key's absence.
      if (live && epoch == epochBefore && cursor <= seq) {
        absent.put(key, System.nanoTime() + options.cacheTtl.toNanos());
      }
    }
  }

  /** Whether {@code key} is in the local absence cache (and not expired). */
  public boolean isCachedAbsent(String key) {
    synchronized (lock) {
      Long expiry = absent.get(key);
      return expiry != null && expiry - System.nanoTime() > 0;
    }
  }

  /** Whether the invalidation subscription is live now. */
  public boolean isLive() {
    synchronized (lock) {
      return live;
    }
  }

  /**
   * Applies an invalidation as the subscription does: drops the cached absences of its keys (all of them
   * for RESYNC). For tools and self-checks; the subscription calls it for every message.
   */
  public void applyInvalidation(Invalidation invalidation) {
    boolean resync = invalidation.getCause() == InvalidationCause.INVALIDATION_CAUSE_RESYNC;
    synchronized (lock) {
      if (resync) {
        absent.clear();
      } else {
        for (ByteString key : invalidation.getKeysList()) {
          absent.remove(GateClient.utf8(key));
        }
      }
      // A RESYNC carries the namespace's latest seq and the stream continues after it (lower than the
      // cursor when resuming on a gate behind the last one); ADDED seqs only grow.
      cursor = resync ? invalidation.getSeq() : Math.max(cursor, invalidation.getSeq());
    }
    invalidations.add(resync ? 1 : invalidation.getKeysCount());
  }

  /** Ends the current subscription stream; the reader resumes from its last seq, as after any drop. */
  public void resubscribe() {
    ClientCallStreamObserver<SubscribeInvalidationsRequest> current;
    synchronized (lock) {
      current = stream;
    }
    if (current != null) {
      current.cancel("resubscribing", null);
    }
  }

  /** The reader's counters and its client's. */
  public Stats stats() {
    Stats c = client.stats();
    return new Stats(
        c.lookups(),
        c.gateCalls(),
        c.batchedKeys(),
        c.retries(),
        cacheHits.sum(),
        failOpens.sum(),
        sourceReads.sum(),
        absencesRecorded.sum(),
        invalidations.sum(),
        resubscribes.sum(),
        warmingAddsDropped.sum(),
        c.mirrorAnswers(),
        c.mirrorGrants(),
        c.mirrorAttaches(),
        c.mirrorResyncs());
  }

  /** Ends the subscription and closes its channels (not the client's: close the client too). */
  @Override
  public void close() {
    ClientCallStreamObserver<SubscribeInvalidationsRequest> current;
    synchronized (lock) {
      closed = true;
      current = stream;
    }
    if (current != null) {
      current.cancel("reader closed", null);
    }
    scheduler.shutdownNow();
    synchronized (channels) {
      for (ManagedChannel channel : channels) {
        if (channel != null) {
          channel.shutdownNow();
        }
      }
    }
  }

  // ------------------------------------------------------------------------------------------------------
  // The subscription.

  private ManagedChannel channel(int index) {
    synchronized (channels) {
      if (channels[index] == null) {
        channels[index] = client.newChannel(client.addresses().get(index));
      }
      return channels[index];
    }
  }

  private void subscribe() {
    long afterSeq;
    int index;
    synchronized (lock) {
      if (closed) {
        return;
      }
      afterSeq = cursor;
      addressIndex = (addressIndex + 1) % channels.length; // each new subscription on the next address
      index = addressIndex;
      if (subscribedOnce) {
        resubscribes.increment();
      }
      subscribedOnce = true;
    }
    SubscribeInvalidationsRequest request =
        SubscribeInvalidationsRequest.newBuilder()
            .setNamespace(client.namespace())
            .setAfterSeq(afterSeq)
            .build();
    // The server sends headers once it has registered the subscription: from then on the stream is live.
    ExistenceGateGrpc.newStub(channel(index))
        .withInterceptors(new OnHeaders(() -> wentLive(afterSeq == 0)))
        .subscribeInvalidations(
            request,
            new ClientResponseObserver<SubscribeInvalidationsRequest, Invalidation>() {
              @Override
              public void beforeStart(ClientCallStreamObserver<SubscribeInvalidationsRequest> requestStream) {
                synchronized (lock) {
                  stream = requestStream;
                }
              }

              @Override
              public void onNext(Invalidation invalidation) {
                applyInvalidation(invalidation);
              }

              @Override
              public void onError(Throwable error) {
                wentDown(Status.fromThrowable(error).toString());
              }

              @Override
              public void onCompleted() {
                wentDown("completed");
              }
            });
  }

  private void wentLive(boolean fromNow) {
    synchronized (lock) {
      if (fromNow) {
        // Subscribed "from now on": whatever happened while no stream was up is unknown.
        absent.clear();
      }
      live = true;
      epoch++;
      delayMillis = options.reconnectDelay.toMillis();
    }
    firstLive.countDown();
  }

  private void wentDown(String why) {
    long delay;
    long after;
    synchronized (lock) {
      live = false;
      epoch++;
      stream = null;
      if (closed) {
        return;
      }
      delay = delayMillis;
      delayMillis = Math.min(delayMillis * 2, options.maxReconnectDelay.toMillis());
      after = cursor;
    }
    LOG.log(Level.FINE, "invalidation stream ended ({0}); resubscribing after seq {1} in {2} ms",
        new Object[] {why, after, delay});
    try {
      scheduler.schedule(this::subscribe, delay, TimeUnit.MILLISECONDS);
    } catch (RejectedExecutionException e) {
      // closed meanwhile
    }
  }

  /** Calls {@code onHeaders} when a call's response headers arrive. */
  private static final class OnHeaders implements ClientInterceptor {
    private final Runnable onHeaders;

    OnHeaders(Runnable onHeaders) {
      this.onHeaders = onHeaders;
    }

    @Override
    public <ReqT, RespT> ClientCall<ReqT, RespT> interceptCall(
        MethodDescriptor<ReqT, RespT> method, CallOptions callOptions, Channel next) {
      return new ForwardingClientCall.SimpleForwardingClientCall<ReqT, RespT>(next.newCall(method, callOptions)) {
        @Override
        public void start(Listener<RespT> listener, Metadata headers) {
          super.start(
              new ForwardingClientCallListener.SimpleForwardingClientCallListener<RespT>(listener) {
                @Override
                public void onHeaders(Metadata responseHeaders) {
                  onHeaders.run();
                  super.onHeaders(responseHeaders);
                }
              },
              headers);
        }
      };
    }
  }
}
