package io.existencegate.client;

import com.google.protobuf.ByteString;
import io.existencegate.v1.FilterLayer;
import io.existencegate.v1.FilterWindow;
import io.existencegate.v1.LeaseAsk;
import io.existencegate.v1.LeaseGrant;
import io.existencegate.v1.MirrorApplied;
import io.existencegate.v1.MirrorGrpc;
import io.existencegate.v1.MirrorHeader;
import io.existencegate.v1.MirrorOpen;
import io.existencegate.v1.MirrorRequest;
import io.existencegate.v1.MirrorUpdate;
import io.existencegate.v1.MirroredAdd;
import io.grpc.Context;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.grpc.stub.StreamObserver;
import java.nio.ByteOrder;
import java.nio.LongBuffer;
import java.util.ArrayDeque;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * The thread that keeps a {@link Mirror}'s copy: attach, download, follow, and attach again when the stream
 * ends. Everything the copy and the sub-lease go through happens on this one thread, so neither needs a lock;
 * lookups only read what it publishes.
 */
final class MirrorKeeper {
  private static final long FIRST_BACKOFF_NANOS = TimeUnit.MILLISECONDS.toNanos(200);
  private static final long MAX_BACKOFF_NANOS = TimeUnit.SECONDS.toNanos(5);
  /** A layer's blocks are at most 2^32 − 1, as the gate's are (its block index is 32 bits). */
  private static final long MAX_LAYER_BLOCKS = 0xffff_ffffL;
  /** Unanswered requests for sub-leases remembered (a gate that stopped granting leaves some). */
  private static final int MAX_ASKED = 16;
  /** What the gRPC observer queues when the gate ends the stream without an error. */
  private static final Object ENDED = new Object();
  /**
   * Messages the gate may send ahead of what the keeper took: HTTP/2's flow control holds the rest back, so a
   * mirror that applies too slowly leaves the gate behind in its invalidation buffer (which ends in a RESYNC)
   * rather than queueing without bound in this process.
   */
  private static final int INBOUND_WINDOW = 16;

  private final Mirror mirror;
  private final GateClient client;
  private final long maxFilterBytes;
  private final Thread thread;
  private volatile boolean closed;
  /** The current stream's context: cancelling it ends the stream (on close). */
  private volatile Context.CancellableContext stream;

  MirrorKeeper(Mirror mirror, GateClient client, MirrorOptions options) {
    this.mirror = mirror;
    this.client = client;
    this.maxFilterBytes = options.maxFilterBytes() == 0 ? Long.MAX_VALUE : options.maxFilterBytes();
    this.thread = new Thread(this::run, "existence-gate-mirror-" + client.namespace());
    thread.setDaemon(true);
  }

  void start() {
    thread.start();
  }

  void close() {
    closed = true;
    Context.CancellableContext current = stream;
    if (current != null) {
      current.cancel(null);
    }
    thread.interrupt();
    try {
      thread.join(TimeUnit.SECONDS.toMillis(5));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    detach();
  }

  private void run() {
    long backoff = FIRST_BACKOFF_NANOS;
    while (!closed) {
      int index = client.router().firstUp();
      try {
        follow(index);
        backoff = FIRST_BACKOFF_NANOS;
      } catch (StatusRuntimeException e) {
        if (closed) {
          break;
        }
        mirror.lastError = e;
        if (AddressRouter.connectionLossAsUnavailable(e.getStatus()).getCode() == Status.Code.UNAVAILABLE) {
          client.router().markDown(index);
        }
      } catch (InterruptedException e) {
        break;
      } catch (RuntimeException e) {
        // A stream this copy cannot follow (a layer no Java array holds, a message it cannot read): the
        // thread goes on attaching, and says why it is not attached.
        mirror.lastError = Status.INTERNAL.withDescription("the mirror could not follow the gate's stream")
            .withCause(e).asRuntimeException();
      }
      detach();
      try {
        TimeUnit.NANOSECONDS.sleep(backoff);
      } catch (InterruptedException e) {
        break;
      }
      backoff = Math.min(backoff * 2, MAX_BACKOFF_NANOS);
    }
    detach();
  }

  /**
   * The sub-lease dropped at once rather than left to run out: the copy is fed no more, and what would still
   * cover it (a gate waits out a detached mirror's sub-lease, a restarted gate one sub-lease) is the gate's
   * to keep, nothing this mirror can check. Then the copy, whose memory the next download replaces.
   */
  private void detach() {
    mirror.holdsUntil = 0;
    mirror.attached = false;
    mirror.copy = null;
  }

  /** Attaches to address {@code index} and follows its stream until it ends (normally: a RESYNC). */
  private void follow(int index) throws InterruptedException {
    Inbox inbox = new Inbox();
    Context.CancellableContext context = Context.current().withCancellation();
    stream = context;
    try {
      if (closed) {
        return;
      }
      StreamObserver<MirrorRequest> requests;
      Context previous = context.attach();
      try {
        requests = MirrorGrpc.newStub(client.channel(index)).attach(inbox);
      } finally {
        context.detach(previous);
      }
      mirror.address = client.addresses().get(index);
      requests.onNext(MirrorRequest.newBuilder()
          .setOpen(MirrorOpen.newBuilder().setNamespace(client.namespace())
              .setMaxFilterBytes(maxFilterBytes == Long.MAX_VALUE ? 0 : maxFilterBytes))
          .build());
      new Following(requests, inbox).run();
    } finally {
      context.cancel(null);
    }
  }

  /**
   * The gRPC stream's messages, queued for the keeper's thread, then its end (an error or {@link #ENDED});
   * each message taken asks the gate for one more ({@link #INBOUND_WINDOW}).
   */
  private static final class Inbox implements ClientResponseObserver<MirrorRequest, MirrorUpdate> {
    private final BlockingQueue<Object> queue = new LinkedBlockingQueue<>();
    /** The call, to ask for more; set before the call starts, used by the keeper's thread alone. */
    private ClientCallStreamObserver<MirrorRequest> call;

    @Override
    public void beforeStart(ClientCallStreamObserver<MirrorRequest> starting) {
      call = starting;
      call.disableAutoRequestWithInitial(INBOUND_WINDOW);
    }

    /** The next item, waiting for it. */
    Object take() throws InterruptedException {
      return taken(queue.take());
    }

    /** The next item, or null when none came within {@code nanos}. */
    Object poll(long nanos) throws InterruptedException {
      return taken(queue.poll(nanos, TimeUnit.NANOSECONDS));
    }

    private Object taken(Object item) {
      if (item instanceof MirrorUpdate) {
        call.request(1);
      }
      return item;
    }

    @Override
    public void onNext(MirrorUpdate update) {
      queue.add(update);
    }

    @Override
    public void onError(Throwable error) {
      queue.add(error);
    }

    @Override
    public void onCompleted() {
      queue.add(ENDED);
    }
  }

  /** A request for a sub-lease not yet answered: its id, and when it was sent on the mirror's clock. */
  private record Asked(long id, long atNanos) {}

  /** One attachment: the download, then what it applied and its sub-lease. */
  private final class Following {
    private final StreamObserver<MirrorRequest> requests;
    private final Inbox inbox;
    private final ArrayDeque<Asked> asked = new ArrayDeque<>();
    private Sublease sublease;
    private WindowedFilter filter;
    private FilterHash hash;
    private long applied;
    private long lastAskId;
    /**
     * A quarter of the latest grant's length (at first, of the longest the gate grants): a replica grants no
     * longer than its own read lease has left, often much less than {@code [mirrors] sublease}.
     */
    private long askEveryNanos;

    Following(StreamObserver<MirrorRequest> requests, Inbox inbox) {
      this.requests = requests;
      this.inbox = inbox;
    }

    void run() throws InterruptedException {
      MirrorHeader header = download();
      sublease = new Sublease(header.getMaxClockDriftPpm(), header.getMarginNs());
      askEveryNanos = quarter(header.getSubleaseNs());
      applied = header.getSeq();
      mirror.copy = new Mirror.Copy(filter, hash);
      publish();
      // The copy is the gate's filter as of the header's seq: acknowledged like an applied Add, since the
      // gate grants again only once the previous grant's from_seq is acknowledged.
      acknowledge(applied);
      mirror.lastError = null;
      mirror.attached = true;
      client.mirrorCounters.attaches.increment();
      long nextAsk = mirror.clock();
      while (true) {
        long wait = nextAsk - mirror.clock();
        Object item = wait > 0 ? inbox.poll(wait) : null;
        if (item == null) {
          ask();
          nextAsk = mirror.clock() + askEveryNanos;
        } else if (!handle(item)) {
          return;
        }
      }
    }

    /** Acts on one message of the stream; false when the stream is over. */
    private boolean handle(Object item) {
      MirrorUpdate update = (MirrorUpdate) ended(item);
      if (update == null) {
        return false;
      }
      switch (update.getUpdateCase()) {
        case ADDED -> apply(update.getAdded());
        case GRANT -> granted(update.getGrant());
        case RESYNC -> {
          client.mirrorCounters.resyncs.increment();
          return false;
        }
        case HEADER, WORDS -> throw Status.INTERNAL
            .withDescription("the gate sent a second filter on one stream").asRuntimeException();
        default -> { } // a message of a newer gate: nothing to do
      }
      return true;
    }

    /** The next message of the stream (null once it ended without an error), waiting for it. */
    private MirrorUpdate next() throws InterruptedException {
      return (MirrorUpdate) ended(inbox.take());
    }

    /** {@code item} itself, null for the stream's end, thrown as its status for an error. */
    private Object ended(Object item) {
      if (item instanceof Throwable error) {
        throw GateClient.asStatusException(error);
      }
      return item == ENDED ? null : item;
    }

    private void ask() {
      long id = ++lastAskId;
      if (asked.size() >= MAX_ASKED) {
        asked.pollFirst();
      }
      // Noted before it is sent: the sub-lease is counted from no later than the gate could have granted it.
      asked.addLast(new Asked(id, mirror.clock()));
      requests.onNext(MirrorRequest.newBuilder().setAsk(LeaseAsk.newBuilder().setId(id)).build());
    }

    private void apply(MirroredAdd added) {
      long[] hashes = new long[added.getKeysCount()];
      for (int i = 0; i < hashes.length; i++) {
        hashes[i] = hash.hash(added.getKeys(i).toByteArray());
      }
      filter.insertAll(hashes, added.getAtMs());
      if (filter.bytes() > maxFilterBytes) {
        throw Status.RESOURCE_EXHAUSTED
            .withDescription("the mirror's filter grew to " + filter.bytes()
                + " bytes, more than its maxFilterBytes (" + maxFilterBytes + ")")
            .asRuntimeException();
      }
      applied = added.getSeq();
      publish();
      acknowledge(applied);
    }

    private void granted(LeaseGrant grant) {
      Asked request = null;
      while (!asked.isEmpty() && request == null) {
        Asked oldest = asked.pollFirst();
        if (oldest.id() == grant.getId()) {
          request = oldest;
        }
      }
      if (request == null) {
        return; // an answer to a request forgotten: it cannot be dated
      }
      if (grant.getLengthNs() == 0) {
        // Refused: the gate may not answer ABSENT itself now (a replica without its read lease). The
        // sub-lease held is still within what the gate granted, but dropping it asks nothing of that bound.
        sublease.drop();
        publish();
        return;
      }
      askEveryNanos = quarter(grant.getLengthNs());
      mirror.nowMs = grant.getNowMs();
      // Before the sub-lease is published: a lookup that sees it holding sees this grant's bound.
      mirror.observableBound = grant.getObservableSeq();
      // Windows no longer live at the gate's time free their memory, as the gate's do.
      filter.expire(grant.getNowMs());
      sublease.granted(request.atNanos(), grant.getLengthNs(), grant.getFromSeq());
      publish();
      client.mirrorCounters.grants.increment();
    }

    /**
     * Makes the applied seq and the sub-lease visible to lookups: the volatile store that releases the
     * filter's changes to every lookup that loads it.
     */
    private void publish() {
      mirror.applied = applied;
      mirror.holdsUntil = sublease.holdingUntil(applied);
    }

    private void acknowledge(long seq) {
      requests.onNext(MirrorRequest.newBuilder().setApplied(MirrorApplied.newBuilder().setSeq(seq)).build());
    }

    /** Reads the header and the layers' words: the filter as of the header's seq. */
    private MirrorHeader download() throws InterruptedException {
      MirrorUpdate first = next();
      if (first == null || first.getUpdateCase() != MirrorUpdate.UpdateCase.HEADER) {
        throw Status.INTERNAL.withDescription("the gate's mirror stream did not begin with its header")
            .asRuntimeException();
      }
      MirrorHeader header = first.getHeader();
      WindowedFilter.Spec spec = specOf(header);
      checkSize(header);
      WindowedFilter.Window[] windows = new WindowedFilter.Window[header.getFilterWindowsCount()];
      LongBuffer[] pending = {LongBuffer.allocate(0)};
      for (int w = 0; w < windows.length; w++) {
        FilterWindow window = header.getFilterWindows(w);
        BloomLayer[] layers = new BloomLayer[window.getLayersCount()];
        for (int l = 0; l < layers.length; l++) {
          FilterLayer layer = window.getLayers(l);
          BloomGeometry geometry = new BloomGeometry(layer.getBlocks(), layer.getProbes(), layer.getCapacity());
          long[] words = new long[BloomLayer.wordsOf(geometry)];
          fill(words, pending);
          layers[l] = new BloomLayer(geometry, layer.getInserted(), words);
        }
        windows[w] = new WindowedFilter.Window(window.getId(), layers, false);
      }
      filter = new WindowedFilter(spec, windows);
      hash = new FilterHash(header.getHashSeed());
      return header;
    }

    /**
     * Fills {@code words} from the stream's FilterWords messages, what is left of the last one kept in
     * {@code pending}.
     */
    private void fill(long[] words, LongBuffer[] pending) throws InterruptedException {
      int filled = 0;
      while (filled < words.length) {
        if (!pending[0].hasRemaining()) {
          MirrorUpdate update = next();
          if (update == null || update.getUpdateCase() != MirrorUpdate.UpdateCase.WORDS) {
            throw Status.INTERNAL.withDescription("the gate's filter ended before its words did")
                .asRuntimeException();
          }
          ByteString chunk = update.getWords().getWords();
          pending[0] = chunk.asReadOnlyByteBuffer().order(ByteOrder.LITTLE_ENDIAN).asLongBuffer();
        }
        int take = Math.min(pending[0].remaining(), words.length - filled);
        pending[0].get(words, filled, take);
        filled += take;
      }
    }
  }

  /**
   * The sizing the header carries, checked for what this copy relies on: a plausible sizing, and a base layer
   * equal to the one the gate's windows begin with — else the layers this copy grows and opens would differ
   * from the gate's, and keys added later would be looked for where the gate did not put them.
   */
  private static WindowedFilter.Spec specOf(MirrorHeader header) {
    WindowedFilter.Spec spec = new WindowedFilter.Spec(header.getExpectedKeys(), header.getFalsePositiveRate(),
        header.getRetentionMs(), header.getWindows(), header.getMaxFilterBytes());
    boolean plausible = spec.falsePositiveRate() > 0 && spec.falsePositiveRate() < 1
        && (spec.retentionMs() == 0 || spec.windows() >= 2);
    if (!plausible) {
      throw Status.INTERNAL.withDescription("the gate sent an implausible filter sizing: " + header)
          .asRuntimeException();
    }
    BloomGeometry base = spec.baseGeometry();
    for (FilterWindow window : header.getFilterWindowsList()) {
      FilterLayer first = window.getLayers(0);
      if (first.getBlocks() != base.blocks() || first.getProbes() != base.probes()
          || first.getCapacity() != base.capacity()) {
        throw Status.INTERNAL.withDescription("the gate's base layer (" + first.getBlocks() + " blocks, "
            + first.getProbes() + " probes) is not the one its sizing gives here (" + base + ")")
            .asRuntimeException();
      }
    }
    return spec;
  }

  /** Refuses layers the gate would not make, and a filter over {@code maxFilterBytes}, before any word is read. */
  private void checkSize(MirrorHeader header) {
    long total = 0;
    for (FilterWindow window : header.getFilterWindowsList()) {
      if (window.getLayersCount() == 0) {
        throw Status.INTERNAL.withDescription("the gate sent a window without layers").asRuntimeException();
      }
      for (FilterLayer layer : window.getLayersList()) {
        if (layer.getBlocks() > BloomLayer.MAX_BLOCKS && layer.getBlocks() <= MAX_LAYER_BLOCKS) {
          throw Status.RESOURCE_EXHAUSTED.withDescription("a layer of " + layer.getBlocks()
              + " blocks is more than a Java array holds").asRuntimeException();
        }
        boolean sane = layer.getBlocks() > 0 && layer.getBlocks() <= MAX_LAYER_BLOCKS
            && layer.getProbes() >= 1 && layer.getProbes() <= BloomGeometry.MAX_PROBES
            && Long.compareUnsigned(layer.getInserted(), layer.getBlocks() * BloomGeometry.BLOCK_BITS) <= 0;
        if (!sane) {
          throw Status.INTERNAL.withDescription("the gate announced a layer of " + layer.getBlocks()
              + " blocks, " + layer.getProbes() + " probes, " + layer.getInserted() + " keys")
              .asRuntimeException();
        }
        total += layer.getBlocks() * (BloomGeometry.BLOCK_BITS / 8);
      }
    }
    if (total > maxFilterBytes) {
      throw Status.RESOURCE_EXHAUSTED.withDescription("the filter of namespace \"" + header.getNamespace()
          + "\" takes " + total + " bytes, more than this mirror's maxFilterBytes (" + maxFilterBytes + ")")
          .asRuntimeException();
    }
  }

  /** A quarter of a sub-lease of {@code lengthNanos}, at least a millisecond: how often the mirror asks. */
  private static long quarter(long lengthNanos) {
    return Math.max(Long.divideUnsigned(lengthNanos, 4), TimeUnit.MILLISECONDS.toNanos(1));
  }
}
