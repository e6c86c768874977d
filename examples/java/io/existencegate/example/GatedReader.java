package io.existencegate.example;

import com.google.protobuf.ByteString;
import io.existencegate.v1.AbsenceKind;
import io.existencegate.v1.AddRequest;
import io.existencegate.v1.Answer;
import io.existencegate.v1.Basis;
import io.existencegate.v1.ExistenceGateGrpc;
import io.existencegate.v1.Invalidation;
import io.existencegate.v1.InvalidationCause;
import io.existencegate.v1.MayExistRequest;
import io.existencegate.v1.MayExistResponse;
import io.existencegate.v1.RecordAbsentRequest;
import io.existencegate.v1.RecordAbsentResponse;
import io.existencegate.v1.RecordOutcome;
import io.existencegate.v1.SubscribeInvalidationsRequest;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.ForwardingClientCallListener;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.LongAdder;
import java.util.logging.Logger;

/**
 * The recommended existence-gate read path for Java services (grpc-java).
 *
 * <pre>{@code
 * GatedReader<User> reader = new GatedReader<>(channel, "users", db::loadUser, new GatedReader.Options());
 * reader.start(Duration.ofSeconds(10)); // subscribe first: absences are cached only while it is live
 * Optional<User> user = reader.get("user:42"); // empty when the key does not exist
 * }</pre>
 *
 * <p>{@link #get}:
 *
 * <ol>
 *   <li>a local, bounded, short-TTL cache of absences: a hit means "does not exist", no call at all;
 *   <li>{@code MayExist}: ABSENT means "does not exist" (and is cached locally);
 *   <li>MAY_EXIST: read the source through a per-key single flight, so a burst of reads of one key costs one
 *       source read; found: return it (and {@code Add} it if the gate did not know it: it answered WARMING,
 *       i.e. it was still loading and refuses writes until it is done, so the key is added with the first
 *       answer that is not WARMING); not found: {@code RecordAbsent(kind, observed_seq)}, and when the gate RECORDED it cache
 *       it locally too;
 *   <li>a background {@code SubscribeInvalidations} drops cached absences on ADDED, clears them all on
 *       RESYNC, and reconnects with {@code after_seq} = the last seq seen, so no Add is missed across a
 *       reconnect.
 * </ol>
 *
 * <p>The gate is an optimisation, never a dependency: when it cannot be reached the reader goes to the
 * source.
 *
 * <p>A local absence is cached only when no invalidation of the key can have been applied before the entry is
 * written: the same subscription must be live from before the MayExist until the write, and must not have
 * applied any seq past the one the answer was computed at.
 */
public final class GatedReader<V> implements AutoCloseable {
  private static final Logger LOG = Logger.getLogger(GatedReader.class.getName());

  /** At most this many keys found while the gate was warming wait to be added (one Add call's worth). */
  private static final int MAX_PENDING_ADDS = 10_000;

  /** What the source of truth says about a key. */
  public enum SourceStatus {
    FOUND,
    /** No such row: recorded as ABSENCE_KIND_MISSING. */
    MISSING,
    /** The row existed and was deleted: recorded as ABSENCE_KIND_DELETED. */
    DELETED
  }

  /** One row read from the source: its status and, when found, its value. */
  public record SourceRow<V>(SourceStatus status, V value) {
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

  /** Reads one key from the source of truth. */
  @FunctionalInterface
  public interface Source<V> {
    SourceRow<V> load(String key) throws Exception;
  }

  /** Tuning; the defaults suit most services. */
  public static final class Options {
    public int cacheSize = 100_000;
    public Duration cacheTtl = Duration.ofSeconds(5);
    public Duration callTimeout = Duration.ofMillis(500);
    public Duration reconnectDelay = Duration.ofMillis(200);
    public Duration maxReconnectDelay = Duration.ofSeconds(5);
  }

  private final String namespace;
  private final Source<V> source;
  private final Options options;
  private final ExistenceGateGrpc.ExistenceGateBlockingStub blocking;
  private final ExistenceGateGrpc.ExistenceGateStub async;
  private final ConcurrentHashMap<String, CompletableFuture<Optional<V>>> flights = new ConcurrentHashMap<>();
  private final ConcurrentHashMap<String, LongAdder> stats = new ConcurrentHashMap<>();
  private final ScheduledExecutorService scheduler =
      Executors.newSingleThreadScheduledExecutor(
          r -> {
            Thread t = new Thread(r, "existence-invalidations");
            t.setDaemon(true);
            return t;
          });
  private final CountDownLatch ready = new CountDownLatch(1);
  // Keys found while the gate was warming, added once it is ready.
  private final Set<String> pendingAdds = ConcurrentHashMap.newKeySet();

  // Guarded by `lock`: the cache and the subscription state, so that applying an invalidation and caching an
  // absence are ordered.
  private final Object lock = new Object();
  private final LinkedHashMap<String, Long> absent; // key -> expiry (System.nanoTime), in LRU order
  private long cursor; // the last seq applied from the stream
  private boolean live;
  private long epoch; // changes whenever the subscription goes up or down
  private ClientCallStreamObserver<SubscribeInvalidationsRequest> stream;
  private boolean closed;
  private long delayMillis;

  public GatedReader(Channel channel, String namespace, Source<V> source, Options options) {
    this.namespace = namespace;
    this.source = source;
    this.options = options;
    this.blocking = ExistenceGateGrpc.newBlockingStub(channel);
    this.async = ExistenceGateGrpc.newStub(channel);
    this.delayMillis = options.reconnectDelay.toMillis();
    this.absent =
        new LinkedHashMap<>(16, 0.75f, true) {
          @Override
          protected boolean removeEldestEntry(Map.Entry<String, Long> eldest) {
            return size() > options.cacheSize;
          }
        };
  }

  /**
   * Starts the invalidation subscription and waits up to {@code timeout} for it to be live. Reads work either
   * way; absences are cached only while it is live.
   */
  public boolean start(Duration timeout) throws InterruptedException {
    scheduler.execute(this::subscribe);
    return ready.await(timeout.toMillis(), TimeUnit.MILLISECONDS);
  }

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
  }

  /** The source's value of {@code key}, or empty when it does not exist (or was deleted). */
  public Optional<V> get(String key) throws Exception {
    long epochBefore;
    boolean liveBefore;
    synchronized (lock) {
      Long expiry = absent.get(key);
      if (expiry != null && expiry - System.nanoTime() > 0) {
        count("local_hits");
        return Optional.empty();
      }
      if (expiry != null) {
        absent.remove(key);
      }
      epochBefore = epoch;
      liveBefore = live;
    }
    MayExistResponse reply;
    try {
      reply = withDeadline().mayExist(
          MayExistRequest.newBuilder().setNamespace(namespace).setKey(ByteString.copyFromUtf8(key)).build());
      count("gate_calls");
      if (reply.getBasis() != Basis.BASIS_WARMING && !pendingAdds.isEmpty()) {
        flushPendingAdds();
      }
    } catch (StatusRuntimeException e) {
      // Fail open: without the gate every read goes to the source.
      count("gate_errors");
      LOG.warning("MayExist(" + key + ") failed (" + e.getStatus().getCode() + "); reading the source");
      reply = null;
    }
    if (reply != null && reply.getAnswer() == Answer.ANSWER_ABSENT) {
      count("gate_absent");
      if (liveBefore) {
        rememberAbsent(key, reply.getObservedSeq(), epochBefore);
      }
      return Optional.empty();
    }
    MayExistResponse answer = reply;
    return singleFlight(key, () -> loadAndReport(key, answer, epochBefore, liveBefore));
  }

  private interface Load<T> {
    T call() throws Exception;
  }

  /** Runs one load per key at a time; concurrent callers of the same key share its result. */
  private Optional<V> singleFlight(String key, Load<Optional<V>> load) throws Exception {
    CompletableFuture<Optional<V>> mine = new CompletableFuture<>();
    CompletableFuture<Optional<V>> running = flights.putIfAbsent(key, mine);
    if (running != null) {
      try {
        return running.get();
      } catch (ExecutionException e) {
        throw e.getCause() instanceof Exception ? (Exception) e.getCause() : e;
      }
    }
    try {
      Optional<V> value = load.call();
      mine.complete(value);
      return value;
    } catch (Exception e) {
      mine.completeExceptionally(e);
      throw e;
    } finally {
      flights.remove(key, mine);
    }
  }

  /**
   * Reads the source for a key the gate passed ({@code reply} is null when the gate could not be asked) and
   * tells the gate what it found.
   */
  Optional<V> loadAndReport(String key, MayExistResponse reply, long epochBefore, boolean liveBefore)
      throws Exception {
    count("source_reads");
    SourceRow<V> row = source.load(key);
    if (row.status() != SourceStatus.FOUND) {
      if (reply != null) {
        AbsenceKind kind =
            row.status() == SourceStatus.DELETED
                ? AbsenceKind.ABSENCE_KIND_DELETED
                : AbsenceKind.ABSENCE_KIND_MISSING;
        try {
          RecordAbsentResponse recorded =
              withDeadline()
                  .recordAbsent(
                      RecordAbsentRequest.newBuilder()
                          .setNamespace(namespace)
                          .setKey(ByteString.copyFromUtf8(key))
                          .setKind(kind)
                          .setObservedSeq(reply.getObservedSeq())
                          .build());
          if (recorded.getOutcome() == RecordOutcome.RECORD_OUTCOME_RECORDED) {
            count("absences_recorded");
            if (liveBefore) {
              rememberAbsent(key, recorded.getSeq(), epochBefore);
            }
          } else {
            // REDUNDANT, SUPERSEDED (an Add raced this read), THROTTLED: nothing stored.
            count("absences_not_stored");
          }
        } catch (StatusRuntimeException e) {
          count("gate_errors");
          LOG.warning("RecordAbsent(" + key + ") failed: " + e.getStatus().getCode());
        }
      }
      return Optional.empty();
    }
    if (reply != null && reply.getBasis() == Basis.BASIS_WARMING && pendingAdds.size() < MAX_PENDING_ADDS) {
      // The gate is still loading and may not know this key; it refuses writes until it is ready.
      pendingAdds.add(key);
    }
    return Optional.ofNullable(row.value());
  }

  /** Adds the keys found while the gate was warming, in one call. */
  private void flushPendingAdds() {
    List<String> keys = new ArrayList<>();
    for (String key : pendingAdds) {
      if (pendingAdds.remove(key)) {
        keys.add(key);
      }
    }
    if (keys.isEmpty()) {
      return;
    }
    AddRequest.Builder request = AddRequest.newBuilder().setNamespace(namespace);
    keys.forEach(key -> request.addKeys(ByteString.copyFromUtf8(key)));
    try {
      withDeadline().add(request.build());
      stats.computeIfAbsent("adds", n -> new LongAdder()).add(keys.size());
    } catch (StatusRuntimeException e) {
      count("gate_errors");
      LOG.warning(
          "Add of " + keys.size() + " keys found while the gate was warming failed: " + e.getStatus().getCode());
      if (e.getStatus().getCode() == Status.Code.UNAVAILABLE) {
        for (String key : keys) {
          if (pendingAdds.size() < MAX_PENDING_ADDS) {
            pendingAdds.add(key);
          }
        }
      }
    }
  }

  private ExistenceGateGrpc.ExistenceGateBlockingStub withDeadline() {
    return blocking.withDeadlineAfter(options.callTimeout.toMillis(), TimeUnit.MILLISECONDS);
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

  /** Whether {@code key} is in the local absence cache. */
  public boolean isCachedAbsent(String key) {
    synchronized (lock) {
      Long expiry = absent.get(key);
      return expiry != null && expiry - System.nanoTime() > 0;
    }
  }

  /** Drops the cached absences an invalidation makes wrong (all of them for RESYNC). */
  public void applyInvalidation(Invalidation invalidation) {
    boolean resync = invalidation.getCause() == InvalidationCause.INVALIDATION_CAUSE_RESYNC;
    synchronized (lock) {
      if (resync) {
        absent.clear();
      } else {
        for (ByteString key : invalidation.getKeysList()) {
          absent.remove(key.toStringUtf8());
        }
      }
      cursor = Math.max(cursor, invalidation.getSeq());
    }
    count(resync ? "resyncs" : "invalidations");
  }

  /** Ends the current subscription stream; the reader reconnects from its last seq, as after any drop. */
  public void resubscribe() {
    ClientCallStreamObserver<SubscribeInvalidationsRequest> current;
    synchronized (lock) {
      current = stream;
    }
    if (current != null) {
      current.cancel("resubscribing", null);
    }
  }

  /** What the reader did, by counter name. */
  public Map<String, Long> stats() {
    Map<String, Long> out = new TreeMap<>();
    stats.forEach((name, adder) -> out.put(name, adder.sum()));
    return out;
  }

  public long stat(String name) {
    LongAdder adder = stats.get(name);
    return adder == null ? 0 : adder.sum();
  }

  private void count(String name) {
    stats.computeIfAbsent(name, n -> new LongAdder()).increment();
  }

  private void subscribe() {
    long afterSeq;
    synchronized (lock) {
      if (closed) {
        return;
      }
      afterSeq = cursor;
    }
    SubscribeInvalidationsRequest request =
        SubscribeInvalidationsRequest.newBuilder().setNamespace(namespace).setAfterSeq(afterSeq).build();
    // The server sends headers once it has registered the subscription: from then on the stream is live.
    async
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
                wentDown(Status.fromThrowable(error).getCode().toString());
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
    count("subscriptions");
    ready.countDown();
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
    LOG.info("invalidation stream ended (" + why + "); resubscribing after seq " + after);
    scheduler.schedule(this::subscribe, delay, TimeUnit.MILLISECONDS);
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
