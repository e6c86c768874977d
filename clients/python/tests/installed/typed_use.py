"""A program using existence-gate-client as a service would. clients/python/test.sh runs `mypy --strict` on it
in fresh venvs: it passes only when the installed package is typed (py.typed, and the .pyi of the stubs)."""

from existence_gate_client import Answer, GateClient, GatedReader, RecordOutcome, Recorded
from existence_gate_client.stubs import existence_pb2


def lookup(client: GateClient, key: str) -> bool:
    answer: Answer = client.may_exist(key, timeout=1.0)
    return answer.may_exist


def add_one(client: GateClient, key: str) -> int:
    return client.add([key])


def was_recorded(result: Recorded) -> bool:
    return result.outcome is RecordOutcome.RECORDED


def request(key: bytes) -> existence_pb2.MayExistRequest:
    return existence_pb2.MayExistRequest(namespace="users", key=key)


def reader(client: GateClient) -> "GatedReader":
    return GatedReader(client, lambda key: None)
