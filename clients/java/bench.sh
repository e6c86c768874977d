#!/usr/bin/env bash
# Runs CoalescedBench (src/test) with Maven offline against Debian's maven-repo, as test.sh builds the client:
# 64 threads' coalesced lookups against a gate of its own ($EXISTENCE_GATE_BIN), this JVM's CPU per lookup.
# Prints the bench's line. `bench.sh async`: the asynchronous callers instead of 64 blocked threads.
#   EXISTENCE_GATE_BIN   the server binary (required; `cargo build --release` makes target/release/existence-gate)
#   BENCH_LOOKUPS        lookups measured (default 200000)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${EXISTENCE_GATE_BIN:?must name the server binary}"
EXISTENCE_GATE_BIN=$(cd "$(dirname "$EXISTENCE_GATE_BIN")" && pwd)/$(basename "$EXISTENCE_GATE_BIN")
export EXISTENCE_GATE_BIN EXISTENCE_GATE_CONFORMANCE=$here/../conformance
work=$(mktemp -d "${TMPDIR:-/tmp}/existence-gate-java-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$here"
# target/ is removed by hand, as in test.sh (maven-clean-plugin does not resolve from Debian's repository).
rm -rf target
mvn -o -B -ntp -s maven-settings-debian.xml -Daether.offline.protocols=file -Dmaven.repo.local="$work/m2" \
    -Pdebian test -Dtest="CoalescedBench#$([ "${1:-}" = async ] && echo coalescedAsyncLookups64 || echo coalescedLookups64)" \
    -Dexistence.bench=true \
    -Dexistence.bench.lookups="${BENCH_LOOKUPS:-200000}" >"$work/mvn.log" 2>&1 || { cat "$work/mvn.log" >&2; exit 1; }
grep '^java .*per lookup' "$work/mvn.log"
