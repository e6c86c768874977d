"""GateClient: the gate's calls over one or more addresses, with single-key lookups coalesced into batches."""

import asyncio
import concurrent.futures as cf
import dataclasses
import enum
import heapq
import itertools
import logging
import threading
import time
from typing import Callable, Iterable, List, Optional, Sequence, Union

import grpc

from ._stubs import pb, pb_grpc

log = logging.getLogger("existence_gate_client")

Key = Union[str, bytes, bytearray, memoryview]

#: The server's default `max_batch_keys`: `may_exist_many` splits larger inputs into parts of this size.
MAX_BATCH_KEYS = 10_000
#: How long an address that answered UNAVAILABLE (or could not be reached) is skipped.
DOWN_FOR = 1.0


class AddressPolicy(str, enum.Enum):
    ROUND_ROBIN = "round_robin"  # each call or batch to the next address that is up
    PICK_FIRST = "pick_first"  # the first address that is up


class AbsenceKind(enum.IntEnum):
    MISSING = pb.ABSENCE_KIND_MISSING
    DELETED = pb.ABSENCE_KIND_DELETED


class RecordOutcome(enum.IntEnum):
    UNSPECIFIED = pb.RECORD_OUTCOME_UNSPECIFIED
    RECORDED = pb.RECORD_OUTCOME_RECORDED
    REDUNDANT = pb.RECORD_OUTCOME_REDUNDANT
    SUPERSEDED = pb.RECORD_OUTCOME_SUPERSEDED
    THROTTLED = pb.RECORD_OUTCOME_THROTTLED


@dataclasses.dataclass(frozen=True)
class Answer:
    """The gate's answer for one key."""

    may_exist: bool  # False: the key does not exist (a promise); True: ask the source
    observed_seq: int  # the namespace's seq the answer was computed at (pass it to record_absent)
    warming: bool  # the gate was still loading: it answered "may exist" without knowing
    address: str = ""  # the gate address that answered (record an absence there)


@dataclasses.dataclass(frozen=True)
class Recorded:
    """The outcome of `record_absent`."""

    outcome: RecordOutcome
    seq: int  # the tombstone's seq when RECORDED, else the namespace's latest seq
    expires_in_ms: int  # the TTL applied; 0 unless RECORDED


@dataclasses.dataclass(frozen=True)
class Stats:
    """A snapshot of monotonically increasing counters."""

    lookups: int = 0  # single-key lookups asked of the client
    gate_calls: int = 0  # lookup RPCs (MayExist or BatchMayExist); a retry counts in `retries`, not again here
    batched_keys: int = 0  # keys sent in coalesced batches
    retries: int = 0  # calls retried on another address
    cache_hits: int = 0  # gets answered by the local absence cache
    fail_opens: int = 0  # gets that read the source because the gate failed
    source_reads: int = 0  # source reads (after single flight)
    absences_recorded: int = 0  # RecordAbsent answered RECORDED
    invalidations: int = 0  # ADDED keys applied, plus one per RESYNC
    resubscribes: int = 0  # subscriptions reopened
    warming_adds: int = 0  # keys found while the gate was warming, added once it was not
    warming_adds_dropped: int = 0  # such keys dropped: more than 10,000 waiting, or their Add failed

    def as_dict(self):
        return dataclasses.asdict(self)


class _Counters:
    def __init__(self):
        self._lock = threading.Lock()
        self._values = dict.fromkeys((f.name for f in dataclasses.fields(Stats)), 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._values[name] += n

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._values)


class GateError(grpc.RpcError):
    """A gRPC status from the gate (or for a lookup whose deadline passed), with its code and message unchanged.

    It is a `grpc.RpcError`, so `except grpc.RpcError as e: e.code()` works as with a plain stub."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata=None, debug_error_string: str = ""):
        super().__init__("{}: {}".format(code.name, details))
        self._code = code
        self._details = details
        self._trailing_metadata = trailing_metadata
        self._debug_error_string = debug_error_string

    @classmethod
    def of(cls, error: BaseException) -> "GateError":
        if isinstance(error, GateError):
            return cls(error._code, error._details, error._trailing_metadata, error._debug_error_string)
        if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
            debug = error.debug_error_string() if hasattr(error, "debug_error_string") else ""
            trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
            return cls(error.code(), error.details() or "", trailing, debug)
        if isinstance(error, grpc.FutureCancelledError):
            return cls(grpc.StatusCode.CANCELLED, "the call was cancelled")
        return cls(grpc.StatusCode.UNKNOWN, "{}: {}".format(type(error).__name__, error))

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self):
        return self._trailing_metadata

    def debug_error_string(self) -> str:
        return self._debug_error_string


def _deadline_error(what: str) -> GateError:
    return GateError(grpc.StatusCode.DEADLINE_EXCEEDED, "{}: deadline exceeded".format(what))


def _key_bytes(key: Key) -> bytes:
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise TypeError("a key is str or bytes, not {}".format(type(key).__name__))


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _pack(keys: Sequence[bytes]) -> bytes:
    return b"".join(_varint(len(k)) + k for k in keys)


def _bits(bitmap: bytes, n: int) -> List[bool]:
    if len(bitmap) * 8 < n:
        raise GateError(
            grpc.StatusCode.INTERNAL,
            "BatchMayExist answered {} bitmap bytes for {} packed keys (a server without packed_keys?)".format(
                len(bitmap), n
            ),
        )
    return [bool(bitmap[i >> 3] >> (i & 7) & 1) for i in range(n)]


class _Address:
    __slots__ = ("target", "channel", "stub", "down_until", "down_since")

    def __init__(self, target: str, channel: grpc.Channel):
        self.target = target
        self.channel = channel
        self.stub = pb_grpc.ExistenceGateStub(channel)
        self.down_until = 0.0
        self.down_since = 0.0


class _Pool:
    """One channel per address; which one a call goes to, and which are down."""

    def __init__(self, addresses: Sequence[str], policy: AddressPolicy, make_channel: Callable[[str], grpc.Channel]):
        self.addresses = [_Address(a, make_channel(a)) for a in addresses]
        self.policy = policy
        self._lock = threading.Lock()
        self._turn = itertools.count()

    def _order(self) -> List[int]:
        n = len(self.addresses)
        if self.policy is AddressPolicy.PICK_FIRST:
            return list(range(n))
        start = next(self._turn) % n
        return [(start + i) % n for i in range(n)]

    def first(self, preferred: Optional[int] = None) -> int:
        now = time.monotonic()
        with self._lock:
            if preferred is not None and self.addresses[preferred].down_until <= now:
                return preferred
            for i in self._order():
                if self.addresses[i].down_until <= now:
                    return i
            # Every address is down: try the one down the longest.
            return min(range(len(self.addresses)), key=lambda i: self.addresses[i].down_since)

    def next_up(self, tried: List[int]) -> Optional[int]:
        """An address not tried yet that is up, in address order: asking does not take a round-robin turn
        (a call that asked whether it has somewhere to go next would shift where the following call goes)."""
        now = time.monotonic()
        with self._lock:
            for i in range(len(self.addresses)):
                if i not in tried and self.addresses[i].down_until <= now:
                    return i
        return None

    def mark_down(self, i: int) -> None:
        now = time.monotonic()
        with self._lock:
            address = self.addresses[i]
            if address.down_until <= now:
                address.down_since = now
            address.down_until = now + DOWN_FOR

    def mark_up(self, i: int) -> None:
        with self._lock:
            self.addresses[i].down_until = 0.0

    def close(self) -> None:
        for address in self.addresses:
            address.channel.close()


class _Waiter:
    """One coalesced caller: its keys (one for `may_exist`, a part for `may_exist_many`), its future and its
    own deadline. A single-key waiter's result is an `Answer`; a part's is `(bits, observed_seq, warming,
    address)`."""

    __slots__ = ("keys", "single", "future", "deadline", "arrived")

    def __init__(self, keys: List[bytes], deadline: float, single: bool = True):
        self.keys = keys
        self.single = single
        self.future = cf.Future()
        self.deadline = deadline
        self.arrived = time.monotonic()

    def resolve(self, result) -> None:
        try:
            self.future.set_result(result)
        except cf.InvalidStateError:  # cancelled or timed out meanwhile
            pass

    def fail(self, error: BaseException) -> None:
        try:
            self.future.set_exception(GateError.of(error))
        except cf.InvalidStateError:
            pass


class _Coalescer:
    """Gathers concurrent lookups into packed BatchMayExist calls. A pending batch leaves when
    - no batch is in flight (sent and not yet answered): a lone caller pays one round trip, never a window,
    - its oldest caller has waited `window`, or
    - it holds `max_keys` keys,
    so under load each batch carries what arrived while the previous ones were out. A waiter may bring several
    keys (a `may_exist_many` part); a batch takes whole waiters, oldest first, and never exceeds 10,000 keys.

    One dispatcher thread waits on a condition for exactly as long as the pending batch's window or the
    nearest caller deadline, and is woken when the last batch in flight is answered; the RPCs themselves are
    asynchronous (grpc futures), so batches overlap freely."""

    def __init__(self, client: "GateClient", window: float, max_keys: int):
        self._client = client
        self._window = window
        self._max_keys = min(max_keys, MAX_BATCH_KEYS)
        self._cond = threading.Condition()
        self._pending: List[_Waiter] = []
        self._pending_keys = 0  # keys of the pending waiters
        self._in_flight = 0  # batches sent and not yet answered
        self._deadlines: list = []  # heap of (deadline, n, waiter) of unfinished lookups
        self._n = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="existence-gate-coalescer", daemon=True)
        self._thread.start()

    def submit(self, waiter: _Waiter) -> None:
        with self._cond:
            if self._closed:
                raise GateError(grpc.StatusCode.CANCELLED, "the client is closed")
            was_full = self._pending_keys >= self._max_keys
            self._pending.append(waiter)
            self._pending_keys += len(waiter.keys)
            heapq.heappush(self._deadlines, (waiter.deadline, next(self._n), waiter))
            if len(self._pending) == 1 or (not was_full and self._pending_keys >= self._max_keys):
                # The first waiter (it leaves at once when nothing is in flight, or starts the window), or a
                # full batch.
                self._cond.notify()
            elif self._deadlines[0][2] is waiter:
                # A deadline before the one the dispatcher sleeps towards.
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            pending, self._pending = self._pending, []
            self._pending_keys = 0
            self._cond.notify()
        for waiter in pending:
            waiter.fail(GateError(grpc.StatusCode.CANCELLED, "the client is closed"))
        self._thread.join(timeout=5)

    def _expired(self, now: float) -> List[_Waiter]:
        """Takes the lookups whose deadline passed (their batch, if sent, goes on for the others)."""
        expired = []
        while self._deadlines and (self._deadlines[0][0] <= now or self._deadlines[0][2].future.done()):
            _, _, waiter = heapq.heappop(self._deadlines)
            if not waiter.future.done():
                expired.append(waiter)
        return expired

    def _take_batch(self) -> List[_Waiter]:
        """The oldest live waiters, up to `max_keys` keys (at least one waiter, never past 10,000 keys); waiters
        cancelled or expired meanwhile are dropped on the way."""
        batch: List[_Waiter] = []
        keys = taken = 0
        for waiter in self._pending:
            more = len(waiter.keys)
            if batch and (keys >= self._max_keys or keys + more > MAX_BATCH_KEYS):
                break
            taken += 1
            self._pending_keys -= more
            if not waiter.future.done():
                batch.append(waiter)
                keys += more
        del self._pending[:taken]
        return batch

    def _run(self) -> None:
        while True:
            with self._cond:
                batch: List[_Waiter] = []
                while True:
                    now = time.monotonic()
                    expired = self._expired(now)
                    if expired or self._closed:
                        break
                    wake = None
                    if self._pending:
                        due = self._pending[0].arrived + self._window
                        if self._in_flight == 0 or self._pending_keys >= self._max_keys or now >= due:
                            batch = self._take_batch()
                            if batch:
                                self._in_flight += 1
                                break
                            continue  # only abandoned waiters: look again
                        wake = due
                    if self._deadlines:
                        wake = self._deadlines[0][0] if wake is None else min(wake, self._deadlines[0][0])
                    self._cond.wait(None if wake is None else max(0.0, wake - now))
                closed = self._closed
            # Futures are completed outside the lock: their callbacks may start lookups of their own.
            for waiter in expired:
                waiter.fail(_deadline_error("MayExist (coalesced)"))
            if batch:
                self._send(batch)
            if closed:
                return

    def _answered(self) -> None:
        """One batch fewer in flight: if none is left, callers still pending leave at once."""
        with self._cond:
            self._in_flight -= 1
            if self._in_flight == 0 and self._pending:
                self._cond.notify()

    def _send(self, batch: List[_Waiter]) -> None:
        client = self._client
        keys = [key for waiter in batch for key in waiter.keys]
        client._counters.add("gate_calls")
        client._counters.add("batched_keys", len(keys))
        request = pb.BatchMayExistRequest(namespace=client.namespace, packed_keys=_pack(keys))

        def done(response, error, address):
            self._answered()
            if error is None:
                try:
                    bits = _bits(response.may_exist_bitmap, len(keys))
                except GateError as bad:
                    error = bad
            if error is not None:
                for waiter in batch:
                    waiter.fail(error)
                return
            offset = 0
            for waiter in batch:
                n = len(waiter.keys)
                if waiter.single:
                    waiter.resolve(Answer(bits[offset], response.observed_seq, response.warming, address))
                else:
                    waiter.resolve((bits[offset : offset + n], response.observed_seq, response.warming, address))
                offset += n

        client._call("BatchMayExist", request, max(w.deadline for w in batch), done)


class GateClient:
    """The gate's calls for one namespace, over one or more addresses (replicas of one deployment).

        client = GateClient(["gate-a:50051", "gate-b:50051"], "users")
        answer = client.may_exist("user:42")      # coalesced with concurrent lookups
        if not answer.may_exist: ...              # the key does not exist

    Thread-safe; one per namespace and process. Errors are `GateError` (a `grpc.RpcError`) with the gate's
    status code and message unchanged."""

    def __init__(
        self,
        addresses: Union[str, Iterable[str]],
        namespace: str = "",
        *,
        coalesce_window: float = 0.0002,
        coalesce_max_keys: int = 1024,
        deadline: float = 0.5,
        address_policy: Union[AddressPolicy, str] = AddressPolicy.ROUND_ROBIN,
        token: Optional[str] = None,
        credentials: Optional[grpc.ChannelCredentials] = None,
        channel_options: Sequence = (),
        max_key_bytes: int = 1024,
    ):
        """
        addresses: "host:port" or a list of them.
        coalesce_window: seconds a single-key lookup waits for others to share its batch; 0 = unary MayExist.
        coalesce_max_keys: a batch is sent as soon as it holds this many keys.
        deadline: seconds per call, retries included (a call's own `timeout` overrides it).
        address_policy: "round_robin" or "pick_first".
        token: sent as `authorization: Bearer <token>`.
        credentials: grpc.ssl_channel_credentials(...) for TLS; None = plaintext.
        channel_options: extra grpc channel arguments.
        max_key_bytes: longer (and empty) keys are looked up alone, so a key the gate refuses gets its own
            INVALID_ARGUMENT and never fails a batch shared with others (the server's default limit).
        """
        if isinstance(addresses, str):
            addresses = [addresses]
        addresses = list(addresses)
        if not addresses:
            raise ValueError("GateClient needs at least one address")
        if coalesce_window < 0 or coalesce_max_keys < 1 or deadline <= 0:
            raise ValueError("coalesce_window >= 0, coalesce_max_keys >= 1 and deadline > 0")
        self.namespace = namespace
        self.addresses = addresses
        self.deadline = deadline
        self.coalesce_window = coalesce_window
        self.coalesce_max_keys = coalesce_max_keys
        self.max_key_bytes = max_key_bytes
        self._credentials = credentials
        self._channel_options = list(channel_options)
        self._metadata = (("authorization", "Bearer " + token),) if token else None
        self._counters = _Counters()
        self._pool = _Pool(addresses, AddressPolicy(address_policy), self.make_channel)
        self._coalescer = _Coalescer(self, coalesce_window, coalesce_max_keys) if coalesce_window > 0 else None
        self._closed = False

    # -- plumbing -------------------------------------------------------------------------------------------

    def make_channel(self, address: str) -> grpc.Channel:
        """A new channel to `address` with this client's credentials and options (the reader's stream uses one)."""
        if self._credentials is not None:
            return grpc.secure_channel(address, self._credentials, options=self._channel_options)
        return grpc.insecure_channel(address, options=self._channel_options)

    @property
    def metadata(self):
        return self._metadata

    def _call(self, method: str, request, deadline: float, on_done, preferred: Optional[int] = None) -> None:
        """Starts `method` on an address; on UNAVAILABLE, or no answer within half of what is left of
        `deadline` while another address is up, marks it down and retries on the next one that is up, within
        `deadline`. Calls on_done(response, error, address) exactly once, from any thread."""
        tried: List[int] = []

        def attempt(i: int) -> None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                on_done(None, _deadline_error(method), self.addresses[i])
                return
            tried.append(i)
            # An address that accepts and never answers (a stopped replica) would hold the call to its
            # deadline: with another address left, it gets half of what remains, then the call moves on.
            budget = remaining / 2 if self._pool.next_up(tried) is not None else remaining
            try:
                stub_method = getattr(self._pool.addresses[i].stub, method)
                call = stub_method.future(request, timeout=budget, metadata=self._metadata)
            except Exception as error:  # e.g. a closed channel
                on_done(None, GateError.of(error), self.addresses[i])
                return
            call.add_done_callback(lambda f: finished(i, f))

        def finished(i: int, call) -> None:
            try:
                response = call.result()
            except grpc.RpcError as error:
                silent = error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and deadline > time.monotonic()
                if error.code() == grpc.StatusCode.UNAVAILABLE or silent:
                    self._pool.mark_down(i)
                    following = self._pool.next_up(tried)
                    if following is not None and deadline > time.monotonic():
                        self._counters.add("retries")
                        log.debug("%s on %s: %s; retrying on %s", method, self.addresses[i], error.code(), self.addresses[following])
                        attempt(following)
                        return
                on_done(None, GateError.of(error), self.addresses[i])
                return
            except BaseException as error:  # cancelled (channel closed)
                on_done(None, GateError.of(error), self.addresses[i])
                return
            self._pool.mark_up(i)
            on_done(response, None, self.addresses[i])

        attempt(self._pool.first(preferred))

    def _future(self, method: str, request, timeout: Optional[float], preferred: Optional[int] = None) -> "cf.Future":
        future: cf.Future = cf.Future()

        def done(response, error, address):
            try:
                if error is None:
                    future.set_result((response, address))
                else:
                    future.set_exception(error)
            except cf.InvalidStateError:
                pass

        self._call(method, request, time.monotonic() + (self.deadline if timeout is None else timeout), done, preferred)
        return future

    def _wait(self, future: "cf.Future", deadline: float, what: str):
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except cf.TimeoutError:
            if future.cancel():
                raise _deadline_error(what) from None
            return future.result()

    def _check_open(self):
        if self._closed:
            raise GateError(grpc.StatusCode.CANCELLED, "the client is closed")

    # -- lookups --------------------------------------------------------------------------------------------

    def may_exist_future(self, key: Key, timeout: Optional[float] = None) -> "cf.Future":
        """Starts a lookup; the future's result is an `Answer`, or it fails with `GateError` (DEADLINE_EXCEEDED
        once `timeout`, default `deadline`, passed). `cancel()` abandons it: others sharing its batch go on."""
        self._check_open()
        key = _key_bytes(key)
        self._counters.add("lookups")
        timeout = self.deadline if timeout is None else timeout
        if self._coalescer is not None and self._coalescable(key):
            waiter = _Waiter([key], time.monotonic() + timeout)
            self._coalescer.submit(waiter)
            return waiter.future
        self._counters.add("gate_calls")
        future: cf.Future = cf.Future()

        def done(response, error, address):
            try:
                if error is None:
                    future.set_result(
                        Answer(
                            response.answer != pb.ANSWER_ABSENT,
                            response.observed_seq,
                            response.basis == pb.BASIS_WARMING,
                            address,
                        )
                    )
                else:
                    future.set_exception(error)
            except cf.InvalidStateError:
                pass

        request = pb.MayExistRequest(namespace=self.namespace, key=key)
        self._call("MayExist", request, time.monotonic() + timeout, done)
        return future

    def may_exist(self, key: Key, timeout: Optional[float] = None) -> Answer:
        """Can `key` exist? Coalesced with concurrent lookups (see `coalesce_window`)."""
        deadline = time.monotonic() + (self.deadline if timeout is None else timeout)
        return self._wait(self.may_exist_future(key, timeout), deadline, "MayExist")

    async def may_exist_async(self, key: Key, timeout: Optional[float] = None) -> Answer:
        """`may_exist` for asyncio code: coalesced with every other lookup of this client (threads and tasks
        alike); cancelling the task abandons the lookup."""
        # The lookup fails itself with DEADLINE_EXCEEDED at its deadline (the coalescer's timer, or the call's),
        # and cancelling the awaiting task cancels it (wrap_future chains the cancellation): asyncio.wait_for
        # around it added a task and a timer of the loop's per lookup, 98 instead of 73 µs of CPU per lookup at
        # 64 tasks (bench/coalesced.py).
        return await asyncio.wrap_future(self.may_exist_future(key, timeout))

    def _coalescable(self, key: bytes) -> bool:
        """Whether `key` may share a batch: the gate refuses an empty or over-long key with INVALID_ARGUMENT for
        the whole batch, so such a key is sent alone and its caller alone is refused."""
        return 0 < len(key) <= self.max_key_bytes

    def may_exist_many(self, keys: Iterable[Key], timeout: Optional[float] = None) -> List[Answer]:
        """One answer per key, in order, from packed BatchMayExist calls (in parallel parts of at most 10,000
        keys); every answer carries the smallest observed_seq of the parts (the conservative one to record an
        absence with) and `warming` if any part was warming. With coalescing on, a part whose keys are all
        coalescable joins the pending batch like a single key does (a batch never splits a part), so concurrent
        small batches and single-key lookups share calls."""
        self._check_open()
        keys = [_key_bytes(k) for k in keys]
        if not keys:
            return []
        deadline = time.monotonic() + (self.deadline if timeout is None else timeout)
        parts = [keys[i : i + MAX_BATCH_KEYS] for i in range(0, len(keys), MAX_BATCH_KEYS)]
        futures = []
        for part in parts:
            if self._coalescer is not None and all(self._coalescable(k) for k in part):
                waiter = _Waiter(part, deadline, single=False)
                self._coalescer.submit(waiter)
                futures.append(waiter.future)
                continue
            self._counters.add("gate_calls")
            request = pb.BatchMayExistRequest(namespace=self.namespace, packed_keys=_pack(part))
            uncoalesced: cf.Future = cf.Future()

            def unpack(call: "cf.Future", part=part, into=uncoalesced) -> None:
                try:
                    response, address = call.result()
                    result = (_bits(response.may_exist_bitmap, len(part)), response.observed_seq, response.warming, address)
                    failure = None
                except BaseException as error:  # noqa: B902 - handed to the caller
                    failure = GateError.of(error)
                try:
                    if failure is None:
                        into.set_result(result)
                    else:
                        into.set_exception(failure)
                except cf.InvalidStateError:  # the caller gave up meanwhile
                    pass

            self._future("BatchMayExist", request, deadline - time.monotonic()).add_done_callback(unpack)
            futures.append(uncoalesced)
        results = [self._wait(f, deadline, "BatchMayExist") for f in futures]
        seq = min(observed_seq for _, observed_seq, _, _ in results)
        warming = any(part_warming for _, _, part_warming, _ in results)
        answers: List[Answer] = []
        for bits, _, _, address in results:
            answers.extend(Answer(bit, seq, warming, address) for bit in bits)
        return answers

    # -- writes ---------------------------------------------------------------------------------------------

    def add(self, keys: Union[Key, Iterable[Key]], timeout: Optional[float] = None) -> int:
        """Declares that keys exist (call it before the rows become visible in the source); returns the seq."""
        self._check_open()
        if isinstance(keys, (str, bytes, bytearray, memoryview)):
            keys = [keys]
        request = pb.AddRequest(namespace=self.namespace, keys=[_key_bytes(k) for k in keys])
        deadline = time.monotonic() + (self.deadline if timeout is None else timeout)
        response, _ = self._wait(self._future("Add", request, timeout), deadline, "Add")
        return response.seq

    def record_absent(
        self,
        key: Key,
        kind: Union[AbsenceKind, int, str] = AbsenceKind.MISSING,
        observed_seq: int = 0,
        *,
        address: Optional[str] = None,
        ttl_seconds: int = 0,
        timeout: Optional[float] = None,
    ) -> Recorded:
        """Records that the source does not have `key` (`kind` MISSING or DELETED), with the `observed_seq` of
        the answer that sent the caller to the source; `address` (an `Answer.address`) sends it to the gate
        that answered, the one whose seqs `observed_seq` counts."""
        self._check_open()
        if isinstance(kind, str):
            kind = AbsenceKind[kind.upper()]
        request = pb.RecordAbsentRequest(
            namespace=self.namespace,
            key=_key_bytes(key),
            kind=int(kind),
            observed_seq=observed_seq,
            ttl_seconds=ttl_seconds,
        )
        preferred = self.addresses.index(address) if address in self.addresses else None
        deadline = time.monotonic() + (self.deadline if timeout is None else timeout)
        response, _ = self._wait(self._future("RecordAbsent", request, timeout, preferred), deadline, "RecordAbsent")
        try:
            outcome = RecordOutcome(response.outcome)
        except ValueError:
            outcome = RecordOutcome.UNSPECIFIED
        return Recorded(outcome, response.seq, response.expires_in_ms)

    # -- the rest -------------------------------------------------------------------------------------------

    def stats(self) -> Stats:
        return Stats(**self._counters.snapshot())

    def close(self) -> None:
        """Fails lookups still waiting for a batch (CANCELLED) and closes the channels."""
        if self._closed:
            return
        self._closed = True
        if self._coalescer is not None:
            self._coalescer.close()
        self._pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
