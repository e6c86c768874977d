"""Builds existence-gate-client with its gRPC stubs generated from existence/v1/existence.proto.

The stubs are not committed: grpc_tools.protoc (a build requirement) writes them while the package is built,
into the package's private `existence_gate_client._gen` (imports rewritten to be relative), so they can never
clash with a service's own `existence.v1` modules. The proto is taken from the repository
(`clients/python/../../proto`, where `pip install ./clients/python` builds) or from an sdist, which bundles it
under `proto/`.
"""

import atexit
import os
import re
import shutil
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PROTO = Path("existence/v1/existence.proto")
# An sdist carries its own copy; a checkout of the repository has the original two levels up.
PROTO_ROOTS = [HERE / "proto", HERE.parent.parent / "proto"]
GEN_PACKAGE = Path("existence_gate_client/_gen")


def proto_root() -> Path:
    override = os.environ.get("EXISTENCE_GATE_PROTO_DIR")
    roots = [Path(override)] if override else PROTO_ROOTS
    for root in roots:
        if (root / PROTO).is_file():
            return root
    raise SystemExit(
        "existence-gate-client: cannot find {} under {}. Build from the existence-gate repository "
        "(pip install ./clients/python from its root), from an sdist made there (it bundles proto/), or set "
        "EXISTENCE_GATE_PROTO_DIR to a directory holding {}.".format(
            PROTO, " or ".join(str(r) for r in roots), PROTO
        )
    )


_generated = None


def generate() -> Path:
    """Runs grpc_tools.protoc once per build process; returns the directory holding the finished modules."""
    global _generated
    if _generated is not None:
        return _generated
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as error:
        raise SystemExit(
            "existence-gate-client: building it needs grpcio-tools (a build requirement; with "
            "--no-build-isolation install it first): {}".format(error)
        )
    root = proto_root()
    raw = Path(tempfile.mkdtemp(prefix="existence-gate-client-protoc-"))
    atexit.register(shutil.rmtree, raw, True)
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    status = protoc.main(
        [
            "grpc_tools.protoc",
            "-I{}".format(root),
            "-I{}".format(well_known),
            "--python_out={}".format(raw),
            "--grpc_python_out={}".format(raw),
            "--pyi_out={}".format(raw),
            str(root / PROTO),
        ]
    )
    if status != 0:
        raise SystemExit("existence-gate-client: grpc_tools.protoc failed on {} (status {})".format(root / PROTO, status))
    out = raw / "package"
    out.mkdir()
    for name in ("existence_pb2.py", "existence_pb2.pyi", "existence_pb2_grpc.py"):
        text = (raw / PROTO.parent / name).read_text(encoding="utf-8")
        # grpc_tools writes absolute imports of the proto's package (`from existence.v1 import ...`); inside
        # the private package they must be relative.
        text = re.sub(r"^from existence\.v1 import ", "from . import ", text, flags=re.M)
        if name == "existence_pb2.py":
            text = private_pool(text)
        (out / name).write_text(text, encoding="utf-8")
    (out / "__init__.py").write_text(
        '"""Stubs generated from existence/v1/existence.proto at build time (private: import '
        'existence_gate_client instead)."""\n',
        encoding="utf-8",
    )
    _generated = out
    return out


def private_pool(text: str) -> str:
    """Registers the descriptors in a pool of the package's own instead of protobuf's default one: a service's
    own stubs of existence/v1/existence.proto (another version of it, say) then load beside these, where the
    shared pool would refuse the second file of that name."""
    shared = "_descriptor_pool.Default().AddSerializedFile("
    if text.count(shared) != 1:
        raise SystemExit("existence-gate-client: unexpected generated code (no {}): update setup.py".format(shared))
    text = text.replace(shared, "_descriptor_pool.DescriptorPool().AddSerializedFile(")
    return text.replace("'existence.v1.existence_pb2'", "'existence_gate_client._gen.existence_pb2'")


def runtime_requirements():
    """The generated code refuses to load on a grpcio or protobuf older than the generator that wrote it."""
    from importlib.metadata import version

    gen = generate()
    header = (gen / "existence_pb2.py").read_text(encoding="utf-8")
    match = re.search(r"^# Protobuf Python Version: (\d+\.\d+\.\d+)", header, flags=re.M)
    grpc_match = re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'", (gen / "existence_pb2_grpc.py").read_text(encoding="utf-8"), flags=re.M)
    grpc_version = grpc_match.group(1) if grpc_match else version("grpcio-tools")
    requirements = ["grpcio>={}".format(grpc_version)]
    requirements.append("protobuf>={}".format(match.group(1)) if match else "protobuf")
    return requirements


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            # An editable install imports from src/: the stubs go there (ignored by git).
            target = HERE / "src" / GEN_PACKAGE
        else:
            target = Path(self.build_lib) / GEN_PACKAGE
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(generate(), target)


class SdistWithProto(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        copy = Path(base_dir) / "proto" / PROTO
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(proto_root() / PROTO, copy)


setup(
    install_requires=runtime_requirements(),
    cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto},
)
