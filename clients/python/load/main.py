"""The Python side of the load-balancer tests (tests/suite/balancer.rs): a steady load through the library,
with its default settings, against the addresses given — HAProxy's front, or the replicas themselves,
balanced by the library — while the test restarts, kills, pauses or cuts off replicas. ../load.sh runs it.

    python main.py DIR ADDRESS[,ADDRESS...]

Four callers, each in a loop: add of a new key, may_exist of it (ABSENT there is a false ABSENT), may_exist of
a key nobody adds. DIR/started appears once every caller has had 20 adds acknowledged (a steady load: a
channel's first calls may miss the default deadline while it connects); the callers stop once DIR/stop
appears; then DIR/report holds "calls=N failed=N false_absent=N", then a line per failed call or
false ABSENT: "UNIX_MS what"."""

import os
import sys
import threading
import time

from existence_gate_client import GateClient

CALLERS = 4
WARM = 20  # adds each caller has acknowledged before the load counts as started


class Seen:
    def __init__(self):
        self.lock = threading.Lock()
        self.calls = self.failed = self.false_absent = 0
        self.lines = []

    def count(self, failed=None, false_absent=None):
        with self.lock:
            self.calls += 1
            if failed is not None:
                self.failed += 1
                self.lines.append("{} {}".format(int(time.time() * 1000), failed))
            if false_absent is not None:
                self.false_absent += 1
                self.lines.append("{} false ABSENT for {}, acknowledged".format(int(time.time() * 1000), false_absent))


def caller(client, c, seen, stop, started):
    acked = 0
    i = 0
    while not os.path.exists(stop):
        key = "py-{}-{}".format(c, i)
        i += 1
        try:
            client.add([key])
        except Exception as error:  # noqa: BLE001 - every failure is counted and reported
            seen.count(failed="add {}: {!r}".format(key, error))
            continue
        seen.count()
        acked += 1
        if acked == WARM:
            started.release()
        for k in (key, "py-none-" + key):
            try:
                answer = client.may_exist(k)
            except Exception as error:  # noqa: BLE001
                seen.count(failed="may_exist {}: {!r}".format(k, error))
                continue
            seen.count(false_absent=k if k == key and not answer.may_exist else None)
    if acked < WARM:
        started.release()


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: main.py DIR ADDRESS[,ADDRESS...]")
    directory, addresses = sys.argv[1], sys.argv[2].split(",")
    seen = Seen()
    started = threading.Semaphore(0)
    stop = os.path.join(directory, "stop")
    with GateClient(addresses, "users") as client:
        threads = [threading.Thread(target=caller, args=(client, c, seen, stop, started)) for c in range(CALLERS)]
        for thread in threads:
            thread.start()
        for _ in range(CALLERS):
            started.acquire()
        open(os.path.join(directory, "started"), "w").close()
        for thread in threads:
            thread.join()
    with open(os.path.join(directory, "report"), "w") as report:
        report.write("calls={} failed={} false_absent={}\n".format(seen.calls, seen.failed, seen.false_absent))
        for line in seen.lines:
            report.write(line + "\n")


if __name__ == "__main__":
    main()
