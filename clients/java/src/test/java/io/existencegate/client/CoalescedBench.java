package io.existencegate.client;

import static org.junit.Assume.assumeTrue;

import java.lang.management.ManagementFactory;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.Test;

/**
 * The client's side of coalescing: 64 threads, each with one {@code mayExist} in flight, against a gate of its
 * own; prints this JVM's CPU per lookup (every thread: callers, gRPC, JIT, GC) beside the lookups per second,
 * as {@code cargo bench --bench load -- callers} does for the Rust client. Two kinds of callers: threads
 * blocked in {@code mayExist} (a thread per request, the common Java service), and asynchronous callers
 * that chain their next {@code mayExistAsync} on the previous one's completion (as the Node and Rust callers
 * do): the difference is what parking and waking a thread per lookup costs. Not a test: skipped unless
 * {@code -Dexistence.bench=true}; {@code bench.sh} runs it.
 */
public class CoalescedBench {
  private static final int CALLERS = 64;
  private static final long LOOKUPS = Long.getLong("existence.bench.lookups", 200_000L);

  private static long cpuNanos() {
    return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
        .getProcessCpuTime();
  }

  /** {@code lookups} coalesced lookups from {@link #CALLERS} threads; the number that failed. */
  private static long run(GateClient client, List<String> keys, long lookups) throws InterruptedException {
    AtomicLong next = new AtomicLong();
    AtomicLong failed = new AtomicLong();
    List<Thread> threads = new ArrayList<>();
    for (int t = 0; t < CALLERS; t++) {
      Thread thread = new Thread(() -> {
        for (long i = next.getAndIncrement(); i < lookups; i = next.getAndIncrement()) {
          try {
            client.mayExist(keys.get((int) (i % keys.size())));
          } catch (RuntimeException e) {
            failed.incrementAndGet();
          }
        }
      });
      thread.start();
      threads.add(thread);
    }
    for (Thread thread : threads) {
      thread.join();
    }
    return failed.get();
  }

  /** {@code lookups} coalesced lookups from {@link #CALLERS} asynchronous callers; the number that failed. */
  private static long runAsync(GateClient client, List<String> keys, long lookups) {
    AtomicLong next = new AtomicLong();
    AtomicLong failed = new AtomicLong();
    CompletableFuture<?>[] callers = new CompletableFuture<?>[CALLERS];
    for (int c = 0; c < CALLERS; c++) {
      CompletableFuture<Void> done = new CompletableFuture<>();
      callers[c] = done;
      lookupAsync(client, keys, lookups, next, failed, done);
    }
    CompletableFuture.allOf(callers).join();
    return failed.get();
  }

  /** One caller's next lookup, which starts the one after it when it completes (on gRPC's thread). */
  private static void lookupAsync(GateClient client, List<String> keys, long lookups, AtomicLong next,
      AtomicLong failed, CompletableFuture<Void> done) {
    long i = next.getAndIncrement();
    if (i >= lookups) {
      done.complete(null);
      return;
    }
    client.mayExistAsync(keys.get((int) (i % keys.size()))).whenComplete((answer, error) -> {
      if (error != null) {
        failed.incrementAndGet();
      }
      lookupAsync(client, keys, lookups, next, failed, done);
    });
  }

  /** Lookups by one kind of caller. */
  private interface Callers {
    long run(GateClient client, List<String> keys, long lookups) throws InterruptedException;
  }

  @Test
  public void coalescedLookups64() throws Exception {
    measure("threads", CoalescedBench::run);
  }

  @Test
  public void coalescedAsyncLookups64() throws Exception {
    measure("async callers", CoalescedBench::runAsync);
  }

  private static void measure(String kind, Callers callers) throws Exception {
    assumeTrue("a benchmark: run with -Dexistence.bench=true", Boolean.getBoolean("existence.bench"));
    try (GateServer server = GateServer.start("users");
        GateClient client = GateClient.builder(server.address).namespace("users").build()) {
      List<String> keys = GateServer.keys("bench-", 0, 4096);
      long failed = callers.run(client, keys, 50_000); // connections, batches and the JIT warm
      Stats before = client.stats();
      long cpu = cpuNanos();
      long started = System.nanoTime();
      failed += callers.run(client, keys, LOOKUPS);
      double seconds = (System.nanoTime() - started) / 1e9;
      long used = cpuNanos() - cpu;
      Stats after = client.stats();
      if (failed > 0) {
        throw new AssertionError(failed + " lookups failed");
      }
      double keysPerCall =
          (double) (after.batchedKeys() - before.batchedKeys()) / (after.gateCalls() - before.gateCalls());
      System.out.printf("java %s, %d %s, %d coalesced lookups: %.2f µs of client CPU per lookup, "
              + "%.1f keys per call, %.0f lookups/s%n", System.getProperty("java.version"), CALLERS, kind,
          LOOKUPS, used / 1e3 / LOOKUPS, keysPerCall, LOOKUPS / seconds);
    }
  }
}
