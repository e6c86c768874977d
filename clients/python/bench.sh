#!/usr/bin/env bash
# Builds the Python client into a temporary directory (as test.sh does, offline, from the venv made by
# .ci/install-interop) and runs bench/coalesced.py against a gate of its own ($EXISTENCE_GATE_BIN):
# 64 threads, or with `bench.sh async` 64 asyncio tasks.
#   EXISTENCE_GATE_BIN           the server binary (required; `cargo build --release` makes target/release/existence-gate)
#   EXISTENCE_GATE_INTEROP_VENV  the Python venv (default: target/interop-venv)
#   BENCH_LOOKUPS                lookups measured (default 100000)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${EXISTENCE_GATE_INTEROP_VENV:-$root/target/interop-venv}
: "${EXISTENCE_GATE_BIN:?must name the server binary}"
export EXISTENCE_GATE_BIN
work=$(mktemp -d "${TMPDIR:-/tmp}/existence-gate-client-python-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
rm -rf "$here/build"
(cd "$root" && "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
    --no-index --target "$work/site" ./clients/python)
rm -rf "$here/build"
PYTHONPATH=$work/site PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" "$here/bench/coalesced.py" "$@"
