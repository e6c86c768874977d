package io.existencegate.client;

import static org.junit.Assume.assumeTrue;

import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.Test;

/**
 * A mirror's local ABSENT against the same library's RPC path, on one gate holding 10M keys: the lookup a
 * mirror answers in-process (sub-lease check, hash, filter probe), then the same keys through the client's
 * coalesced {@code mayExist} (64 threads, as {@link CoalescedBench}); beside them the mirror's attach time
 * at 10M keys and its memory. Prints lines beginning {@code java mirror}. Not a test: skipped unless
 * {@code -Dexistence.bench=true}; {@code bench.sh mirror} runs it.
 */
public class MirrorBench {
  private static final long KEYS = Long.getLong("existence.bench.keys", 10_000_000L);
  /** Distinct keys looked up (never added), cycled through: far more blocks than the CPU caches hold. */
  private static final int PROBES = 2_000_000;
  private static final long LOCAL_LOOKUPS = 40_000_000L;
  private static final long RPC_LOOKUPS = Long.getLong("existence.bench.lookups", 200_000L);
  private static final int CALLERS = 64;
  /** Keys per {@code absentLocally(byte[][])} call. */
  private static final int BATCH = 64;
  private static final int ADD_BATCH = GateClient.MAX_BATCH_KEYS;

  private static long cpuNanos() {
    return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
        .getProcessCpuTime();
  }

  /** The gate's CPU time (user and system) from /proc, in ns (clock ticks of 10 ms). */
  private static long gateCpuNanos(GateServer server) throws Exception {
    String stat = Files.readString(Path.of("/proc", Long.toString(server.pid()), "stat"));
    String[] fields = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
    return (Long.parseLong(fields[11]) + Long.parseLong(fields[12])) * 10_000_000L;
  }

  @Test
  public void mirrorAgainstRpcAt10MKeys() throws Exception {
    assumeTrue("a benchmark: run with -Dexistence.bench=true", Boolean.getBoolean("existence.bench"));
    String config = "[mirrors]\nmax_per_namespace = 2\nsublease = \"1s\"\n\n[namespaces.users]\nexpected_keys = "
        + KEYS + "\n";
    try (GateServer server = GateServer.startWithConfig(config);
        GateClient client = GateClient.builder(server.address).namespace("users")
            .deadline(java.time.Duration.ofSeconds(60)).build()) {
      long loading = System.nanoTime();
      load(client);
      System.out.printf("java mirror: %d keys added in %.1f s%n", KEYS, (System.nanoTime() - loading) / 1e9);
      byte[][] probes = new byte[PROBES][];
      for (int i = 0; i < PROBES; i++) {
        probes[i] = ("absent-" + i).getBytes(StandardCharsets.UTF_8);
      }
      long heapBefore = usedHeapAfterGc();
      long attaching = System.nanoTime();
      try (Mirror mirror = client.mirror(MirrorOptions.defaults())) {
        GateServer.eventually("the mirror attached", mirror::isAttached);
        double attachSeconds = (System.nanoTime() - attaching) / 1e9;
        GateServer.eventually("the mirror holds a sub-lease", mirror::holdsSublease);
        double holdSeconds = (System.nanoTime() - attaching) / 1e9;
        long heap = usedHeapAfterGc() - heapBefore;
        System.out.printf("java mirror: attached (filter downloaded) in %.2f s, first sub-lease after %.2f s; "
            + "filter %d bytes (%.1f MiB), heap grown by %.1f MiB%n", attachSeconds, holdSeconds,
            mirror.filterBytes(), mirror.filterBytes() / 1048576.0, heap / 1048576.0);
        localLookups(mirror, probes);
        rpcLookups(server, client, probes);
      }
    }
  }

  /** Adds {@link #KEYS} keys, four Adds of 10,000 in flight. */
  private static void load(GateClient client) throws Exception {
    AtomicLong next = new AtomicLong();
    List<Thread> threads = new ArrayList<>();
    for (int t = 0; t < 4; t++) {
      Thread thread = new Thread(() -> {
        for (long from = next.getAndAdd(ADD_BATCH); from < KEYS; from = next.getAndAdd(ADD_BATCH)) {
          List<String> keys = new ArrayList<>(ADD_BATCH);
          for (long k = from; k < Math.min(KEYS, from + ADD_BATCH); k++) {
            keys.add("key-" + k);
          }
          client.add(keys);
        }
      });
      thread.start();
      threads.add(thread);
    }
    for (Thread thread : threads) {
      thread.join();
    }
  }

  private static long usedHeapAfterGc() {
    System.gc();
    return ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getUsed();
  }

  /**
   * One thread's lookups: the hash alone, the hash and the filter probe (no sub-lease), and the mirror's
   * {@code absentLocally} whole; each measured after a warm-up run, the local answers counted so that a
   * sub-lease lost meanwhile (which would make lookups return early) shows. A loop of its own each, so that
   * the JIT inlines each lookup into its loop as it would into a caller's.
   */
  private static void localLookups(Mirror mirror, byte[][] probes) {
    Mirror.Copy copy = mirror.copy;
    long nowMs = mirror.nowMs;
    clockReadings(mirror, LOCAL_LOOKUPS / 4);
    Timing timing = new Timing();
    long sum = clockReadings(mirror, LOCAL_LOOKUPS);
    timing.report("the monotonic clock alone (System.nanoTime)", sum == 0 ? 0 : LOCAL_LOOKUPS);
    hashes(copy, probes, LOCAL_LOOKUPS / 4);
    timing = new Timing();
    long odd = hashes(copy, probes, LOCAL_LOOKUPS);
    timing.report("hash only", odd);
    probed(copy, nowMs, probes, LOCAL_LOOKUPS / 4);
    timing = new Timing();
    long absent = probed(copy, nowMs, probes, LOCAL_LOOKUPS);
    timing.report("hash + filter probe, no sub-lease check", absent);
    local(mirror, probes, LOCAL_LOOKUPS / 4);
    timing = new Timing();
    absent = local(mirror, probes, LOCAL_LOOKUPS);
    timing.report("absentLocally (sub-lease check, hash, probe)", absent);
    batched(mirror, probes, LOCAL_LOOKUPS / 4);
    timing = new Timing();
    absent = batched(mirror, probes, LOCAL_LOOKUPS);
    timing.report("absentLocally of " + BATCH + " keys at once, per key", absent);
    twoThreads(mirror, probes);
  }

  /**
   * The wall time and this thread's CPU time of {@link #LOCAL_LOOKUPS} lookups: on a shared machine the wall
   * time includes the time the thread waited for a core, the CPU time only what it ran.
   */
  private static final class Timing {
    private final long wall = System.nanoTime();
    private final long cpu = ManagementFactory.getThreadMXBean().getCurrentThreadCpuTime();

    void report(String what, long counted) {
      double wallNs = (double) (System.nanoTime() - wall) / LOCAL_LOOKUPS;
      double cpuNs = (double) (ManagementFactory.getThreadMXBean().getCurrentThreadCpuTime() - cpu)
          / LOCAL_LOOKUPS;
      System.out.printf("java mirror, one thread, %s: %.1f ns per lookup (%.1f ns of CPU), %.2f M lookups/s "
          + "per core, %.2f %% counted%n", what, wallNs, cpuNs, 1e3 / cpuNs, 100.0 * counted / LOCAL_LOOKUPS);
    }
  }

  /** {@code readings} readings of the mirror's clock; their sum (so the work is used). */
  private static long clockReadings(Mirror mirror, long readings) {
    long sum = 0;
    for (long i = 0; i < readings; i++) {
      sum += mirror.clock();
    }
    return sum;
  }

  /** The hashes of {@code lookups} keys; how many were odd (so the work is used). */
  private static long hashes(Mirror.Copy copy, byte[][] probes, long lookups) {
    long odd = 0;
    for (long i = 0; i < lookups; i++) {
      odd += copy.hash().hash(probes[(int) (i % probes.length)]) & 1;
    }
    return odd;
  }

  private static long probed(Mirror.Copy copy, long nowMs, byte[][] probes, long lookups) {
    long absent = 0;
    for (long i = 0; i < lookups; i++) {
      if (!copy.filter().contains(copy.hash().hash(probes[(int) (i % probes.length)]), nowMs)) {
        absent++;
      }
    }
    return absent;
  }

  /** Lookups {@link #BATCH} keys at a time ({@code absentLocally(byte[][])}). */
  private static long batched(Mirror mirror, byte[][] probes, long lookups) {
    long absent = 0;
    byte[][] batch = new byte[BATCH][];
    for (long i = 0; i < lookups; i += BATCH) {
      for (int k = 0; k < BATCH; k++) {
        batch[k] = probes[(int) ((i + k) % probes.length)];
      }
      for (boolean answer : mirror.absentLocally(batch)) {
        absent += answer ? 1 : 0;
      }
    }
    return absent;
  }

  private static long local(Mirror mirror, byte[][] probes, long lookups) {
    long absent = 0;
    for (long i = 0; i < lookups; i++) {
      if (mirror.absentLocally(probes[(int) (i % probes.length)])) {
        absent++;
      }
    }
    return absent;
  }

  /** Both cores looking up at once: the machine's local lookups per second. */
  private static void twoThreads(Mirror mirror, byte[][] probes) {
    long[] absent = new long[2];
    Thread[] threads = new Thread[2];
    long started = System.nanoTime();
    for (int t = 0; t < 2; t++) {
      int index = t;
      threads[t] = new Thread(() -> absent[index] = local(mirror, probes, LOCAL_LOOKUPS / 2));
      threads[t].start();
    }
    for (Thread thread : threads) {
      try {
        thread.join();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return;
      }
    }
    double seconds = (System.nanoTime() - started) / 1e9;
    System.out.printf("java mirror, two threads, absentLocally: %.2f M lookups/s in all, %.2f %% ABSENT%n",
        LOCAL_LOOKUPS / seconds / 1e6, 100.0 * (absent[0] + absent[1]) / LOCAL_LOOKUPS);
  }

  /** The same keys through the client's coalesced mayExist, 64 threads; this JVM's and the gate's CPU. */
  private static void rpcLookups(GateServer server, GateClient client, byte[][] probes) throws Exception {
    rpc(client, probes, 50_000); // connections, batches and the JIT
    long cpu = cpuNanos();
    long gateCpu = gateCpuNanos(server);
    long started = System.nanoTime();
    long absent = rpc(client, probes, RPC_LOOKUPS);
    double seconds = (System.nanoTime() - started) / 1e9;
    double clientCpu = (cpuNanos() - cpu) / (double) RPC_LOOKUPS;
    double gateCpuPer = (gateCpuNanos(server) - gateCpu) / (double) RPC_LOOKUPS;
    System.out.printf("java mirror, RPC path (coalesced mayExist, %d threads): %.0f lookups/s, %.1f µs of "
            + "client CPU and %.1f µs of gate CPU per lookup (%.0f lookups/s per core of both), %.2f %% ABSENT%n",
        CALLERS, RPC_LOOKUPS / seconds, clientCpu / 1e3, gateCpuPer / 1e3, 1e9 / (clientCpu + gateCpuPer),
        100.0 * absent / RPC_LOOKUPS);
  }

  private static long rpc(GateClient client, byte[][] probes, long lookups) throws InterruptedException {
    AtomicLong next = new AtomicLong();
    AtomicLong absent = new AtomicLong();
    List<Thread> threads = new ArrayList<>();
    for (int t = 0; t < CALLERS; t++) {
      Thread thread = new Thread(() -> {
        for (long i = next.getAndIncrement(); i < lookups; i = next.getAndIncrement()) {
          if (!client.mayExist(probes[(int) (i % probes.length)]).mayExist()) {
            absent.incrementAndGet();
          }
        }
      });
      thread.start();
      threads.add(thread);
    }
    for (Thread thread : threads) {
      thread.join();
    }
    return absent.get();
  }
}
