#!/usr/bin/env bash
# Runs benchmarks in GOPATH mode against Debian's Go packages, as test.sh runs the tests, against gates of
# their own ($EXISTENCE_GATE_BIN). By default BenchmarkCoalescedLookups64 (bench_test.go): 64 goroutines'
# coalesced lookups, this process's CPU per lookup. BENCH=Mirror10M runs BenchmarkMirror10M
# (mirror_bench_test.go): a mirror's local lookups at 10M keys beside the coalesced calls, its attach time
# and memory. Prints go test's benchmark lines.
#   EXISTENCE_GATE_BIN   the server binary (required; `cargo build --release` makes target/release/existence-gate)
#   BENCH                the benchmarks to run (go test -bench; default Coalesced)
#   BENCH_TIME           go test -benchtime (default ${BENCH_LOOKUPS}x)
#   BENCH_LOOKUPS        lookups measured by the default benchmark (default 200000)
#   BENCH_FLAGS          more go test flags (e.g. -cpuprofile /tmp/cpu.out)
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
# shellcheck disable=SC2086 # BENCH_FLAGS is a list of flags
go test -run '^$' -bench "${BENCH:-Coalesced}" -benchtime "${BENCH_TIME:-${BENCH_LOOKUPS:-200000}x}" ${BENCH_FLAGS:-} .
