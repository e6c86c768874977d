#!/usr/bin/env bash
# Builds the Python client (its stubs generated from proto/ by grpc_tools.protoc while pip builds it) into a
# temporary directory and runs its tests with pytest against real servers ($EXISTENCE_GATE_BIN). Then checks
# that it installs the way Python packages do: `python -m build` makes an sdist and a wheel (static
# requirements, py.typed); each is installed, offline, into a fresh venv with no protoc on PATH (the wheel on
# the oldest grpcio and protobuf it accepts, the sdist built by pip with build isolation on the newest), where
# the package imports, calls a real server and type-checks (mypy --strict) a program that uses it.
#
# Environment:
#   EXISTENCE_GATE_BIN           the server binary (required)
#   EXISTENCE_GATE_INTEROP_VENV  the Python venv made by .ci/install-interop (default: target/interop-venv);
#                                it needs grpcio, grpcio-tools, setuptools, build and pytest. Nothing is
#                                installed into it: the package goes to a temporary --target directory, offline.
#   EXISTENCE_GATE_PYTHON_WHEELHOUSE
#                                the wheels the fresh venvs install from, offline (default: target/python-wheelhouse,
#                                downloaded by .ci/install-interop from tests/interop/python/wheelhouse.txt)
#   CLIENT_TEST_TIMEOUT          seconds any one step may take (default 300)
# Extra arguments go to pytest (e.g. -k resync).
#
# Exit status: 0 when every test passed, 77 when the toolchain is missing, otherwise non-zero.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${EXISTENCE_GATE_INTEROP_VENV:-$root/target/interop-venv}
case $venv in /*) ;; *) venv=$root/$venv ;; esac
wheelhouse=${EXISTENCE_GATE_PYTHON_WHEELHOUSE:-$root/target/python-wheelhouse}
case $wheelhouse in /*) ;; *) wheelhouse=$root/$wheelhouse ;; esac
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
"$python" -c 'import build' 2>/dev/null || skip "the venv at $venv lacks build (python -m build)"
compgen -G "$wheelhouse/mypy-*.whl" >/dev/null || skip "no wheelhouse (with mypy) at $wheelhouse"
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
status=$?
[ $status -eq 0 ] || echo "FAIL: pytest exited $status" >&2

# -- packaging: the sdist and the wheel, each installed into a fresh venv ------------------------------------

checks=$here/tests/installed
failed_packaging=0
packaging_fail() {
    echo "FAIL: packaging: $1" >&2
    failed_packaging=1
}
# Runs a command with nothing from this shell's environment but a HOME, a TMPDIR, the server binary, and a
# PATH that holds only the venv's bin/ (so no protoc, nor any other tool of this machine).
in_fresh_env() {
    local env_dir=$1
    shift
    (cd "$work" && timeout -k 10 "$step_timeout" env -i HOME="$work/home" TMPDIR="$work/tmp" LC_ALL=C.UTF-8 \
        PYTHONNOUSERSITE=1 EXISTENCE_GATE_BIN="$EXISTENCE_GATE_BIN" PATH="$env_dir/bin" "$@")
}
# try_installed NAME ARTIFACT DESCRIPTION [PIP ARGUMENTS]: installs ARTIFACT (and mypy) into a fresh venv, from
# the wheelhouse only, with no protoc on PATH; then the package must import from there, work against a real
# server (smoke.py), and be typed: mypy --strict accepts typed_use.py and finds the two errors of
# typed_misuse.py.
try_installed() {
    local name=$1 artifact=$2 description=$3
    shift 3
    local env_dir=$work/venv-$name started
    echo "== packaging: the $name in a fresh venv without protoc, $description"
    started=$(date +%s)
    "$python" -m venv --without-pip "$env_dir" || { packaging_fail "python -m venv failed"; return; }
    if in_fresh_env "$env_dir" /bin/sh -c 'command -v protoc' >/dev/null; then
        packaging_fail "protoc is on the fresh venv's PATH"
        return
    fi
    # The venv has no pip of its own: this pip installs into it (--python), as the venv's own would.
    if ! in_fresh_env "$env_dir" "$python" -m pip --python "$env_dir/bin/python" install -q --no-cache-dir \
        --disable-pip-version-check --no-index --find-links "$wheelhouse" "$@" "$artifact" mypy \
        >"$work/install-$name.log" 2>&1; then
        cat "$work/install-$name.log" >&2
        packaging_fail "the $name did not install offline into a fresh venv (is $wheelhouse current? .ci/install-interop)"
        return
    fi
    echo "   installed in $(($(date +%s) - started)) s with $(in_fresh_env "$env_dir" python -c \
        'import grpc, google.protobuf; print("grpcio", grpc.__version__, "and protobuf", google.protobuf.__version__)')"
    in_fresh_env "$env_dir" python "$checks/smoke.py" || { packaging_fail "the installed $name does not work"; return; }
    if ! in_fresh_env "$env_dir" python -m mypy --strict --cache-dir "$work/mypy-$name" "$checks/typed_use.py" \
        >"$work/mypy-$name.log" 2>&1; then
        cat "$work/mypy-$name.log" >&2
        packaging_fail "mypy --strict rejects a correct program using the installed $name (is the package typed?)"
        return
    fi
    in_fresh_env "$env_dir" python -m mypy --strict --cache-dir "$work/mypy-$name" "$checks/typed_misuse.py" \
        >"$work/mypy-misuse-$name.log" 2>&1
    if ! grep -q '\[return-value\]' "$work/mypy-misuse-$name.log" ||
        ! grep -q '\[arg-type\]' "$work/mypy-misuse-$name.log" ||
        ! grep -q '^Found 2 errors' "$work/mypy-misuse-$name.log"; then
        cat "$work/mypy-misuse-$name.log" >&2
        packaging_fail "mypy did not report the two errors of typed_misuse.py against the installed $name"
        return
    fi
    echo "   typed: mypy --strict checks a program against the package's annotations and the stubs' .pyi;" \
        "$(($(date +%s) - started)) s in all"
}
mkdir -p "$work/home" "$work/tmp"

echo "== packaging: python -m build (sdist, then the wheel built from it; offline, no isolation)"
started=$(date +%s)
rm -rf "$here/build"
if ! (cd "$root" && timeout -k 10 "$step_timeout" "$python" -m build --no-isolation --outdir "$work/dist" \
    clients/python >"$work/dist.log" 2>&1); then
    cat "$work/dist.log" >&2
    packaging_fail "python -m build failed"
elif ! "$python" "$checks/check_dists.py" "$work/dist" "$work/floors.txt"; then
    packaging_fail "the sdist or the wheel is incomplete (above)"
else
    echo "   built in $(($(date +%s) - started)) s"
    try_installed wheel "$(echo "$work"/dist/*.whl)" \
        "on the oldest grpcio and protobuf it accepts ($(paste -sd' ' "$work/floors.txt"))" -c "$work/floors.txt"
    try_installed sdist "$(echo "$work"/dist/*.tar.gz)" \
        "built by pip with build isolation (grpcio-tools from the wheelhouse), newest dependencies"
fi

if [ $failed_packaging -ne 0 ]; then
    [ $status -ne 0 ] || status=1
else
    echo "packaging: OK (sdist and wheel install into fresh venvs without protoc, typed)"
fi
exit $status
