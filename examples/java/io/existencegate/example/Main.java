package io.existencegate.example;

import com.google.protobuf.ByteString;
import io.existencegate.client.GateClient;
import io.existencegate.client.GatedReader;
import io.existencegate.client.Lookup;
import io.existencegate.v1.Answer;
import io.existencegate.v1.Basis;
import io.existencegate.v1.ExistenceGateGrpc;
import io.existencegate.v1.Invalidation;
import io.existencegate.v1.InvalidationCause;
import io.existencegate.v1.MayExistRequest;
import io.existencegate.v1.MayExistResponse;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

/**
 * A small service's read path over existence-gate, with an in-memory map standing in for the database: the
 * Java client library ({@code clients/java}, {@link GateClient} and {@link GatedReader}) does the work.
 *
 * <p>{@code java io.existencegate.example.Main --addr 127.0.0.1:50051 --namespace default} runs a short
 * self-check against the server (each step prints ok/FAIL) and exits 0 when every step passed. Use a
 * namespace nobody else writes to: the checks expect to be the only writer of the keys they use.
 */
public final class Main {
  private static int passed;
  private static int failed;

  private Main() {}

  /** The source of truth: rows by key; a deleted row is kept as a marker (a soft delete). */
  static final class Database {
    private final Map<String, Optional<String>> rows = new ConcurrentHashMap<>();
    private final Map<String, Integer> reads = new ConcurrentHashMap<>();
    volatile long delayMillis;

    GatedReader.SourceRow<String> load(String key) throws InterruptedException {
      Thread.sleep(delayMillis);
      reads.merge(key, 1, Integer::sum);
      Optional<String> row = rows.get(key);
      if (row == null) {
        return GatedReader.SourceRow.missing();
      }
      return row.isPresent() ? GatedReader.SourceRow.found(row.get()) : GatedReader.SourceRow.deleted();
    }

    void insert(String key, String value) {
      rows.put(key, Optional.of(value));
    }

    void delete(String key) {
      rows.put(key, Optional.empty());
    }

    int readsOf(String key) {
      return reads.getOrDefault(key, 0);
    }

    int totalReads() {
      return reads.values().stream().mapToInt(Integer::intValue).sum();
    }
  }

  /** The write path: Add the key to the gate before the insert becomes visible in the source. */
  static final class Writer {
    private final GateClient gate;
    private final Database db;

    Writer(GateClient gate, Database db) {
      this.gate = gate;
      this.db = db;
    }

    void create(String key, String value) {
      gate.add(List.of(key)); // raises when the gate cannot Add: then the row must not be inserted
      db.insert(key, value);
    }

    /** The Add succeeded but the insert then failed: the gate holds a key the source lacks. */
    void createFailed(String key) {
      gate.add(List.of(key));
    }
  }

  static void check(String name, boolean ok, Object... detail) {
    if (ok) {
      passed++;
      System.out.println("ok   " + name);
    } else {
      failed++;
      System.out.println("FAIL " + name + " " + List.of(detail));
    }
  }

  static boolean eventually(BooleanSupplier condition) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (System.nanoTime() < deadline) {
      if (condition.getAsBoolean()) {
        return true;
      }
      Thread.sleep(20);
    }
    return condition.getAsBoolean();
  }

  static void selfCheck(String addr, ManagedChannel channel, String namespace) throws Exception {
    Database db = new Database();
    // Plain stub calls only to check what the gate answers, with its basis.
    ExistenceGateGrpc.ExistenceGateBlockingStub gate = ExistenceGateGrpc.newBlockingStub(channel);
    try (GateClient client = GateClient.builder(addr).namespace(namespace).build();
        GateClient writerClient = GateClient.builder(addr).namespace(namespace).build();
        GatedReader<String> reader = new GatedReader<>(client, db::load)) {
      Writer writer = new Writer(writerClient, db);
      check("the invalidation subscription goes live", reader.awaitLive(Duration.ofSeconds(10)));

      writer.create("user:1", "Ada");
      check("an added row is read from the source", reader.get("user:1").equals(Optional.of("Ada")));
      check("... with one source read", db.totalReads() == 1, db.reads);

      check("a key never added does not exist", reader.get("user:404").isEmpty());
      check("... and the gate spared the source", db.totalReads() == 1, db.reads);
      check("... and the absence is cached locally", reader.isCachedAbsent("user:404"));
      long calls = reader.stats().gateCalls();
      check(
          "a second read of it is a local hit",
          reader.get("user:404").isEmpty() && reader.stats().gateCalls() == calls);

      writer.createFailed("user:2");
      check("a key the gate knows but the source lacks does not exist", reader.get("user:2").isEmpty());
      check("... the source was read once", db.readsOf("user:2") == 1, db.reads);
      check("... and the absence RECORDED at the gate", reader.stats().absencesRecorded() == 1, reader.stats());
      MayExistResponse answer = gateAnswer(gate, namespace, "user:2");
      check(
          "... so the gate now answers it",
          answer.getAnswer() == Answer.ANSWER_ABSENT && answer.getBasis() == Basis.BASIS_TOMBSTONE,
          answer);
      reader.get("user:2");
      check("... and the next read is a local hit", db.readsOf("user:2") == 1, db.reads);

      writer.create("user:3", "Grace");
      db.delayMillis = 300;
      ExecutorService pool = Executors.newFixedThreadPool(8);
      List<Future<Optional<String>>> reads = new ArrayList<>();
      for (int i = 0; i < 8; i++) {
        reads.add(pool.submit(() -> reader.get("user:3")));
      }
      List<Optional<String>> results = new ArrayList<>();
      for (Future<Optional<String>> read : reads) {
        results.add(read.get(10, TimeUnit.SECONDS));
      }
      pool.shutdown();
      db.delayMillis = 0;
      check(
          "8 concurrent reads of one key all get the row",
          results.stream().allMatch(r -> r.equals(Optional.of("Grace"))),
          results);
      check("... through a single source read", db.readsOf("user:3") == 1, db.reads);

      check("user:404 is cached absent", reader.isCachedAbsent("user:404"));
      writer.create("user:404", "Linus");
      check("ADDED drops the cached absence", eventually(() -> !reader.isCachedAbsent("user:404")));
      check("... and the new row is read", reader.get("user:404").equals(Optional.of("Linus")));

      check(
          "user:405 does not exist yet",
          reader.get("user:405").isEmpty() && reader.isCachedAbsent("user:405"));
      long resubscribes = reader.stats().resubscribes();
      reader.resubscribe(); // as if the connection dropped
      writer.create("user:405", "Barbara"); // lands while the reader is reconnecting
      check(
          "an Add made while reconnecting reaches the reader (resumed by after_seq)",
          eventually(() -> !reader.isCachedAbsent("user:405")));
      check("... over a new subscription", eventually(() -> reader.stats().resubscribes() > resubscribes));
      check("... and the new row is read", reader.get("user:405").equals(Optional.of("Barbara")));

      db.delete("user:1");
      check("a deleted row does not exist", reader.get("user:1").isEmpty());
      answer = gateAnswer(gate, namespace, "user:1");
      check(
          "... its absence RECORDED as DELETED",
          answer.getAnswer() == Answer.ANSWER_ABSENT && answer.getBasis() == Basis.BASIS_TOMBSTONE,
          answer);
      check("... and cached locally", reader.isCachedAbsent("user:1"));

      // While the gate loads its state it answers MAY_EXIST + WARMING for every key and refuses writes; a row
      // found then is added with the first answer that is not WARMING. (This server is warm: the check feeds
      // the reader such an answer.)
      db.insert("user:legacy", "Edsger");
      check(
          "a row the gate does not know is ABSENT there",
          gateAnswer(gate, namespace, "user:legacy").getAnswer() == Answer.ANSWER_ABSENT);
      // Such an answer carries the seq loaded so far; here, the latest.
      Lookup warming = new Lookup(true, latestSeq(gate, namespace), true, addr);
      check(
          "read while the gate warms: found",
          reader.readSource("user:legacy", warming).equals(Optional.of("Edsger")));
      check(
          "... and not added yet",
          gateAnswer(gate, namespace, "user:legacy").getAnswer() == Answer.ANSWER_ABSENT);
      reader.get("user:406"); // the gate is ready: this answer is not WARMING
      check(
          "... added with the next answer",
          eventually(() -> gateAnswer(gate, namespace, "user:legacy").getAnswer() == Answer.ANSWER_MAY_EXIST));

      // RESYNC (events were missed, e.g. a long disconnection) clears every cached absence.
      // user:1's absence is cached as DELETED (10 minutes here); user:2's MISSING one may have expired by now
      // (1 s in the interop configuration).
      check("some absences are cached", reader.isCachedAbsent("user:1"));
      reader.applyInvalidation(
          Invalidation.newBuilder()
              .setNamespace(namespace)
              .setSeq(latestSeq(gate, namespace)) // a RESYNC carries the namespace's latest seq
              .setCause(InvalidationCause.INVALIDATION_CAUSE_RESYNC)
              .build());
      check(
          "RESYNC drops them all", !reader.isCachedAbsent("user:2") && !reader.isCachedAbsent("user:1"));
      System.out.println("reader stats: " + reader.stats());
    }
  }

  static MayExistResponse gateAnswer(ExistenceGateGrpc.ExistenceGateBlockingStub gate, String ns, String key) {
    return gate.mayExist(
        MayExistRequest.newBuilder().setNamespace(ns).setKey(ByteString.copyFromUtf8(key)).build());
  }

  /** The namespace's latest seq, which every answer carries (never 0: seqs start at 1). */
  static long latestSeq(ExistenceGateGrpc.ExistenceGateBlockingStub gate, String ns) {
    return gateAnswer(gate, ns, "user:0").getObservedSeq();
  }

  public static void main(String[] args) throws InterruptedException {
    String addr = "127.0.0.1:50051";
    String namespace = "default";
    for (int i = 0; i + 1 < args.length; i += 2) {
      switch (args[i]) {
        case "--addr" -> addr = args[i + 1];
        case "--namespace" -> namespace = args[i + 1];
        default -> {
          System.err.println("usage: Main [--addr HOST:PORT] [--namespace NAME]");
          System.exit(2);
        }
      }
    }
    ManagedChannel channel = ManagedChannelBuilder.forTarget(addr).usePlaintext().build();
    try {
      selfCheck(addr, channel, namespace);
    } catch (Exception e) {
      check("self-check ran to the end", false, e);
    } finally {
      channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
    System.out.println("example: " + passed + " passed, " + failed + " failed");
    System.exit(failed > 0 || passed == 0 ? 1 : 0);
  }
}
