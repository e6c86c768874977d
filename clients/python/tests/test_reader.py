"""GatedReader against real gates: the read path, fail-open, invalidations, resuming and RESYNC."""

import threading
import time

import grpc
import pytest

from existence_gate_client import DELETED, Answer, GateClient, GatedReader
from existence_gate_client._gen import existence_pb2 as pb
from existence_gate_client._gen import existence_pb2_grpc as pb_grpc

from conftest import closed_port_address, concurrently, eventually


class Source:
    """The source of truth: rows by key, DELETED for a soft-deleted one; counts reads per key."""

    def __init__(self, rows=None):
        self._lock = threading.Lock()
        self.rows = dict(rows or {})
        self.reads = {}
        self.delay = 0.0
        self.hook = None  # called with the key before the read (a write racing the read)

    def __call__(self, key):
        key = key.decode() if isinstance(key, bytes) else key
        if self.hook is not None:
            self.hook(key)
        time.sleep(self.delay)
        with self._lock:
            self.reads[key] = self.reads.get(key, 0) + 1
            return self.rows.get(key)

    def total(self):
        with self._lock:
            return sum(self.reads.values())


def gate_answer(address, namespace, key):
    with grpc.insecure_channel(address) as channel:
        reply = pb_grpc.ExistenceGateStub(channel).MayExist(
            pb.MayExistRequest(namespace=namespace, key=key.encode()), timeout=5
        )
    return pb.Answer.Name(reply.answer), pb.Basis.Name(reply.basis)


@pytest.fixture
def reader_for():
    made = []

    def make(address, namespace, source, **options):
        client_options = {k: options.pop(k) for k in list(options) if k in ("coalesce_window", "deadline")}
        client = GateClient(address, namespace, **client_options)
        reader = GatedReader(client, source, **options)
        made.append(reader)
        return reader

    yield make
    for reader in made:
        reader.close()
        reader.client.close()


def test_an_absent_key_is_answered_by_the_gate_then_the_local_cache(gate, namespace, reader_for):
    source = Source()
    reader = reader_for(gate.grpc_addr, namespace, source)
    assert reader.wait_live(30)
    assert reader.get("user:404") is None
    assert source.total() == 0
    assert reader.is_cached_absent("user:404")
    assert reader.get("user:404", default="none") == "none"
    stats = reader.stats()
    assert stats.gate_calls == 1 and stats.cache_hits == 1 and stats.source_reads == 0


def test_a_found_key_is_read_once(gate, namespace, reader_for):
    source = Source({"user:1": "Ada"})
    reader = reader_for(gate.grpc_addr, namespace, source)
    reader.add(["user:1"])
    assert reader.get("user:1") == "Ada"
    assert reader.get(b"user:1") == "Ada"  # bytes keys too; found rows are not cached
    assert source.reads == {"user:1": 2}
    assert reader.stats().source_reads == 2 and not reader.is_cached_absent("user:1")


def test_concurrent_reads_of_one_key_share_one_source_read(gate, namespace, reader_for):
    source = Source({"slow": "value"})
    source.delay = 0.3
    # A window wide enough for eight threads started together to share calls on a loaded machine (5 ms let
    # each thread make its own call when the cores were busy).
    # The eight are released together: started one by one, each thread could make its own lookup and have
    # its answer before the next one started, on a loaded machine.
    reader = reader_for(gate.grpc_addr, namespace, source, coalesce_window=0.25)
    reader.add(["slow"])
    results = concurrently(8, lambda i: reader.get("slow"))
    assert results == ["value"] * 8
    assert source.reads == {"slow": 1}
    stats = reader.stats()
    assert stats.source_reads == 1 and stats.lookups == 8 and stats.gate_calls < 8


def test_source_errors_are_the_callers(gate, namespace, reader_for):
    def broken(key):
        raise KeyError("database down")

    reader = reader_for(gate.grpc_addr, namespace, broken)
    reader.add(["k"])
    with pytest.raises(KeyError):
        reader.get("k")


def test_a_missing_key_is_recorded_then_answered_by_the_gate(gate, namespace, reader_for):
    source = Source()
    reader = reader_for(gate.grpc_addr, namespace, source)
    assert reader.wait_live(30)
    reader.add(["user:2"])  # the Add succeeded, the insert then failed
    # Its invalidation must arrive before the absence is cached, or it would (rightly) drop it.
    assert eventually(lambda: reader.stats().invalidations >= 1)
    assert reader.get("user:2") is None
    assert source.reads == {"user:2": 1}
    assert reader.stats().absences_recorded == 1
    assert gate_answer(gate.grpc_addr, namespace, "user:2") == ("ANSWER_ABSENT", "BASIS_TOMBSTONE")
    assert reader.is_cached_absent("user:2")
    assert reader.get("user:2") is None and source.reads == {"user:2": 1}


def test_a_deleted_row_is_recorded_as_deleted(gate, namespace, reader_for):
    source = Source({"user:9": DELETED})
    reader = reader_for(gate.grpc_addr, namespace, source)
    assert reader.wait_live(30)
    reader.add(["user:9"])
    # Its invalidation must arrive before the absence is cached, or it would (rightly) drop it.
    assert eventually(lambda: reader.stats().invalidations >= 1)
    assert reader.get("user:9") is None
    assert reader.stats().absences_recorded == 1
    assert gate_answer(gate.grpc_addr, namespace, "user:9") == ("ANSWER_ABSENT", "BASIS_TOMBSTONE")
    assert reader.is_cached_absent("user:9")


def test_an_absence_raced_by_an_add_is_not_cached(gate, namespace, reader_for):
    source = Source()
    reader = reader_for(gate.grpc_addr, namespace, source)
    assert reader.wait_live(30)
    reader.add(["raced"])
    # Another writer adds the key while the source is read (its row is not visible to this read yet).
    with GateClient(gate.grpc_addr, namespace) as writer:
        source.hook = lambda key: writer.add([key])
        assert reader.get("raced") is None
    assert reader.stats().absences_recorded == 0  # SUPERSEDED
    assert not reader.is_cached_absent("raced")
    assert gate_answer(gate.grpc_addr, namespace, "raced")[0] == "ANSWER_MAY_EXIST"


def test_an_add_by_another_client_drops_a_cached_absence(gate, namespace, reader_for):
    source = Source()
    reader = reader_for(gate.grpc_addr, namespace, source)
    assert reader.wait_live(30)
    assert reader.get("user:5") is None and reader.is_cached_absent("user:5")
    with GateClient(gate.grpc_addr, namespace) as writer:
        writer.add(["user:5"])
    source.rows["user:5"] = "Linus"
    assert eventually(lambda: not reader.is_cached_absent("user:5"))
    assert reader.stats().invalidations >= 1
    assert reader.get("user:5") == "Linus"


def test_the_gate_down_fails_open(namespace, reader_for):
    source = Source({"here": "row"})
    reader = reader_for(closed_port_address(), namespace, source, deadline=2)
    for _ in range(2):
        assert reader.get("here") == "row"
        assert reader.get("gone") is None
    assert source.reads == {"here": 2, "gone": 2}  # never "absent" without the source, never cached
    stats = reader.stats()
    assert stats.fail_opens == 4 and stats.cache_hits == 0 and stats.absences_recorded == 0
    assert not reader.live


def test_a_gate_stopped_under_a_reader_fails_open(start_gate, reader_for):
    server = start_gate(["stopping"])
    source = Source({"here": "row"})
    reader = reader_for(server.grpc_addr, "stopping", source, deadline=2)
    assert reader.wait_live(30)
    assert reader.get("gone") is None and source.total() == 0
    server.stop()
    assert eventually(lambda: not reader.live)
    assert reader.get("here") == "row" and reader.get("other") is None
    assert source.reads == {"here": 1, "other": 1}
    assert reader.stats().fail_opens == 2


def test_subscribe_off_caches_nothing(gate, namespace, reader_for):
    reader = reader_for(gate.grpc_addr, namespace, Source(), subscribe=False)
    assert reader.get("nope") is None and reader.get("nope") is None
    stats = reader.stats()
    assert stats.gate_calls == 2 and stats.cache_hits == 0 and not reader.is_cached_absent("nope")


def test_a_dropped_stream_resumes_after_its_last_seq(gate, namespace, reader_for, proxy_to):
    proxy = proxy_to(gate.grpc_addr)
    source = Source()
    reader = reader_for(proxy.address, namespace, source)
    assert reader.wait_live(30)
    with GateClient(gate.grpc_addr, namespace) as writer:
        writer.add(["seen"])  # the stream carries it: the reader's cursor moves past 0
        assert eventually(lambda: reader.stats().invalidations >= 1)
        assert reader.get("user:405") is None and reader.is_cached_absent("user:405")
        before = reader.stats()
        proxy.pause()
        proxy.drop()
        assert eventually(lambda: not reader.live)
        writer.add(["user:405"])  # lands while the reader is disconnected
        assert reader.is_cached_absent("user:405")
        proxy.pause(False)
        assert eventually(lambda: not reader.is_cached_absent("user:405"))
    after = reader.stats()
    assert after.resubscribes > before.resubscribes
    assert after.invalidations == before.invalidations + 1  # the missed ADDED, not a RESYNC
    assert eventually(lambda: reader.live)


def test_resuming_where_the_seq_is_unknown_gets_a_resync(start_gate, reader_for, proxy_to):
    first = start_gate(["moving"])
    proxy = proxy_to(first.grpc_addr)
    reader = reader_for(proxy.address, "moving", Source())
    assert reader.wait_live(30)
    with GateClient(first.grpc_addr, "moving") as writer:
        for i in range(5):
            writer.add(["seen:{}".format(i)])
    assert eventually(lambda: reader.stats().invalidations >= 5)
    assert reader.get("absent") is None and reader.is_cached_absent("absent")
    # Another gate (a restarted one that lost its state): the reader's after_seq is ahead of its log.
    second = start_gate(["moving"])
    invalidations = reader.stats().invalidations
    proxy.retarget(second.grpc_addr)
    proxy.drop()
    assert eventually(lambda: not reader.is_cached_absent("absent"))
    assert eventually(lambda: reader.live)
    assert reader.stats().invalidations == invalidations + 1  # one RESYNC
    # The cursor follows the new gate's seqs: absences are cached again.
    assert reader.get("absent:2") is None
    assert reader.is_cached_absent("absent:2")


def test_a_row_found_while_warming_is_added_with_the_next_answer(gate, namespace, reader_for):
    # While a gate loads its state it answers MAY_EXIST + WARMING and refuses writes; this one is warm, so the
    # reader is fed such an answer for one read.
    source = Source({"legacy": "Edsger"})
    reader = reader_for(gate.grpc_addr, namespace, source)
    assert gate_answer(gate.grpc_addr, namespace, "legacy")[0] == "ANSWER_ABSENT"
    warming = Answer(True, reader.client.may_exist("x").observed_seq, True, gate.grpc_addr)
    assert reader._read_source("legacy", b"legacy", warming, None) == "Edsger"
    assert gate_answer(gate.grpc_addr, namespace, "legacy")[0] == "ANSWER_ABSENT"
    reader.get("other")  # an answer that is not WARMING
    assert gate_answer(gate.grpc_addr, namespace, "legacy")[0] == "ANSWER_MAY_EXIST"
    assert reader.stats().warming_adds == 1


def test_close_ends_the_subscription(gate, namespace):
    client = GateClient(gate.grpc_addr, namespace)
    reader = GatedReader(client, Source())
    assert reader.wait_live(30)
    reader.close()
    assert not reader.live
    assert not reader._thread.is_alive()
    client.close()
    with pytest.raises(grpc.RpcError):
        client.may_exist("k")
