package io.existencegate.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.nio.channels.ClosedChannelException;
import java.util.ArrayList;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/** Several addresses (a dead one and a live server), and a gate that requires a token. */
public class AddressesTest {
  private static GateServer server;
  private static String dead;

  @BeforeClass
  public static void startServer() throws Exception {
    server = GateServer.start("multi");
    dead = GateServer.deadAddress();
  }

  @AfterClass
  public static void stopServer() {
    if (server != null) {
      server.close();
    }
  }

  @Test
  public void roundRobinRetriesOnTheLiveAddress() {
    for (Duration window : List.of(GateClient.DEFAULT_COALESCE_WINDOW, Duration.ZERO)) {
      try (GateClient gate =
          GateClient.builder(dead, server.address).namespace("multi").coalesceWindow(window).build()) {
        gate.add(List.of("r:1"));
        for (int i = 0; i < 10; i++) {
          Lookup answer = gate.mayExist("r:" + (i % 2));
          assertEquals(i % 2 == 1, answer.mayExist());
          assertEquals(server.address, answer.address());
        }
        Stats stats = gate.stats();
        // The dead address is tried, marked down for 1 s and skipped meanwhile.
        assertTrue("retries counted: " + stats, stats.retries() >= 1);
        assertTrue("the dead address is skipped while down: " + stats, stats.retries() <= 3);
      }
    }
  }

  /**
   * A replica that accepts connections and never answers (SIGSTOPped) beside a live one: a call sent to it
   * moves on to the live one after half its deadline instead of failing at the deadline, and the silent
   * address is then skipped: every lookup is answered, one retry in all.
   */
  @Test
  public void aSilentAddressCostsACallHalfItsDeadlineAndIsThenSkipped() throws Exception {
    try (ServerSocket silent = new ServerSocket(0, 64, InetAddress.getLoopbackAddress());
        GateClient gate =
            GateClient.builder("127.0.0.1:" + silent.getLocalPort(), server.address)
                .namespace("multi")
                .coalesceWindow(Duration.ZERO)
                .deadline(Duration.ofMillis(400))
                .build()) {
      for (int i = 0; i < 4; i++) {
        assertEquals(server.address, gate.mayExist("silent-beside-live").address());
      }
      assertEquals(1, gate.stats().retries());
    }
  }

  /**
   * A replica killed under a steady load, five times: the calls it held move on to the live address
   * (grpc-java reports some of them as UNKNOWN "channel closed", a connection lost, not the server's answer),
   * so none fails.
   */
  @Test
  public void aKilledAddressCostsNoCall() throws Exception {
    for (int kill = 0; kill < 5; kill++) {
      try (GateServer doomed = GateServer.start("multi");
          GateClient gate =
              GateClient.builder(doomed.address, server.address)
                  .namespace("multi")
                  .coalesceWindow(Duration.ZERO)
                  .deadline(Duration.ofSeconds(10))
                  .build()) {
        AtomicBoolean stop = new AtomicBoolean();
        AtomicLong calls = new AtomicLong();
        List<StatusRuntimeException> failed = new CopyOnWriteArrayList<>();
        List<Thread> callers = new ArrayList<>();
        for (int c = 0; c < 32; c++) {
          String prefix = "killed-" + kill + "-" + c + "-";
          Thread thread = new Thread(() -> {
            for (int i = 0; !stop.get(); i++) {
              try {
                gate.add(List.of(prefix + i));
                calls.incrementAndGet();
              } catch (StatusRuntimeException e) {
                failed.add(e);
              }
            }
          });
          thread.start();
          callers.add(thread);
        }
        GateServer.eventually("calls answered by both addresses", () -> calls.get() > 400);
        doomed.signal("KILL");
        long before = calls.get();
        GateServer.eventually("calls answered after the kill", () -> calls.get() > before + 400);
        stop.set(true);
        for (Thread caller : callers) {
          caller.join();
        }
        assertTrue("calls failed: " + failed, failed.isEmpty());
      }
    }
  }

  @Test
  public void aConnectionClosedUnderACallIsUnavailableAndAnyOtherUnknownIsKept() {
    Status closed = Status.UNKNOWN.withDescription("channel closed").withCause(new ClosedChannelException());
    Status lost = AddressRouter.connectionLossAsUnavailable(closed);
    assertEquals(Status.Code.UNAVAILABLE, lost.getCode());
    assertTrue(lost.getDescription(), lost.getDescription().contains("channel closed"));
    Status wrapped = Status.UNKNOWN.withCause(new IllegalStateException(new ClosedChannelException()));
    assertEquals(Status.Code.UNAVAILABLE, AddressRouter.connectionLossAsUnavailable(wrapped).getCode());
    Status servers = Status.UNKNOWN.withDescription("the handler threw");
    assertEquals(servers, AddressRouter.connectionLossAsUnavailable(servers));
    Status internal = Status.INTERNAL.withCause(new ClosedChannelException());
    assertEquals(internal, AddressRouter.connectionLossAsUnavailable(internal));
  }

  @Test
  public void pickFirstStaysOnTheFirstHealthyAddress() {
    try (GateClient gate =
        GateClient.builder(server.address, dead).namespace("multi").addressPolicy(AddressPolicy.PICK_FIRST)
            .build()) {
      for (int i = 0; i < 10; i++) {
        assertEquals(server.address, gate.mayExist("p:" + i).address());
      }
      assertEquals(0, gate.stats().retries());
    }
    try (GateClient gate =
        GateClient.builder(dead, server.address).namespace("multi").addressPolicy(AddressPolicy.PICK_FIRST)
            .build()) {
      for (int i = 0; i < 10; i++) {
        assertEquals(server.address, gate.mayExist("p:" + i).address());
      }
      assertEquals("one retry, then the dead first address is down", 1, gate.stats().retries());
    }
  }

  @Test
  public void everyAddressDownIsUnavailableBeforeTheDeadline() throws Exception {
    try (GateClient gate =
        GateClient.builder(dead, GateServer.deadAddress()).namespace("multi").deadline(Duration.ofSeconds(20))
            .build()) {
      for (int i = 0; i < 3; i++) { // also once both are marked down: the one down the longest is tried
        long started = System.nanoTime();
        try {
          gate.mayExist("down");
          fail("nothing listens");
        } catch (StatusRuntimeException e) {
          assertEquals(Status.Code.UNAVAILABLE, e.getStatus().getCode());
        }
        assertTrue(System.nanoTime() - started < TimeUnit.SECONDS.toNanos(10));
      }
      assertFalse(gate.stats().retries() == 0);
    }
  }

  @Test
  public void theTokenIsSentOnEveryCallAndTheSubscription() throws Exception {
    try (GateServer guarded = GateServer.startWithToken("s3cret", "guarded")) {
      try (GateClient gate = GateClient.builder(guarded.address).namespace("guarded").token("s3cret").build();
          GatedReader<String> reader = new GatedReader<>(gate, key -> GatedReader.SourceRow.missing())) {
        assertTrue("the subscription goes live", reader.awaitLive(Duration.ofSeconds(30)));
        gate.add(List.of("t:1"));
        assertTrue(gate.mayExist("t:1").mayExist());
        assertTrue(reader.get("t:2").isEmpty());
        assertTrue(reader.isCachedAbsent("t:2"));
        assertEquals(0, reader.stats().failOpens());
      }
      try (GateClient anonymous = GateClient.builder(guarded.address).namespace("guarded").build()) {
        try {
          anonymous.mayExist("t:1");
          fail("the gate requires a token");
        } catch (StatusRuntimeException e) {
          assertEquals(Status.Code.UNAUTHENTICATED, e.getStatus().getCode());
        }
      }
    }
  }
}
