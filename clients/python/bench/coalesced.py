"""The client's side of coalescing: 64 threads, each with one `may_exist` in flight, against a gate of its own
(a separate process, from $EXISTENCE_GATE_BIN); prints this process's CPU per lookup (every thread of it:
the callers, the coalescer and gRPC's) beside the lookups per second, as `cargo bench --bench load -- callers`
does for the Rust client, `clients/go/bench_test.go` for Go and `clients/node/bench/coalesced.js` for Node.
Run with `bench.sh` beside `bench/` (it builds the package first).
"""

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


def main():
    gate = Gate(["users"])
    try:
        with GateClient(gate.grpc_addr, "users") as client:
            keys = ["bench-{}".format(i) for i in range(4096)]
            failed = run(client, keys, 10000)  # connections and batches warm
            before = client.stats()
            cpu = cpu_seconds()
            started = time.monotonic()
            failed += run(client, keys, LOOKUPS)
            seconds = time.monotonic() - started
            used = cpu_seconds() - cpu
            after = client.stats()
            if failed:
                raise SystemExit("{} lookups failed, e.g. {!r}".format(len(failed), failed[0]))
            keys_per_call = (after.batched_keys - before.batched_keys) / (after.gate_calls - before.gate_calls)
            print(
                "python {}, {} callers, {} coalesced lookups: {:.2f} µs of client CPU per lookup, "
                "{:.1f} keys per call, {:.0f} lookups/s".format(
                    platform.python_version(), CALLERS, LOOKUPS, used / LOOKUPS * 1e6, keys_per_call,
                    LOOKUPS / seconds,
                )
            )
    finally:
        gate.stop()


if __name__ == "__main__":
    main()
