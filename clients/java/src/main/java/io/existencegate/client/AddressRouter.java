package io.existencegate.client;

import io.existencegate.v1.ExistenceGateGrpc;
import io.grpc.Deadline;
import io.grpc.Status;
import io.grpc.stub.StreamObserver;
import java.nio.channels.ClosedChannelException;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLongArray;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.BooleanSupplier;

/**
 * Which gate address each attempt of a client's call goes to: the address policy, the addresses marked down
 * (for 1 s, after UNAVAILABLE, a connection lost or no answer in time) and skipped meanwhile, and the retry
 * on another address. Shared by a client's calls and its mirrors, so that an address one of them found down
 * is skipped by all.
 */
final class AddressRouter {
  /** How long an address that answered UNAVAILABLE is skipped. */
  static final long DOWN_NANOS = TimeUnit.SECONDS.toNanos(1);

  /** One started RPC: the stub (with its deadline) and where to deliver the answer. */
  @FunctionalInterface
  interface Rpc<R> {
    void start(ExistenceGateGrpc.ExistenceGateStub stub, StreamObserver<R> observer);
  }

  /** An RPC's response and the address that gave it. */
  record Answered<R>(R response, String address) {}

  private final List<String> addresses;
  private final AddressPolicy policy;
  private final List<ExistenceGateGrpc.ExistenceGateStub> stubs;
  /** Whether the client is closed: no retry then. */
  private final BooleanSupplier closed;
  /** Per address: until when (nanos since {@link #base}) it is down; 0 = up. */
  private final AtomicLongArray downUntil;
  private final long base = System.nanoTime();
  private final AtomicInteger roundRobin = new AtomicInteger();
  private final LongAdder retries = new LongAdder();

  AddressRouter(List<String> addresses, AddressPolicy policy, List<ExistenceGateGrpc.ExistenceGateStub> stubs,
      BooleanSupplier closed) {
    this.addresses = addresses;
    this.policy = policy;
    this.stubs = stubs;
    this.closed = closed;
    this.downUntil = new AtomicLongArray(addresses.size());
  }

  /** Calls retried on another address. */
  long retries() {
    return retries.sum();
  }

  /**
   * The first address, in the order given, that is up (the one down the longest when none is): where a
   * mirror attaches, whatever the calls' policy.
   */
  int firstUp() {
    long now = now();
    for (int i = 0; i < addresses.size(); i++) {
      if (downUntil.get(i) <= now) {
        return i;
      }
    }
    return downLongest();
  }

  /**
   * Starts {@code rpc} on an address chosen by the policy ({@code preferred} first when it is up) and, when
   * an address answers UNAVAILABLE (or the connection closes under the call), or does not answer within half
   * of what is left of {@code callDeadline} while another address not tried yet is up, marks it down for 1 s
   * and retries on the next address that is up and not tried yet, within {@code callDeadline}. Every other
   * status ends the call as it is.
   */
  <R> CompletableFuture<Answered<R>> invoke(Rpc<R> rpc, Deadline callDeadline, int preferred, Runnable onAttempt) {
    CompletableFuture<Answered<R>> result = new CompletableFuture<>();
    boolean[] tried = new boolean[addresses.size()];
    attempt(rpc, callDeadline, pick(tried, preferred, -1), tried, onAttempt, result);
    return result;
  }

  private <R> void attempt(
      Rpc<R> rpc,
      Deadline callDeadline,
      int index,
      boolean[] tried,
      Runnable onAttempt,
      CompletableFuture<Answered<R>> result) {
    tried[index] = true;
    if (onAttempt != null) {
      onAttempt.run();
    }
    // An address that accepts and never answers (a stopped replica, its connections open) would hold the call
    // to its deadline: while another untried address is up, it gets half of what remains, then the call moves
    // on. With none up, it gets all of it: a slow replica alone still answers within the deadline.
    Deadline attemptDeadline =
        anotherUp(tried)
            ? Deadline.after(callDeadline.timeRemaining(TimeUnit.NANOSECONDS) / 2, TimeUnit.NANOSECONDS)
            : callDeadline;
    StreamObserver<R> observer =
        new StreamObserver<>() {
          private R response;

          @Override
          public void onNext(R value) {
            response = value;
          }

          @Override
          public void onError(Throwable error) {
            Status status = Status.fromThrowable(error);
            Status lost = connectionLossAsUnavailable(status);
            boolean silent =
                status.getCode() == Status.Code.DEADLINE_EXCEEDED && !callDeadline.isExpired();
            if (lost.getCode() == Status.Code.UNAVAILABLE || silent) {
              markDown(index);
              int next = callDeadline.isExpired() || closed.getAsBoolean() ? -1 : pick(tried, -1, index);
              if (next >= 0) {
                retries.increment();
                attempt(rpc, callDeadline, next, tried, onAttempt, result);
                return;
              }
            }
            result.completeExceptionally(
                lost == status ? GateClient.asStatusException(error) : lost.asRuntimeException());
          }

          @Override
          public void onCompleted() {
            downUntil.set(index, 0);
            result.complete(new Answered<>(response, addresses.get(index)));
          }
        };
    try {
      rpc.start(stubs.get(index).withDeadline(attemptDeadline), observer);
    } catch (RuntimeException e) {
      result.completeExceptionally(GateClient.asStatusException(e));
    }
  }

  private long now() {
    return System.nanoTime() - base;
  }

  /**
   * {@code status}, with a connection that closed under the call said as UNAVAILABLE. grpc-java reports a
   * write to a connection the server's end has closed (a replica killed, a reset) as UNKNOWN "channel
   * closed", a {@link ClosedChannelException} its cause (grpc/grpc-java#10120), where a refused connect or a
   * read that ends is UNAVAILABLE. Either way the call got no answer from that address, so it moves on as
   * after any UNAVAILABLE (an Add twice adds nothing twice), and a caller whose retries ran out sees the
   * code that says "try again". Any other UNKNOWN (the server's own) is kept as it is.
   */
  static Status connectionLossAsUnavailable(Status status) {
    if (status.getCode() != Status.Code.UNKNOWN) {
      return status;
    }
    for (Throwable cause = status.getCause(); cause != null; cause = cause.getCause()) {
      if (cause instanceof ClosedChannelException) {
        return Status.UNAVAILABLE
            .withDescription("the connection closed under the call (" + status.getDescription() + ")")
            .withCause(status.getCause());
      }
    }
    return status;
  }

  /** Skips {@code index} for a while: it answered UNAVAILABLE, or nothing in time. */
  void markDown(int index) {
    downUntil.set(index, Math.max(1, now() + DOWN_NANOS));
  }

  /** Whether an address not tried yet is up: somewhere for the call to go if this attempt gets no answer. */
  private boolean anotherUp(boolean[] tried) {
    long now = now();
    for (int i = 0; i < tried.length; i++) {
      if (!tried[i] && downUntil.get(i) <= now) {
        return true;
      }
    }
    return false;
  }

  /**
   * The address for an attempt: {@code preferred} if up; else, by the policy, the next one that is up and not
   * tried (after {@code last} for a retry). A first attempt with every address down goes to the one down the
   * longest; a retry with none left returns -1.
   */
  private int pick(boolean[] tried, int preferred, int last) {
    int n = addresses.size();
    long now = now();
    if (preferred >= 0 && downUntil.get(preferred) <= now) {
      return preferred;
    }
    int start;
    if (policy == AddressPolicy.PICK_FIRST) {
      start = 0;
    } else if (last >= 0) {
      start = last + 1;
    } else {
      start = Math.floorMod(roundRobin.getAndIncrement(), n);
    }
    for (int k = 0; k < n; k++) {
      int i = (start + k) % n;
      if (!tried[i] && downUntil.get(i) <= now) {
        return i;
      }
    }
    if (last >= 0) {
      return -1;
    }
    return downLongest();
  }

  private int downLongest() {
    int longest = 0;
    for (int i = 1; i < addresses.size(); i++) {
      if (downUntil.get(i) < downUntil.get(longest)) {
        longest = i;
      }
    }
    return longest;
  }
}
