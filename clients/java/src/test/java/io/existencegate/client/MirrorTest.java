package io.existencegate.client;

import static io.existencegate.client.GateServer.eventually;
import static io.existencegate.client.GateServer.keys;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;

import com.google.protobuf.ByteString;
import io.existencegate.v1.AdminGrpc;
import io.existencegate.v1.RebuildRequest;
import io.existencegate.v1.RebuildResponse;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Status;
import io.grpc.stub.StreamObserver;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/**
 * Mirrors against real gates: a copy kept by the gate's stream is the gate's filter to the bit (through
 * rotations, growth and expiry), answers ABSENT exactly where the gate does, never for an acknowledged key
 * while Adds race lookups, stops answering within its sub-lease when the gate is paused or killed and answers
 * again once it holds one, follows a rebuild, and says why it was refused.
 */
public class MirrorTest {
  /** The sub-lease of {@link #MIRRORED}. */
  private static final long SUBLEASE_NANOS = TimeUnit.MILLISECONDS.toNanos(300);

  /**
   * {@code windowed} rotates every 334 ms (1 s over 4 windows) and is sized for 100 keys per window, so a few
   * hundred keys grow a layer. Its growth cap is far above what the tests add: near the cap, whether a full
   * layer grows or its window saturates depends on when dead windows were dropped, which the gate does on its
   * own schedule and a mirror at each grant, so there a copy kept up may hold a key in another layer than a
   * fresh download (never lose it), and the two are not bit for bit the same.
   */
  private static final String MIRRORED = """
      [mirrors]
      max_per_namespace = 4
      sublease = "300ms"

      [namespaces.users]
      expected_keys = 100000

      [namespaces.windowed]
      expected_keys = 300
      retention = "1s"
      windows = 4
      max_filter_bytes = 1048576

      [namespaces.crowded]
      expected_keys = 2000

      [namespaces.rebuilt]
      expected_keys = 1000

      [namespaces.growing]
      expected_keys = 1000
      """;

  private static GateServer server;

  @BeforeClass
  public static void start() throws Exception {
    server = GateServer.startWithConfig(MIRRORED);
  }

  @AfterClass
  public static void stop() {
    server.close();
  }

  private static GateClient client(String namespace, String... addresses) {
    List<String> to = addresses.length == 0 ? List.of(server.address) : List.of(addresses);
    return GateClient.builder(to).namespace(namespace).addressPolicy(AddressPolicy.PICK_FIRST).build();
  }

  /** Waits until the mirror holds a sub-lease and, under it, answers a key never added ABSENT locally. */
  private static void untilLocal(Mirror mirror) throws InterruptedException {
    eventually("the mirror answers locally", () -> mirror.absentLocally("never-added"));
  }

  /**
   * Which of {@code probes} the mirror answers ABSENT locally, read while it held its sub-lease the whole time
   * (a lapse on a loaded machine makes it read them again).
   */
  private static boolean[] localAbsences(Mirror mirror, List<String> probes) throws InterruptedException {
    while (true) {
      eventually("the mirror holds a sub-lease", mirror::holdsSublease);
      boolean[] absent = new boolean[probes.size()];
      for (int i = 0; i < absent.length; i++) {
        absent[i] = mirror.absentLocally(probes.get(i));
      }
      boolean[] batched = mirror.absentLocally(utf8(probes));
      if (mirror.holdsSublease()) {
        assertArrayEquals("one key at a time and in one batch", absent, batched);
        return absent;
      }
    }
  }

  private static byte[][] utf8(List<String> keys) {
    return keys.stream().map(k -> k.getBytes(java.nio.charset.StandardCharsets.UTF_8)).toArray(byte[][]::new);
  }

  /**
   * For keys in the filter the mirror downloaded, keys added after it attached, and 20,000 never added, the
   * mirror answers ABSENT for exactly the keys the gate does — its false positives included, which a filter
   * sized for 2,000 keys and holding 6,000 has by the hundred: the same hash and the same bits, downloaded and
   * inserted. And {@code mayExist} answers such a key locally: no call, counted as a mirror answer.
   */
  @Test
  public void aMirrorAnswersAbsentExactlyWhereTheGateDoes() throws Exception {
    try (GateClient gate = client("crowded")) {
      gate.add(keys("before-", 0, 3_000));
      try (Mirror mirror = gate.mirror(MirrorOptions.defaults())) {
        eventually("the mirror holds a sub-lease", mirror::holdsSublease);
        long afterSeq = gate.add(keys("after-", 0, 3_000));
        List<String> probes = new ArrayList<>(keys("before-", 0, 3_000));
        probes.addAll(keys("after-", 0, 3_000));
        probes.addAll(keys("never-", 0, 20_000));
        boolean[] local = localAbsences(mirror, probes);
        List<Boolean> atGate = gate.mayExistMany(probes).mayExist();
        int absent = 0;
        for (int i = 0; i < local.length; i++) {
          assertEquals(probes.get(i) + ": local ABSENT vs the gate's MAY_EXIST", !atGate.get(i), local[i]);
          absent += local[i] ? 1 : 0;
        }
        int falsePositives = 20_000 - absent;
        assertTrue(falsePositives + " of the 20,000 never added pass the filter", falsePositives > 20);
        assertTrue(falsePositives + " of the 20,000 never added pass the filter", falsePositives < 1_000);
        answeredLocally(gate, mirror, probes.get(6_000 + indexOfFirst(local, 6_000)), afterSeq);
        assertTrue("the gate's answer for a key it holds", mirror.mayExist("before-7").mayExist());
        assertFalse(mirror.mayExist("before-7").local());
        Stats stats = gate.stats();
        assertTrue(stats.toString(), stats.mirrorAttaches() >= 1 && stats.mirrorGrants() >= 1);
      }
    }
  }

  /**
   * {@code mayExist(key)} of a key the copy lacks: ABSENT, local, counted, no call, observed at a seq no
   * earlier than {@code acknowledged} (an Add acknowledged before: under a sub-lease the copy applied it).
   */
  private static void answeredLocally(GateClient gate, Mirror mirror, String key, long acknowledged)
      throws Exception {
    Lookup lookup;
    do { // tried again only if the sub-lease lapsed in between, as it may on a loaded machine
      eventually("the mirror holds a sub-lease", mirror::holdsSublease);
      Stats before = gate.stats();
      lookup = mirror.mayExist(key);
      if (lookup.local()) {
        Stats after = gate.stats();
        assertEquals(before.mirrorAnswers() + 1, after.mirrorAnswers());
        assertEquals(before.lookups() + 1, after.lookups());
        assertEquals("a local answer makes no call", before.gateCalls(), after.gateCalls());
      }
    } while (!lookup.local());
    assertFalse(lookup.mayExist());
    assertEquals(server.address, lookup.address());
    assertTrue(lookup.observedSeq() + " before the acknowledged " + acknowledged,
        lookup.observedSeq() >= acknowledged);
  }

  private static int indexOfFirst(boolean[] values, int from) {
    for (int i = from; i < values.length; i++) {
      if (values[i]) {
        return i - from;
      }
    }
    throw new AssertionError("no value set from " + from);
  }

  /**
   * A mirror kept up through Adds that rotate windows (a new one every 334 ms), grow layers and saturate
   * windows at the growth cap, and drop expired windows, ends bit for bit the copy a mirror attached afresh
   * at the same seq downloads: the same windows, layer shapes, key counts and words. What it proves: the hash,
   * the insert, the rotation, the growth (layer sizing included) and the expiry are the gate's.
   */
  @Test
  public void aMirrorKeptUpIsTheFilterAFreshOneDownloads() throws Exception {
    try (GateClient gate = client("windowed"); Mirror kept = gate.mirror(MirrorOptions.defaults())) {
      untilLocal(kept);
      Set<Long> windowIds = new HashSet<>();
      int mostLayers = 0;
      long seq = 0;
      for (int batch = 0; windowIds.size() < 7 || mostLayers < 3; batch++) {
        assertTrue("no rotations and growth after " + batch + " Adds: " + windowIds, batch < 5_000);
        seq = gate.add(keys("rotating-" + batch + "-", 0, 40));
        for (WindowedFilter.Window window : copyOf(kept).filter().windows()) {
          windowIds.add(window.id());
          mostLayers = Math.max(mostLayers, window.layers().length);
        }
      }
      long through = seq;
      eventually("the kept mirror applied the last Add", () -> kept.applied == through);
      try (Mirror fresh = gate.mirror(MirrorOptions.defaults())) {
        // Granted a sub-lease: its time is past the gate's latest dropping of dead windows, as the kept one's is.
        eventually("the fresh mirror holds a sub-lease", fresh::holdsSublease);
        assertEquals("no Add in between", through, fresh.applied);
        WindowedFilter.Window[] keptWindows = copyOf(kept).filter().windows();
        WindowedFilter.Window[] freshWindows = copyOf(fresh).filter().windows();
        // Read after the windows: both copies expired at most what was dead at this time.
        long nowMs = Math.max(kept.nowMs, fresh.nowMs);
        long oldest = copyOf(kept).filter().oldestLiveId(nowMs);
        List<WindowedFilter.Window> keptLive = live(keptWindows, oldest);
        List<WindowedFilter.Window> freshLive = live(freshWindows, oldest);
        assertEquals(shapes(freshLive), shapes(keptLive));
        for (int w = 0; w < keptLive.size(); w++) {
          for (int l = 0; l < keptLive.get(w).layers().length; l++) {
            assertArrayEquals("window " + keptLive.get(w).id() + ", layer " + l,
                freshLive.get(w).layers()[l].words(), keptLive.get(w).layers()[l].words());
          }
        }
        assertTrue("windows rotated and expired: " + windowIds, keptWindows[0].id() > windowIds.stream()
            .mapToLong(Long::longValue).min().orElseThrow());
        assertTrue("layers grew: " + shapes(keptLive), mostLayers >= 3);
      }
    }
  }

  private static Mirror.Copy copyOf(Mirror mirror) {
    Mirror.Copy copy = mirror.copy;
    assertNotNull("the mirror holds a copy", copy);
    return copy;
  }

  private static List<WindowedFilter.Window> live(WindowedFilter.Window[] windows, long oldest) {
    List<WindowedFilter.Window> live = new ArrayList<>();
    for (WindowedFilter.Window window : windows) {
      if (window.id() >= oldest) {
        live.add(window);
      }
    }
    return live;
  }

  /** Each window's id and its layers' shapes and key counts. */
  private static List<String> shapes(List<WindowedFilter.Window> windows) {
    List<String> shapes = new ArrayList<>();
    for (WindowedFilter.Window window : windows) {
      StringBuilder shape = new StringBuilder("window " + window.id() + ":");
      for (BloomLayer layer : window.layers()) {
        shape.append(' ').append(layer.geometry()).append(" inserted=").append(layer.inserted());
      }
      shapes.add(shape.toString());
    }
    return shapes;
  }

  /**
   * Adds acknowledged one after another while another thread looks up every key acknowledged so far: none is
   * ever ABSENT locally after its Add returned (the gate waited for the mirror's acknowledgement), and the
   * mirror answered keys never added locally meanwhile, so the check was not empty.
   */
  @Test
  public void noAcknowledgedKeyIsEverAbsentInAMirrorWhileAddsRaceLookups() throws Exception {
    try (GateClient gate = client("users"); Mirror mirror = gate.mirror(MirrorOptions.defaults())) {
      untilLocal(mirror);
      List<String> added = keys("raced-", 0, 600);
      AtomicInteger acknowledged = new AtomicInteger();
      AtomicBoolean done = new AtomicBoolean();
      List<String> wrong = new ArrayList<>();
      AtomicLong localAnswers = new AtomicLong();
      Thread reader = new Thread(() -> {
        for (int i = 0; !done.get(); i++) {
          int through = acknowledged.get();
          for (String key : added.subList(Math.max(0, through - 64), through)) {
            if (mirror.absentLocally(key)) {
              wrong.add(key);
            }
          }
          if (mirror.absentLocally("never-raced-" + i)) {
            localAnswers.incrementAndGet();
          }
        }
      });
      reader.start();
      for (int i = 0; i < added.size(); i++) {
        gate.add(List.of(added.get(i)));
        assertFalse(added.get(i) + " is ABSENT in the mirror after its Add was acknowledged",
            mirror.absentLocally(added.get(i)));
        acknowledged.set(i + 1);
      }
      done.set(true);
      reader.join();
      assertTrue("acknowledged keys ABSENT in the mirror: " + wrong, wrong.isEmpty());
      assertTrue("the mirror never answered locally: the check proved nothing", localAnswers.get() > 0);
    }
  }

  /**
   * A gate paused (SIGSTOP: its connections stay open, nothing answers) grants nothing more, so the mirror's
   * sub-lease runs out on its own clock: no local ABSENT from no later than one sub-lease after the pause
   * began. Once the gate runs again the mirror holds a sub-lease and answers locally again.
   */
  @Test
  public void aPausedGateLeavesTheMirrorNoLocalAnswerPastItsSublease() throws Exception {
    try (GateServer paused = GateServer.startWithConfig(MIRRORED);
        GateClient gate = client("users", paused.address);
        Mirror mirror = gate.mirror(MirrorOptions.defaults())) {
      untilLocal(mirror);
      long stopped;
      long lastLocal = -1;
      try {
        paused.signal("STOP");
        stopped = mirror.clock();
        List<String> batch = keys("never-batched-", 0, 16);
        for (int i = 0; mirror.clock() < stopped + 3 * SUBLEASE_NANOS; i++) {
          long asked = mirror.clock();
          boolean[] batched = mirror.absentLocally(utf8(batch));
          if (mirror.absentLocally("never-" + i) || batched[i % batched.length]) {
            lastLocal = asked;
          }
        }
        assertFalse("the mirror still holds a sub-lease three sub-leases into the pause", mirror.holdsSublease());
      } finally {
        paused.signal("CONT");
      }
      assertTrue("a local ABSENT " + (lastLocal - stopped) / 1_000_000 + " ms into the pause, past the "
          + "sub-lease (300 ms)", lastLocal < stopped + SUBLEASE_NANOS);
      untilLocal(mirror);
    }
  }

  /**
   * A gate killed under its mirror: the stream breaks and the mirror drops its sub-lease at once, not at its
   * end (10 s here), then attaches to the next address that is up, downloads its filter and answers locally
   * again from there.
   */
  @Test
  public void aKilledGateEndsTheSubleaseAtOnceAndTheMirrorAttachesElsewhere() throws Exception {
    String longLeases = MIRRORED.replace("sublease = \"300ms\"", "sublease = \"10s\"");
    try (GateServer doomed = GateServer.startWithConfig(longLeases);
        GateServer next = GateServer.startWithConfig(longLeases);
        GateClient gate = client("users", doomed.address, next.address);
        Mirror mirror = gate.mirror(MirrorOptions.defaults())) {
      untilLocal(mirror);
      assertEquals(doomed.address, mirror.address);
      long attaches = gate.stats().mirrorAttaches();
      doomed.signal("KILL");
      long killed = System.nanoTime();
      eventually("the mirror dropped its sub-lease", () -> !mirror.holdsSublease());
      long dropped = System.nanoTime() - killed;
      assertTrue("dropped " + dropped / 1_000_000 + " ms after the kill", dropped < TimeUnit.SECONDS.toNanos(5));
      untilLocal(mirror);
      assertEquals(next.address, mirror.address);
      assertEquals(attaches + 1, gate.stats().mirrorAttaches());
    }
  }

  /**
   * A rebuild swaps in a filter whose keys no Add announced: the gate ends the stream with RESYNC, and the
   * mirror attaches again and answers from the new filter (a key only the old one held is ABSENT, the rebuilt
   * ones are not).
   */
  @Test
  public void aRebuildMakesTheMirrorDownloadTheNewFilter() throws Exception {
    try (GateClient gate = client("rebuilt"); Mirror mirror = gate.mirror(MirrorOptions.defaults())) {
      gate.add(List.of("only-before"));
      untilLocal(mirror);
      assertFalse(mirror.absentLocally("only-before"));
      rebuild("rebuilt", "rebuilt-1", "rebuilt-2");
      eventually("the mirror took the rebuilt filter", () -> mirror.absentLocally("only-before"));
      assertFalse(mirror.absentLocally("rebuilt-1") || mirror.absentLocally("rebuilt-2"));
      Stats stats = gate.stats();
      assertEquals(stats.toString(), 1, stats.mirrorResyncs());
      assertEquals(stats.toString(), 2, stats.mirrorAttaches());
    }
  }

  private static void rebuild(String namespace, String... keys) throws Exception {
    ManagedChannel channel = ManagedChannelBuilder.forTarget(server.address).usePlaintext().build();
    try {
      CompletableFuture<RebuildResponse> done = new CompletableFuture<>();
      StreamObserver<RebuildRequest> requests = AdminGrpc.newStub(channel).rebuild(new StreamObserver<>() {
        @Override
        public void onNext(RebuildResponse response) {
          done.complete(response);
        }

        @Override
        public void onError(Throwable error) {
          done.completeExceptionally(error);
        }

        @Override
        public void onCompleted() {}
      });
      RebuildRequest.Builder request = RebuildRequest.newBuilder().setNamespace(namespace).setCommit(true);
      for (String key : keys) {
        request.addKeys(ByteString.copyFromUtf8(key));
      }
      requests.onNext(request.build());
      requests.onCompleted();
      done.get(30, TimeUnit.SECONDS);
    } finally {
      channel.shutdownNow();
    }
  }

  /**
   * A filter larger than the mirror's {@code maxFilterBytes} is refused by the gate before any byte is sent
   * (RESOURCE_EXHAUSTED, saying the limit), and the mirror answers nothing locally.
   */
  @Test
  public void aFilterOverTheMirrorsLimitIsRefused() throws Exception {
    try (GateClient gate = client("users"); Mirror mirror = gate.mirror(new MirrorOptions(64))) {
      eventually("the mirror was refused", () -> mirror.lastError() != null);
      assertEquals(Status.Code.RESOURCE_EXHAUSTED, mirror.lastError().getStatus().getCode());
      String message = mirror.lastError().getMessage();
      assertTrue(message, message.contains("max_filter_bytes (64)"));
      assertFalse(mirror.isAttached() || mirror.absentLocally("never-added"));
      assertEquals(0, mirror.filterBytes());
      assertEquals(0, gate.stats().mirrorAttaches());
    }
  }

  /**
   * A copy that Adds grow past the mirror's {@code maxFilterBytes} is dropped (its memory with it): no local
   * answer, RESOURCE_EXHAUSTED, and the gate refuses it the larger filter after that.
   */
  @Test
  public void aCopyGrownPastTheMirrorsLimitIsDropped() throws Exception {
    try (GateClient gate = client("growing")) {
      gate.add(keys("first-", 0, 10)); // the filter's first window: before it, a filter of no bytes
      long limit;
      try (Mirror probe = gate.mirror(MirrorOptions.defaults())) {
        eventually("the probe attached", probe::isAttached);
        limit = probe.filterBytes();
      }
      assertTrue(limit > 0);
      try (Mirror mirror = gate.mirror(new MirrorOptions(limit))) {
        untilLocal(mirror);
        assertEquals(limit, mirror.filterBytes());
        gate.add(keys("growing-", 0, 3_000)); // past the 1,000 keys the first layer holds: a second layer
        eventually("the copy was dropped", () -> mirror.lastError() != null && mirror.filterBytes() == 0);
        assertEquals(Status.Code.RESOURCE_EXHAUSTED, mirror.lastError().getStatus().getCode());
        assertFalse(mirror.absentLocally("never-added"));
      }
    }
  }

  /**
   * Refusals reach the caller as the gate's status: a gate with mirrors off (FAILED_PRECONDITION), a token
   * without the {@code mirror} role (PERMISSION_DENIED) — and a token with it attaches.
   */
  @Test
  public void refusalsAreTheGatesStatus() throws Exception {
    try (GateServer off = GateServer.start("users");
        GateClient gate = client("users", off.address);
        Mirror mirror = gate.mirror(MirrorOptions.defaults())) {
      eventually("the mirror was refused", () -> mirror.lastError() != null);
      assertEquals(Status.Code.FAILED_PRECONDITION, mirror.lastError().getStatus().getCode());
    }
    String config = MIRRORED
        + GateServer.tokenEntry("reader", "read-secret", "[\"read\", \"write\"]", "[\"*\"]")
        + GateServer.tokenEntry("mirror", "mirror-secret", "[\"read\", \"mirror\"]", "[\"users\"]");
    try (GateServer guarded = GateServer.startWithConfig(config, "read-secret")) {
      try (GateClient reader = GateClient.builder(guarded.address).namespace("users").token("read-secret").build();
          Mirror refused = reader.mirror(MirrorOptions.defaults())) {
        eventually("the mirror was refused", () -> refused.lastError() != null);
        assertEquals(Status.Code.PERMISSION_DENIED, refused.lastError().getStatus().getCode());
        assertFalse(refused.absentLocally("never-added"));
      }
      try (GateClient mirrorer = GateClient.builder(guarded.address).namespace("users").token("mirror-secret")
              .build();
          Mirror allowed = mirrorer.mirror(MirrorOptions.defaults())) {
        untilLocal(allowed);
        assertNull(allowed.lastError());
      }
    }
  }
}
