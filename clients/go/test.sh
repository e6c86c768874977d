#!/usr/bin/env bash
# Builds and tests the Go client (module github.com/existence-gate/existence-gate/clients/go) against real
# servers, offline:
#   1. stubs: `go generate` regenerates existencepb/ from proto/ with protoc + protoc-gen-go(-grpc); they must
#      equal the committed ones (tool version comments aside), so the committed stubs cannot go stale;
#   2. GOPATH mode against Debian's Go packages (/usr/share/gocode): go vet, go build, go test;
#   3. module mode (GO111MODULE=on, -mod=vendor) with a vendor/ directory assembled from the same packages,
#      versions as in go.mod: go vet, go build, and the tests again;
#   4. installed as a user installs it: fresh modules (example.org/consumer) require the module by its path,
#      (a) with a replace to this directory, (b) with `go get` of a version, from a module proxy on disk that
#      serves Debian's packages (and, for (b), this module); `go mod tidy`, go vet, go build, and the program
#      (testdata/consumer) calls a gate through the library and its stubs. go.mod declaring any other path
#      fails this step.
#
# Environment: EXISTENCE_GATE_BIN (the server binary, required); CLIENT_STEP_TIMEOUT (seconds per step,
# default 300); GO_CLIENT_MODULE_TESTS=0 to only build (not test) in module mode.
# Exit status: 0 all passed, 1 a failure, 77 the toolchain is missing.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
step_timeout=${CLIENT_STEP_TIMEOUT:-300}
gocode=/usr/share/gocode/src
# The module path: where the repository lives (github.com/existence-gate/existence-gate), plus the module's
# directory in it; its versions are tagged clients/go/vX.Y.Z. go.mod must declare it (step 4 fails otherwise).
module=github.com/existence-gate/existence-gate/clients/go

missing=
for tool in go protoc protoc-gen-go protoc-gen-go-grpc zip; do
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
    # The module cache of step 4 is read-only unless -modcacherw applied; make sure it can be removed.
    chmod -R u+w "$work" 2>/dev/null
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
ln -s "$root/proto" "$gopath/src/${module%/clients/go}/proto"

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
unformatted=$(gofmt -l "$here"/*.go "$here"/testdata/consumer/*.go "$here"/testdata/load/*.go "$root/examples/go"/*.go)
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

# ---------------------------------------------------------------------------------------------------------
# Installed as a user installs it, offline, twice: (a) the README's way, a replace to this directory
# (go mod edit -require/-replace, go mod tidy); (b) as a published version is fetched (go get $module@VERSION).
# The module proxy is a directory (GOPROXY=file://) serving, for each requirement of go.mod, Debian's package
# tree at that version: without nested modules, vendor/, testdata/ and tests, and with a go.mod of its own
# path and no requirements (Debian's go.mod files name modules Debian does not ship). For (b) it also serves
# this module as v0.0.0: its files and its go.mod, as a tag clients/go/v0.0.0 would publish them. No checksum
# database (go.sum is what tidy computes from these zips), and a module cache of its own, so that these zips
# never meet real ones. A wrong module path fails both: go refuses a fetched module whose go.mod declares
# another path ("module declares its path as"); with a replace it does not look, so (a) checks it.
step "a fresh module requires $module: (a) with a replace, (b) fetched; go mod tidy, go vet, go build, calls to a gate"
proxy=$work/goproxy
# serve_module PATH VERSION DIR GOMOD: DIR's files under PATH@VERSION with GOMOD as its go.mod.
serve_module() {
    local path=$1 version=$2 dir=$3 gomod=$4 stage=$work/zip/$1@$2
    # Nested modules are not part of a module; Debian's trees also lose their tests (not needed to build
    # against them), while this module keeps its own.
    local prune=(-name vendor -o -name '.*' -o -exec test -e '{}/go.mod' \;) files=()
    if [ "$path" != "$module" ]; then
        prune+=(-o -name testdata)
        files=(! -name '*_test.go')
    fi
    mkdir -p "$stage" "$proxy/$path/@v"
    (
        cd "$dir" &&
            find . -mindepth 1 -type d \( "${prune[@]}" \) -prune -o -type f "${files[@]}" ! -name go.mod ! -name go.sum -print0 |
            tar --null -T - -cf - | tar -xf - -C "$stage"
    ) || { echo "FAIL: copying $dir"; return 1; }
    printf '%s' "$gomod" >"$stage/go.mod"
    cp "$stage/go.mod" "$proxy/$path/@v/$version.mod"
    printf '{"Version":"%s"}\n' "$version" >"$proxy/$path/@v/$version.info"
    echo "$version" >>"$proxy/$path/@v/list"
    (cd "$work/zip" && zip -qrD "$proxy/$path/@v/$version.zip" "$path@$version") || { echo "FAIL: zip $path"; return 1; }
}
while read -r path version _; do
    [ -n "$path" ] || continue
    [ -d "$gocode/$path" ] || { echo "FAIL: $gocode/$path is missing (a requirement of go.mod)"; exit 1; }
    goversion=$(sed -nE 's/^go ([0-9.]+)$/\1/p' "$gocode/$path/go.mod" 2>/dev/null)
    serve_module "$path" "$version" "$gocode/$path" "module $path
${goversion:+
go $goversion
}" || exit 1
done < <(sed -nE 's/^\t([^ ]+) (v[^ ]+)( \/\/ indirect)?$/\1 \2/p' "$here/go.mod")
serve_module "$module" v0.0.0 "$here" "$(cat "$here/go.mod")
" || exit 1

# The first "Path" of go mod edit -json is the module's own.
declared=$(cd "$here" && go mod edit -json | sed -nE '/^\s*"Path": /{s/^\s*"Path": "(.*)",?$/\1/p;q}')
if [ "$declared" != "$module" ]; then
    echo "FAIL: go.mod declares the module '$declared', not $module (a replace does not check it; go get would fail)"
    exit 1
fi
# fresh_module DIR COMMAND...: a new module example.org/consumer holding the program, COMMAND run in it to
# require this module, then tidied, vetted and built (DIR/consumer).
fresh_module() {
    local dir=$1
    shift
    mkdir -p "$dir"
    cp "$here/testdata/consumer/main.go" "$dir/"
    (
        export GO111MODULE=on GOPROXY=file://$proxy GOSUMDB=off GOFLAGS=-modcacherw GOPATH=$work/consumer-gopath \
            GOMODCACHE=$work/consumer-gopath/pkg/mod
        cd "$dir" &&
            bounded go mod init example.org/consumer &&
            bounded "$@" &&
            bounded go mod tidy &&
            bounded go vet . &&
            bounded go build -o consumer .
    ) || return 1
    echo "its go.mod:"
    sed 's/^/    /' "$dir/go.mod"
}
echo "(a) go mod edit -require=$module@v0.0.0 -replace=$module=$here"
fresh_module "$work/consumer-replace" go mod edit -require="$module@v0.0.0" -replace="$module=$here" ||
    { echo "FAIL: a fresh module could not require $module with a replace"; exit 1; }
echo "(b) go get $module@v0.0.0"
fresh_module "$work/consumer-get" go get "$module@v0.0.0" ||
    { echo "FAIL: a fresh module could not go get $module@v0.0.0"; exit 1; }

# A gate (the conformance one: namespace users).
source "$EXISTENCE_GATE_CONFORMANCE/start-gate.sh"
start_conformance_gate "$work/consumer-gate.log"
status=$?
echo "$gate_pid" >>"$EXISTENCE_GATE_TEST_PIDS"
[ $status -eq 0 ] || exit 1
for consumer in "$work/consumer-replace" "$work/consumer-get"; do
    bounded "$consumer/consumer" "$addr" || { echo "FAIL: $consumer/consumer against $addr"; exit 1; }
done
kill -TERM "$gate_pid"
wait "$gate_pid" 2>/dev/null
echo "ok   fresh modules install $module (with a replace, and fetched), build offline and call a gate"
