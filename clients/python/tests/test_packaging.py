"""The package builds its stubs from the proto (in the repository or bundled in an sdist) and keeps them private."""

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
REPO = PACKAGE_DIR.parent.parent


def run(*args, cwd=None, env=None, check=True):
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )
    if check and result.returncode != 0:
        raise AssertionError("{} failed ({}):\n{}\n{}".format(args, result.returncode, result.stdout, result.stderr))
    return result


def pip_install(source, target):
    return run(
        sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
        "--target", target, source, check=False,
    )


def test_stubs_load_beside_a_services_own_stubs_of_another_proto_version(tmp_path):
    # The service generated existence/v1 stubs from a newer proto (one more field) and imports them first.
    proto = tmp_path / "proto" / "existence" / "v1" / "existence.proto"
    proto.parent.mkdir(parents=True)
    text = (REPO / "proto" / "existence" / "v1" / "existence.proto").read_text()
    proto.write_text(text.replace("bool warming = 4;", "bool warming = 4;\n  bool newer = 99;"))
    gen = tmp_path / "gen"
    gen.mkdir()
    run(sys.executable, "-m", "grpc_tools.protoc", "-I", tmp_path / "proto", "--python_out", gen, proto)
    check = (
        "from existence.v1 import existence_pb2 as own\n"
        "import existence_gate_client\n"
        "from existence_gate_client._gen import existence_pb2 as ours\n"
        "assert 'newer' in own.BatchMayExistResponse.DESCRIPTOR.fields_by_name\n"
        "assert 'newer' not in ours.BatchMayExistResponse.DESCRIPTOR.fields_by_name\n"
        "assert ours.MayExistRequest.__module__ == 'existence_gate_client._gen.existence_pb2'\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(gen), os.environ.get("PYTHONPATH", "")]))
    run(sys.executable, "-c", check, env=env)


def test_an_sdist_bundles_the_proto(tmp_path):
    # Built from a copy, so the checkout gets no build output.
    copy = tmp_path / "src-copy"
    shutil.copytree(
        PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "_gen", "tests")
    )
    env = dict(os.environ, EXISTENCE_GATE_PROTO_DIR=str(REPO / "proto"))
    run(sys.executable, "setup.py", "-q", "sdist", "-d", tmp_path / "dist", cwd=copy, env=env)
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        assert any(n.endswith("/proto/existence/v1/existence.proto") for n in names), names
        archive.extractall(tmp_path / "unpacked")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    # Far from the repository: only the bundled proto can be found.
    installed = pip_install(unpacked, tmp_path / "site")
    assert installed.returncode == 0, installed.stderr
    run(
        sys.executable, "-c", "import existence_gate_client._gen.existence_pb2_grpc",
        env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")),
    )
    # Without any proto the build says what is missing.
    shutil.rmtree(unpacked / "proto")
    failed = pip_install(unpacked, tmp_path / "site2")
    assert failed.returncode != 0
    assert "cannot find existence/v1/existence.proto" in failed.stderr + failed.stdout
