package io.existencegate.client;

import com.google.protobuf.ByteString;
import io.existencegate.v1.Basis;
import io.existencegate.v1.ExistenceGateGrpc;
import io.existencegate.v1.MayExistRequest;
import io.existencegate.v1.MayExistResponse;
import io.grpc.ChannelCredentials;
import io.grpc.Grpc;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.StatusRuntimeException;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/** A real existence-gate server ($EXISTENCE_GATE_BIN) on free loopback ports, for one test class. */
final class GateServer implements AutoCloseable {
  private static final Pattern ADDRESSES = Pattern.compile("grpc_addr=(\\S+) http_addr=(\\S+)");

  final String address;
  final String httpAddress;
  private final Process process;
  private final Path dir;
  private final ManagedChannel channel;
  /** A plain stub: the reference answers the client's are compared with. */
  final ExistenceGateGrpc.ExistenceGateBlockingStub stub;

  private GateServer(Process process, Path dir, String address, String httpAddress, String token,
      ChannelCredentials credentials) {
    this.process = process;
    this.dir = dir;
    this.address = address;
    this.httpAddress = httpAddress;
    ManagedChannelBuilder<?> builder = credentials == null
        ? ManagedChannelBuilder.forTarget(address).usePlaintext()
        : Grpc.newChannelBuilder(address, credentials).overrideAuthority("localhost");
    if (token != null) {
      io.grpc.Metadata headers = new io.grpc.Metadata();
      headers.put(io.grpc.Metadata.Key.of("authorization", io.grpc.Metadata.ASCII_STRING_MARSHALLER),
          "Bearer " + token);
      builder.intercept(io.grpc.stub.MetadataUtils.newAttachHeadersInterceptor(headers));
    }
    this.channel = builder.build();
    this.stub = ExistenceGateGrpc.newBlockingStub(channel);
  }

  /** Starts a server with these namespaces (missing_ttl 2 s), waiting until it answers warm. */
  static GateServer start(String... namespaces) throws Exception {
    return startWithToken(null, namespaces);
  }

  /**
   * Starts a server that, when {@code token} is not null, requires it (read and write, every namespace).
   */
  static GateServer startWithToken(String token, String... namespaces) throws Exception {
    return start(token, List.of(), null, namespaces);
  }

  /**
   * Starts a server serving gRPC over TLS with {@code tls.serverCert}/{@code serverKey}, requiring client
   * certificates signed by {@code tls.ca} (mutual TLS). Its reference stub connects with {@code reference}
   * (expecting the name {@code localhost}).
   */
  static GateServer startTls(TestPki tls, ChannelCredentials reference, String... namespaces)
      throws Exception {
    return start(null, List.of("--tls-cert", tls.serverCert.toString(), "--tls-key", tls.serverKey.toString(),
        "--tls-client-ca", tls.ca.toString()), reference, namespaces);
  }

  private static GateServer start(String token, List<String> extraArgs, ChannelCredentials reference,
      String... namespaces) throws Exception {
    Path dir = Files.createTempDirectory("existence-gate-java-test");
    StringBuilder config = new StringBuilder();
    for (String namespace : namespaces) {
      config.append("[namespaces.").append(namespace).append("]\n")
          .append("expected_keys = 100000\nmissing_ttl = \"2s\"\ndeleted_ttl = \"10m\"\n")
          .append("ttl_jitter = 0.0\nmax_ttl = \"1h\"\n\n");
    }
    if (token != null) {
      byte[] digest = java.security.MessageDigest.getInstance("SHA-256")
          .digest(token.getBytes(StandardCharsets.UTF_8));
      config.append("[[tokens]]\nname = \"tests\"\nsha256 = \"")
          .append(java.util.HexFormat.of().formatHex(digest))
          .append("\"\nroles = [\"read\", \"write\"]\nnamespaces = [\"*\"]\n");
    }
    return launch(dir, config.toString(), token, extraArgs, reference);
  }

  /** Starts a server with the configuration {@code config} (a TOML text), waiting until it answers warm. */
  static GateServer startWithConfig(String config) throws Exception {
    return launch(Files.createTempDirectory("existence-gate-java-test"), config, null, List.of(), null);
  }

  /**
   * Starts a server with the configuration {@code config}, whose tokens include {@code token} (with the
   * {@code read} role on the namespace {@code default}): the reference stub sends it.
   */
  static GateServer startWithConfig(String config, String token) throws Exception {
    return launch(Files.createTempDirectory("existence-gate-java-test"), config, token, List.of(), null);
  }

  /** A {@code [[tokens]]} entry of the configuration: {@code secret}'s digest, its roles and namespaces. */
  static String tokenEntry(String name, String secret, String roles, String namespaces) throws Exception {
    byte[] digest = java.security.MessageDigest.getInstance("SHA-256")
        .digest(secret.getBytes(StandardCharsets.UTF_8));
    return "[[tokens]]\nname = \"" + name + "\"\nsha256 = \"" + java.util.HexFormat.of().formatHex(digest)
        + "\"\nroles = " + roles + "\nnamespaces = " + namespaces + "\n";
  }

  private static GateServer launch(Path dir, String config, String token, List<String> extraArgs,
      ChannelCredentials reference) throws Exception {
    String bin = System.getenv("EXISTENCE_GATE_BIN");
    if (bin == null || bin.isEmpty()) {
      throw new IllegalStateException("EXISTENCE_GATE_BIN is not set");
    }
    Path configFile = dir.resolve("gate.toml");
    Files.writeString(configFile, config);
    Path log = dir.resolve("server.log");
    List<String> command = new java.util.ArrayList<>(List.of(bin, "serve", "--in-memory", "--listen",
        "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--resp-listen", "127.0.0.1:0", "--config", configFile.toString()));
    command.addAll(extraArgs);
    ProcessBuilder builder =
        new ProcessBuilder(command)
            .redirectErrorStream(true)
            .redirectOutput(log.toFile());
    builder.environment().put("NO_COLOR", "1");
    // Stopped at once on SIGTERM: these tests are about the client, not the drain delay a balancer needs.
    builder.environment().put("EXISTENCE_GATE_DRAIN_DELAY", "0s");
    Process process = builder.start();
    // A run stopped by a signal (test.sh's timeout sends SIGTERM) still stops its servers.
    Runtime.getRuntime().addShutdownHook(new Thread(process::destroy));
    String[] found = new String[2];
    try {
      eventually("the server logs its addresses", () -> {
        if (!process.isAlive()) {
          throw new IllegalStateException("the server exited: " + read(log));
        }
        Matcher m = ADDRESSES.matcher(read(log));
        if (m.find()) {
          found[0] = m.group(1);
          found[1] = m.group(2);
          return true;
        }
        return false;
      });
      GateServer server = new GateServer(process, dir, found[0], found[1], token, reference);
      eventually("the server answers warm", () -> {
        try {
          return server.answer("default", "warm?").getBasis() != Basis.BASIS_WARMING;
        } catch (StatusRuntimeException e) {
          return false;
        }
      });
      return server;
    } catch (Exception | Error e) {
      process.destroyForcibly();
      throw e;
    }
  }

  private static String read(Path log) {
    try {
      return Files.readString(log, StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** The unary MayExist answer of {@code key}, straight from the server. */
  MayExistResponse answer(String namespace, String key) {
    return stub.withDeadlineAfter(5, TimeUnit.SECONDS)
        .mayExist(
            MayExistRequest.newBuilder()
                .setNamespace(namespace)
                .setKey(ByteString.copyFromUtf8(key))
                .build());
  }

  /** The sum of {@code existence_requests_total{rpc="RPC",...}} over codes, from /metrics. */
  long requests(String rpc) throws Exception {
    HttpResponse<String> response =
        HttpClient.newHttpClient()
            .send(
                HttpRequest.newBuilder(URI.create("http://" + httpAddress + "/metrics"))
                    .timeout(Duration.ofSeconds(10))
                    .build(),
                HttpResponse.BodyHandlers.ofString());
    long total = 0;
    for (String line : response.body().split("\n")) {
      if (line.startsWith("existence_requests_total{rpc=\"" + rpc + "\"")) {
        total += (long) Double.parseDouble(line.substring(line.lastIndexOf(' ') + 1));
      }
    }
    return total;
  }

  /** Stops the server with SIGTERM (SIGKILL if it lingers). */
  @Override
  public void close() {
    channel.shutdownNow();
    process.destroy(); // SIGTERM
    try {
      if (!process.waitFor(15, TimeUnit.SECONDS)) {
        process.destroyForcibly();
      }
    } catch (InterruptedException e) {
      process.destroyForcibly();
      Thread.currentThread().interrupt();
    }
    try (var files = Files.walk(dir)) {
      for (Path p : files.sorted(java.util.Comparator.reverseOrder()).toList()) {
        Files.deleteIfExists(p);
      }
    } catch (IOException e) {
      // a temp directory left behind is harmless
    }
  }

  boolean isAlive() {
    return process.isAlive();
  }

  long pid() {
    return process.pid();
  }

  /**
   * Sends the server {@code signal} ({@code STOP}, {@code CONT}, {@code KILL}) with kill(1), returning once
   * kill has: a stopped server answers nothing and keeps its connections open, as a paused machine does.
   */
  void signal(String signal) throws Exception {
    Process kill = new ProcessBuilder("kill", "-" + signal, Long.toString(pid())).inheritIO().start();
    if (kill.waitFor() != 0) {
      throw new IllegalStateException("kill -" + signal + " failed");
    }
  }

  /** A loopback address nothing listens on (a port bound, noted and closed). */
  static String deadAddress() throws IOException {
    try (ServerSocket socket = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
      return "127.0.0.1:" + socket.getLocalPort();
    }
  }

  /** Polls {@code condition} (every 10 ms) until it holds, failing after 30 s. */
  static void eventually(String what, BooleanSupplier condition) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (!condition.getAsBoolean()) {
      if (System.nanoTime() - deadline > 0) {
        throw new AssertionError("not within 30 s: " + what);
      }
      Thread.sleep(10);
    }
  }

  static List<String> keys(String prefix, int from, int to) {
    return java.util.stream.IntStream.range(from, to).mapToObj(i -> prefix + i).toList();
  }
}
