#!/usr/bin/env bash
# Runs BenchmarkCoalescedLookups64 (bench_test.go) in GOPATH mode against Debian's Go packages, as test.sh
# runs the tests: 64 goroutines' coalesced lookups against a gate of its own ($EXISTENCE_GATE_BIN), this
# process's CPU per lookup. Prints go test's benchmark line.
#   EXISTENCE_GATE_BIN   the server binary (required; `cargo build --release` makes target/release/existence-gate)
#   BENCH_LOOKUPS        lookups measured (default 200000)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
module=github.com/existence-gate/existence-gate/clients/go
: "${EXISTENCE_GATE_BIN:?must name the server binary}"
EXISTENCE_GATE_BIN=$(cd "$(dirname "$EXISTENCE_GATE_BIN")" && pwd)/$(basename "$EXISTENCE_GATE_BIN")
export EXISTENCE_GATE_BIN EXISTENCE_GATE_CONFORMANCE=$root/clients/conformance
work=$(mktemp -d "${TMPDIR:-/tmp}/existence-gate-go-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
export EXISTENCE_GATE_TEST_PIDS=$work/server-pids
copy=$work/gopath/src/$module
mkdir -p "$(dirname "$copy")"
cp -r "$here" "$copy"
rm -rf "$copy/vendor"
export GOPROXY=off GOFLAGS='' GO111MODULE=off GOPATH=$work/gopath:/usr/share/gocode
cd "$copy"
go test -run '^$' -bench Coalesced -benchtime "${BENCH_LOOKUPS:-200000}x" .
