package io.existencegate.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertTrue;

import io.grpc.Status;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import org.junit.Test;

/**
 * The conformance cases every client library runs ({@code clients/conformance/cases.txt}, the behaviours of
 * {@code clients/README.md} written once), against a real gate started with {@code gate.toml}.
 */
public class ConformanceTest {
  /** The cases' call deadline (a loaded 2-core machine); the library's default is 500 ms. */
  private static final Duration DEADLINE = Duration.ofSeconds(10);

  private record Line(int number, List<String> words) {}

  private record Case(int number, String name, List<Line> lines) {}

  private static Path dir() {
    String dir = System.getenv("EXISTENCE_GATE_CONFORMANCE");
    assertNotNull("EXISTENCE_GATE_CONFORMANCE must name clients/conformance (test.sh sets it)", dir);
    return Path.of(dir);
  }

  private static List<Case> cases() throws Exception {
    List<Case> cases = new ArrayList<>();
    List<String> text = Files.readAllLines(dir().resolve("cases.txt"), StandardCharsets.UTF_8);
    for (int i = 0; i < text.size(); i++) {
      String content = text.get(i).split("#", 2)[0].trim();
      if (content.isEmpty()) {
        continue;
      }
      List<String> words = Arrays.asList(content.split("\\s+"));
      if (words.get(0).equals("case")) {
        cases.add(new Case(cases.size() + 1, String.join(" ", words.subList(1, words.size())), new ArrayList<>()));
      } else {
        cases.get(cases.size() - 1).lines().add(new Line(i + 1, words));
      }
    }
    return cases;
  }

  /** The words before and after {@code ->}. */
  private static List<List<String>> splitArrow(List<String> words) {
    int arrow = words.indexOf("->");
    assertTrue("a line with ->", arrow >= 0);
    return List.of(words.subList(0, arrow), words.subList(arrow + 1, words.size()));
  }

  /** A case being run: its options until the first call, then its client (and reader). */
  private static final class Run implements AutoCloseable {
    private final Case kase;
    private final String gateAddress;
    private final Map<String, String> table = new ConcurrentHashMap<>();
    private List<String> addresses;
    private String namespace = "users";
    private Duration window = GateClient.DEFAULT_COALESCE_WINDOW;
    private Duration deadline = DEADLINE;
    private AddressPolicy policy = AddressPolicy.ROUND_ROBIN;
    private GateClient client;
    private GatedReader<String> reader;

    Run(Case kase, String gateAddress) {
      this.kase = kase;
      this.gateAddress = gateAddress;
      this.addresses = List.of(gateAddress);
    }

    String key(String word) {
      return switch (word) {
        case "<empty>" -> "";
        case "<oversized>" -> "x".repeat(1025);
        default -> kase.number() + ":" + word;
      };
    }

    GateClient client() {
      if (client == null) {
        client = GateClient.builder(addresses).namespace(namespace).coalesceWindow(window).deadline(deadline)
            .addressPolicy(policy).build();
      }
      return client;
    }

    Map<String, Long> stats() {
      return (reader != null ? reader.stats() : client.stats()).toMap();
    }

    void line(List<String> words) throws Exception {
      List<String> rest = words.subList(1, words.size());
      switch (words.get(0)) {
        case "option" -> option(rest.get(0), rest.get(1));
        case "add" -> client().add(rest.stream().map(this::key).toList());
        case "lookup" -> lookup(rest);
        case "many" -> many(rest);
        case "stats" -> checkStats(rest);
        case "reader" -> reader = new GatedReader<>(client(), key -> table.containsKey(key)
            ? GatedReader.SourceRow.found(table.get(key)) : GatedReader.SourceRow.missing());
        case "row" -> table.put(key(rest.get(0)), rest.get(1));
        case "get" -> {
          List<List<String>> parts = splitArrow(rest);
          assertEquals(parts.get(1).get(0), get(parts.get(0).get(0)));
        }
        case "eventually" -> eventually(rest);
        default -> throw new AssertionError("no such line: " + words.get(0));
      }
    }

    void option(String name, String value) throws Exception {
      assertTrue("options come before the first call", client == null);
      switch (name) {
        case "coalesce_window_ms" -> window = Duration.ofMillis(Long.parseLong(value));
        case "deadline_ms" -> deadline = Duration.ofMillis(Long.parseLong(value));
        case "namespace" -> namespace = value;
        case "address_policy" -> policy = AddressPolicy.valueOf(value.toUpperCase());
        case "addresses" -> {
          List<String> chosen = new ArrayList<>();
          for (String a : value.split(",")) {
            chosen.add(switch (a) {
              case "gate" -> gateAddress;
              case "dead" -> GateServer.deadAddress();
              default -> throw new AssertionError("no address " + a);
            });
          }
          addresses = chosen;
        }
        default -> throw new AssertionError("no option " + name);
      }
    }

    void lookup(List<String> words) throws Exception {
      List<List<String>> parts = splitArrow(words);
      GateClient gate = client();
      List<CompletableFuture<Lookup>> futures = new ArrayList<>();
      for (String k : parts.get(0)) {
        futures.add(gate.mayExistAsync(key(k)));
      }
      List<String> answers = new ArrayList<>();
      for (CompletableFuture<Lookup> future : futures) {
        try {
          answers.add(String.valueOf(future.get().mayExist()));
        } catch (ExecutionException e) {
          answers.add(Status.fromThrowable(e.getCause()).getCode().name());
        }
      }
      assertEquals("answers for " + parts.get(0), parts.get(1), answers);
    }

    void many(List<String> words) {
      List<List<String>> parts = splitArrow(words);
      int count = Integer.parseInt(parts.get(0).get(0));
      List<String> names = GateServer.keys(parts.get(0).get(1), 0, count);
      GateClient gate = client();
      long before = gate.stats().gateCalls();
      BatchLookup answers = gate.mayExistMany(names.stream().map(this::key).toList());
      assertEquals(count, answers.mayExist().size());
      for (Line line : kase.lines()) {
        if (line.words().get(0).equals("add")) {
          for (String name : line.words().subList(1, line.words().size())) {
            assertTrue(name + " was added", answers.mayExist().get(names.indexOf(name)));
          }
        }
      }
      assertEquals("calls sent", parts.get(1).get(0), String.valueOf(gate.stats().gateCalls() - before));
    }

    void checkStats(List<String> checks) {
      Map<String, Long> stats = stats();
      for (String check : checks) {
        boolean atLeast = check.contains(">=");
        String[] parts = check.split(atLeast ? ">=" : "=");
        Long actual = stats.get(parts[0]);
        assertNotNull("no counter " + parts[0], actual);
        long wanted = Long.parseLong(parts[1]);
        boolean holds = atLeast ? actual >= wanted : actual == wanted;
        assertTrue(check + ": " + parts[0] + " is " + actual + " (" + stats + ")", holds);
      }
    }

    String get(String word) throws Exception {
      assertNotNull("a `reader` line first", reader);
      return reader.get(key(word)).orElse("missing");
    }

    void eventually(List<String> words) throws Exception {
      long deadlineNanos = System.nanoTime() + Duration.ofSeconds(30).toNanos();
      while (true) {
        boolean holds;
        if (words.get(0).equals("get")) {
          List<List<String>> parts = splitArrow(words.subList(1, words.size()));
          holds = get(parts.get(0).get(0)).equals(parts.get(1).get(0));
        } else {
          assertEquals("no such eventually", "cached", words.get(0));
          long hits = reader.stats().cacheHits();
          assertEquals("missing", get(words.get(1)));
          holds = reader.stats().cacheHits() > hits;
        }
        if (holds) {
          return;
        }
        assertTrue("not within 30 s", System.nanoTime() - deadlineNanos < 0);
        Thread.sleep(10);
      }
    }

    @Override
    public void close() {
      if (reader != null) {
        reader.close();
      }
      if (client != null) {
        client.close();
      }
    }
  }

  @Test
  public void everyConformanceCaseHolds() throws Exception {
    String config = Files.readString(dir().resolve("gate.toml"), StandardCharsets.UTF_8);
    List<Case> cases = cases();
    try (GateServer server = GateServer.startWithConfig(config)) {
      for (Case kase : cases) {
        try (Run run = new Run(kase, server.address)) {
          for (Line line : kase.lines()) {
            try {
              run.line(line.words());
            } catch (Exception | AssertionError e) {
              throw new AssertionError("case " + kase.number() + " (" + kase.name() + "), cases.txt line "
                  + line.number() + " `" + String.join(" ", line.words()) + "`: " + e, e);
            }
          }
        }
      }
    }
  }
}
