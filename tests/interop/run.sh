#!/usr/bin/env bash
# shellcheck disable=SC2317  # the per-language functions are called by name ("${lang}_run")
# The polyglot interop suite: starts the real server on ephemeral loopback ports, checks it as load balancers
# and container runtimes do (`existence-gate probe`, HTTP /healthz and /readyz), then for each language
# generates stubs from proto/ with that ecosystem's own tool, runs the shared scenario client
# (tests/interop/LANG/) and the read-path example (examples/LANG/) against the server, and finally stops the
# server with SIGTERM and checks that it exits 0.
#
# Usage: tests/interop/run.sh [python] [go] [java] [node]      (no argument: all four)
#
# Environment:
#   EXISTENCE_GATE_BIN                 the server binary (default: target/release/existence-gate)
#   EXISTENCE_GATE_INTEROP_VENV        the Python venv made by .ci/install-interop (default: target/interop-venv)
#   EXISTENCE_GATE_REQUIRE_INTEROP=1   a missing toolchain fails the run instead of skipping that language
#   INTEROP_STEP_TIMEOUT               seconds any one step (a compile, a client run) may take (default 300)
#   INTEROP_KEEP=1                     keep the work directory (stubs, builds, server log) for inspection
#
# Exit status: 0 when every requested language passed; 1 when anything failed (or a toolchain was missing
# with EXISTENCE_GATE_REQUIRE_INTEROP=1); 77 when nothing failed but a language was skipped.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${EXISTENCE_GATE_BIN:-$root/target/release/existence-gate}
venv=${EXISTENCE_GATE_INTEROP_VENV:-$root/target/interop-venv}
step_timeout=${INTEROP_STEP_TIMEOUT:-300}
require=${EXISTENCE_GATE_REQUIRE_INTEROP:-0}
all_languages=(python go java node)
languages=("$@")
[ ${#languages[@]} -eq 0 ] && languages=("${all_languages[@]}")
for lang in "${languages[@]}"; do
    case " ${all_languages[*]} " in
    *" $lang "*) ;;
    *) echo "unknown language '$lang' (known: ${all_languages[*]})" >&2; exit 2 ;;
    esac
done

if [ ! -x "$bin" ]; then
    echo "FAIL: no server binary at $bin (run 'cargo build --release' or set EXISTENCE_GATE_BIN)" >&2
    exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/existence-gate-interop.XXXXXX")
server_pid=
cleanup() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null
        wait "$server_pid" 2>/dev/null
    fi
    if [ "${INTEROP_KEEP:-0}" = 1 ]; then
        echo "work directory kept: $work"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

passed=0
failed=0
skipped=0
passed_languages=0
results=()

say() { printf '%s\n' "$*"; }
pass() { passed=$((passed + 1)); say "ok   $1"; }
fail() { failed=$((failed + 1)); say "FAIL $1"; }

# Runs "$@" bounded by the step timeout; its output goes to the terminal.
bounded() {
    timeout -k 10 "$step_timeout" "$@"
    local status=$?
    [ $status -eq 124 ] && say "TIMEOUT after ${step_timeout}s: $*"
    return $status
}

# ---------------------------------------------------------------------------------------------------------
# The server: one for the whole run, a fresh pair of namespaces per language (interop_LANG, example_LANG).
config=$work/interop.toml
for lang in "${all_languages[@]}"; do
    for prefix in interop example; do
        cat >>"$config" <<EOF
[namespaces.${prefix}_$lang]
expected_keys = 100000
missing_ttl = "1s"
deleted_ttl = "10m"
ttl_jitter = 0.0
max_ttl = "1h"

EOF
    done
done

# A data directory of its own (in the work directory, which is also its working directory): durable, as in
# production, and never state left by an earlier run.
(cd "$work" && NO_COLOR=1 RUST_LOG=info exec "$bin" serve --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --resp-listen 127.0.0.1:0 \
    --config "$config" --data-dir "$work/data" >"$work/server.log" 2>&1) &
server_pid=$!
grpc_addr=
http_addr=
for _ in $(seq 1 300); do
    line=$(sed 's/\x1b\[[0-9;]*m//g' "$work/server.log" | grep -m1 'grpc_addr=' || true)
    if [ -n "$line" ]; then
        grpc_addr=$(sed -E 's/.*grpc_addr=([^ ]+).*/\1/' <<<"$line")
        http_addr=$(sed -E 's/.*http_addr=([^ ]+).*/\1/' <<<"$line")
        break
    fi
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$grpc_addr" ] || [ -z "$http_addr" ]; then
    say "FAIL the server did not start; its log:"
    cat "$work/server.log"
    exit 1
fi
say "server: $bin (pid $server_pid) gRPC $grpc_addr, HTTP $http_addr"

# GET http://$http_addr$1 over bash's /dev/tcp (no curl needed); prints the status code, body to $2.
http_get() {
    local path=$1 out=$2 host=${http_addr%:*} port=${http_addr##*:} status
    exec 3<>"/dev/tcp/$host/$port" || return 1
    printf 'GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$path" "$http_addr" >&3
    timeout 5 cat <&3 >"$out"
    exec 3<&-
    status=$(head -n1 "$out" | awk '{print $2}')
    printf '%s' "$status"
}

# Health as load balancers and container runtimes check it.
health_checks() {
    local when=$1 status path
    if bounded "$bin" probe --addr "$grpc_addr" --timeout 2s; then
        pass "[$when] existence-gate probe (whole server) exits 0"
    else
        fail "[$when] existence-gate probe (whole server) exits 0"
    fi
    if bounded "$bin" probe --addr "$grpc_addr" --service existence.v1.ExistenceGate --timeout 2s; then
        pass "[$when] existence-gate probe --service existence.v1.ExistenceGate exits 0"
    else
        fail "[$when] existence-gate probe --service existence.v1.ExistenceGate exits 0"
    fi
    for path in /healthz /readyz; do
        status=$(http_get "$path" "$work/response")
        if [ "$status" = 200 ]; then
            pass "[$when] GET $path is 200"
        else
            fail "[$when] GET $path is 200 (got '$status')"
        fi
    done
}
# The port is open before state is loaded: until then health says NOT_SERVING, /readyz 503 and lookups fail
# open (MAY_EXIST + WARMING). Wait for readiness, as a load balancer does before sending traffic.
ready=
for _ in $(seq 1 300); do
    if "$bin" probe --addr "$grpc_addr" --timeout 1s 2>/dev/null; then
        ready=1
        break
    fi
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$ready" ]; then
    say "FAIL the server did not become ready within 30 s; its log:"
    cat "$work/server.log"
    exit 1
fi
health_checks startup
if bounded "$bin" probe --addr "$grpc_addr" --service no.such.Service --timeout 2s 2>"$work/probe.err"; then
    fail "probe of an unknown service exits non-zero"
else
    pass "probe of an unknown service exits non-zero ($(cat "$work/probe.err"))"
fi

# ---------------------------------------------------------------------------------------------------------
# Languages. Each has: a toolchain check (prints what is missing) and a run (stubs, build, client, example).

python_missing() {
    [ -x "$venv/bin/python" ] || { echo "no Python venv at $venv"; return; }
    "$venv/bin/python" -c 'import grpc, grpc_tools, grpc_health.v1, grpc_reflection, setuptools' 2>/dev/null ||
        echo "the venv at $venv lacks grpcio, grpcio-tools, grpcio-health-checking, grpcio-reflection or setuptools"
}
python_run() {
    local out=$work/python
    mkdir -p "$out"
    bounded "$venv/bin/python" -m grpc_tools.protoc -I "$root/proto" --python_out="$out" \
        --grpc_python_out="$out" "$root/proto/existence/v1/existence.proto" || return 1
    PYTHONPATH=$out bounded "$venv/bin/python" "$here/python/interop.py" "$grpc_addr" interop_python || return 1
    # The example uses the client library: built (its own stubs generated by pip) into a directory of its
    # own, offline, with the build requirements the venv has.
    bounded "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
        --no-index --target "$work/python-client" "$root/clients/python" || return 1
    PYTHONPATH=$work/python-client bounded "$venv/bin/python" "$root/examples/python/main.py" \
        --addr "$grpc_addr" --namespace example_python || return 1
}

go_missing() {
    local tool
    for tool in go protoc protoc-gen-go protoc-gen-go-grpc; do
        command -v "$tool" >/dev/null || { echo "$tool not found"; return; }
    done
    [ -d /usr/share/gocode/src/google.golang.org/grpc ] || echo "golang-google-grpc-dev is not installed"
}
go_run() {
    local gopath=$work/go
    # The checkout at the repository's import path: the client library (clients/go) is the module
    # github.com/existence-gate/existence-gate/clients/go, imported by that path by the example.
    local src=$gopath/src/github.com/existence-gate/existence-gate
    mkdir -p "$src/interop" "$src/examples" "$gopath/bin"
    # go_package is example.com/existence-gate/gen/existence/v1: protoc writes it under the GOPATH tree.
    bounded protoc -I "$root/proto" --go_out="$gopath/src" --go-grpc_out="$gopath/src" \
        "$root/proto/existence/v1/existence.proto" || return 1
    cp "$here/go/"*.go "$src/interop/"
    cp -r "$root/examples/go" "$src/examples/go"
    # The example uses the client library (clients/go), whose stubs go generate makes from proto/ (beside
    # it at its import path, as in the repository).
    mkdir -p "$src/clients"
    cp -r "$root/clients/go" "$src/clients/go"
    rm -rf "$src/clients/go/vendor" "$src/clients/go/existencepb/"*.pb.go
    ln -s "$root/proto" "$src/proto"
    # GOPATH mode against Debian's Go packages: no module proxy is involved.
    export GO111MODULE=off GOPROXY=off GOFLAGS='' GOPATH=$gopath:/usr/share/gocode
    export GOCACHE=${GOCACHE:-${XDG_CACHE_HOME:-${HOME:-$work}/.cache}/go-build}
    (cd "$src/clients/go" && bounded go generate .) || return 1
    (cd "$src/interop" && bounded go vet . && bounded go build -o "$gopath/bin/interop" .) || return 1
    (cd "$src/examples/go" && bounded go vet . && bounded go build -o "$gopath/bin/example" .) || return 1
    bounded "$gopath/bin/interop" "$grpc_addr" interop_go || return 1
    bounded "$gopath/bin/example" -addr "$grpc_addr" -namespace example_go || return 1
}

java_jars="grpc-api grpc-core grpc-context grpc-stub grpc-protobuf grpc-protobuf-lite grpc-netty protobuf guava
    perfmark-api geronimo-annotation-1.3-spec netty-buffer netty-codec netty-codec-http netty-codec-http2
    netty-codec-socks netty-common netty-handler netty-handler-proxy netty-resolver netty-transport
    netty-transport-native-unix-common"
java_missing() {
    local tool jar
    for tool in java javac protoc; do
        command -v "$tool" >/dev/null || { echo "$tool not found"; return; }
    done
    [ -x /usr/bin/grpc_java_plugin ] || { echo "/usr/bin/grpc_java_plugin not found"; return; }
    [ -f /usr/share/grpc-proto/grpc/health/v1/health.proto ] || { echo "grpc-proto is not installed"; return; }
    for jar in $java_jars; do
        [ -f "/usr/share/java/$jar.jar" ] || { echo "/usr/share/java/$jar.jar not found"; return; }
    done
}
java_run() {
    local out=$work/java classpath jar
    mkdir -p "$out/gen" "$out/classes"
    classpath=$(for jar in $java_jars; do printf '/usr/share/java/%s.jar:' "$jar"; done)
    bounded protoc -I "$root/proto" -I /usr/share/grpc-proto \
        --plugin=protoc-gen-grpc-java=/usr/bin/grpc_java_plugin \
        --java_out="$out/gen" --grpc-java_out="$out/gen" \
        "$root/proto/existence/v1/existence.proto" grpc/health/v1/health.proto || return 1
    # The example is built against the client library's sources (clients/java), compiled alongside.
    find "$out/gen" "$here/java" "$root/examples/java" "$root/clients/java/src/main/java" -name '*.java' \
        >"$out/sources"
    bounded javac -nowarn -encoding UTF-8 -d "$out/classes" -cp "$classpath" @"$out/sources" || return 1
    bounded java -cp "$out/classes:$classpath" io.existencegate.interop.Interop "$grpc_addr" interop_java ||
        return 1
    bounded java -cp "$out/classes:$classpath" io.existencegate.example.Main \
        --addr "$grpc_addr" --namespace example_java || return 1
}

node_missing() {
    command -v node >/dev/null || { echo "node not found"; return; }
    [ -d "$here/node/node_modules/@grpc/grpc-js" ] ||
        { echo "tests/interop/node/node_modules is missing (npm ci)"; return; }
    # The example uses the client library (clients/node), linked into examples/node by its npm ci.
    [ -e "$root/examples/node/node_modules/existence-gate-client" ] ||
        { echo "examples/node/node_modules is missing (npm ci)"; return; }
    (cd "$root/examples/node" && node -e 'require("existence-gate-client")' 2>/dev/null) ||
        echo "examples/node cannot load existence-gate-client (npm ci in clients/node and examples/node)"
}
node_run() {
    # @grpc/proto-loader generates the stubs from proto/ when the client (and the library) starts.
    bounded node "$here/node/interop.js" "$grpc_addr" interop_node || return 1
    bounded node "$root/examples/node/main.js" --addr "$grpc_addr" --namespace example_node || return 1
}

for lang in "${languages[@]}"; do
    say ""
    say "=== $lang"
    missing=$("${lang}_missing")
    if [ -n "$missing" ]; then
        if [ "$require" = 1 ]; then
            fail "$lang: toolchain missing ($missing) and EXISTENCE_GATE_REQUIRE_INTEROP=1"
            results+=("$lang: FAIL (toolchain missing: $missing)")
        else
            skipped=$((skipped + 1))
            say "SKIPPED: $lang toolchain missing (install with .ci/install-interop): $missing"
            results+=("$lang: SKIPPED (toolchain missing: $missing)")
        fi
        continue
    fi
    started=$(date +%s)
    if (set -o pipefail; "${lang}_run"); then
        pass "$lang: client and example"
        passed_languages=$((passed_languages + 1))
        results+=("$lang: PASS ($(($(date +%s) - started)) s)")
    else
        fail "$lang: client and example"
        results+=("$lang: FAIL ($(($(date +%s) - started)) s)")
    fi
done

# ---------------------------------------------------------------------------------------------------------
# The server is still healthy after all that; then SIGTERM: exit 0, and probes fail once it is gone.
say ""
say "=== server"
health_checks "after the clients"
status=$(http_get /metrics "$work/metrics")
if [ "$status" = 200 ] && grep -q '^existence_' "$work/metrics"; then
    pass "GET /metrics is 200 with existence_ metrics"
else
    fail "GET /metrics is 200 with existence_ metrics (got '$status')"
fi
if [ "$passed_languages" -gt 0 ]; then
    if grep -q '^existence_requests_total{rpc="SubscribeInvalidations",code="OK"}' "$work/metrics" &&
        grep -q '^existence_requests_total{rpc="MayExist",code="INVALID_ARGUMENT"}' "$work/metrics"; then
        pass "/metrics counts the clients' calls per RPC and status"
    else
        fail "/metrics counts the clients' calls per RPC and status"
    fi
fi
kill -TERM "$server_pid"
exit_status=
for _ in $(seq 1 150); do
    if ! kill -0 "$server_pid" 2>/dev/null; then
        wait "$server_pid"
        exit_status=$?
        break
    fi
    sleep 0.1
done
server_pid_done=$server_pid
server_pid=
if [ "$exit_status" = 0 ]; then
    pass "SIGTERM: the server exits 0"
else
    fail "SIGTERM: the server exits 0 (status '${exit_status:-still running}')"
    kill -KILL "$server_pid_done" 2>/dev/null
fi
if "$bin" probe --addr "$grpc_addr" --timeout 1s 2>/dev/null; then
    fail "probe of a stopped server exits non-zero"
else
    pass "probe of a stopped server exits non-zero"
fi
if [ "$failed" -gt 0 ] || [ "${INTEROP_KEEP:-0}" = 1 ]; then
    say "--- server log"
    sed 's/\x1b\[[0-9;]*m//g' "$work/server.log" | tail -n 40
fi

say ""
for result in "${results[@]}"; do say "$result"; done
say "interop: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -gt 0 ] && exit 1
[ "$skipped" -gt 0 ] && exit 77
exit 0
