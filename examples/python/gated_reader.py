"""The recommended existence-gate read path for Python services (grpcio).

    reader = GatedReader(grpc.insecure_channel("gate:50051"), "users", load=db.load_user)
    reader.start()                 # subscribe to invalidations first: absences are cached only while live
    user = reader.get("user:42")   # None when the key does not exist

`get(key)`:

1. a local, bounded, short-TTL cache of absences: a hit means "does not exist", no call at all;
2. `MayExist`: ABSENT means "does not exist" (and is cached locally);
3. MAY_EXIST: read the source through a per-key single flight, so a burst of reads of one key costs one
   source read; found: return it (and `Add` it if the gate did not know it: it answered WARMING, i.e. it was
   still loading and refuses writes until it is done, so the key is added with the first answer that is
   not WARMING); not found: `RecordAbsent(kind, observed_seq)` so the next reader is answered by the gate; when the gate
   RECORDED it, cache the absence locally too;
4. a background `SubscribeInvalidations` drops cached absences on ADDED, clears them all on RESYNC, and
   reconnects with `after_seq` = the last seq seen, so no Add is missed across a reconnect.

The gate is an optimisation, never a dependency: when it cannot be reached the reader goes to the source.

A local absence is cached only when no invalidation for the key can have been applied before the entry is
written: the subscription must be live (and the same one) from before the `MayExist` until the write, and
must not have applied any seq past the one the answer was computed at.

The stubs (`existence.v1.existence_pb2`, `existence_pb2_grpc`) are generated from the proto with
`python -m grpc_tools.protoc -I proto --python_out=GEN --grpc_python_out=GEN proto/existence/v1/existence.proto`
and GEN must be on `sys.path`.
"""

import collections
import logging
import threading
import time
from typing import Callable, Optional

import grpc

from existence.v1 import existence_pb2 as pb
from existence.v1 import existence_pb2_grpc as pb_grpc

log = logging.getLogger("existence_gate.reader")

#: At most this many keys found while the gate was warming wait to be added (one Add call's worth).
MAX_PENDING_ADDS = 10_000


class _Deleted:
    def __repr__(self):
        return "DELETED"


#: What a source loader returns for an entity it knows was deleted (recorded with ABSENCE_KIND_DELETED);
#: a plain `None` means "not found" (ABSENCE_KIND_MISSING).
DELETED = _Deleted()


class AbsenceCache:
    """A bounded LRU of keys known to be absent, each kept at most `ttl` seconds. Not thread-safe."""

    def __init__(self, max_entries: int, ttl: float):
        self.max_entries = max_entries
        self.ttl = ttl
        self._expiry = collections.OrderedDict()

    def __len__(self):
        return len(self._expiry)

    def contains(self, key: str, now: float) -> bool:
        expiry = self._expiry.get(key)
        if expiry is None:
            return False
        if expiry <= now:
            del self._expiry[key]
            return False
        self._expiry.move_to_end(key)
        return True

    def put(self, key: str, now: float) -> None:
        self._expiry[key] = now + self.ttl
        self._expiry.move_to_end(key)
        while len(self._expiry) > self.max_entries:
            self._expiry.popitem(last=False)

    def discard(self, key: str) -> None:
        self._expiry.pop(key, None)

    def clear(self) -> None:
        self._expiry.clear()


class SingleFlight:
    """Runs one call per key at a time; concurrent callers of the same key share its result."""

    class _Call:
        def __init__(self):
            self.done = threading.Event()
            self.value = None
            self.error = None

    def __init__(self):
        self._lock = threading.Lock()
        self._calls = {}

    def do(self, key, fn):
        with self._lock:
            call = self._calls.get(key)
            leader = call is None
            if leader:
                call = self._calls[key] = SingleFlight._Call()
        if not leader:
            call.done.wait()
            if call.error is not None:
                raise call.error
            return call.value
        try:
            call.value = fn()
            return call.value
        except BaseException as error:
            call.error = error
            raise
        finally:
            with self._lock:
                del self._calls[key]
            call.done.set()


class GatedReader:
    """Reads through existence-gate: local absence cache, MayExist, single-flight source reads."""

    def __init__(
        self,
        channel: grpc.Channel,
        namespace: str,
        load: Callable[[str], object],
        *,
        cache_size: int = 100_000,
        cache_ttl: float = 5.0,
        call_timeout: float = 0.5,
        reconnect_delay: float = 0.2,
        max_reconnect_delay: float = 5.0,
    ):
        self.namespace = namespace
        self._stub = pb_grpc.ExistenceGateStub(channel)
        self._load_source = load
        self._call_timeout = call_timeout
        self._reconnect_delay = reconnect_delay
        self._max_reconnect_delay = max_reconnect_delay
        self._flight = SingleFlight()
        self._pending_adds = set()  # keys found while the gate was warming, added once it is ready
        self._pending_lock = threading.Lock()
        # Guards the cache and the subscription state below, so that applying an invalidation and caching an
        # absence are ordered.
        self._lock = threading.Lock()
        self._absent = AbsenceCache(cache_size, cache_ttl)
        self._cursor = 0  # the last seq applied from the stream
        self._live = False
        self._epoch = 0  # changes whenever the subscription goes up or down
        self._call = None
        self._ready = threading.Event()
        self._closed = threading.Event()
        self._thread = None
        self._stats_lock = threading.Lock()
        self.stats = collections.Counter()

    def _count(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[name] += n

    # -- lifecycle ------------------------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> bool:
        """Starts the invalidation subscription; returns once it is live (True) or after `timeout` (False).

        Reads work either way; absences are cached only while the subscription is live."""
        self._thread = threading.Thread(target=self._subscribe_loop, name="existence-invalidations", daemon=True)
        self._thread.start()
        return self._ready.wait(timeout)

    def close(self) -> None:
        self._closed.set()
        call = self._call
        if call is not None:
            call.cancel()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- the read path --------------------------------------------------------------------------------------

    def get(self, key: str):
        """The source's value for `key`, or None when it does not exist (or was deleted)."""
        with self._lock:
            if self._absent.contains(key, time.monotonic()):
                self._count("local_hits")
                return None
            epoch = self._epoch if self._live else None
        try:
            reply = self._stub.MayExist(
                pb.MayExistRequest(namespace=self.namespace, key=key.encode()), timeout=self._call_timeout
            )
        except grpc.RpcError as error:
            # Fail open: without the gate every read goes to the source.
            self._count("gate_errors")
            log.warning("MayExist(%r) failed (%s); reading the source", key, error.code())
            reply = None
        self._count("gate_calls")
        if reply is not None and reply.basis != pb.BASIS_WARMING and self._pending_adds:
            self._flush_pending_adds()
        if reply is not None and reply.answer == pb.ANSWER_ABSENT:
            self._count("gate_absent")
            self._remember_absent(key, reply.observed_seq, epoch)
            return None
        return self._flight.do(key, lambda: self._load(key, reply, epoch))

    def _load(self, key: str, reply: Optional[pb.MayExistResponse], epoch: Optional[int]):
        """Reads the source for a key the gate passed, and tells the gate what it found."""
        self._count("source_reads")
        value = self._load_source(key)
        if reply is None:
            return None if value is DELETED else value
        if value is None or value is DELETED:
            kind = pb.ABSENCE_KIND_DELETED if value is DELETED else pb.ABSENCE_KIND_MISSING
            try:
                recorded = self._stub.RecordAbsent(
                    pb.RecordAbsentRequest(
                        namespace=self.namespace, key=key.encode(), kind=kind, observed_seq=reply.observed_seq
                    ),
                    timeout=self._call_timeout,
                )
                self._count("absences_" + pb.RecordOutcome.Name(recorded.outcome).removeprefix("RECORD_OUTCOME_").lower())
                if recorded.outcome == pb.RECORD_OUTCOME_RECORDED:
                    self._remember_absent(key, recorded.seq, epoch)
            except grpc.RpcError as error:
                self._count("gate_errors")
                log.warning("RecordAbsent(%r) failed: %s", key, error.code())
            return None
        if reply.basis == pb.BASIS_WARMING:
            # The gate is still loading and may not know this key; it refuses writes until it is ready.
            with self._pending_lock:
                if len(self._pending_adds) < MAX_PENDING_ADDS:
                    self._pending_adds.add(key)
        return value

    def _flush_pending_adds(self) -> None:
        """Adds the keys found while the gate was warming, in one call."""
        with self._pending_lock:
            keys, self._pending_adds = sorted(self._pending_adds), set()
        if not keys:
            return
        try:
            self._stub.Add(
                pb.AddRequest(namespace=self.namespace, keys=[k.encode() for k in keys]), timeout=self._call_timeout
            )
            self._count("adds", len(keys))
        except grpc.RpcError as error:
            self._count("gate_errors")
            log.warning("Add of %d keys found while the gate was warming failed: %s", len(keys), error.code())
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                with self._pending_lock:
                    self._pending_adds.update(keys[: MAX_PENDING_ADDS - len(self._pending_adds)])

    def _remember_absent(self, key: str, seq: int, epoch: Optional[int]) -> None:
        with self._lock:
            # Only if the same live subscription covers everything after `seq`: otherwise an invalidation of this
            # key may already have been applied (or missed), and the entry could outlive the key's absence.
            if epoch is not None and self._live and self._epoch == epoch and self._cursor <= seq:
                self._absent.put(key, time.monotonic())

    def is_cached_absent(self, key: str) -> bool:
        with self._lock:
            return self._absent.contains(key, time.monotonic())

    # -- invalidations --------------------------------------------------------------------------------------

    def apply_invalidation(self, invalidation: pb.Invalidation) -> None:
        """Drops the cached absences an invalidation makes wrong (all of them for RESYNC)."""
        with self._lock:
            if invalidation.cause == pb.INVALIDATION_CAUSE_RESYNC:
                self._absent.clear()
            else:
                for key in invalidation.keys:
                    self._absent.discard(key.decode("utf-8", "replace"))
            self._cursor = max(self._cursor, invalidation.seq)
        self._count("resyncs" if invalidation.cause == pb.INVALIDATION_CAUSE_RESYNC else "invalidations")

    def resubscribe(self) -> None:
        """Ends the current subscription stream; the reader reconnects from its last seq, as after any drop."""
        call = self._call
        if call is not None:
            call.cancel()

    def _subscribe_loop(self) -> None:
        delay = self._reconnect_delay
        while not self._closed.is_set():
            with self._lock:
                after_seq = self._cursor
            call = self._stub.SubscribeInvalidations(
                pb.SubscribeInvalidationsRequest(namespace=self.namespace, after_seq=after_seq)
            )
            self._call = call
            try:
                call.initial_metadata()  # the server sends headers once it has registered the subscription
                if not call.done():
                    self._went_live(from_now=after_seq == 0)
                    delay = self._reconnect_delay
                for invalidation in call:
                    self.apply_invalidation(invalidation)
            except grpc.RpcError as error:
                if not self._closed.is_set():
                    log.info("invalidation stream ended (%s); resubscribing after seq %d", error.code(), self._cursor)
            finally:
                self._went_down()
            if self._closed.wait(delay):
                break
            delay = min(delay * 2, self._max_reconnect_delay)

    def _went_live(self, from_now: bool) -> None:
        with self._lock:
            if from_now:
                # Subscribed "from now on": whatever happened while no stream was up is unknown.
                self._absent.clear()
            self._live = True
            self._epoch += 1
        self._count("subscriptions")
        self._ready.set()

    def _went_down(self) -> None:
        with self._lock:
            self._live = False
            self._epoch += 1
