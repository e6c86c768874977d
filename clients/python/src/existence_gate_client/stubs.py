"""The generated protobuf and gRPC modules, for calls the client does not wrap (Admin, a raw `basis`):

    from existence_gate_client.stubs import existence_pb2, existence_pb2_grpc

They are private to this package (their own descriptor pool), so they never clash with a service's own
`existence.v1` stubs; messages of one cannot be passed to stubs of the other."""

from ._stubs import pb as existence_pb2
from ._stubs import pb_grpc as existence_pb2_grpc

__all__ = ["existence_pb2", "existence_pb2_grpc"]
