"""Checks what `python -m build` made of clients/python (clients/python/test.sh runs it): one wheel and one sdist,
static dependencies with floors in both (nothing to run, no protoc, to learn them), py.typed and the stubs'
.pyi in the wheel, the proto and py.typed in the sdist. Writes the floors as a pip constraints file
(grpcio==X, protobuf==Y), so the wheel can be installed on the oldest versions it accepts.

    python check_dists.py DIST_DIR FLOORS_FILE
"""

import re
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

PACKAGE = "existence_gate_client"
RUNTIME = ("grpcio", "protobuf")
problems = []


def check(condition, message):
    if not condition:
        problems.append(message)


def requirements(metadata, where):
    """{name: floor} of the Requires-Dist fields; the metadata must not leave them dynamic."""
    dynamic = [value.lower() for value in metadata.get_all("Dynamic") or []]
    check("requires-dist" not in dynamic, "{}: Requires-Dist is declared dynamic".format(where))
    floors = {}
    for requirement in metadata.get_all("Requires-Dist") or []:
        match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(.*)$", requirement)
        floor = re.search(r">=\s*([0-9][0-9.]*)", match.group(2))
        floors[match.group(1).lower()] = floor.group(1) if floor else None
    for name in RUNTIME:
        check(name in floors, "{}: no Requires-Dist on {} ({})".format(where, name, floors))
        check(floors.get(name), "{}: the requirement on {} has no floor (>=)".format(where, name))
    check("grpcio-tools" not in floors, "{}: grpcio-tools is a run-time requirement".format(where))
    check(
        "Typing :: Typed" in (metadata.get_all("Classifier") or []),
        "{}: no 'Typing :: Typed' classifier".format(where),
    )
    return floors


dist = Path(sys.argv[1])
wheels = sorted(dist.glob("*.whl"))
sdists = sorted(dist.glob("*.tar.gz"))
if len(wheels) != 1 or len(sdists) != 1:
    sys.exit("FAIL: expected one wheel and one sdist in {}, found {}".format(dist, [p.name for p in dist.iterdir()]))

with zipfile.ZipFile(wheels[0]) as wheel:
    names = set(wheel.namelist())
    for name in ("py.typed", "__init__.py", "_gen/__init__.py", "_gen/existence_pb2.py", "_gen/existence_pb2.pyi",
                 "_gen/existence_pb2_grpc.py"):
        check("{}/{}".format(PACKAGE, name) in names, "wheel: {}/{} is missing".format(PACKAGE, name))
    (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    wheel_floors = requirements(Parser().parsestr(wheel.read(metadata_name).decode()), "wheel METADATA")
    check(not any(n.startswith("proto/") for n in names), "wheel: ships the proto sources")

with tarfile.open(sdists[0]) as sdist:
    names = set(sdist.getnames())
    top = sorted(names)[0].split("/")[0]
    for name in ("PKG-INFO", "pyproject.toml", "setup.py", "proto/existence/v1/existence.proto",
                 "src/{}/py.typed".format(PACKAGE)):
        check("{}/{}".format(top, name) in names, "sdist: {} is missing".format(name))
    check(
        not any("/_gen/" in n for n in names),
        "sdist: ships generated stubs (they must be generated when the sdist is built)",
    )
    sdist_floors = requirements(Parser().parsestr(sdist.extractfile(top + "/PKG-INFO").read().decode()), "sdist PKG-INFO")

check(wheel_floors == sdist_floors, "the wheel's requirements {} differ from the sdist's {}".format(wheel_floors, sdist_floors))
if problems:
    sys.exit("FAIL: the distributions are not right:\n  " + "\n  ".join(problems))
Path(sys.argv[2]).write_text("".join("{}=={}\n".format(name, wheel_floors[name]) for name in RUNTIME))
print("{} and {}: static requirements {}, typed".format(
    wheels[0].name, sdists[0].name, ", ".join("{}>={}".format(n, wheel_floors[n]) for n in RUNTIME)))
