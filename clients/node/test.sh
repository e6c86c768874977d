#!/usr/bin/env bash
# Builds and tests the Node client library against real servers ($EXISTENCE_GATE_BIN), with Node's own test
# runner. CI runs `npm ci` here first (.ci/install-interop); without node_modules the run is SKIPPED (exit 77).
#
# "Building" a Node package made with @grpc/proto-loader is: copy proto/ into the package (the `prepare`
# script, as npm pack does) and load it, which generates the stubs at load time.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
step_timeout=${CLIENT_STEP_TIMEOUT:-300}

skip() {
    echo "SKIPPED: node client toolchain missing (install with .ci/install-interop): $1"
    exit 77
}
command -v node >/dev/null || skip "node not found"
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
[ "$major" -ge 18 ] || skip "node $(node --version) is older than 18"
[ -d "$here/node_modules/@grpc/grpc-js" ] && [ -d "$here/node_modules/@grpc/proto-loader" ] ||
    skip "clients/node/node_modules is missing (npm ci in clients/node)"

bin=${EXISTENCE_GATE_BIN:-}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "FAIL: EXISTENCE_GATE_BIN must name the server binary (got '${bin}')" >&2
    exit 1
fi
export EXISTENCE_GATE_BIN=$bin

bounded() {
    timeout -k 10 "$step_timeout" "$@"
    local status=$?
    [ $status -eq 124 ] && echo "TIMEOUT after ${step_timeout}s: $*"
    return $status
}

cd "$here" || exit 1
# The proto the package ships (git-ignored copy of $root/proto), refreshed on every run.
bounded node scripts/prepare.js --copy-only || exit 1
cmp -s "$root/proto/existence/v1/existence.proto" proto/existence/v1/existence.proto || {
    echo "FAIL: proto/ was not copied into the package" >&2
    exit 1
}
# Load the package: @grpc/proto-loader generates the stubs; a broken proto or package fails here.
bounded node -e '
  const c = require("./");
  const pkg = c.loadExistencePackage();
  for (const m of ["MayExist", "BatchMayExist", "Add", "RecordAbsent", "SubscribeInvalidations"]) {
    if (typeof pkg.ExistenceGate.service[m] !== "object") throw new Error("no stub for " + m);
  }
  console.log("stubs loaded from proto/: ExistenceGate with " + Object.keys(pkg.ExistenceGate.service).length + " methods");
' || exit 1

# Test files run in parallel (each starts its own server); the tests inside a file run in order.
bounded node --test --test-concurrency=4 test/*.test.js
