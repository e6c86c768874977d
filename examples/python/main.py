"""A small service's read path over existence-gate with the Python client library, over an in-memory dict
standing in for the database.

    pip install ./clients/python
    python examples/python/main.py --addr 127.0.0.1:50051 --namespace default

The read path itself (local absence cache, coalesced MayExist, single-flight source reads, RecordAbsent,
invalidations) is `existence_gate_client.GatedReader`; this program wires it to a "database" and runs a short
self-check against the server (each step prints ok/FAIL), exiting 0 when every step passed. Use a namespace
nobody else writes to: the checks expect to be the only writer of the keys they use.
"""

import argparse
import logging
import sys
import threading
import time

import grpc

from existence_gate_client import DELETED, Answer, GateClient, GatedReader
from existence_gate_client.stubs import existence_pb2 as pb
from existence_gate_client.stubs import existence_pb2_grpc as pb_grpc


class Database:
    """The source of truth: rows by key; a deleted row is kept as a marker (a soft delete)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rows = {}
        self.reads = {}
        self.delay = 0.0  # seconds each read takes

    def load(self, key):
        time.sleep(self.delay)
        with self._lock:
            self.reads[key] = self.reads.get(key, 0) + 1
            return self._rows.get(key)  # None = not found, DELETED = soft-deleted

    def insert(self, key, value):
        with self._lock:
            self._rows[key] = value

    def delete(self, key):
        with self._lock:
            self._rows[key] = DELETED

    def total_reads(self):
        with self._lock:
            return sum(self.reads.values())


class Writer:
    """The write path: Add the key to the gate before the insert becomes visible in the source."""

    def __init__(self, reader, db):
        self._reader = reader
        self._db = db

    def create(self, key, value):
        self._reader.add([key])  # raises if the gate refuses: then the row must not be inserted
        self._db.insert(key, value)

    def create_failed(self, key):
        """Add succeeded but the insert then failed: the gate holds a key the source lacks."""
        self._reader.add([key])


passed = 0
failed = 0


def check(name, condition, detail=""):
    global passed, failed
    if condition:
        passed += 1
        print(f"ok   {name}", flush=True)
    else:
        failed += 1
        print(f"FAIL {name} {detail}", flush=True)


def eventually(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def self_check(addr, namespace):
    db = Database()
    client = GateClient(addr, namespace)
    reader = GatedReader(client, db.load)
    writer = Writer(reader, db)
    channel = grpc.insecure_channel(addr)  # raw calls, only to look at what the gate answers
    gate = pb_grpc.ExistenceGateStub(channel)

    def gate_answer(key):
        reply = gate.MayExist(pb.MayExistRequest(namespace=namespace, key=key.encode()), timeout=5)
        return pb.Answer.Name(reply.answer), pb.Basis.Name(reply.basis)

    def latest_seq():
        """The namespace's latest seq, which every answer carries (never 0: seqs start at 1)."""
        return client.may_exist("user:0", timeout=5).observed_seq

    check("the invalidation subscription goes live", reader.wait_live(timeout=10))

    writer.create("user:1", "Ada")
    check("an added row is read from the source", reader.get("user:1") == "Ada")
    check("... with one source read", db.total_reads() == 1, str(db.reads))

    check("a key never added does not exist", reader.get("user:404") is None)
    check("... and the gate spared the source", db.total_reads() == 1, str(db.reads))
    check("... and the absence is cached locally", reader.is_cached_absent("user:404"))
    calls = reader.stats().gate_calls
    check("a second read of it is a local hit", reader.get("user:404") is None and reader.stats().gate_calls == calls)

    writer.create_failed("user:2")
    check("a key the gate knows but the source lacks does not exist", reader.get("user:2") is None)
    check("... the source was read once", db.reads.get("user:2") == 1, str(db.reads))
    check("... and the absence RECORDED at the gate", reader.stats().absences_recorded == 1, str(reader.stats()))
    check("... so the gate now answers it", gate_answer("user:2") == ("ANSWER_ABSENT", "BASIS_TOMBSTONE"))
    reader.get("user:2")
    check("... and the next read is a local hit", db.reads.get("user:2") == 1, str(db.reads))

    writer.create("user:3", "Grace")
    db.delay = 0.3
    results = []
    threads = [threading.Thread(target=lambda: results.append(reader.get("user:3"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    db.delay = 0.0
    check("8 concurrent reads of one key all get the row", results == ["Grace"] * 8, str(results))
    check("... through a single source read", db.reads.get("user:3") == 1, str(db.reads))

    check("user:404 is cached absent", reader.is_cached_absent("user:404"))
    writer.create("user:404", "Linus")
    check("ADDED drops the cached absence", eventually(lambda: not reader.is_cached_absent("user:404")))
    check("... and the new row is read", reader.get("user:404") == "Linus")

    check("user:405 does not exist yet", reader.get("user:405") is None and reader.is_cached_absent("user:405"))
    resubscribes = reader.stats().resubscribes
    reader.resubscribe()  # as if the connection dropped
    writer.create("user:405", "Barbara")  # lands while the reader is reconnecting
    check(
        "an Add made while reconnecting reaches the reader (resumed by after_seq)",
        eventually(lambda: not reader.is_cached_absent("user:405")),
    )
    check("... over a new subscription", eventually(lambda: reader.stats().resubscribes > resubscribes))
    check("... and the new row is read", reader.get("user:405") == "Barbara")

    db.delete("user:1")
    check("a deleted row does not exist", reader.get("user:1") is None)
    check("... its absence RECORDED as DELETED", gate_answer("user:1") == ("ANSWER_ABSENT", "BASIS_TOMBSTONE"))
    check("... and cached locally", reader.is_cached_absent("user:1"))

    # While the gate loads its state it answers MAY_EXIST + WARMING for every key and refuses writes; a row
    # found then is added with the first answer that is not WARMING. (This server is warm: the check feeds
    # the reader's internals such an answer.)
    db.insert("user:legacy", "Edsger")
    check("a row the gate does not know is ABSENT there", gate_answer("user:legacy")[0] == "ANSWER_ABSENT")
    # Such an answer carries the seq loaded so far; here, the latest.
    warming = Answer(may_exist=True, observed_seq=latest_seq(), warming=True, address=addr)
    check("read while the gate warms: found", reader._read_source("user:legacy", b"user:legacy", warming, None) == "Edsger")
    check(
        "... and not added yet",
        gate_answer("user:legacy")[0] == "ANSWER_ABSENT" and reader.stats().warming_adds == 0,
    )
    reader.get("user:406")  # the gate is ready: this answer is not WARMING
    check(
        "... added with the next answer",
        gate_answer("user:legacy")[0] == "ANSWER_MAY_EXIST" and reader.stats().warming_adds == 1,
    )

    # RESYNC (events were missed, e.g. a long disconnection) clears every cached absence.
    # user:1's absence is cached as DELETED (10 minutes here); user:2's MISSING one may have expired by now
    # (1 s in the interop configuration).
    check("some absences are cached", reader.is_cached_absent("user:1"))
    # A RESYNC carries the namespace's latest seq (applied directly: a live server sends one only after lost
    # events).
    resync = pb.Invalidation(namespace=namespace, seq=latest_seq(), cause=pb.INVALIDATION_CAUSE_RESYNC)
    reader._apply(resync)
    check("RESYNC drops them all", not reader.is_cached_absent("user:2") and not reader.is_cached_absent("user:1"))

    reader.close()
    client.close()
    channel.close()
    print("reader stats:", reader.stats().as_dict(), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:50051", help="the gate's gRPC address")
    parser.add_argument("--namespace", default="default", help="a namespace only this check writes to")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        self_check(args.addr, args.namespace)
    except Exception as error:
        check("self-check ran to the end", False, repr(error))
    print(f"example: {passed} passed, {failed} failed", flush=True)
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
