#!/usr/bin/env bash
# Builds and tests the Go client (example.com/existence-gate/clients/go) against real servers, offline:
#   1. stubs: `go generate` regenerates existencepb/ from proto/ with protoc + protoc-gen-go(-grpc); they must
#      equal the committed ones (tool version comments aside), so the committed stubs cannot go stale;
#   2. GOPATH mode against Debian's Go packages (/usr/share/gocode): go vet, go build, go test;
#   3. module mode (GO111MODULE=on, -mod=vendor) with a vendor/ directory assembled from the same packages,
#      versions as in go.mod: go vet, go build, and the tests again.
#
# Environment: EXISTENCE_GATE_BIN (the server binary, required); CLIENT_STEP_TIMEOUT (seconds per step,
# default 300); GO_CLIENT_MODULE_TESTS=0 to only build (not test) in module mode.
# Exit status: 0 all passed, 1 a failure, 77 the toolchain is missing.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
step_timeout=${CLIENT_STEP_TIMEOUT:-300}
gocode=/usr/share/gocode/src
module=example.com/existence-gate/clients/go

missing=
for tool in go protoc protoc-gen-go protoc-gen-go-grpc; do
    command -v "$tool" >/dev/null || { missing="$tool not found"; break; }
done
if [ -z "$missing" ] && [ ! -d "$gocode/google.golang.org/grpc" ]; then
    missing="golang-google-grpc-dev is not installed"
fi
if [ -n "$missing" ]; then
    echo "SKIPPED: go client toolchain missing (install with .ci/install-interop): $missing"
    exit 77
fi
if [ -z "${EXISTENCE_GATE_BIN:-}" ] || [ ! -x "${EXISTENCE_GATE_BIN}" ]; then
    echo "FAIL: EXISTENCE_GATE_BIN must name the existence-gate server binary (got '${EXISTENCE_GATE_BIN:-}')"
    exit 1
fi
EXISTENCE_GATE_BIN=$(cd "$(dirname "$EXISTENCE_GATE_BIN")" && pwd)/$(basename "$EXISTENCE_GATE_BIN")
export EXISTENCE_GATE_BIN
# The conformance cases (conformance_test.go), shared by every client library; the tests run in copies of
# this directory, so they are named by path.
export EXISTENCE_GATE_CONFORMANCE=$root/clients/conformance

work=$(mktemp -d "${TMPDIR:-/tmp}/existence-gate-go-client.XXXXXX")
# The tests write the pid of every server they start here; whatever a killed test run left is stopped.
export EXISTENCE_GATE_TEST_PIDS=$work/server-pids
cleanup() {
    local pid
    if [ -f "$EXISTENCE_GATE_TEST_PIDS" ]; then
        while read -r pid; do
            kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null
        done <"$EXISTENCE_GATE_TEST_PIDS"
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

bounded() {
    timeout -k 10 "$step_timeout" "$@"
    local status=$?
    [ $status -eq 124 ] && echo "TIMEOUT after ${step_timeout}s: $*"
    return $status
}
step() { printf '\n=== %s\n' "$*"; }

export GOPROXY=off GOFLAGS=''
export GOCACHE=${GOCACHE:-${XDG_CACHE_HOME:-${HOME:-$work}/.cache}/go-build}

# ---------------------------------------------------------------------------------------------------------
# GOPATH mode: the module's tree at its import path, proto/ beside it as in the repository.
gopath=$work/gopath
copy=$gopath/src/$module
mkdir -p "$(dirname "$copy")"
cp -r "$here" "$copy"
rm -rf "$copy/vendor"
ln -s "$root/proto" "$gopath/src/example.com/existence-gate/proto"

step "stubs: go generate from proto/, compared with the committed existencepb/"
rm -f "$copy"/existencepb/*.pb.go
(cd "$copy" && GO111MODULE=off GOPATH=$gopath:/usr/share/gocode bounded go generate .) || exit 1
strip_versions() { sed -E '/^\/\/ (\t| - )protoc(-gen-go(-grpc)?)? +v/d' "$1"; }
stale=0
for f in "$here"/existencepb/*.pb.go "$copy"/existencepb/*.pb.go; do
    name=$(basename "$f")
    if ! diff -u <(strip_versions "$here/existencepb/$name" 2>/dev/null) <(strip_versions "$copy/existencepb/$name" 2>/dev/null) \
        >"$work/stub.diff"; then
        echo "FAIL existencepb/$name differs from what proto/ generates (run 'go generate' in clients/go):"
        head -n 40 "$work/stub.diff"
        stale=1
    fi
done
[ "$stale" = 0 ] || exit 1
echo "ok   existencepb/ is what proto/ generates"

step "gofmt"
unformatted=$(gofmt -l "$here"/*.go "$root/examples/go"/*.go)
if [ -n "$unformatted" ]; then
    echo "FAIL gofmt would reformat: $unformatted"
    exit 1
fi
echo "ok   gofmt -l is empty"

step "GOPATH mode: go vet, go build, go test"
(
    export GO111MODULE=off GOPATH=$gopath:/usr/share/gocode
    cd "$copy" &&
        bounded go vet ./... &&
        bounded go build ./... &&
        bounded go test -count=1 -v ./...
) || { echo "FAIL: GOPATH mode"; exit 1; }

# ---------------------------------------------------------------------------------------------------------
# Module mode, offline: vendor/ holds Debian's packages under the versions go.mod requires.
step "module mode (-mod=vendor): go vet, go build$([ "${GO_CLIENT_MODULE_TESTS:-1}" = 1 ] && echo ", go test")"
mod=$work/module
cp -r "$here" "$mod"
rm -rf "$mod/vendor"
mkdir -p "$mod/vendor"
# The packages the module and its tests import, by the module (of go.mod's requirements) that provides them.
(cd "$copy" && GO111MODULE=off GOPATH=$gopath:/usr/share/gocode go list -deps -test -f '{{if not .Standard}}{{.ImportPath}}{{end}}' ./...) |
    grep -v "^$module" | sort -u >"$work/packages" || exit 1
{
    while read -r path version _; do
        [ -n "$path" ] || continue
        goversion=$(sed -nE 's/^go ([0-9.]+)$/\1/p' "$gocode/$path/go.mod" 2>/dev/null)
        echo "# $path $version"
        echo "## explicit${goversion:+; go $goversion}"
        while read -r pkg; do
            case "$pkg" in
            "$path" | "$path"/*)
                echo "$pkg"
                mkdir -p "$mod/vendor/$(dirname "$pkg")"
                mkdir -p "$mod/vendor/$pkg"
                find "$gocode/$pkg" -maxdepth 1 -type f ! -name '*_test.go' -exec cp {} "$mod/vendor/$pkg/" \;
                ;;
            esac
        done <"$work/packages"
    done < <(sed -nE 's/^\t([^ ]+) (v[^ ]+)( \/\/ indirect)?$/\1 \2/p' "$mod/go.mod")
} >"$mod/vendor/modules.txt"
unprovided=$(grep -vxF -f <(grep -v '^#' "$mod/vendor/modules.txt") "$work/packages")
if [ -n "$unprovided" ]; then
    echo "FAIL: packages imported but provided by no module of go.mod:"
    echo "$unprovided"
    exit 1
fi
(
    export GO111MODULE=on GOFLAGS="-mod=vendor -trimpath" GOPATH=$work/modpath
    cd "$mod" &&
        bounded go vet ./... &&
        bounded go build ./... &&
        if [ "${GO_CLIENT_MODULE_TESTS:-1}" = 1 ]; then
            bounded go test -count=1 ./...
        else
            bounded go test -count=1 -run '^$' ./...
        fi
) || { echo "FAIL: module mode"; exit 1; }
