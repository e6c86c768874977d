"""The stubs generated from existence/v1/existence.proto when the package was built (see setup.py)."""

try:
    from ._gen import existence_pb2 as pb
    from ._gen import existence_pb2_grpc as pb_grpc
except ImportError as error:  # pragma: no cover - a source checkout that was never built
    raise ImportError(
        "existence_gate_client has no generated stubs: install the package (pip install ./clients/python) "
        "instead of importing it from its source directory ({})".format(error)
    ) from error

__all__ = ["pb", "pb_grpc"]
