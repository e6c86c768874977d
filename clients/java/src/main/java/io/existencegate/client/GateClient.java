package io.existencegate.client;

import com.google.protobuf.ByteString;
import com.google.protobuf.CodedOutputStream;
import io.existencegate.v1.AddRequest;
import io.existencegate.v1.AddResponse;
import io.existencegate.v1.Answer;
import io.existencegate.v1.BatchMayExistRequest;
import io.existencegate.v1.BatchMayExistResponse;
import io.existencegate.v1.Basis;
import io.existencegate.v1.ExistenceGateGrpc;
import io.existencegate.v1.MayExistRequest;
import io.existencegate.v1.MayExistResponse;
import io.existencegate.v1.RecordAbsentRequest;
import io.existencegate.v1.RecordAbsentResponse;
import io.grpc.ChannelCredentials;
import io.grpc.Context;
import io.grpc.Contexts;
import io.grpc.Deadline;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusException;
import io.grpc.StatusRuntimeException;
import io.grpc.TlsChannelCredentials;
import io.grpc.stub.MetadataUtils;
import io.grpc.stub.StreamObserver;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.LongAdder;

/**
 * The existence gate's calls for one namespace, with single-key lookups coalesced into packed
 * {@code BatchMayExist} calls.
 *
 * <pre>{@code
 * try (GateClient gate = GateClient.builder("10.0.0.1:50051", "10.0.0.2:50051").namespace("users").build()) {
 *   Lookup answer = gate.mayExist("user:42"); // blocking; mayExistAsync returns a CompletableFuture
 *   if (!answer.mayExist()) { ... the key does not exist ... }
 * }
 * }</pre>
 *
 * <p>Thread-safe: one client is meant to be shared by every thread of a service. Errors are the gRPC status,
 * unchanged, as a {@link StatusRuntimeException} (thrown by the blocking calls, completing the futures of the
 * asynchronous ones).
 */
public final class GateClient implements AutoCloseable {
  /** Default of {@link Builder#coalesceWindow}: 200 µs. */
  public static final Duration DEFAULT_COALESCE_WINDOW = Duration.ofNanos(200_000);
  /** Default of {@link Builder#coalesceMaxKeys}. */
  public static final int DEFAULT_COALESCE_MAX_KEYS = 1024;
  /** Default of {@link Builder#deadline}: 500 ms per call, retries included. */
  public static final Duration DEFAULT_DEADLINE = Duration.ofMillis(500);
  /** The server's default {@code max_batch_keys}: {@link #mayExistMany} and {@link #add} split there. */
  public static final int MAX_BATCH_KEYS = 10_000;
  /** The server's default {@code max_key_bytes}; longer (and empty) keys are not coalesced (see below). */
  static final int MAX_KEY_BYTES = 1_024;

  /** Starts a client of the given gate addresses ({@code host:port}, replicas of one deployment). */
  public static Builder builder(String... addresses) {
    return new Builder(List.of(addresses));
  }

  /** Starts a client of the given gate addresses ({@code host:port}, replicas of one deployment). */
  public static Builder builder(List<String> addresses) {
    return new Builder(List.copyOf(addresses));
  }

  /** Options; every one has the default of the client contract. */
  public static final class Builder {
    private final List<String> addresses;
    private String namespace = "";
    private Duration coalesceWindow = DEFAULT_COALESCE_WINDOW;
    private int coalesceMaxKeys = DEFAULT_COALESCE_MAX_KEYS;
    private Duration deadline = DEFAULT_DEADLINE;
    private AddressPolicy addressPolicy = AddressPolicy.ROUND_ROBIN;
    private String token;
    private boolean plaintext = true;
    private ChannelCredentials credentials;
    private String authority;

    private Builder(List<String> addresses) {
      if (addresses.isEmpty()) {
        throw new IllegalArgumentException("at least one gate address is needed");
      }
      this.addresses = addresses;
    }

    /** The namespace every call uses; {@code ""} (the default) is the server's {@code default}. */
    public Builder namespace(String namespace) {
      this.namespace = Objects.requireNonNull(namespace);
      return this;
    }

    /**
     * The longest a lookup waits for others to share its batch (default 200 µs), and only while another
     * coalesced batch is in flight: with none in flight it leaves at once. Zero turns coalescing off (each
     * lookup is a unary {@code MayExist}).
     */
    public Builder coalesceWindow(Duration window) {
      if (window.isNegative()) {
        throw new IllegalArgumentException("coalesceWindow must not be negative");
      }
      this.coalesceWindow = window;
      return this;
    }

    /** A batch is sent as soon as it holds this many keys (default 1,024; at most 10,000). */
    public Builder coalesceMaxKeys(int maxKeys) {
      if (maxKeys < 1 || maxKeys > MAX_BATCH_KEYS) {
        throw new IllegalArgumentException("coalesceMaxKeys must be 1 to " + MAX_BATCH_KEYS);
      }
      this.coalesceMaxKeys = maxKeys;
      return this;
    }

    /** The deadline of each call, retries included (default 500 ms). */
    public Builder deadline(Duration deadline) {
      if (deadline.isNegative() || deadline.isZero()) {
        throw new IllegalArgumentException("deadline must be positive");
      }
      this.deadline = deadline;
      return this;
    }

    /** Round robin (default) or pick first. */
    public Builder addressPolicy(AddressPolicy policy) {
      this.addressPolicy = Objects.requireNonNull(policy);
      return this;
    }

    /** Sent as {@code authorization: Bearer <token>} on every call (default: none). */
    public Builder token(String token) {
      this.token = token;
      return this;
    }

    /**
     * Plaintext connections (default true). False uses TLS with the JVM's trust store and no client
     * certificate ({@code TlsChannelCredentials.create()}); {@link #credentials} says more.
     */
    public Builder plaintext(boolean plaintext) {
      this.plaintext = plaintext;
      return this;
    }

    /**
     * The channel credentials of every connection (default: none, see {@link #plaintext}); when set, they
     * win over {@link #plaintext}. For TLS with a private CA and a client certificate (mutual TLS):
     * {@code TlsChannelCredentials.newBuilder().trustManager(caPem).keyManager(certPem, keyPem).build()}.
     */
    public Builder credentials(ChannelCredentials credentials) {
      this.credentials = Objects.requireNonNull(credentials);
      return this;
    }

    /**
     * The name the server's certificate must carry (and the {@code :authority} sent), instead of each
     * address's host; for example {@code "localhost"} when connecting to {@code 127.0.0.1:PORT} with a
     * certificate for {@code localhost}. Default: none (the address's host).
     */
    public Builder authority(String authority) {
      this.authority = Objects.requireNonNull(authority);
      return this;
    }

    public GateClient build() {
      return new GateClient(this);
    }
  }

  /**
   * A caller waiting for a coalesced batch: one key ({@link #mayExist}) or a part of {@link #mayExistMany}. A
   * batch takes whole waiters and never splits one.
   */
  private static final class Waiter {
    final List<ByteString> keys;
    /** Completed with this waiter's part of the batch's answer, or the batch's status. */
    final CompletableFuture<Share> share = new CompletableFuture<>();
    /** Done once the caller has its answer or gave up (deadline, cancellation): then it is left out. */
    final CompletableFuture<?> caller;
    final Deadline deadline;
    final long arrived = System.nanoTime();

    Waiter(List<ByteString> keys, CompletableFuture<?> caller, Deadline deadline) {
      this.keys = keys;
      this.caller = caller == null ? share : caller;
      this.deadline = deadline;
    }
  }

  /** What {@link #holdBatch} returns; closing it answers the pretend batch. */
  interface Hold extends AutoCloseable {
    @Override
    void close();
  }

  /** A waiter's part of a batch's answer: its keys are bits {@code offset..} of the response's bitmap. */
  record Share(BatchMayExistResponse response, int offset, String address) {}

  private final List<String> addresses;
  private final String namespace;
  private final long windowNanos;
  private final int maxKeys;
  private final Duration deadline;
  private final String token;
  private final boolean plaintext;
  private final ChannelCredentials credentials;
  private final String authority;
  private final List<ManagedChannel> channels = new ArrayList<>();
  /** Where each call's attempts go, and its retries. */
  private final AddressRouter router;
  /** Batch windows and per-caller deadlines. */
  private final ScheduledThreadPoolExecutor timers;

  private final Object batchLock = new Object();
  /** Callers waiting for a batch, oldest first. Guarded by batchLock, like the next three. */
  private final ArrayDeque<Waiter> waiting = new ArrayDeque<>();
  /** Keys of all waiters. */
  private int waitingKeys;
  /** Coalesced batches sent and not yet answered. */
  private int inFlight;
  /** Fires when the oldest waiter's window ends (null when none is scheduled). */
  private ScheduledFuture<?> windowTimer;
  private volatile boolean closed;

  /** Lookups asked, local answers of its mirrors included. */
  final LongAdder lookups = new LongAdder();
  final Mirror.Counters mirrorCounters = new Mirror.Counters();
  /** The mirrors open on this client, closed with it. */
  private final List<Mirror> mirrors = new CopyOnWriteArrayList<>();
  private final LongAdder gateCalls = new LongAdder();
  private final LongAdder batchedKeys = new LongAdder();

  private GateClient(Builder b) {
    this.addresses = b.addresses;
    this.namespace = b.namespace;
    this.windowNanos = b.coalesceWindow.toNanos();
    this.maxKeys = b.coalesceMaxKeys;
    this.deadline = b.deadline;
    this.token = b.token;
    this.plaintext = b.plaintext;
    this.credentials = b.credentials;
    this.authority = b.authority;
    List<ExistenceGateGrpc.ExistenceGateStub> stubs = new ArrayList<>();
    for (String address : addresses) {
      ManagedChannel channel = newChannel(address);
      channels.add(channel);
      stubs.add(ExistenceGateGrpc.newStub(channel));
    }
    this.router = new AddressRouter(addresses, b.addressPolicy, stubs, () -> closed);
    this.timers =
        new ScheduledThreadPoolExecutor(
            1,
            r -> {
              Thread t = new Thread(r, "existence-gate-client-timers");
              t.setDaemon(true);
              return t;
            });
    timers.setRemoveOnCancelPolicy(true);
  }

  /** The namespace every call uses. */
  public String namespace() {
    return namespace;
  }

  /** The gate addresses, in the order given. */
  public List<String> addresses() {
    return addresses;
  }

  /** The deadline of each call. */
  public Duration deadline() {
    return deadline;
  }

  /**
   * A new channel to {@code address}, configured like the client's own (credentials, plaintext or TLS,
   * authority, token).
   */
  ManagedChannel newChannel(String address) {
    ChannelCredentials creds = credentials;
    if (creds == null) {
      creds = plaintext ? InsecureChannelCredentials.create() : TlsChannelCredentials.create();
    }
    ManagedChannelBuilder<?> builder = Grpc.newChannelBuilder(address, creds);
    if (authority != null) {
      builder.overrideAuthority(authority);
    }
    if (token != null) {
      Metadata headers = new Metadata();
      headers.put(Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER), "Bearer " + token);
      builder.intercept(MetadataUtils.newAttachHeadersInterceptor(headers));
    }
    return builder.build();
  }

  // ------------------------------------------------------------------------------------------------------
  // Single-key lookups.

  /** Whether {@code key} (UTF-8) may exist; blocks for at most the deadline. */
  public Lookup mayExist(String key) {
    return await(mayExistAsync(key));
  }

  /** Whether {@code key} may exist; blocks for at most the deadline. */
  public Lookup mayExist(byte[] key) {
    return await(mayExistAsync(key));
  }

  /** Whether {@code key} (UTF-8) may exist, asynchronously. */
  public CompletableFuture<Lookup> mayExistAsync(String key) {
    return mayExistAsync(ByteString.copyFromUtf8(key));
  }

  /** Whether {@code key} may exist, asynchronously. */
  public CompletableFuture<Lookup> mayExistAsync(byte[] key) {
    return mayExistAsync(ByteString.copyFrom(key));
  }

  /**
   * The lookup of one key. With coalescing on it waits for the next coalesced batch to leave; the future
   * completes with the key's answer, or fails with the batch's status, or with DEADLINE_EXCEEDED when the
   * caller's deadline passes first (or CANCELLED when the caller's gRPC {@link Context} is cancelled); the
   * batch goes on for the others. Cancelling the future drops this caller only.
   */
  CompletableFuture<Lookup> mayExistAsync(ByteString key) {
    lookups.increment();
    CompletableFuture<Lookup> future = new CompletableFuture<>();
    if (closed) {
      future.completeExceptionally(Status.CANCELLED.withDescription("client closed").asRuntimeException());
      return future;
    }
    Deadline callDeadline = newDeadline();
    armDeadline(future, callDeadline);
    // An empty or overlong key would fail a whole batch with INVALID_ARGUMENT: it goes alone, so that the
    // gate's own status reaches its caller and only it.
    if (windowNanos == 0 || !coalescable(key)) {
      unaryLookup(key, future, callDeadline);
    } else {
      Waiter waiter = new Waiter(List.of(key), future, callDeadline);
      waiter.share.whenComplete(
          (share, error) -> {
            if (error != null) {
              future.completeExceptionally(error);
              return;
            }
            BatchMayExistResponse r = share.response();
            future.complete(
                new Lookup(
                    bit(r.getMayExistBitmap(), share.offset()),
                    r.getObservedSeq(),
                    r.getWarming(),
                    share.address()));
          });
      submit(waiter);
    }
    return future;
  }

  /** The call's deadline: now + the option, or the caller's gRPC Context deadline if sooner. */
  Deadline newDeadline() {
    Deadline own = Deadline.after(deadline.toNanos(), TimeUnit.NANOSECONDS);
    Deadline context = Context.current().getDeadline();
    return context == null ? own : own.minimum(context);
  }

  /** Whether {@code key} may share a batch: the gate would refuse a whole batch over an empty or overlong key. */
  private static boolean coalescable(ByteString key) {
    return !key.isEmpty() && key.size() <= MAX_KEY_BYTES;
  }

  /** Fails {@code future} when its deadline passes or its caller's Context is cancelled. */
  private <T> void armDeadline(CompletableFuture<T> future, Deadline callDeadline) {
    long nanos = callDeadline.timeRemaining(TimeUnit.NANOSECONDS);
    ScheduledFuture<?> timer;
    try {
      timer =
          timers.schedule(
              () ->
                  future.completeExceptionally(
                      Status.DEADLINE_EXCEEDED
                          .withDescription(
                              "deadline of " + deadline.toMillis() + " ms exceeded before the gate answered")
                          .asRuntimeException()),
              Math.max(0, nanos),
              TimeUnit.NANOSECONDS);
    } catch (RejectedExecutionException e) {
      future.completeExceptionally(Status.CANCELLED.withDescription("client closed").asRuntimeException());
      return;
    }
    Context context = Context.current();
    Context.CancellationListener onCancel =
        cancelled -> {
          Status status = Contexts.statusFromCancelled(cancelled);
          future.completeExceptionally(
              (status != null ? status : Status.CANCELLED.withDescription("context cancelled"))
                  .asRuntimeException());
        };
    context.addListener(onCancel, Runnable::run);
    future.whenComplete(
        (answer, error) -> {
          timer.cancel(false);
          context.removeListener(onCancel);
        });
  }

  private void unaryLookup(ByteString key, CompletableFuture<Lookup> future, Deadline callDeadline) {
    MayExistRequest request = MayExistRequest.newBuilder().setNamespace(namespace).setKey(key).build();
    router.<MayExistResponse>invoke(
            (stub, observer) -> stub.mayExist(request, observer), callDeadline, -1, gateCalls::increment)
        .whenComplete(
            (answered, error) -> {
              if (error != null) {
                future.completeExceptionally(error);
                return;
              }
              MayExistResponse r = answered.response();
              future.complete(
                  new Lookup(
                      r.getAnswer() != Answer.ANSWER_ABSENT,
                      r.getObservedSeq(),
                      r.getBasis() == Basis.BASIS_WARMING,
                      answered.address()));
            });
  }

  /*
   * Coalescing. A pending batch leaves when
   *  (a) no coalesced batch is in flight (a lone caller pays one round trip, never a window),
   *  (b) its oldest caller has waited the window, or
   *  (c) it holds coalesceMaxKeys keys,
   * so under load each batch carries what arrived while the previous ones were out. There is no gathering
   * thread: the rules are checked when a caller arrives, when a batch is answered (which may wake the
   * waiters at once) and when the oldest caller's window timer fires. Batches are sent outside the lock.
   */

  /** Queues {@code waiter} and sends whatever batches the rules let leave. */
  private void submit(Waiter waiter) {
    List<List<Waiter>> leaving;
    synchronized (batchLock) {
      if (closed) { // close() has sent what waited: nothing would send this one
        leaving = null;
      } else {
        waiting.addLast(waiter);
        waitingKeys += waiter.keys.size();
        leaving = takeLeaving();
      }
    }
    if (leaving == null) {
      waiter.share.completeExceptionally(Status.CANCELLED.withDescription("client closed").asRuntimeException());
      return;
    }
    leaving.forEach(this::send);
  }

  /** A coalesced batch was answered (or failed): one fewer in flight, which may let the waiters leave. */
  private void batchDone() {
    List<List<Waiter>> leaving;
    synchronized (batchLock) {
      inFlight--;
      leaving = takeLeaving();
    }
    leaving.forEach(this::send);
  }

  /** The oldest waiter's window ended (or an earlier timer fired: the rules are checked again). */
  private void windowEnded() {
    List<List<Waiter>> leaving;
    synchronized (batchLock) {
      windowTimer = null;
      leaving = takeLeaving();
    }
    leaving.forEach(this::send);
  }

  /**
   * Takes the batches that may leave now (each counted in flight) and keeps a timer for the oldest waiter's
   * window. Holds batchLock.
   */
  private List<List<Waiter>> takeLeaving() {
    List<List<Waiter>> leaving = new ArrayList<>(1);
    while (!waiting.isEmpty()) {
      long due = waiting.peekFirst().arrived + windowNanos;
      boolean leave = inFlight == 0 || waitingKeys >= maxKeys || System.nanoTime() - due >= 0 || closed;
      if (!leave) {
        break;
      }
      List<Waiter> batch = takeBatch();
      if (!batch.isEmpty()) {
        inFlight++;
        leaving.add(batch);
      }
    }
    if (waiting.isEmpty()) {
      if (windowTimer != null) {
        windowTimer.cancel(false);
        windowTimer = null;
      }
    } else if (windowTimer == null) {
      long delay = waiting.peekFirst().arrived + windowNanos - System.nanoTime();
      try {
        windowTimer = timers.schedule(this::windowEnded, Math.max(0, delay), TimeUnit.NANOSECONDS);
      } catch (RejectedExecutionException e) {
        // Closed meanwhile: close() sends what waits.
      }
    }
    return leaving;
  }

  /**
   * The oldest waiters, whole, until the batch holds coalesceMaxKeys keys (at least one waiter, never more
   * than 10,000 keys). Callers already done (deadline, cancellation) are dropped, not sent. Holds batchLock.
   */
  private List<Waiter> takeBatch() {
    List<Waiter> batch = new ArrayList<>();
    int keys = 0;
    while (!waiting.isEmpty()) {
      Waiter next = waiting.peekFirst();
      int more = next.keys.size();
      if (next.caller.isDone()) {
        waiting.pollFirst();
        waitingKeys -= more;
        continue;
      }
      if (!batch.isEmpty() && (keys >= maxKeys || keys + more > MAX_BATCH_KEYS)) {
        break;
      }
      waiting.pollFirst();
      waitingKeys -= more;
      keys += more;
      batch.add(next);
    }
    return batch;
  }

  /**
   * Counts a coalesced batch in flight as a real one would, until the returned handle is closed. For tests:
   * it makes later callers gather by the window and by {@code coalesceMaxKeys}, as they do under load.
   */
  Hold holdBatch() {
    synchronized (batchLock) {
      inFlight++;
    }
    AtomicBoolean released = new AtomicBoolean();
    return () -> {
      if (released.compareAndSet(false, true)) {
        batchDone();
      }
    };
  }

  /** Sends one coalesced batch (packed keys) and gives each waiter its keys' bits, or the batch's status. */
  private void send(List<Waiter> batch) {
    List<ByteString> keys = new ArrayList<>();
    Deadline latest = null;
    for (Waiter w : batch) {
      keys.addAll(w.keys);
      if (latest == null || latest.isBefore(w.deadline)) {
        latest = w.deadline; // the batch lives as long as its last caller may wait
      }
    }
    BatchMayExistRequest request =
        BatchMayExistRequest.newBuilder().setNamespace(namespace).setPackedKeys(pack(keys)).build();
    int count = keys.size();
    router.<BatchMayExistResponse>invoke(
            (stub, observer) -> stub.batchMayExist(request, observer),
            latest,
            -1,
            () -> {
              gateCalls.increment();
              batchedKeys.add(count);
            })
        .whenComplete(
            (answered, error) -> {
              // Answered first: an asynchronous caller's next lookup, made in the stage it chained on the
              // answer, then joins the next batch instead of following it. Told first, 64 async callers
              // made 32 keys per call and cost 19.9-22.4 µs of CPU per lookup; now 57-61 keys and 15.7 µs
              // (bench.sh async, interleaved). A stage that blocks holds the next batch back, as it holds
              // this executor: chain slow work with the *Async variants.
              try {
                answer(batch, answered, error);
              } finally {
                batchDone();
              }
            });
  }

  /** Gives each waiter of {@code batch} its keys' bits, or the batch's status. */
  private static void answer(
      List<Waiter> batch, AddressRouter.Answered<BatchMayExistResponse> answered, Throwable error) {
    if (error != null) {
      Status status = Status.fromThrowable(error);
      Metadata trailers = Status.trailersFromThrowable(error);
      for (Waiter w : batch) {
        w.share.completeExceptionally(status.asRuntimeException(trailers));
      }
      return;
    }
    int offset = 0;
    for (Waiter w : batch) {
      w.share.complete(new Share(answered.response(), offset, answered.address()));
      offset += w.keys.size();
    }
  }

  /** Bit i of the bitmap (least significant bit first); a bitmap too short answers "may exist" (fail open). */
  static boolean bit(ByteString bitmap, int i) {
    return i / 8 >= bitmap.size() || ((bitmap.byteAt(i / 8) >> (i % 8)) & 1) != 0;
  }

  /** The keys concatenated, each preceded by its length as a varint. */
  static ByteString pack(List<ByteString> keys) {
    try {
      ByteString.Output out = ByteString.newOutput();
      CodedOutputStream coded = CodedOutputStream.newInstance(out);
      for (ByteString key : keys) {
        coded.writeUInt32NoTag(key.size());
        coded.writeRawBytes(key);
      }
      coded.flush();
      return out.toByteString();
    } catch (IOException e) {
      throw new UncheckedIOException(e); // an in-memory stream does not fail
    }
  }

  // ------------------------------------------------------------------------------------------------------
  // Direct calls.

  /**
   * Many keys (UTF-8) at once, in parts of at most 10,000 keys. With coalescing on, each part joins the
   * coalesced batches whole (unless a key is empty or overlong: then the part is sent alone).
   */
  public BatchLookup mayExistMany(List<String> keys) {
    List<ByteString> bytes = new ArrayList<>(keys.size());
    keys.forEach(k -> bytes.add(ByteString.copyFromUtf8(k)));
    return await(mayExistManyAsync(bytes));
  }

  /** {@link #mayExistMany} of raw keys. */
  public BatchLookup mayExistManyBytes(List<byte[]> keys) {
    List<ByteString> bytes = new ArrayList<>(keys.size());
    keys.forEach(k -> bytes.add(ByteString.copyFrom(k)));
    return await(mayExistManyAsync(bytes));
  }

  CompletableFuture<BatchLookup> mayExistManyAsync(List<ByteString> keys) {
    if (keys.isEmpty()) {
      return CompletableFuture.completedFuture(new BatchLookup(List.of(), 0, false));
    }
    Deadline callDeadline = newDeadline();
    List<CompletableFuture<Share>> parts = new ArrayList<>();
    List<Integer> sizes = new ArrayList<>();
    for (int from = 0; from < keys.size(); from += MAX_BATCH_KEYS) {
      List<ByteString> part = List.copyOf(keys.subList(from, Math.min(keys.size(), from + MAX_BATCH_KEYS)));
      sizes.add(part.size());
      if (windowNanos > 0 && part.stream().allMatch(GateClient::coalescable)) {
        // The part joins the coalesced batches whole, like a single key does.
        Waiter waiter = new Waiter(part, null, callDeadline);
        armDeadline(waiter.share, callDeadline);
        submit(waiter);
        parts.add(waiter.share);
      } else {
        BatchMayExistRequest request =
            BatchMayExistRequest.newBuilder().setNamespace(namespace).setPackedKeys(pack(part)).build();
        parts.add(
            router.<BatchMayExistResponse>invoke(
                    (stub, observer) -> stub.batchMayExist(request, observer), callDeadline, -1,
                    gateCalls::increment)
                .thenApply(answered -> new Share(answered.response(), 0, answered.address())));
      }
    }
    return CompletableFuture.allOf(parts.toArray(new CompletableFuture<?>[0]))
        .thenApply(
            done -> {
              List<Boolean> answers = new ArrayList<>(keys.size());
              long seq = Long.MAX_VALUE;
              boolean warming = false;
              for (int p = 0; p < parts.size(); p++) {
                Share share = parts.get(p).join();
                BatchMayExistResponse r = share.response();
                for (int i = 0; i < sizes.get(p); i++) {
                  answers.add(bit(r.getMayExistBitmap(), share.offset() + i));
                }
                seq = Math.min(seq, r.getObservedSeq());
                warming |= r.getWarming();
              }
              return new BatchLookup(answers, seq, warming);
            });
  }

  /**
   * Declares that keys (UTF-8) exist; returns the seq of the Add (the largest one when more than 10,000 keys
   * are split into several Adds). Call it before the rows become visible at the source.
   */
  public long add(Collection<String> keys) {
    return await(addAsync(keys));
  }

  /** {@link #add} of raw keys. */
  public long addBytes(Collection<byte[]> keys) {
    List<ByteString> bytes = new ArrayList<>(keys.size());
    keys.forEach(k -> bytes.add(ByteString.copyFrom(k)));
    return await(addKeys(bytes));
  }

  /** {@link #add}, asynchronously. */
  public CompletableFuture<Long> addAsync(Collection<String> keys) {
    List<ByteString> bytes = new ArrayList<>(keys.size());
    keys.forEach(k -> bytes.add(ByteString.copyFromUtf8(k)));
    return addKeys(bytes);
  }

  private CompletableFuture<Long> addKeys(List<ByteString> keys) {
    Deadline callDeadline = newDeadline();
    CompletableFuture<Long> chain = CompletableFuture.completedFuture(0L);
    // An empty list is still sent: the gate's INVALID_ARGUMENT is the answer.
    for (int from = 0; from == 0 || from < keys.size(); from += MAX_BATCH_KEYS) {
      AddRequest request =
          AddRequest.newBuilder()
              .setNamespace(namespace)
              .addAllKeys(keys.subList(from, Math.min(keys.size(), from + MAX_BATCH_KEYS)))
              .build();
      chain =
          chain.thenCompose(
              seq ->
                  router.<AddResponse>invoke((stub, observer) -> stub.add(request, observer), callDeadline, -1,
                          null)
                      .thenApply(answered -> Math.max(seq, answered.response().getSeq())));
    }
    return chain;
  }

  /**
   * Records that the source said {@code key} (UTF-8) does not exist, with the {@code observedSeq} of the
   * lookup that sent the caller to the source.
   */
  public RecordResult recordAbsent(String key, AbsenceKind kind, long observedSeq) {
    return recordAbsent(key, kind, observedSeq, null);
  }

  /**
   * {@link #recordAbsent(String, AbsenceKind, long)} sent first to {@code address} (the one that answered
   * the lookup, {@link Lookup#address()}), when it is up.
   */
  public RecordResult recordAbsent(String key, AbsenceKind kind, long observedSeq, String address) {
    return await(recordAbsentAsync(ByteString.copyFromUtf8(key), kind, observedSeq, address));
  }

  CompletableFuture<RecordResult> recordAbsentAsync(
      ByteString key, AbsenceKind kind, long observedSeq, String address) {
    RecordAbsentRequest request =
        RecordAbsentRequest.newBuilder()
            .setNamespace(namespace)
            .setKey(key)
            .setKind(
                kind == AbsenceKind.DELETED
                    ? io.existencegate.v1.AbsenceKind.ABSENCE_KIND_DELETED
                    : io.existencegate.v1.AbsenceKind.ABSENCE_KIND_MISSING)
            .setObservedSeq(observedSeq)
            .build();
    int preferred = address == null ? -1 : addresses.indexOf(address);
    return router.<RecordAbsentResponse>invoke(
            (stub, observer) -> stub.recordAbsent(request, observer), newDeadline(), preferred, null)
        .thenApply(
            answered -> {
              RecordAbsentResponse r = answered.response();
              RecordOutcome outcome =
                  switch (r.getOutcome()) {
                    case RECORD_OUTCOME_RECORDED -> RecordOutcome.RECORDED;
                    case RECORD_OUTCOME_REDUNDANT -> RecordOutcome.REDUNDANT;
                    case RECORD_OUTCOME_SUPERSEDED -> RecordOutcome.SUPERSEDED;
                    case RECORD_OUTCOME_THROTTLED -> RecordOutcome.THROTTLED;
                    default -> RecordOutcome.UNKNOWN;
                  };
              return new RecordResult(outcome, r.getSeq(), r.getExpiresInMs(), answered.address());
            });
  }

  // ------------------------------------------------------------------------------------------------------

  /**
   * A {@link Mirror} of this client's namespace: a copy of its filter that answers ABSENT with no call while
   * it holds a sub-lease, attached to the first of the client's addresses that is up. Needs a gate with
   * {@code [mirrors] max_per_namespace} set and, with tokens, the {@code mirror} role. Closed with the client.
   */
  public Mirror mirror(MirrorOptions options) {
    if (closed) {
      throw new IllegalStateException("the client is closed: its mirror would have no channel to attach on");
    }
    Mirror mirror = new Mirror(this, Objects.requireNonNull(options));
    mirrors.add(mirror);
    return mirror;
  }

  void forget(Mirror mirror) {
    mirrors.remove(mirror);
  }

  AddressRouter router() {
    return router;
  }

  ManagedChannel channel(int index) {
    return channels.get(index);
  }

  /** The client's counters (the reader counters are 0 here; see {@link GatedReader#stats()}). */
  public Stats stats() {
    return new Stats(lookups.sum(), gateCalls.sum(), batchedKeys.sum(), router.retries(), 0, 0, 0, 0, 0, 0, 0,
        mirrorCounters.answers.sum(), mirrorCounters.grants.sum(), mirrorCounters.attaches.sum(),
        mirrorCounters.resyncs.sum());
  }

  /** Sends the batch being gathered, then closes the channels (in-flight calls get a moment to finish). */
  @Override
  public void close() {
    mirrors.forEach(Mirror::close);
    List<List<Waiter>> last;
    synchronized (batchLock) {
      closed = true;
      last = takeLeaving(); // closed: everything waiting leaves
    }
    last.forEach(this::send);
    for (ManagedChannel channel : channels) {
      channel.shutdown();
    }
    try {
      for (ManagedChannel channel : channels) {
        if (!channel.awaitTermination(deadline.toNanos(), TimeUnit.NANOSECONDS)) {
          channel.shutdownNow();
        }
      }
    } catch (InterruptedException e) {
      channels.forEach(ManagedChannel::shutdownNow);
      Thread.currentThread().interrupt();
    }
    timers.shutdownNow();
  }

  /** The result of a future, or its failure as the gRPC status it carries. */
  static <T> T await(CompletableFuture<T> future) {
    try {
      return future.get();
    } catch (InterruptedException e) {
      future.cancel(false);
      Thread.currentThread().interrupt();
      throw Status.CANCELLED.withDescription("interrupted").withCause(e).asRuntimeException();
    } catch (ExecutionException e) {
      throw asStatusException(e.getCause());
    } catch (CancellationException e) {
      throw Status.CANCELLED.withDescription("cancelled").withCause(e).asRuntimeException();
    }
  }

  /** {@code error} as a StatusRuntimeException: the one it is or wraps, else UNKNOWN with it as cause. */
  static StatusRuntimeException asStatusException(Throwable error) {
    for (Throwable t = error; t != null; t = t.getCause()) {
      if (t instanceof StatusRuntimeException sre) {
        return sre;
      }
      if (t instanceof StatusException se) {
        return se.getStatus().asRuntimeException(se.getTrailers());
      }
    }
    return Status.fromThrowable(error).asRuntimeException();
  }

  static String utf8(ByteString key) {
    return key.toString(StandardCharsets.UTF_8);
  }
}
