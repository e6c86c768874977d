"""Run by clients/python/test.sh with the python of a fresh venv that has existence-gate-client installed (from
the wheel or the sdist) and nothing else of this repository: the package imports from that venv, ships its
typing (py.typed, the stubs' .pyi), needs neither protoc nor grpcio-tools at run time, and makes real calls to
a server started from $EXISTENCE_GATE_BIN."""

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import existence_gate_client
from existence_gate_client import GateClient, GatedReader, RecordOutcome
from existence_gate_client.stubs import existence_pb2


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


package = Path(existence_gate_client.__file__).resolve().parent
if not str(package).startswith(str(Path(sys.prefix).resolve())):
    fail("existence_gate_client was imported from {}, not from the venv {}".format(package, sys.prefix))
for name in ("py.typed", "_gen/existence_pb2.pyi", "_gen/existence_pb2.py", "_gen/existence_pb2_grpc.py"):
    if not (package / name).is_file():
        fail("the installed package lacks {} (in {})".format(name, package))
if importlib.util.find_spec("grpc_tools") is not None:
    fail("grpcio-tools is installed in the venv: it must be a build requirement only")
if existence_pb2.MayExistRequest.__module__ != "existence_gate_client._gen.existence_pb2":
    fail("the stubs are not the package's private ones: " + existence_pb2.MayExistRequest.__module__)

with tempfile.TemporaryDirectory(prefix="existence-gate-installed-") as scratch:
    config = Path(scratch) / "gate.toml"
    config.write_text('[namespaces.installed]\nexpected_keys = 1000\nmissing_ttl = "1m"\ndeleted_ttl = "1m"\n')
    log_path = Path(scratch) / "gate.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [os.environ["EXISTENCE_GATE_BIN"], "serve", "--in-memory", "--listen", "127.0.0.1:0",
             "--http-listen", "127.0.0.1:0", "--resp-listen", "127.0.0.1:0", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, NO_COLOR="1"),
        )
    try:
        deadline = time.monotonic() + 30
        address = None
        while address is None:
            match = re.search(r"grpc_addr=(\S+)", log_path.read_text(errors="replace"))
            if match:
                address = match.group(1)
            elif server.poll() is not None or time.monotonic() > deadline:
                fail("the server did not start; its log:\n" + log_path.read_text(errors="replace"))
            else:
                time.sleep(0.02)
        with GateClient(address, "installed", deadline=5.0) as client:
            # The gate answers "may exist" while it is warming: wait for a real answer.
            while client.may_exist("user:absent").warming:
                if time.monotonic() > deadline:
                    fail("the gate stayed warming")
                time.sleep(0.05)
            client.add(["user:1"])
            if not client.may_exist("user:1").may_exist:
                fail("an added key was answered absent")
            answer = client.may_exist("user:absent")
            if answer.may_exist:
                fail("a key never added may exist: {}".format(answer))
            recorded = client.record_absent("user:absent", observed_seq=answer.observed_seq, address=answer.address)
            if not isinstance(recorded.outcome, RecordOutcome):
                fail("record_absent: {}".format(recorded))
            with GatedReader(client, lambda key: {"user:1": "row 1"}.get(key)) as reader:
                if reader.get("user:1") != "row 1" or reader.get("user:3") is not None:
                    fail("GatedReader.get read the wrong rows")
    finally:
        server.terminate()
        server.wait(timeout=15)

print("installed from {}: typed, no protoc or grpcio-tools needed, calls answered by the gate".format(package))
