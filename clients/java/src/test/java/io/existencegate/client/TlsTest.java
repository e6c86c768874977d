package io.existencegate.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotEquals;
import static org.junit.Assert.assertTrue;

import io.existencegate.v1.Answer;
import io.grpc.ChannelCredentials;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.TlsChannelCredentials;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/** The client over TLS against a gate that requires client certificates (mutual TLS). */
public class TlsTest {
  private static TestPki pki;
  private static GateServer server;

  @BeforeClass
  public static void startServer() throws Exception {
    pki = TestPki.create();
    try {
      server = GateServer.startTls(pki, mutual(), "tls");
    } catch (Exception | Error e) {
      pki.close();
      throw e;
    }
  }

  @AfterClass
  public static void stopServer() {
    if (server != null) {
      server.close();
    }
    if (pki != null) {
      pki.close();
    }
  }

  /** Trusts the test CA and presents the client certificate. */
  private static ChannelCredentials mutual() throws Exception {
    return TlsChannelCredentials.newBuilder()
        .trustManager(pki.ca.toFile())
        .keyManager(pki.clientCert.toFile(), pki.clientKey.toFile())
        .build();
  }

  @Test
  public void mutualTlsAddsAndLooksUpCoalesced() throws Exception {
    try (GateClient gate = GateClient.builder(server.address).namespace("tls").credentials(mutual())
        .authority("localhost").deadline(Duration.ofSeconds(10)).build()) {
      List<String> added = GateServer.keys("tls-added-", 0, 32);
      List<String> never = GateServer.keys("tls-never-", 0, 32);
      assertTrue(gate.add(added) > 0);
      List<String> keys = new ArrayList<>(added);
      keys.addAll(never);
      List<CompletableFuture<Lookup>> answers = new ArrayList<>();
      for (String key : keys) {
        answers.add(gate.mayExistAsync(key)); // concurrent single-key lookups: coalesced
      }
      for (int i = 0; i < keys.size(); i++) {
        Lookup answer = answers.get(i).get();
        boolean unary = server.answer("tls", keys.get(i)).getAnswer() != Answer.ANSWER_ABSENT;
        assertEquals(keys.get(i), unary, answer.mayExist());
        assertFalse(answer.warming());
        assertEquals(server.address, answer.address());
      }
      for (String key : added) {
        assertTrue(key, gate.mayExist(key).mayExist());
      }
      long absent = never.stream().filter(key -> !gate.mayExist(key).mayExist()).count();
      assertTrue("never-added keys are (mostly) absent: " + absent, absent >= never.size() - 2);
      Stats stats = gate.stats();
      assertEquals(keys.size() + added.size() + never.size(), stats.lookups());
      assertTrue("some lookups shared a batch: " + stats, stats.gateCalls() < stats.lookups());
    }
  }

  @Test
  public void readerSubscribesOverMutualTls() throws Exception {
    try (GateClient gate = GateClient.builder(server.address).namespace("tls").credentials(mutual())
            .authority("localhost").deadline(Duration.ofSeconds(10)).build();
        GatedReader<String> reader = new GatedReader<>(gate, key -> GatedReader.SourceRow.missing())) {
      assertTrue("the invalidation stream goes live over TLS", reader.awaitLive(Duration.ofSeconds(30)));
      assertEquals(Optional.empty(), reader.get("tls-reader-absent"));
    }
  }

  @Test
  public void clientWithoutCertificateIsRefused() throws Exception {
    ChannelCredentials noClientCert = TlsChannelCredentials.newBuilder().trustManager(pki.ca.toFile()).build();
    Status.Code refused = refusal(GateClient.builder(server.address).namespace("tls").credentials(noClientCert)
        .authority("localhost"), "a client without a certificate got an answer");
    assertNotEquals(Status.Code.OK, refused);
  }

  @Test
  public void certificateNameIsCheckedAgainstTheAuthority() throws Exception {
    // 127.0.0.1 is not in the certificate (DNS:localhost only): without authority("localhost") it fails.
    Status.Code refused = refusal(GateClient.builder(server.address).namespace("tls").credentials(mutual()),
        "the certificate for localhost was accepted for 127.0.0.1");
    assertEquals(Status.Code.UNAVAILABLE, refused);
  }

  @Test
  public void plaintextClientIsRefused() throws Exception {
    Status.Code refused = refusal(GateClient.builder(server.address).namespace("tls"),
        "a plaintext client got an answer from a TLS gate");
    assertNotEquals(Status.Code.OK, refused);
  }

  /** The code a lookup through the client {@code builder} makes fails with; fails the test if it is answered. */
  private static Status.Code refusal(GateClient.Builder builder, String answered) throws Exception {
    try (GateClient gate = builder.deadline(Duration.ofSeconds(5)).build()) {
      gate.mayExist("tls-refused");
    } catch (StatusRuntimeException e) {
      return e.getStatus().getCode();
    }
    throw new AssertionError(answered);
  }
}
