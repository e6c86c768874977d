package io.existencegate.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertSame;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import io.existencegate.v1.Answer;
import io.existencegate.v1.Basis;
import io.existencegate.v1.MayExistResponse;
import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/** GatedReader against real servers: the read path, invalidations, resubscription, fail open. */
public class GatedReaderTest {
  private static GateServer server;

  @BeforeClass
  public static void startServer() throws Exception {
    server = GateServer.start("read", "flight", "missing", "invalidate", "resume", "warming", "nosub", "errors");
  }

  @AfterClass
  public static void stopServer() {
    if (server != null) {
      server.close();
    }
  }

  /** The source of truth: rows by key (an empty Optional is a soft-deleted row), with read counts. */
  static final class Database implements GatedReader.Source<String> {
    final Map<String, Optional<String>> rows = new ConcurrentHashMap<>();
    final Map<String, AtomicInteger> reads = new ConcurrentHashMap<>();
    volatile long delayMillis;
    volatile Exception failure;

    @Override
    public GatedReader.SourceRow<String> load(String key) throws Exception {
      reads.computeIfAbsent(key, k -> new AtomicInteger()).incrementAndGet();
      if (delayMillis > 0) {
        Thread.sleep(delayMillis); // a slow source: the read's own duration, not a wait for a condition
      }
      if (failure != null) {
        throw failure;
      }
      Optional<String> row = rows.get(key);
      if (row == null) {
        return GatedReader.SourceRow.missing();
      }
      return row.isPresent() ? GatedReader.SourceRow.found(row.get()) : GatedReader.SourceRow.deleted();
    }

    int readsOf(String key) {
      AtomicInteger n = reads.get(key);
      return n == null ? 0 : n.get();
    }
  }

  private static GateClient client(String namespace, String... addresses) {
    return GateClient.builder(addresses.length == 0 ? List.of(server.address) : List.of(addresses))
        .namespace(namespace)
        .build();
  }

  private static GatedReader<String> liveReader(GateClient gate, Database db) throws InterruptedException {
    GatedReader<String> reader = new GatedReader<>(gate, db);
    assertTrue("the subscription goes live", reader.awaitLive(Duration.ofSeconds(30)));
    return reader;
  }

  @Test
  public void absentKeysAreAnsweredWithoutTheSourceThenLocally() throws Exception {
    Database db = new Database();
    try (GateClient gate = client("read"); GatedReader<String> reader = liveReader(gate, db)) {
      assertEquals(Optional.empty(), reader.get("a:never"));
      assertEquals(0, db.readsOf("a:never"));
      assertTrue(reader.isCachedAbsent("a:never"));
      long calls = reader.stats().gateCalls();
      assertEquals(Optional.empty(), reader.get("a:never"));
      assertEquals("a local hit makes no call", calls, reader.stats().gateCalls());
      assertEquals(1, reader.stats().cacheHits());

      // A found key is read once, and nothing is cached for it.
      reader.add(List.of("a:1"));
      db.rows.put("a:1", Optional.of("one"));
      assertEquals(Optional.of("one"), reader.get("a:1"));
      assertEquals(1, db.readsOf("a:1"));
      assertFalse(reader.isCachedAbsent("a:1"));
      assertEquals(1, reader.stats().sourceReads());
      assertEquals(0, reader.stats().failOpens());
    }
  }

  @Test
  public void concurrentReadsOfASlowKeyShareOneSourceRead() throws Exception {
    Database db = new Database();
    try (GateClient gate = client("flight"); GatedReader<String> reader = liveReader(gate, db)) {
      reader.add(List.of("f:1"));
      db.rows.put("f:1", Optional.of("slow"));
      db.delayMillis = 300;
      ExecutorService pool = Executors.newFixedThreadPool(8);
      CountDownLatch start = new CountDownLatch(1);
      List<Future<Optional<String>>> reads = new ArrayList<>();
      for (int i = 0; i < 8; i++) {
        reads.add(pool.submit(() -> {
          start.await();
          return reader.get("f:1");
        }));
      }
      start.countDown();
      for (Future<Optional<String>> read : reads) {
        assertEquals(Optional.of("slow"), read.get(30, TimeUnit.SECONDS));
      }
      pool.shutdown();
      assertEquals(1, db.readsOf("f:1"));
      assertEquals(1, reader.stats().sourceReads());
    }
  }

  @Test
  public void sourceErrorsReachTheCallerAsTheyAre() throws Exception {
    Database db = new Database();
    try (GateClient gate = client("errors"); GatedReader<String> reader = liveReader(gate, db)) {
      reader.add(List.of("e:1"));
      IOException broken = new IOException("the database is down");
      db.failure = broken;
      try {
        reader.get("e:1");
        fail("the source failed");
      } catch (IOException e) {
        assertSame(broken, e);
      }
      db.failure = null;
    }
  }

  @Test
  public void aKeyTheSourceLacksIsRecordedThenAnsweredByTheGate() throws Exception {
    Database db = new Database();
    try (GateClient gate = client("missing"); GatedReader<String> reader = liveReader(gate, db)) {
      reader.add(List.of("m:1", "m:2")); // the inserts then failed: the gate knows keys the source lacks
      // The Add's invalidation must arrive before the absence is cached, or it would (rightly) drop it.
      GateServer.eventually("the Add's invalidation arrives", () -> reader.stats().invalidations() == 2);
      assertEquals(Optional.empty(), reader.get("m:1"));
      assertEquals(1, db.readsOf("m:1"));
      assertEquals(1, reader.stats().absencesRecorded());
      MayExistResponse answer = server.answer("missing", "m:1");
      assertEquals(Answer.ANSWER_ABSENT, answer.getAnswer());
      assertEquals(Basis.BASIS_TOMBSTONE, answer.getBasis());
      assertTrue(reader.isCachedAbsent("m:1"));
      assertEquals(Optional.empty(), reader.get("m:1"));
      assertEquals("then a local hit", 1, db.readsOf("m:1"));

      db.rows.put("m:2", Optional.empty()); // soft-deleted
      assertEquals(Optional.empty(), reader.get("m:2"));
      assertEquals(2, reader.stats().absencesRecorded());
      assertTrue(reader.isCachedAbsent("m:2"));

      // RecordAbsent refused (an observed_seq ahead, as from a replica further ahead): swallowed.
      reader.add(List.of("m:3"));
      Lookup ahead = new Lookup(true, Long.MAX_VALUE / 2, false, server.address);
      assertEquals(Optional.empty(), reader.readSource("m:3", ahead));
      assertEquals(2, reader.stats().absencesRecorded());
      assertFalse(reader.isCachedAbsent("m:3"));
    }
  }

  @Test
  public void anAddByAnotherClientInvalidatesACachedAbsence() throws Exception {
    Database db = new Database();
    try (GateClient gate = client("invalidate");
        GateClient writer = client("invalidate");
        GatedReader<String> reader = liveReader(gate, db)) {
      assertEquals(Optional.empty(), reader.get("i:1"));
      assertTrue(reader.isCachedAbsent("i:1"));
      writer.add(List.of("i:1"));
      db.rows.put("i:1", Optional.of("now"));
      GateServer.eventually("ADDED drops the cached absence", () -> !reader.isCachedAbsent("i:1"));
      assertEquals(Optional.of("now"), reader.get("i:1"));
      assertTrue(reader.stats().invalidations() >= 1);
    }
  }

  @Test
  public void aDroppedStreamResumesAfterItsSeqAndDeliversTheGap() throws Exception {
    Database db = new Database();
    GatedReader.Options options =
        new GatedReader.Options().reconnectDelay(Duration.ofMillis(300), Duration.ofSeconds(5));
    try (GateClient gate = client("resume");
        GateClient writer = client("resume");
        GatedReader<String> reader = new GatedReader<>(gate, db, options)) {
      assertTrue(reader.awaitLive(Duration.ofSeconds(30)));
      writer.add(List.of("r:0")); // the reader's cursor moves past 0: it resumes by seq, not "from now"
      GateServer.eventually("the first Add is applied", () -> reader.stats().invalidations() == 1);
      assertEquals(Optional.empty(), reader.get("r:1"));
      assertTrue(reader.isCachedAbsent("r:1"));
      reader.resubscribe(); // as if the connection dropped
      GateServer.eventually("the stream is down", () -> !reader.isLive());
      writer.add(List.of("r:1")); // lands while the reader waits to resubscribe
      GateServer.eventually("the resumed stream delivers it", () -> !reader.isCachedAbsent("r:1"));
      assertEquals(1, reader.stats().resubscribes());
      assertTrue(reader.isLive());
      assertEquals(2, reader.stats().invalidations());
    }
  }

  @Test
  public void aStreamBrokenByAStoppedGateResumesOnTheNextAddressWithAResync() throws Exception {
    // Gate A and gate B (a fresh one, behind A's seqs). The reader's stream is on A; A stops; it resumes on
    // B with after_seq = A's last seq, which B has not reached: B answers RESYNC, and every cached absence
    // goes.
    GateServer a = GateServer.start("resync");
    GateServer b = GateServer.start("resync");
    Database db = new Database();
    try (GateClient gate =
            GateClient.builder(a.address, b.address).namespace("resync").addressPolicy(AddressPolicy.PICK_FIRST)
                .build();
        GatedReader<String> reader = liveReader(gate, db)) {
      gate.add(List.of("s:0"));
      gate.add(List.of("s:00"));
      GateServer.eventually("the Adds are applied", () -> reader.stats().invalidations() == 2);
      assertEquals(Optional.empty(), reader.get("s:1"));
      assertTrue(reader.isCachedAbsent("s:1"));
      a.close();
      GateServer.eventually("RESYNC clears the cache", () -> !reader.isCachedAbsent("s:1"));
      GateServer.eventually("the stream is live on B", reader::isLive);
      assertEquals(3, reader.stats().invalidations()); // 2 keys + 1 RESYNC
      assertTrue(reader.stats().resubscribes() >= 1);

      // Lookups move to B (a retry), and an Add on B reaches the resumed stream.
      assertEquals(Optional.empty(), reader.get("s:2"));
      assertTrue(reader.stats().retries() >= 1);
      assertEquals(0, reader.stats().failOpens());
      assertTrue("absences are cached again, at B's seqs", reader.isCachedAbsent("s:2"));
      gate.add(List.of("s:2"));
      GateServer.eventually("B's Add is delivered", () -> !reader.isCachedAbsent("s:2"));
    } finally {
      a.close();
      b.close();
    }
  }

  @Test
  public void withTheGateDownTheReaderFailsOpenToTheSource() throws Exception {
    Database db = new Database();
    db.rows.put("o:1", Optional.of("still here"));
    try (GateClient gate = client("read", GateServer.deadAddress());
        GatedReader<String> reader = new GatedReader<>(gate, db)) {
      for (int i = 0; i < 3; i++) {
        assertEquals(Optional.of("still here"), reader.get("o:1"));
        assertEquals(Optional.empty(), reader.get("o:missing")); // the source's answer, not the gate's
        assertFalse(reader.isCachedAbsent("o:missing"));
      }
      assertEquals(3, db.readsOf("o:1"));
      assertEquals(3, db.readsOf("o:missing"));
      assertEquals(6, reader.stats().failOpens());
      assertEquals(6, reader.stats().sourceReads());
      assertEquals(0, reader.stats().absencesRecorded());
      assertFalse(reader.isLive());
    }
  }

  @Test
  public void aKeyFoundWhileTheGateWarmsIsAddedWithTheNextAnswer() throws Exception {
    Database db = new Database();
    db.rows.put("w:legacy", Optional.of("old row"));
    try (GateClient gate = client("warming"); GatedReader<String> reader = liveReader(gate, db)) {
      assertEquals(Answer.ANSWER_ABSENT, server.answer("warming", "w:legacy").getAnswer());
      // A warming gate's answer (this server is warm: the test hands the reader such an answer).
      long seq = server.answer("warming", "w:0").getObservedSeq();
      Lookup warming = new Lookup(true, seq, true, server.address);
      assertEquals(Optional.of("old row"), reader.readSource("w:legacy", warming));
      assertEquals("not added while warming", Answer.ANSWER_ABSENT,
          server.answer("warming", "w:legacy").getAnswer());
      reader.get("w:other"); // an answer that is not warming
      GateServer.eventually("the key is added",
          () -> server.answer("warming", "w:legacy").getAnswer() == Answer.ANSWER_MAY_EXIST);
      assertEquals(0, reader.stats().warmingAddsDropped());
    }
  }

  @Test
  public void withoutTheSubscriptionNothingIsCached() throws Exception {
    Database db = new Database();
    try (GateClient gate = client("nosub");
        GatedReader<String> reader = new GatedReader<>(gate, db, new GatedReader.Options().subscribe(false))) {
      assertFalse(reader.awaitLive(Duration.ofMillis(10)));
      assertEquals(Optional.empty(), reader.get("n:1"));
      assertEquals(Optional.empty(), reader.get("n:1"));
      assertFalse(reader.isCachedAbsent("n:1"));
      assertEquals(2, reader.stats().gateCalls());
      assertEquals(0, reader.stats().cacheHits());
      assertEquals(0, db.readsOf("n:1"));
    }
  }
}
