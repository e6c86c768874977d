#!/usr/bin/env bash
# Runs CoalescedBench (src/test) with Maven offline against Debian's maven-repo, as test.sh builds the client:
# 64 threads' coalesced lookups against a gate of its own ($EXISTENCE_GATE_BIN), this JVM's CPU per lookup.
# Prints the bench's line. `bench.sh async`: the asynchronous callers instead of 64 blocked threads.
# `bench.sh mirror` (MirrorBench): a gate of 10M keys (BENCH_KEYS), a mirror's local ABSENT against the same
# keys through the coalesced RPC path, the mirror's attach time and memory; prints its `java mirror` lines.
#   EXISTENCE_GATE_BIN   the server binary (required; `cargo build --release` makes target/release/existence-gate)
#   BENCH_LOOKUPS        lookups measured (default 200000; the RPC path's in `mirror`)
#   BENCH_KEYS           keys the gate holds in `mirror` (default 10000000)
#   BENCH_JVM_ARGS       the benchmark JVM's options (e.g. -XX:+UseTransparentHugePages)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${EXISTENCE_GATE_BIN:?must name the server binary}"
EXISTENCE_GATE_BIN=$(cd "$(dirname "$EXISTENCE_GATE_BIN")" && pwd)/$(basename "$EXISTENCE_GATE_BIN")
export EXISTENCE_GATE_BIN EXISTENCE_GATE_CONFORMANCE=$here/../conformance
work=$(mktemp -d "${TMPDIR:-/tmp}/existence-gate-java-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
case "${1:-}" in
    async) bench=CoalescedBench#coalescedAsyncLookups64 lines='^java .*per lookup' ;;
    mirror) bench=MirrorBench#mirrorAgainstRpcAt10MKeys lines='^java mirror' ;;
    *) bench=CoalescedBench#coalescedLookups64 lines='^java .*per lookup' ;;
esac
cd "$here"
# target/ is removed by hand, as in test.sh (maven-clean-plugin does not resolve from Debian's repository).
rm -rf target
mvn -o -B -ntp -s maven-settings-debian.xml -Daether.offline.protocols=file -Dmaven.repo.local="$work/m2" \
    -Pdebian test -Dtest="$bench" -Dexistence.bench=true -Dexistence.bench.keys="${BENCH_KEYS:-10000000}" \
    -Dexistence.bench.lookups="${BENCH_LOOKUPS:-200000}" ${BENCH_JVM_ARGS:+"-Dtests.argLine=$BENCH_JVM_ARGS"} \
    >"$work/mvn.log" 2>&1 || { cat "$work/mvn.log" >&2; exit 1; }
grep "$lines" "$work/mvn.log"
