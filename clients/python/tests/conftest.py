"""Real existence-gate servers for the tests ($EXISTENCE_GATE_BIN), and a TCP proxy that can cut connections."""

import itertools
import os
import re
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

import pytest

NAMESPACE_TEMPLATE = """
[namespaces.{name}]
expected_keys = 100000
missing_ttl = "2s"
deleted_ttl = "10m"
ttl_jitter = 0.0
max_ttl = "1h"
"""

#: Namespaces of the shared server: each test takes its own, so tests never see each other's keys.
SHARED_NAMESPACES = ["ns{}".format(i) for i in range(40)]


def eventually(condition, timeout=30.0, interval=0.01):
    """Polls `condition` until it holds (True) or `timeout` passes (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def concurrently(n, fn):
    """Runs fn(i) in n threads released together; returns the results (or exceptions) in order."""
    barrier = threading.Barrier(n)
    results = [None] * n

    def run(i):
        barrier.wait()
        try:
            results[i] = fn(i)
        except BaseException as error:  # noqa: B902 - handed back to the test
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def closed_port_address():
    """An address nothing listens on: a port bound, noted and closed."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return "127.0.0.1:{}".format(port)


@pytest.fixture
def black_hole():
    """An address that accepts connections (the kernel completes them) and never answers: a call sent there
    stays in flight until its deadline, or until the client is closed."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield "127.0.0.1:{}".format(sock.getsockname()[1])
    sock.close()


class Gate:
    """One server process: `serve --in-memory` on free loopback ports."""

    def __init__(self, namespaces, extra_config="", extra_args=()):
        binary = os.environ.get("EXISTENCE_GATE_BIN")
        if not binary:
            pytest.fail("EXISTENCE_GATE_BIN is not set")
        self.dir = tempfile.TemporaryDirectory(prefix="existence-gate-client-test-")
        config = os.path.join(self.dir.name, "gate.toml")
        with open(config, "w") as f:
            f.write(extra_config)
            for name in namespaces:
                f.write(NAMESPACE_TEMPLATE.format(name=name))
        self.log_path = os.path.join(self.dir.name, "gate.log")
        self._log = open(self.log_path, "wb")
        # Stopped at once on SIGTERM: these tests are about the client, not the drain delay a balancer needs.
        env = dict(os.environ, NO_COLOR="1", EXISTENCE_GATE_DRAIN_DELAY="0s")
        self.process = subprocess.Popen(
            [binary, "serve", "--in-memory", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--resp-listen", "127.0.0.1:0", "--config", config, *extra_args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.grpc_addr = self.http_addr = None
        try:
            if not eventually(self._read_addresses, 30):
                raise RuntimeError("the gate did not start serving")
            if not eventually(lambda: self.http_status("/readyz") == 200, 30, 0.02):
                raise RuntimeError("the gate did not become ready")
        except BaseException:
            log = self.log()
            self.stop()
            raise RuntimeError("gate failed to start; log:\n" + log)

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def _read_addresses(self):
        if self.process.poll() is not None:
            raise RuntimeError("the gate exited with {}".format(self.process.returncode))
        match = re.search(r"grpc_addr=(\S+) http_addr=(\S+)", self.log())
        if match:
            self.grpc_addr, self.http_addr = match.group(1), match.group(2)
            return True
        return False

    def http_status(self, path):
        try:
            with urllib.request.urlopen("http://{}{}".format(self.http_addr, path), timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
        except OSError:
            return None

    def requests(self, rpc, code="OK"):
        """existence_requests_total for one RPC and status, from /metrics."""
        with urllib.request.urlopen("http://{}/metrics".format(self.http_addr), timeout=5) as response:
            text = response.read().decode()
        total = 0
        for line in text.splitlines():
            if line.startswith("existence_requests_total{") and 'rpc="{}"'.format(rpc) in line and 'code="{}"'.format(code) in line:
                total += int(float(line.rsplit(" ", 1)[1]))
        return total

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        self.dir.cleanup()


class Proxy:
    """A TCP proxy to a gate, so a test can break connections (`drop`), refuse new ones (`pause`), or send them
    to another server (`retarget`)."""

    def __init__(self, target):
        self.target = target
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.address = "127.0.0.1:{}".format(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._sockets = []
        self._paused = False
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refuse = self._paused or self._closed
                target = self.target
            if refuse:
                client.close()
                continue
            host, port = target.rsplit(":", 1)
            try:
                upstream = socket.create_connection((host, int(port)), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    @staticmethod
    def _pump(a, b):
        peers = {a: b, b: a}
        try:
            while True:
                readable, _, _ = select.select([a, b], [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            for sock in (a, b):
                try:
                    sock.close()
                except OSError:
                    pass

    def drop(self):
        """Breaks every open connection."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def pause(self, paused=True):
        with self._lock:
            self._paused = paused

    def retarget(self, target):
        with self._lock:
            self.target = target

    def close(self):
        with self._lock:
            self._closed = True
        self._listener.close()
        self.drop()


@pytest.fixture(scope="session")
def gate():
    server = Gate(SHARED_NAMESPACES)
    yield server
    server.stop()


_namespaces = itertools.count()


@pytest.fixture
def namespace():
    """A namespace of the shared gate that no other test uses."""
    return SHARED_NAMESPACES[next(_namespaces)]


@pytest.fixture
def start_gate():
    """Starts extra gates for one test; all are stopped at its end."""
    started = []

    def start(namespaces, extra_config="", extra_args=()):
        server = Gate(namespaces, extra_config, extra_args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def proxy_to():
    proxies = []

    def make(target):
        proxy = Proxy(target)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()
