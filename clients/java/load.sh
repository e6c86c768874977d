#!/usr/bin/env bash
# Builds a copy of this library (stubs from proto/, Debian's Maven repository, offline, as test.sh does) and
# runs LoadDriver (a steady load through it, see its header): the Java side of tests/suite/balancer.rs.
#   load.sh DIR ADDRESS[,ADDRESS...]
# Exit status: 0 once the load ran and DIR/report is written; 77 when the toolchain is missing.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
[ $# -eq 2 ] || { echo "usage: load.sh DIR ADDRESS[,ADDRESS...]" >&2; exit 2; }
for tool in java javac mvn protoc; do
    command -v "$tool" >/dev/null ||
        { echo "SKIPPED: java client toolchain missing (install with .ci/install-interop): $tool not found"; exit 77; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/existence-gate-java-load.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 143' TERM
# A copy, built in a target/ of its own: test.sh may be building the checkout's meanwhile.
cp -r "$here" "$work/java" && rm -rf "$work/java/target"
cd "$work/java" || exit 1
mvn -o -B -ntp -s maven-settings-debian.xml -Daether.offline.protocols=file -Dmaven.repo.local="$work/m2" \
    -Dproto.dir="$root/proto" -Pdebian test -Dtest=LoadDriver -Dsurefire.failIfNoSpecifiedTests=false \
    -Dexistence.load.dir="$1" -Dexistence.load.addresses="$2" >"$work/mvn.log" 2>&1 ||
    { cat "$work/mvn.log" >&2; echo "FAIL: mvn test -Dtest=LoadDriver" >&2; exit 1; }
[ -f "$1/report" ] || { cat "$work/mvn.log" >&2; echo "FAIL: LoadDriver wrote no report (skipped?)" >&2; exit 1; }
