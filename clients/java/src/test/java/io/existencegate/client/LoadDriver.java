package io.existencegate.client;

import static org.junit.Assume.assumeTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.Test;

/**
 * The Java side of the load-balancer tests (tests/suite/balancer.rs): a steady load through the library, with
 * its default settings, against the addresses given — HAProxy's front, or the replicas themselves, balanced
 * by the library — while the test restarts, kills, pauses or cuts off replicas. Skipped unless
 * {@code -Dexistence.load.dir=DIR -Dexistence.load.addresses=ADDRESS[,ADDRESS...]}; {@code load.sh} runs it.
 *
 * <p>Four callers, each in a loop: add of a new key, mayExist of it (ABSENT there is a false ABSENT), mayExist
 * of a key nobody adds. DIR/started appears once every caller has had 20 adds acknowledged (a steady load: a
 * cold JVM's first calls may miss the default deadline while its channel connects); the callers stop once
 * DIR/stop appears; then DIR/report holds "calls=N failed=N false_absent=N", then a line per failed call
 * or false ABSENT: "UNIX_MS what".
 */
public class LoadDriver {
  private static final int CALLERS = 4;
  /** Adds each caller has acknowledged before the load counts as started. */
  private static final int WARM = 20;

  private final AtomicLong calls = new AtomicLong();
  private final AtomicLong failed = new AtomicLong();
  private final AtomicLong falseAbsent = new AtomicLong();
  private final List<String> lines = new ArrayList<>();

  private synchronized void note(String what) {
    lines.add(System.currentTimeMillis() + " " + what);
  }

  @Test
  public void load() throws Exception {
    String dir = System.getProperty("existence.load.dir");
    String addresses = System.getProperty("existence.load.addresses");
    assumeTrue("a load driver: run by load.sh", dir != null && addresses != null);
    Path stop = Path.of(dir, "stop");
    CountDownLatch started = new CountDownLatch(CALLERS);
    List<Thread> threads = new ArrayList<>();
    try (GateClient gate = GateClient.builder(addresses.split(",")).namespace("users").build()) {
      for (int c = 0; c < CALLERS; c++) {
        int caller = c;
        Thread thread = new Thread(() -> call(gate, caller, stop, started));
        thread.start();
        threads.add(thread);
      }
      started.await();
      Files.writeString(Path.of(dir, "started"), "");
      for (Thread thread : threads) {
        thread.join();
      }
    }
    StringBuilder report = new StringBuilder();
    report.append(String.format("calls=%d failed=%d false_absent=%d%n", calls.get(), failed.get(), falseAbsent.get()));
    synchronized (this) {
      lines.forEach(line -> report.append(line).append('\n'));
    }
    Files.writeString(Path.of(dir, "report"), report.toString(), StandardCharsets.UTF_8);
  }

  private void call(GateClient gate, int caller, Path stop, CountDownLatch started) {
    int acked = 0;
    for (long i = 0; !Files.exists(stop); i++) {
      String key = "java-" + caller + "-" + i;
      calls.incrementAndGet();
      try {
        gate.add(List.of(key));
      } catch (RuntimeException e) {
        failed.incrementAndGet();
        note("add " + key + ": " + e);
        continue;
      }
      if (++acked == WARM) {
        started.countDown();
      }
      for (String k : List.of(key, "java-none-" + key)) {
        calls.incrementAndGet();
        try {
          if (!gate.mayExist(k).mayExist() && k.equals(key)) {
            falseAbsent.incrementAndGet();
            note("false ABSENT for " + k + ", acknowledged");
          }
        } catch (RuntimeException e) {
          failed.incrementAndGet();
          note("mayExist " + k + ": " + e);
        }
      }
    }
    if (acked < WARM) {
      started.countDown();
    }
  }
}
