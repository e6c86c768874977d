#!/usr/bin/env bash
# Builds the Python client (its stubs generated from proto/ by grpc_tools.protoc while pip builds it) into a
# temporary directory and runs its tests with pytest against real servers ($EXISTENCE_GATE_BIN).
#
# Environment:
#   EXISTENCE_GATE_BIN           the server binary (required)
#   EXISTENCE_GATE_INTEROP_VENV  the Python venv made by .ci/install-interop (default: target/interop-venv);
#                                it needs grpcio, grpcio-tools, setuptools and pytest. Nothing is installed
#                                into it: the package goes to a temporary --target directory, offline.
#   CLIENT_TEST_TIMEOUT          seconds any one step may take (default 300)
# Extra arguments go to pytest (e.g. -k resync).
#
# Exit status: 0 when every test passed, 77 when the toolchain is missing, otherwise non-zero.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${EXISTENCE_GATE_INTEROP_VENV:-$root/target/interop-venv}
case $venv in /*) ;; *) venv=$root/$venv ;; esac
step_timeout=${CLIENT_TEST_TIMEOUT:-300}
python=$venv/bin/python

skip() {
    echo "SKIPPED: python client toolchain missing (install with .ci/install-interop): $1"
    exit 77
}
[ -x "$python" ] || skip "no Python venv at $venv"
"$python" -c 'import grpc, grpc_tools, setuptools' 2>/dev/null ||
    skip "the venv at $venv lacks grpcio, grpcio-tools or setuptools"
"$python" -c 'import pytest' 2>/dev/null || skip "the venv at $venv lacks pytest"
if [ -z "${EXISTENCE_GATE_BIN:-}" ] || [ ! -x "$EXISTENCE_GATE_BIN" ]; then
    echo "FAIL: EXISTENCE_GATE_BIN must name the server binary (got '${EXISTENCE_GATE_BIN:-}')" >&2
    exit 1
fi
export EXISTENCE_GATE_BIN

work=$(mktemp -d "${TMPDIR:-/tmp}/existence-gate-client-python.XXXXXX")
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# pip install ./clients/python, as a user would (an in-place build: the proto is found at ../../proto), but
# into a directory of its own, offline, with the build requirements the venv already has.
echo "== building existence-gate-client (stubs generated from proto/)"
rm -rf "$here/build"  # setuptools' build output (ignored by git): stale modules there would end up in the wheel
if ! (cd "$root" && timeout -k 10 "$step_timeout" "$python" -m pip install -q --disable-pip-version-check \
    --no-build-isolation --no-deps --no-index --target "$work/site" ./clients/python 2>"$work/build.log"); then
    cat "$work/build.log" >&2
    echo "FAIL: the package did not build" >&2
    exit 1
fi

echo "== pytest"
# Every server a test starts is stopped by its fixture; the step timeout ends pytest (and with it, its
# servers' parents) if something hangs.
cd "$here" || exit 1
PYTHONPATH=$work/site PYTHONDONTWRITEBYTECODE=1 timeout -k 10 "$step_timeout" \
    "$python" -m pytest -p no:cacheprovider -q --durations=5 tests "$@"
