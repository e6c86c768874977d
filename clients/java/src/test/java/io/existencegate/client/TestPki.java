package io.existencegate.client;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A throwaway PKI made with {@code openssl} (P-256 keys, PKCS#8 PEM): a CA, a server certificate for
 * {@code localhost} (subjectAltName DNS:localhost) and a client certificate, both signed by the CA.
 */
final class TestPki implements AutoCloseable {
  final Path dir;
  final Path ca;
  final Path serverCert;
  final Path serverKey;
  final Path clientCert;
  final Path clientKey;

  private TestPki(Path dir) {
    this.dir = dir;
    ca = dir.resolve("ca.pem");
    serverCert = dir.resolve("server.pem");
    serverKey = dir.resolve("server.key");
    clientCert = dir.resolve("client.pem");
    clientKey = dir.resolve("client.key");
  }

  static TestPki create() throws IOException, InterruptedException {
    TestPki pki = new TestPki(Files.createTempDirectory("existence-gate-java-pki"));
    Path caKey = pki.dir.resolve("ca.key");
    pki.openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", caKey.toString(), "-out", pki.ca.toString(), "-days", "2", "-subj", "/CN=existence-gate test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign");
    pki.leaf("server", pki.serverCert, pki.serverKey, caKey,
        "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n");
    pki.leaf("client", pki.clientCert, pki.clientKey, caKey,
        "subjectAltName=DNS:client.test\nextendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n");
    return pki;
  }

  private void leaf(String name, Path cert, Path key, Path caKey, String extensions)
      throws IOException, InterruptedException {
    Path csr = dir.resolve(name + ".csr");
    Path ext = dir.resolve(name + ".ext");
    Files.writeString(ext, extensions, StandardCharsets.UTF_8);
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key.toString(), "-out", csr.toString(), "-subj", "/CN=" + name);
    openssl("x509", "-req", "-in", csr.toString(), "-CA", ca.toString(), "-CAkey", caKey.toString(),
        "-CAcreateserial", "-days", "2", "-extfile", ext.toString(), "-out", cert.toString());
  }

  private void openssl(String... args) throws IOException, InterruptedException {
    List<String> command = new ArrayList<>();
    command.add("openssl");
    command.addAll(List.of(args));
    Path log = dir.resolve("openssl.log");
    Process process = new ProcessBuilder(command).directory(dir.toFile()).redirectErrorStream(true)
        .redirectOutput(log.toFile()).start();
    if (!process.waitFor(60, TimeUnit.SECONDS)) {
      process.destroyForcibly();
      throw new IllegalStateException("openssl did not finish: " + command);
    }
    if (process.exitValue() != 0) {
      throw new IllegalStateException("openssl failed: " + command + "\n" + Files.readString(log));
    }
  }

  @Override
  public void close() {
    try (var files = Files.walk(dir)) {
      for (Path p : files.sorted(Comparator.reverseOrder()).toList()) {
        Files.deleteIfExists(p);
      }
    } catch (IOException e) {
      // a temp directory left behind is harmless
    }
  }
}
