"""Misuses that mypy must report against the installed package (clients/python/test.sh expects exactly these
two errors): a wrong return type from the client's annotations, a wrong field type from the stubs' .pyi."""

from existence_gate_client import GateClient
from existence_gate_client.stubs import existence_pb2


def seq_as_text(client: GateClient) -> str:
    return client.add(["user:1"])  # error: [return-value], add() returns int


bad = existence_pb2.MayExistRequest(namespace=1)  # error: [arg-type], namespace is a str
