"""Builds existence-gate-client with its gRPC stubs generated from existence/v1/existence.proto.

The stubs are not committed: grpc_tools.protoc (a build requirement) writes them while the package is built,
into the package's private `existence_gate_client._gen` (imports rewritten to be relative), so they can never
clash with a service's own `existence.v1` modules. The proto is taken from the repository
(`clients/python/../../proto`, where `pip install ./clients/python` builds) or from an sdist, which bundles it
under `proto/`.

The runtime dependencies are static (pyproject.toml): nothing runs at metadata time. The floors there are the
versions the pinned grpcio-tools' stubs check when imported; `check_floors` stops a build whose stubs would
need more (a different grpcio-tools in a --no-build-isolation environment, say).
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


def _version(text: str) -> tuple:
    """(1, 85, 0) of "1.85" (the release numbers only: "1.86.0rc1" is (1, 86, 0))."""
    match = re.match(r"\d+(?:\.\d+)*", text.strip())
    numbers = [int(part) for part in match.group(0).split(".")] if match else []
    return tuple((numbers + [0, 0, 0])[:3])


def generated_needs(gen: Path) -> dict:
    """The runtime versions the generated modules check when they are imported: grpcio >= the generator
    (GRPC_GENERATED_VERSION, existence_pb2_grpc.py) and protobuf >= the gencode version
    (ValidateProtobufRuntimeVersion, or the header of older generators, existence_pb2.py)."""
    needs = {}
    grpc_code = (gen / "existence_pb2_grpc.py").read_text(encoding="utf-8")
    match = re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'", grpc_code, flags=re.M)
    if match:
        needs["grpcio"] = match.group(1)
    pb_code = (gen / "existence_pb2.py").read_text(encoding="utf-8")
    match = re.search(
        r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", pb_code
    ) or re.search(r"^# Protobuf Python Version: (\d+)\.(\d+)\.(\d+)", pb_code, flags=re.M)
    if match:
        needs["protobuf"] = ".".join(match.groups())
    return needs


def check_floors(gen: Path, requirements) -> None:
    """The dependencies are static (pyproject.toml); this refuses to build stubs that would not load on their
    floors, as those of a grpcio-tools newer than the pinned build requirement would not."""
    floors = {}
    for requirement in requirements or []:
        match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(.*)$", str(requirement))
        if match:
            floor = re.search(r">=\s*([0-9][0-9.]*)", match.group(2))
            floors[match.group(1).lower()] = floor.group(1) if floor else None
    for name, needed in sorted(generated_needs(gen).items()):
        floor = floors.get(name)
        if floor is None or _version(floor) < _version(needed):
            raise SystemExit(
                "existence-gate-client: the stubs generated here need {name}>={needed} at run time, but the "
                "package declares {declared}. Build with the grpcio-tools version pyproject.toml's build-system "
                "pins (it generates stubs that load on the declared floors), or raise the pin and the floors "
                "together.".format(
                    name=name, needed=needed, declared=", ".join(str(r) for r in requirements or []) or "no floor"
                )
            )


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            # An editable install imports from src/: the stubs go there (ignored by git).
            target = HERE / "src" / GEN_PACKAGE
        else:
            target = Path(self.build_lib) / GEN_PACKAGE
        generated = generate()
        check_floors(generated, self.distribution.install_requires)
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(generated, target)


class SdistWithProto(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        copy = Path(base_dir) / "proto" / PROTO
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(proto_root() / PROTO, copy)


setup(
    cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto},
)
