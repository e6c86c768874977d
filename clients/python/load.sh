#!/usr/bin/env bash
# Builds this library (stubs generated from proto/, as test.sh does) into a directory of its own and runs
# load/main.py (a steady load through it, see its header): the Python side of tests/suite/balancer.rs.
#   load.sh DIR ADDRESS[,ADDRESS...]
#   EXISTENCE_GATE_INTEROP_VENV  the venv made by .ci/install-interop (default: target/interop-venv)
# Exit status: 0 once the load ran and DIR/report is written; 77 when the toolchain is missing.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
[ $# -eq 2 ] || { echo "usage: load.sh DIR ADDRESS[,ADDRESS...]" >&2; exit 2; }
venv=${EXISTENCE_GATE_INTEROP_VENV:-$root/target/interop-venv}
case $venv in /*) ;; *) venv=$root/$venv ;; esac
python=$venv/bin/python
if [ ! -x "$python" ] || ! "$python" -c 'import grpc, grpc_tools, setuptools' 2>/dev/null; then
    echo "SKIPPED: python client toolchain missing (install with .ci/install-interop): no venv with grpcio at $venv"
    exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/existence-gate-python-load.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 143' TERM
# Built outside the checkout (setuptools' build/ folder there is shared with test.sh, which may run meanwhile).
cp -r "$here" "$work/src" && rm -rf "$work/src/build"
ln -s "$root/proto" "$work/src/proto"
if ! (cd "$work" && "$python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
    --no-index --target "$work/site" ./src 2>"$work/build.log"); then
    cat "$work/build.log" >&2
    echo "FAIL: the package did not build" >&2
    exit 1
fi
PYTHONPATH=$work/site PYTHONDONTWRITEBYTECODE=1 "$python" "$here/load/main.py" "$1" "$2"
