package io.existencegate.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import io.existencegate.v1.Answer;
import io.existencegate.v1.Basis;
import io.existencegate.v1.MayExistResponse;
import io.grpc.Context;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/** GateClient against a real server: coalescing, deadlines, cancellation, errors, direct calls. */
public class GateClientTest {
  private static GateServer server;

  @BeforeClass
  public static void startServer() throws Exception {
    server = GateServer.start("coalesce", "unary", "cancel", "many", "writes", "invalid");
  }

  @AfterClass
  public static void stopServer() {
    if (server != null) {
      server.close();
    }
  }

  private static GateClient.Builder client(String namespace) {
    return GateClient.builder(server.address).namespace(namespace);
  }

  private static Status.Code code(Throwable error) {
    return Status.fromThrowable(error).getCode();
  }

  @Test
  public void concurrentLookupsAreCoalescedAndMatchTheUnaryAnswers() throws Exception {
    // What is checked is the sharing and the answers, not how fast: 64 threads' first calls (class loading,
    // the JIT, the connection) on a loaded 2-core machine once missed the 500 ms default.
    try (GateClient gate = client("coalesce").deadline(Duration.ofSeconds(10)).build()) {
      gate.add(GateServer.keys("k", 0, 100)); // k0..k99 added, k100..k199 never
      List<String> keys = GateServer.keys("k", 0, 200);
      int threads = 64;
      int perThread = 25;
      ExecutorService pool = Executors.newFixedThreadPool(threads);
      CountDownLatch start = new CountDownLatch(1);
      List<Future<List<Lookup>>> results = new ArrayList<>();
      for (int t = 0; t < threads; t++) {
        int offset = t;
        results.add(pool.submit(() -> {
          start.await();
          List<Lookup> answers = new ArrayList<>();
          for (int i = 0; i < perThread; i++) {
            answers.add(gate.mayExist(keys.get((offset * 7 + i * 13) % keys.size())));
          }
          return answers;
        }));
      }
      start.countDown();
      for (int t = 0; t < threads; t++) {
        List<Lookup> answers = results.get(t).get(60, TimeUnit.SECONDS);
        for (int i = 0; i < perThread; i++) {
          String key = keys.get((t * 7 + i * 13) % keys.size());
          MayExistResponse unary = server.answer("coalesce", key);
          assertEquals(key, unary.getAnswer() != Answer.ANSWER_ABSENT, answers.get(i).mayExist());
          assertFalse(answers.get(i).warming());
          assertEquals(server.address, answers.get(i).address());
        }
      }
      pool.shutdown();
      Stats stats = gate.stats();
      assertEquals(threads * perThread, stats.lookups());
      assertTrue("batches of more than one key: " + stats, stats.gateCalls() < stats.lookups());
      assertEquals(stats.lookups(), stats.batchedKeys());
      assertEquals(0, stats.retries());
    }
  }

  @Test
  public void asyncLookupsFromOneThreadShareABatch() throws Exception {
    try (GateClient gate = client("coalesce").coalesceWindow(Duration.ofMillis(50)).build()) {
      gate.add(List.of("async:1"));
      List<CompletableFuture<Lookup>> futures = new ArrayList<>();
      for (int i = 0; i < 100; i++) {
        futures.add(gate.mayExistAsync("async:" + (i % 2)));
      }
      for (int i = 0; i < 100; i++) {
        assertEquals(i % 2 == 1, futures.get(i).get(10, TimeUnit.SECONDS).mayExist());
      }
      // The first lookup leaves at once (nothing in flight); the others gather while it is out.
      assertTrue("fewer calls than callers: " + gate.stats(), gate.stats().gateCalls() < 100);
      assertEquals(100, gate.stats().batchedKeys());
    }
    try (GateClient gate = client("coalesce").coalesceWindow(Duration.ofMillis(50)).build()) {
      gate.holdBatch(); // with a batch in flight (as under load), they all gather in one window
      List<CompletableFuture<Lookup>> futures = new ArrayList<>();
      for (int i = 0; i < 100; i++) {
        futures.add(gate.mayExistAsync("async:" + (i % 2)));
      }
      for (int i = 0; i < 100; i++) {
        assertEquals(i % 2 == 1, futures.get(i).get(10, TimeUnit.SECONDS).mayExist());
      }
      assertEquals(1, gate.stats().gateCalls());
      assertEquals(100, gate.stats().batchedKeys());
    }
  }

  @Test
  public void aFullBatchIsSentWithoutWaitingForTheWindow() throws Exception {
    try (GateClient gate =
        client("coalesce").coalesceWindow(Duration.ofSeconds(20)).coalesceMaxKeys(4)
            .deadline(Duration.ofSeconds(30)).build()) {
      GateClient.Hold busy = gate.holdBatch(); // a batch in flight: only a full batch may leave
      List<CompletableFuture<Lookup>> futures = new ArrayList<>();
      for (int i = 0; i < 7; i++) {
        futures.add(gate.mayExistAsync("full:" + i));
      }
      for (int i = 0; i < 4; i++) {
        assertFalse(futures.get(i).get(10, TimeUnit.SECONDS).mayExist());
      }
      assertEquals(1, gate.stats().gateCalls());
      assertEquals(4, gate.stats().batchedKeys());
      for (int i = 4; i < 7; i++) {
        assertFalse("not full, window of 20 s, a batch in flight", futures.get(i).isDone());
      }
      // The last batch in flight is answered: the waiting callers leave at once, not after the window.
      busy.close();
      for (int i = 4; i < 7; i++) {
        assertFalse(futures.get(i).get(10, TimeUnit.SECONDS).mayExist());
      }
      assertEquals(2, gate.stats().gateCalls());
      assertEquals(7, gate.stats().batchedKeys());
    }
  }

  @Test
  public void aLoneCallerDoesNotWaitForTheWindow() {
    // A window of an hour, a deadline of 10 s: a lookup that waited for the window would time out.
    try (GateClient gate =
        client("coalesce").coalesceWindow(Duration.ofHours(1)).deadline(Duration.ofSeconds(10)).build()) {
      gate.add(List.of("lone:1"));
      for (int i = 0; i < 5; i++) {
        assertEquals(i % 2 == 1, gate.mayExist("lone:" + (i % 2)).mayExist());
      }
      assertEquals(5, gate.stats().gateCalls());
      assertEquals(5, gate.stats().batchedKeys()); // coalesced calls, each alone
      assertEquals(5, gate.stats().lookups());
    }
  }

  @Test
  public void concurrentMayExistManyCallsShareBatches() throws Exception {
    try (GateClient uncoalesced = client("coalesce").coalesceWindow(Duration.ZERO).build();
        GateClient gate = client("coalesce").coalesceWindow(Duration.ofSeconds(20))
            .deadline(Duration.ofSeconds(30)).build()) {
      int callers = 10;
      List<List<String>> keys = new ArrayList<>();
      List<String> added = new ArrayList<>();
      for (int c = 0; c < callers; c++) {
        List<String> mine = GateServer.keys("many" + c + ":", 0, 100);
        keys.add(mine);
        for (int i = 0; i < mine.size(); i += 3) {
          added.add(mine.get(i)); // a third of them added
        }
      }
      uncoalesced.add(added);
      List<BatchLookup> expected = new ArrayList<>();
      for (List<String> mine : keys) {
        expected.add(uncoalesced.mayExistMany(mine));
      }
      assertEquals(callers, uncoalesced.stats().gateCalls());
      assertEquals(0, uncoalesced.stats().batchedKeys());

      // A batch held in flight, as under load: the callers' parts gather behind it, whatever the scheduler
      // does (left to it, a loaded machine could answer each caller before the next one arrived).
      GateClient.Hold busy = gate.holdBatch();
      ExecutorService pool = Executors.newFixedThreadPool(callers);
      CountDownLatch start = new CountDownLatch(1);
      List<Future<CompletableFuture<BatchLookup>>> queued = new ArrayList<>();
      for (List<String> mine : keys) {
        queued.add(pool.submit(() -> {
          start.await();
          return gate.mayExistManyAsync(bytes(mine));
        }));
      }
      start.countDown();
      List<CompletableFuture<BatchLookup>> results = new ArrayList<>();
      for (Future<CompletableFuture<BatchLookup>> q : queued) {
        results.add(q.get(60, TimeUnit.SECONDS)); // every part queued
      }
      busy.close(); // the batch in flight is answered: the parts leave together
      for (int c = 0; c < callers; c++) {
        BatchLookup answers = results.get(c).get(60, TimeUnit.SECONDS);
        assertEquals("caller " + c, expected.get(c).mayExist(), answers.mayExist());
        for (int i = 0; i < 100; i += 3) {
          assertTrue(answers.mayExist().get(i)); // no false negatives
        }
        assertFalse(answers.warming());
        assertTrue(answers.observedSeq() >= expected.get(c).observedSeq());
      }
      pool.shutdown();
      Stats stats = gate.stats();
      assertEquals(1_000, stats.batchedKeys());
      assertEquals("one shared call: " + stats, 1, stats.gateCalls());
      assertEquals(0, stats.lookups());
    }
  }

  @Test
  public void aBatchTakesWholePartsAndNeverMoreThanTenThousandKeys() throws Exception {
    try (GateClient gate = client("coalesce").coalesceMaxKeys(150).coalesceWindow(Duration.ofSeconds(20))
            .deadline(Duration.ofSeconds(30)).build()) {
      gate.add(List.of("p1:5", "p2:7", "p3:9", "single"));
      GateClient.Hold busy = gate.holdBatch(); // a batch in flight: only a full batch may leave
      CompletableFuture<BatchLookup> f1 = gate.mayExistManyAsync(bytes(GateServer.keys("p1:", 0, 100)));
      // 200 keys >= 150: one batch of both parts, whole (not split at 150).
      CompletableFuture<BatchLookup> f2 = gate.mayExistManyAsync(bytes(GateServer.keys("p2:", 0, 100)));
      BatchLookup a1 = f1.get(10, TimeUnit.SECONDS);
      BatchLookup a2 = f2.get(10, TimeUnit.SECONDS);
      assertEquals(1, gate.stats().gateCalls());
      assertEquals(200, gate.stats().batchedKeys());
      CompletableFuture<BatchLookup> f3 = gate.mayExistManyAsync(bytes(GateServer.keys("p3:", 0, 100)));
      CompletableFuture<Lookup> single = gate.mayExistAsync("single");
      assertFalse("101 keys, a window of 20 s, a batch in flight", f3.isDone());
      busy.close(); // a part and a single key leave together
      BatchLookup a3 = f3.get(10, TimeUnit.SECONDS);
      assertTrue(single.get(10, TimeUnit.SECONDS).mayExist());
      for (int i = 0; i < 100; i++) {
        assertEquals(i == 5, a1.mayExist().get(i));
        assertEquals(i == 7, a2.mayExist().get(i));
        assertEquals(i == 9, a3.mayExist().get(i));
      }
      assertEquals(2, gate.stats().gateCalls());
      assertEquals(301, gate.stats().batchedKeys());
      assertEquals(1, gate.stats().lookups());
    }
    try (GateClient gate = client("coalesce").coalesceMaxKeys(GateClient.MAX_BATCH_KEYS)
            .coalesceWindow(Duration.ofSeconds(20)).deadline(Duration.ofSeconds(30)).build()) {
      GateClient.Hold busy = gate.holdBatch();
      CompletableFuture<BatchLookup> big = gate.mayExistManyAsync(bytes(GateServer.keys("big:", 0, 9_000)));
      // 11,000 keys waiting: the batch takes the first part only, since both would exceed 10,000 keys.
      CompletableFuture<BatchLookup> next = gate.mayExistManyAsync(bytes(GateServer.keys("next:", 0, 2_000)));
      assertEquals(9_000, big.get(10, TimeUnit.SECONDS).mayExist().size());
      assertEquals(1, gate.stats().gateCalls());
      assertEquals(9_000, gate.stats().batchedKeys());
      assertFalse(next.isDone());
      busy.close();
      assertEquals(2_000, next.get(10, TimeUnit.SECONDS).mayExist().size());
      assertEquals(2, gate.stats().gateCalls());
      assertEquals(11_000, gate.stats().batchedKeys());
    }
  }

  private static List<com.google.protobuf.ByteString> bytes(List<String> keys) {
    List<com.google.protobuf.ByteString> out = new ArrayList<>();
    keys.forEach(k -> out.add(com.google.protobuf.ByteString.copyFromUtf8(k)));
    return out;
  }

  @Test
  public void windowZeroSendsUnaryCalls() throws Exception {
    try (GateClient gate = client("unary").coalesceWindow(Duration.ZERO).build()) {
      gate.add(List.of("u:1"));
      long unaryBefore = server.requests("MayExist");
      long batchBefore = server.requests("BatchMayExist");
      ExecutorService pool = Executors.newFixedThreadPool(8);
      List<Future<Lookup>> results = new ArrayList<>();
      for (int i = 0; i < 16; i++) {
        String key = "u:" + (i % 2);
        results.add(pool.submit(() -> gate.mayExist(key)));
      }
      for (int i = 0; i < 16; i++) {
        Lookup answer = results.get(i).get(30, TimeUnit.SECONDS);
        assertEquals(i % 2 == 1, answer.mayExist());
        assertFalse(answer.warming());
        assertTrue(answer.observedSeq() >= 1);
      }
      pool.shutdown();
      assertEquals(16, gate.stats().gateCalls());
      assertEquals(0, gate.stats().batchedKeys());
      assertEquals(16, server.requests("MayExist") - unaryBefore);
      assertEquals(0, server.requests("BatchMayExist") - batchBefore);
    }
  }

  @Test
  public void aCancelledCallerLeavesTheOthersOfItsBatchAnswered() throws Exception {
    try (GateClient gate = client("cancel").coalesceWindow(Duration.ofMillis(200)).build()) {
      gate.add(List.of("c:1"));
      gate.holdBatch(); // a batch in flight (never answered): these three gather for the window
      CompletableFuture<Lookup> first = gate.mayExistAsync("c:1");
      CompletableFuture<Lookup> cancelled = gate.mayExistAsync("c:2");
      CompletableFuture<Lookup> third = gate.mayExistAsync("c:3");
      assertTrue(cancelled.cancel(true));
      assertTrue(first.get(10, TimeUnit.SECONDS).mayExist());
      assertFalse(third.get(10, TimeUnit.SECONDS).mayExist());
      try {
        cancelled.get();
        fail("a cancelled lookup has no answer");
      } catch (CancellationException expected) {
        // as asked
      }
      assertEquals(1, gate.stats().gateCalls());
      assertEquals(2, gate.stats().batchedKeys()); // the cancelled key was left out
    }
  }

  @Test
  public void aCallerWhoseDeadlinePassesFailsAtOnceAndTheBatchGoesOn() throws Exception {
    ScheduledExecutorService clock = Executors.newSingleThreadScheduledExecutor();
    try (GateClient gate = client("cancel").coalesceWindow(Duration.ofMillis(300)).build()) {
      gate.add(List.of("d:1"));
      gate.holdBatch(); // a batch in flight (never answered): the callers wait for the window
      long started = System.nanoTime();
      CompletableFuture<Lookup> other = gate.mayExistAsync("d:1");
      // This caller's own deadline (its gRPC Context's) is 30 ms: it passes long before the window ends.
      Context.CancellableContext hurried = Context.current().withDeadlineAfter(30, TimeUnit.MILLISECONDS, clock);
      CompletableFuture<Lookup> late = hurried.call(() -> gate.mayExistAsync("d:2"));
      try {
        late.get(10, TimeUnit.SECONDS);
        fail("the hurried caller's deadline passed");
      } catch (ExecutionException e) {
        assertEquals(Status.Code.DEADLINE_EXCEEDED, code(e.getCause()));
      }
      assertTrue("failed at once, before the batch was sent",
          System.nanoTime() - started < TimeUnit.MILLISECONDS.toNanos(290));
      assertFalse(other.isDone());
      assertTrue(other.get(10, TimeUnit.SECONDS).mayExist());
      hurried.cancel(null);

      // A blocking caller whose Context is cancelled gets CANCELLED.
      Context.CancellableContext cancellable = Context.current().withCancellation();
      clock.schedule(() -> cancellable.cancel(null), 30, TimeUnit.MILLISECONDS);
      try {
        cancellable.call(() -> gate.mayExist("d:3"));
        fail("the caller was cancelled");
      } catch (StatusRuntimeException e) {
        assertEquals(Status.Code.CANCELLED, e.getStatus().getCode());
      }
    } finally {
      clock.shutdownNow();
    }
  }

  @Test
  public void theClientDeadlineBoundsABlockingLookup() {
    // The window outlasts the deadline: every caller fails with DEADLINE_EXCEEDED at its deadline.
    try (GateClient gate =
        client("cancel").coalesceWindow(Duration.ofSeconds(2)).deadline(Duration.ofMillis(100)).build()) {
      gate.holdBatch(); // a batch in flight (never answered): the lookup waits for the window
      long started = System.nanoTime();
      try {
        gate.mayExist("slow");
        fail("the deadline passed");
      } catch (StatusRuntimeException e) {
        assertEquals(Status.Code.DEADLINE_EXCEEDED, e.getStatus().getCode());
      }
      assertTrue(System.nanoTime() - started < TimeUnit.MILLISECONDS.toNanos(1500));
    }
  }

  @Test
  public void aFailedBatchFailsEachCallerWithTheSameStatus() throws Exception {
    try (GateClient gate = client("no_such_namespace").coalesceWindow(Duration.ofMillis(50)).build()) {
      GateClient.Hold busy = gate.holdBatch(); // the five callers gather in one batch
      List<CompletableFuture<Lookup>> futures = new ArrayList<>();
      for (int i = 0; i < 5; i++) {
        futures.add(gate.mayExistAsync("x:" + i));
      }
      String message = null;
      for (CompletableFuture<Lookup> f : futures) {
        try {
          f.get(10, TimeUnit.SECONDS);
          fail("the namespace does not exist");
        } catch (ExecutionException e) {
          Status status = Status.fromThrowable(e.getCause());
          assertEquals(Status.Code.NOT_FOUND, status.getCode());
          assertNotNull(status.getDescription());
          if (message == null) {
            message = status.getDescription();
          }
          assertEquals(message, status.getDescription());
        }
      }
      assertEquals(1, gate.stats().gateCalls());
      busy.close();
      try {
        gate.mayExist("x");
        fail("blocking too");
      } catch (StatusRuntimeException e) {
        assertEquals(Status.Code.NOT_FOUND, e.getStatus().getCode());
      }
    }
  }

  @Test
  public void invalidInputKeepsItsStatusAndSparesTheBatch() throws Exception {
    for (Duration window : List.of(GateClient.DEFAULT_COALESCE_WINDOW, Duration.ofMillis(100), Duration.ZERO)) {
      try (GateClient gate = client("invalid").coalesceWindow(window).build()) {
        CompletableFuture<Lookup> valid = gate.mayExistAsync("fine");
        try {
          gate.mayExist("");
          fail("an empty key is invalid");
        } catch (StatusRuntimeException e) {
          assertEquals(Status.Code.INVALID_ARGUMENT, e.getStatus().getCode());
        }
        try {
          gate.mayExist(new byte[2000]);
          fail("an overlong key is invalid");
        } catch (StatusRuntimeException e) {
          assertEquals(Status.Code.INVALID_ARGUMENT, e.getStatus().getCode());
        }
        assertFalse("window " + window, valid.get(10, TimeUnit.SECONDS).mayExist());
      }
    }
    try (GateClient gate = client("invalid").build()) {
      try {
        gate.mayExistMany(List.of("a", ""));
        fail("an empty key is invalid");
      } catch (StatusRuntimeException e) {
        assertEquals(Status.Code.INVALID_ARGUMENT, e.getStatus().getCode());
      }
      try {
        gate.add(List.of());
        fail("an Add of no keys is invalid");
      } catch (StatusRuntimeException e) {
        assertEquals(Status.Code.INVALID_ARGUMENT, e.getStatus().getCode());
      }
    }
  }

  @Test
  public void mayExistManySplitsAtTenThousandKeys() throws Exception {
    try (GateClient gate = client("many").build()) {
      List<String> added = GateServer.keys("m", 0, 12_000);
      long seq = gate.add(added); // two Adds: 10,000 + 2,000
      assertTrue(seq >= 2);
      List<String> keys = GateServer.keys("m", 0, 24_000);
      BatchLookup answers = gate.mayExistMany(keys);
      assertEquals(keys.size(), answers.mayExist().size());
      assertEquals(3, gate.stats().gateCalls());
      assertEquals(0, gate.stats().lookups());
      assertEquals(seq, answers.observedSeq());
      assertFalse(answers.warming());
      for (int i = 0; i < keys.size(); i += 97) {
        MayExistResponse unary = server.answer("many", keys.get(i));
        assertEquals(keys.get(i), unary.getAnswer() != Answer.ANSWER_ABSENT, answers.mayExist().get(i));
      }
      for (int i = 0; i < 12_000; i++) {
        assertTrue(answers.mayExist().get(i)); // no false negatives
      }
      assertTrue(gate.mayExistMany(List.of()).mayExist().isEmpty());
    }
  }

  @Test
  public void addAndRecordAbsentOutcomes() {
    try (GateClient gate = client("writes").build()) {
      long first = gate.add(List.of("w:1"));
      long second = gate.add(List.of("w:2"));
      assertTrue(second > first);

      Lookup before = gate.mayExist("w:1");
      assertTrue(before.mayExist());
      RecordResult recorded = gate.recordAbsent("w:1", AbsenceKind.MISSING, before.observedSeq(),
          before.address());
      assertEquals(RecordOutcome.RECORDED, recorded.outcome());
      assertTrue(recorded.seq() > before.observedSeq());
      assertTrue(recorded.expiresInMs() > 0);
      assertEquals(server.address, recorded.address());
      MayExistResponse unary = server.answer("writes", "w:1");
      assertEquals(Answer.ANSWER_ABSENT, unary.getAnswer());
      assertEquals(Basis.BASIS_TOMBSTONE, unary.getBasis());
      assertFalse(gate.mayExist("w:1").mayExist());

      // Never added: the filter already answers ABSENT.
      assertEquals(RecordOutcome.REDUNDANT,
          gate.recordAbsent("w:never", AbsenceKind.MISSING, gate.mayExist("w:never").observedSeq()).outcome());

      // An Add after the lookup: the absence may be stale.
      Lookup stale = gate.mayExist("w:2");
      gate.add(List.of("w:2"));
      assertEquals(RecordOutcome.SUPERSEDED,
          gate.recordAbsent("w:2", AbsenceKind.DELETED, stale.observedSeq()).outcome());

      // An observed_seq ahead of the gate (as from a replica further ahead).
      try {
        gate.recordAbsent("w:2", AbsenceKind.MISSING, Long.MAX_VALUE / 2);
        fail("an observed_seq from the future is refused");
      } catch (StatusRuntimeException e) {
        assertEquals(Status.Code.INVALID_ARGUMENT, e.getStatus().getCode());
      }
    }
  }

  @Test
  public void closingAClientFailsLaterLookups() {
    GateClient gate = client("coalesce").build();
    gate.close();
    try {
      gate.mayExist("after-close");
      fail("the client is closed");
    } catch (StatusRuntimeException e) {
      assertEquals(Status.Code.CANCELLED, e.getStatus().getCode());
    }
  }
}
