"""The client over TLS with mutual TLS, against a gate that requires client certificates (a throwaway PKI made
with the `openssl` command: a CA, a server certificate for `localhost`, a client certificate)."""

import os
import shutil
import subprocess
import tempfile

import grpc
import pytest

from existence_gate_client import GateClient, GateError, GatedReader

from conftest import Gate, eventually

NAMESPACE = "tls"

# The gate listens on 127.0.0.1 with a certificate for `localhost`: the channel checks that name instead.
LOCALHOST = (("grpc.ssl_target_name_override", "localhost"),)


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, timeout=60, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _signed(name, subject, extensions, cwd):
    """A P-256 key and a certificate for it signed by the CA in `cwd`: NAME.key, NAME.pem."""
    with open(os.path.join(cwd, name + ".ext"), "w") as f:
        f.write(extensions)
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", name + ".key", "-out", name + ".csr", "-subj", subject, cwd=cwd)
    _openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-sha256", "-extfile", name + ".ext", "-out", name + ".pem", cwd=cwd)


@pytest.fixture(scope="module")
def pki():
    """A CA, a server certificate for DNS:localhost and a client certificate, all signed by the CA."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is missing (needed to make the test PKI)")
    directory = tempfile.TemporaryDirectory(prefix="existence-gate-client-tls-")
    d = directory.name
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
             "-sha256", "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=existence-gate test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    _signed("server", "/CN=localhost",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost\n", d)
    _signed("client", "/CN=existence-gate test client",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n", d)

    def read(name):
        with open(os.path.join(d, name), "rb") as f:
            return f.read()

    files = {name: read(name) for name in ("ca.pem", "client.pem", "client.key")}
    files["dir"] = d
    yield files
    directory.cleanup()


@pytest.fixture(scope="module")
def tls_gate(pki):
    d = pki["dir"]
    server = Gate([NAMESPACE], extra_args=[
        "--tls-cert", os.path.join(d, "server.pem"),
        "--tls-key", os.path.join(d, "server.key"),
        "--tls-client-ca", os.path.join(d, "ca.pem"),
    ])
    yield server
    server.stop()


def mutual_tls(pki):
    return grpc.ssl_channel_credentials(
        root_certificates=pki["ca.pem"], private_key=pki["client.key"], certificate_chain=pki["client.pem"])


def test_mutual_tls_adds_and_coalesced_lookups(tls_gate, pki):
    added = ["tls:added:{}".format(i) for i in range(16)]
    never = ["tls:never:{}".format(i) for i in range(16)]
    with GateClient(tls_gate.grpc_addr, NAMESPACE, credentials=mutual_tls(pki), channel_options=LOCALHOST,
                    deadline=10) as client:
        assert client.add(added) > 0
        answers = [client.may_exist(key) for key in added + never]  # coalescing is on (the default)
        many = client.may_exist_many(added + never)
        stats = client.stats()
    assert all(a.may_exist for a in answers[:16])
    assert all(a.may_exist for a in many[:16])
    # A never-added key may be a Bloom false positive, but not most of them; both paths agree key for key.
    assert sum(a.may_exist for a in answers[16:]) < 4
    assert [a.may_exist for a in answers] == [a.may_exist for a in many]
    assert stats.lookups == 32 and stats.batched_keys == 64 and stats.gate_calls == 33 and stats.retries == 0
    assert tls_gate.requests("BatchMayExist") >= 33


def test_the_readers_subscription_runs_over_tls(tls_gate, pki):
    reads = []

    def source(key):
        reads.append(key)
        return "row"

    key = "tls:reader:later"
    with GateClient(tls_gate.grpc_addr, NAMESPACE, credentials=mutual_tls(pki), channel_options=LOCALHOST,
                    deadline=10) as client, GatedReader(client, source) as reader:
        assert reader.wait_live(30)
        assert reader.get(key) is None and reads == []  # absent: answered by the gate, then cached
        assert reader.is_cached_absent(key)
        with GateClient(tls_gate.grpc_addr, NAMESPACE, credentials=mutual_tls(pki), channel_options=LOCALHOST,
                        deadline=10) as writer:
            writer.add([key])
        # The other client's Add reaches this reader over its TLS stream and drops the cached absence.
        assert eventually(lambda: not reader.is_cached_absent(key)), reader.stats()
        assert reader.get(key) == "row" and reads == [key]
        assert reader.stats().invalidations >= 1


def test_a_client_without_a_certificate_is_refused(tls_gate, pki):
    credentials = grpc.ssl_channel_credentials(root_certificates=pki["ca.pem"])
    with GateClient(tls_gate.grpc_addr, NAMESPACE, credentials=credentials, channel_options=LOCALHOST,
                    deadline=10) as client:
        with pytest.raises(GateError) as refused:
            client.may_exist("tls:anything")
        assert refused.value.code() != grpc.StatusCode.OK
        with pytest.raises(GateError):
            client.add(["tls:anything"])


def test_a_client_not_trusting_the_ca_is_refused(tls_gate, pki):
    # The system roots do not include the throwaway CA.
    credentials = grpc.ssl_channel_credentials(private_key=pki["client.key"], certificate_chain=pki["client.pem"])
    with GateClient(tls_gate.grpc_addr, NAMESPACE, credentials=credentials, channel_options=LOCALHOST,
                    deadline=5) as client:
        with pytest.raises(GateError) as refused:
            client.may_exist("tls:anything")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_plaintext_client_is_refused(tls_gate):
    with GateClient(tls_gate.grpc_addr, NAMESPACE, deadline=5) as client:
        with pytest.raises(GateError):
            client.may_exist("tls:anything")


def test_the_server_name_is_checked(tls_gate, pki):
    # Without the override the channel expects the certificate to name 127.0.0.1, which it does not.
    with GateClient(tls_gate.grpc_addr, NAMESPACE, credentials=mutual_tls(pki), deadline=5) as client:
        with pytest.raises(GateError) as refused:
            client.may_exist("tls:anything")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
