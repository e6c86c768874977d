"""GatedReader: the recommended read path (local absence cache, coalesced MayExist, single-flight source reads,
RecordAbsent, invalidations)."""

import collections
import logging
import threading
import time
from typing import Callable, Dict, Iterable, Optional, Union

import grpc

from ._client import AbsenceKind, Answer, GateClient, GateError, Key, RecordOutcome, Stats, _Counters, _key_bytes
from ._stubs import pb, pb_grpc

log = logging.getLogger("existence_gate_client.reader")

#: At most this many keys found while the gate was warming wait to be added (one Add call's worth).
MAX_PENDING_ADDS = 10_000
RESUBSCRIBE_MIN_DELAY = 0.2
RESUBSCRIBE_MAX_DELAY = 5.0


class _Deleted:
    def __repr__(self):
        return "DELETED"


#: What a source returns for a row it knows was deleted (recorded as ABSENCE_KIND_DELETED); `None` (also
#: available as `MISSING`) means "not found" (ABSENCE_KIND_MISSING).
DELETED = _Deleted()
MISSING = None


class AbsenceCache:
    """A bounded LRU of keys known to be absent, each kept at most `ttl` seconds. Not thread-safe."""

    def __init__(self, max_entries: int, ttl: float):
        self.max_entries = max_entries
        self.ttl = ttl
        self._expiry: "collections.OrderedDict[bytes, float]" = collections.OrderedDict()

    def __len__(self):
        return len(self._expiry)

    def contains(self, key: bytes, now: float) -> bool:
        expiry = self._expiry.get(key)
        if expiry is None:
            return False
        if expiry <= now:
            del self._expiry[key]
            return False
        self._expiry.move_to_end(key)
        return True

    def put(self, key: bytes, now: float) -> None:
        if self.max_entries <= 0:
            return
        self._expiry[key] = now + self.ttl
        self._expiry.move_to_end(key)
        while len(self._expiry) > self.max_entries:
            self._expiry.popitem(last=False)

    def discard(self, key: bytes) -> None:
        self._expiry.pop(key, None)

    def clear(self) -> None:
        self._expiry.clear()


class SingleFlight:
    """Runs one call per key at a time; concurrent callers of the same key share its result or error."""

    class _Call:
        def __init__(self):
            self.done = threading.Event()
            self.value = None
            self.error: Optional[BaseException] = None

    def __init__(self):
        self._lock = threading.Lock()
        self._calls: Dict[bytes, "SingleFlight._Call"] = {}

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
    """Reads through existence-gate.

        client = GateClient("gate:50051", "users")
        reader = GatedReader(client, db.load_user)    # load_user(key) -> row, None (missing) or DELETED
        user = reader.get("user:42")                  # None when the key does not exist

    The invalidation subscription starts at once, on its own channel; absences are cached only while it is
    live (`wait_live()` waits for that)."""

    def __init__(
        self,
        client: GateClient,
        source: Callable[[Key], object],
        *,
        cache_capacity: int = 100_000,
        cache_ttl: float = 5.0,
        subscribe: bool = True,
    ):
        self.client = client
        self._source = source
        self._flight = SingleFlight()
        self._counters = _Counters()
        self._pending_adds: set = set()  # keys found while the gate was warming
        self._pending_lock = threading.Lock()
        # Guards the cache and the subscription state below, so that applying an invalidation and caching an
        # absence are ordered.
        self._lock = threading.Lock()
        self._absent = AbsenceCache(cache_capacity, cache_ttl)
        self._cursor = 0  # the last seq applied from the stream
        self._live = False
        self._epoch = 0  # changes whenever a subscription goes live or down
        self._live_event = threading.Event()
        self._closed = threading.Event()
        self._call = None
        self._channels = []
        self._thread = None
        if subscribe:
            self._channels = [client.make_channel(address) for address in client.addresses]
            self._thread = threading.Thread(target=self._subscribe_loop, name="existence-gate-invalidations", daemon=True)
            self._thread.start()

    # -- the read path --------------------------------------------------------------------------------------

    def get(self, key: Key, default=None):
        """The source's value for `key`, or `default` when it does not exist (or was deleted). Source errors
        are raised as they are; gate errors never are (the source is read instead)."""
        k = _key_bytes(key)
        with self._lock:
            if self._absent.contains(k, time.monotonic()):
                self._counters.add("cache_hits")
                return default
            epoch = self._epoch if self._live else None
        try:
            answer: Optional[Answer] = self.client.may_exist(k)
        except GateError as error:
            # Fail open: without the gate every read goes to the source.
            self._counters.add("fail_opens")
            log.debug("MayExist(%r) failed (%s: %s); reading the source", key, error.code().name, error.details())
            answer = None
        if answer is not None and not answer.warming and self._pending_adds:
            self._flush_pending_adds()
        if answer is not None and not answer.may_exist:
            self._remember_absent(k, answer.observed_seq, epoch)
            return default
        value = self._flight.do(k, lambda: self._read_source(key, k, answer, epoch))
        return default if value is None or value is DELETED else value

    def _read_source(self, key: Key, k: bytes, answer: Optional[Answer], epoch: Optional[int]):
        """Reads the source for a key the gate passed (or could not answer), and tells the gate what it found."""
        self._counters.add("source_reads")
        value = self._source(key)
        if answer is None:
            return value
        if value is None or value is DELETED:
            kind = AbsenceKind.DELETED if value is DELETED else AbsenceKind.MISSING
            try:
                recorded = self.client.record_absent(k, kind, answer.observed_seq, address=answer.address)
            except GateError as error:
                # INVALID_ARGUMENT for an observed_seq ahead of that replica, or any failure: nothing is cached.
                log.debug("RecordAbsent(%r) failed: %s: %s", key, error.code().name, error.details())
                return value
            if recorded.outcome == RecordOutcome.RECORDED:
                self._counters.add("absences_recorded")
                self._remember_absent(k, recorded.seq, epoch)
            return value
        if answer.warming:
            # The gate is still loading and may not know this key (and refuses writes until it is ready).
            with self._pending_lock:
                if len(self._pending_adds) < MAX_PENDING_ADDS:
                    self._pending_adds.add(k)
                    return value
            self._counters.add("warming_adds_dropped")
        return value

    def _flush_pending_adds(self) -> None:
        """Adds the keys found while the gate was warming, in one call."""
        with self._pending_lock:
            keys, self._pending_adds = sorted(self._pending_adds), set()
        if not keys:
            return
        try:
            self.client.add(keys)
            self._counters.add("warming_adds", len(keys))
        except GateError as error:
            log.warning("Add of %d keys found while the gate was warming failed: %s", len(keys), error.code().name)
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                with self._pending_lock:
                    room = max(0, MAX_PENDING_ADDS - len(self._pending_adds))
                    self._pending_adds.update(keys[:room])
                    dropped = len(keys) - min(room, len(keys))
            else:
                dropped = len(keys)
            if dropped:
                self._counters.add("warming_adds_dropped", dropped)

    def _remember_absent(self, k: bytes, seq: int, epoch: Optional[int]) -> None:
        with self._lock:
            # Only if the same live subscription covers everything after `seq`: otherwise an invalidation of this
            # key may already have been applied (or missed), and the entry could outlive the key's absence.
            if epoch is not None and self._live and self._epoch == epoch and self._cursor <= seq:
                self._absent.put(k, time.monotonic())

    def add(self, keys: Union[Key, Iterable[Key]], timeout: Optional[float] = None) -> int:
        """The writer's helper: `Add` before the rows become visible in the source. Errors are raised: a writer
        that cannot Add must not insert."""
        return self.client.add(keys, timeout=timeout)

    def is_cached_absent(self, key: Key) -> bool:
        with self._lock:
            return self._absent.contains(_key_bytes(key), time.monotonic())

    def stats(self) -> Stats:
        """The client's counters plus this reader's."""
        values = self.client._counters.snapshot()
        for name, n in self._counters.snapshot().items():
            values[name] += n
        return Stats(**values)

    # -- invalidations --------------------------------------------------------------------------------------

    @property
    def live(self) -> bool:
        with self._lock:
            return self._live

    def wait_live(self, timeout: Optional[float] = None) -> bool:
        """Waits until the invalidation subscription is live (first time); False after `timeout`."""
        return self._live_event.wait(timeout)

    def _apply(self, invalidation) -> None:
        """Drops the cached absences an invalidation makes wrong (all of them for RESYNC)."""
        with self._lock:
            if invalidation.cause == pb.INVALIDATION_CAUSE_RESYNC:
                self._absent.clear()
                # The server's latest seq, which the stream goes on from (lower than ours after a resume on a
                # server that lost state, or on another deployment).
                self._cursor = invalidation.seq
            else:
                for key in invalidation.keys:
                    self._absent.discard(key)
                self._cursor = max(self._cursor, invalidation.seq)
        if invalidation.cause == pb.INVALIDATION_CAUSE_RESYNC:
            self._counters.add("invalidations")
        else:
            self._counters.add("invalidations", len(invalidation.keys))

    def resubscribe(self) -> None:
        """Ends the current stream; the reader resumes from its last seq, as after any drop."""
        call = self._call
        if call is not None:
            call.cancel()

    def _subscribe_loop(self) -> None:
        delay = RESUBSCRIBE_MIN_DELAY
        turn = 0
        opened = 0
        while not self._closed.is_set():
            with self._lock:
                after_seq = self._cursor
            channel = self._channels[turn % len(self._channels)]
            turn += 1
            if opened:
                self._counters.add("resubscribes")
            opened += 1
            try:
                call = pb_grpc.ExistenceGateStub(channel).SubscribeInvalidations(
                    pb.SubscribeInvalidationsRequest(namespace=self.client.namespace, after_seq=after_seq),
                    metadata=self.client.metadata,
                )
            except ValueError:  # the channel was closed by close()
                break
            self._call = call
            if self._closed.is_set():
                call.cancel()
            try:
                call.initial_metadata()  # the server sends headers once it has registered the subscription
                if not call.done():
                    self._went_live(from_now=after_seq == 0)
                    delay = RESUBSCRIBE_MIN_DELAY
                for invalidation in call:
                    self._apply(invalidation)
            except grpc.RpcError as error:
                if not self._closed.is_set():
                    log.info(
                        "invalidation stream ended (%s); resubscribing after seq %d",
                        error.code() if hasattr(error, "code") else error,
                        after_seq,
                    )
            finally:
                self._went_down()
            if self._closed.wait(delay):
                break
            delay = min(delay * 2, RESUBSCRIBE_MAX_DELAY)

    def _went_live(self, from_now: bool) -> None:
        with self._lock:
            if from_now:
                # Subscribed "from now on": whatever happened while no stream was up is unknown.
                self._absent.clear()
            self._live = True
            self._epoch += 1
        self._live_event.set()

    def _went_down(self) -> None:
        with self._lock:
            self._live = False
            self._epoch += 1

    # -- lifecycle ------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Ends the subscription and closes its channels (the client stays open: close it yourself)."""
        self._closed.set()
        call = self._call
        if call is not None:
            call.cancel()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for channel in self._channels:
            channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
