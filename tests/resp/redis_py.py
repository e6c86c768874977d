"""The RESP port with redis-py: its bf() commands, a 10,000-command pipeline, RESP2 and RESP3, the token,
Pub/Sub invalidations, and (with the argument `tls`) mutual TLS. Started by tests/resp/run.sh, which sets
RESP_HOST, RESP_PORT, RESP_TOKEN and, for TLS, RESP_TLS_DIR."""

import os
import subprocess
import sys
import time
import uuid

import redis


def connect(protocol, tls_dir):
    options = dict(host=os.environ["RESP_HOST"], port=int(os.environ["RESP_PORT"]),
                   password=os.environ["RESP_TOKEN"], protocol=protocol, socket_timeout=20)
    if tls_dir:
        options.update(ssl=True, ssl_ca_certs=f"{tls_dir}/ca.pem", ssl_certfile=f"{tls_dir}/client.pem",
                       ssl_keyfile=f"{tls_dir}/client.key", ssl_check_hostname=False)
    return redis.Redis(**options)


def grpc_answers(keys):
    """1 or 0 per key as gRPC answers it (the binary's own client, `existence-gate check`), in order."""
    out = subprocess.run(
        [os.environ["EXISTENCE_GATE_BIN"], "check", "--addr", "http://" + os.environ["GATE_GRPC"],
         "--token", os.environ["RESP_TOKEN"], "--namespace", "users", *keys],
        capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
    assert [line.split()[0] for line in out] == keys, out
    return [0 if line.split()[1] == "ABSENT" else 1 for line in out]


def check(protocol, tls_dir):
    r = connect(protocol, tls_dir)
    bf = r.bf()
    run = uuid.uuid4().hex
    key = lambda i: f"py-{run}-{i}"
    assert bf.add("users", key(0)) == 1
    assert bf.add("users", key(0)) == 0
    assert bf.madd("users", key(1), key(2)) == [1, 1]
    assert bf.exists("users", key(1)) == 1
    assert bf.mexists("users", key(2), "never-" + run) == [1, 0]
    assert bf.insert("users", [key(3)], noCreate=True) == [1]
    info = bf.info("users")
    # RESP2: redis-py's BFInfo; RESP3: the map itself (keys as bytes without decode_responses).
    capacity = info.get(b"Capacity", info.get("Capacity")) if isinstance(info, dict) else info.capacity
    assert capacity == 100000, info
    assert bf.card("users") > 0
    try:
        bf.exists("no-such-namespace", "k")
        raise AssertionError("an unknown namespace was answered")
    except redis.ResponseError as e:
        assert "is not configured" in str(e), e

    # 10,000 commands in one pipeline: replies in order, each as unary answers it.
    pipe = r.pipeline(transaction=False)
    keys = [key(i % 10) if i % 2 == 0 else f"never-{run}-{i}" for i in range(10_000)]
    for k in keys:
        pipe.execute_command("BF.EXISTS", "users", k)
    answers = pipe.execute()
    assert len(answers) == 10_000
    for i in range(0, 10_000, 97):
        assert answers[i] == bf.exists("users", keys[i]), (i, keys[i])
    assert all(answers[i] == 1 for i in range(0, 40, 2) if i % 10 < 4)
    # The same keys through gRPC: the same answers (on the plaintext gate, whose gRPC port needs no
    # client certificate).
    if os.environ.get("GATE_GRPC"):
        assert grpc_answers(keys[:64]) == answers[:64]

    # The read path without gRPC: record an absence, see it, then an add invalidates it.
    pubsub = r.pubsub()
    pubsub.subscribe("invalidations:users")
    deadline = time.time() + 20
    while time.time() < deadline:
        message = pubsub.get_message(timeout=1)
        if message and message["type"] == "subscribe":
            break
    # key(1) was added; the source deleted it since.
    outcome = r.execute_command("GATE.ABSENT", "users", key(1), "DELETED")
    assert outcome[0] in (b"RECORDED", "RECORDED"), outcome
    lookup = r.execute_command("GATE.LOOKUP", "users", key(1))
    assert [x.decode() if isinstance(x, bytes) else x for x in lookup[:2]] == ["ABSENT", "TOMBSTONE"], lookup
    assert bf.exists("users", key(1)) == 0
    assert bf.add("users", key(1)) == 1
    while time.time() < deadline:
        message = pubsub.get_message(timeout=1)
        if message and message["type"] == "message":
            data = message["data"].decode() if isinstance(message["data"], bytes) else message["data"]
            if data.endswith(" " + key(1)):
                assert data.startswith("added "), data
                break
    else:
        raise AssertionError("no invalidation for the added key")
    pubsub.close()
    r.close()


tls_dir = os.environ.get("RESP_TLS_DIR") if "tls" in sys.argv[1:] else None
for protocol in (2, 3):
    check(protocol, tls_dir)
    print(f"redis-py {redis.__version__}, RESP{protocol}{' over mutual TLS' if tls_dir else ''}: passed")
