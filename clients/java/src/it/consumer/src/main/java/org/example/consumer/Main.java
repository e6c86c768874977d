package org.example.consumer;

import io.existencegate.client.GateClient;
import io.existencegate.client.Lookup;
import io.existencegate.v1.CurrentSeqRequest;
import io.existencegate.v1.ExistenceGateGrpc;
import io.existencegate.v1.MayExistRequest;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * The consumer project's program: calls a gate (namespace {@code users}, as clients/conformance/gate.toml
 * configures) through the library and through the stubs its jar carries.
 *
 * <pre>java -cp ... org.example.consumer.Main HOST:PORT</pre>
 */
public final class Main {
  private Main() {}

  public static void main(String[] args) throws InterruptedException {
    if (args.length != 1) {
      fail("usage: Main HOST:PORT");
    }
    String addr = args[0];

    // The stubs, on a channel of the program's own: the gate answers, and is no longer warming.
    ManagedChannel channel = ManagedChannelBuilder.forTarget(addr).usePlaintext().build();
    try {
      ExistenceGateGrpc.ExistenceGateBlockingStub stub =
          ExistenceGateGrpc.newBlockingStub(channel).withDeadlineAfter(30, TimeUnit.SECONDS);
      MayExistRequest ready = MayExistRequest.newBuilder()
          .setNamespace("users")
          .setKey(com.google.protobuf.ByteString.copyFromUtf8("consumer:ready?"))
          .build();
      while (stub.mayExist(ready).getBasis() == io.existencegate.v1.Basis.BASIS_WARMING) {
        Thread.sleep(50);
      }

      // The library: an Add, then lookups of the added key and of one never added.
      long seq;
      try (GateClient gate = GateClient.builder(addr).namespace("users").deadline(Duration.ofSeconds(5)).build()) {
        seq = gate.add(List.of("consumer:added"));
        Lookup added = gate.mayExist("consumer:added");
        if (!added.mayExist() || added.observedSeq() < seq) {
          fail("mayExist(added) = " + added + "; want may exist at seq >= " + seq);
        }
        Lookup never = gate.mayExist("consumer:never-added");
        if (never.mayExist()) {
          fail("mayExist(never added) = " + never + "; want absent");
        }
      }
      long current = stub.currentSeq(CurrentSeqRequest.newBuilder().setNamespace("users").build()).getSeq();
      if (current < seq) {
        fail("CurrentSeq = " + current + "; want >= " + seq);
      }
      System.out.println("consumer: Add seq " + seq + ", the added key may exist, the other is absent, CurrentSeq "
          + current);
    } finally {
      channel.shutdownNow();
    }
  }

  private static void fail(String message) {
    System.err.println("consumer: " + message);
    System.exit(1);
  }
}
