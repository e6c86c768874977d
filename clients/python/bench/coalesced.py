"""The client's side of coalescing: 64 callers, each with one lookup in flight, against a gate of its own
(a separate process, from $EXISTENCE_GATE_BIN); prints this process's CPU per lookup (every thread of it:
the callers, the coalescer and gRPC's) beside the lookups per second, as `cargo bench --bench load -- clients`
does for every library. The callers are 64 threads in `may_exist`, or with `async` as the first argument 64
asyncio tasks in `may_exist_async` on one event loop. Run with `bench.sh [async]` beside `bench/` (it builds
the package first).
"""

import asyncio
import itertools
import os
import platform
import resource
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from conftest import Gate  # noqa: E402  (the tests' real-server helper)
from existence_gate_client import GateClient  # noqa: E402

CALLERS = 64
LOOKUPS = int(os.environ.get("BENCH_LOOKUPS", "100000"))


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(client, keys, lookups):
    """`lookups` coalesced lookups from CALLERS threads; the number that failed."""
    counter = itertools.count()  # next() on a count is atomic under the GIL
    failed = []

    def caller():
        while True:
            i = next(counter)
            if i >= lookups:
                return
            try:
                client.may_exist(keys[i % len(keys)])
            except Exception as error:  # counted, reported below
                failed.append(error)

    threads = [threading.Thread(target=caller) for _ in range(CALLERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failed


def run_async(client, keys, lookups):
    """`lookups` coalesced lookups from CALLERS asyncio tasks on one event loop; the number that failed."""
    counter = itertools.count()
    failed = []

    async def caller():
        for i in counter:
            if i >= lookups:
                return
            try:
                await client.may_exist_async(keys[i % len(keys)])
            except Exception as error:  # counted, reported below
                failed.append(error)

    async def callers():
        await asyncio.gather(*(caller() for _ in range(CALLERS)))

    asyncio.run(callers())
    return failed


def main():
    kind, callers = ("asyncio tasks", run_async) if sys.argv[1:] == ["async"] else ("threads", run)
    gate = Gate(["users"])
    try:
        with GateClient(gate.grpc_addr, "users") as client:
            keys = ["bench-{}".format(i) for i in range(4096)]
            failed = callers(client, keys, 10000)  # connections and batches warm
            before = client.stats()
            cpu = cpu_seconds()
            started = time.monotonic()
            failed += callers(client, keys, LOOKUPS)
            seconds = time.monotonic() - started
            used = cpu_seconds() - cpu
            after = client.stats()
            if failed:
                raise SystemExit("{} lookups failed, e.g. {!r}".format(len(failed), failed[0]))
            keys_per_call = (after.batched_keys - before.batched_keys) / (after.gate_calls - before.gate_calls)
            print(
                "python {}, {} {}, {} coalesced lookups: {:.2f} µs of client CPU per lookup, "
                "{:.1f} keys per call, {:.0f} lookups/s".format(
                    platform.python_version(), CALLERS, kind, LOOKUPS, used / LOOKUPS * 1e6, keys_per_call,
                    LOOKUPS / seconds,
                )
            )
    finally:
        gate.stop()


if __name__ == "__main__":
    main()
