#!/usr/bin/env bash
# Builds testdata/load (a steady load through this library, see its header) in GOPATH mode against Debian's
# Go packages, as test.sh builds the library, and runs it: the Go side of tests/suite/balancer.rs.
#   load.sh DIR ADDRESS[,ADDRESS...]
# Exit status: 0 once the load ran and DIR/report is written; 77 when the toolchain is missing.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
module=github.com/existence-gate/existence-gate/clients/go
[ $# -eq 2 ] || { echo "usage: load.sh DIR ADDRESS[,ADDRESS...]" >&2; exit 2; }
if ! command -v go >/dev/null || [ ! -d /usr/share/gocode/src/google.golang.org/grpc ]; then
    echo "SKIPPED: go client toolchain missing (install with .ci/install-interop): go or golang-google-grpc-dev"
    exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/existence-gate-go-load.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 143' TERM
copy=$work/gopath/src/$module
mkdir -p "$(dirname "$copy")"
cp -r "$here" "$copy"
rm -rf "$copy/vendor"
export GOPROXY=off GOFLAGS='' GO111MODULE=off GOPATH=$work/gopath:/usr/share/gocode
export GOCACHE=${GOCACHE:-${XDG_CACHE_HOME:-${HOME:-$work}/.cache}/go-build}
(cd "$copy/testdata/load" && go build -o "$work/load" .) || { echo "FAIL: go build of testdata/load" >&2; exit 1; }
"$work/load" "$1" "$2"
