#!/usr/bin/env bash
# The RESP port with the Redis tools and client libraries users already have: redis-cli and redis-benchmark
# (Debian's redis-tools), redis-py (tests/resp/redis_py.py, from the interop venv) and node-redis with
# @redis/bloom (tests/resp/node). Starts the binary ($EXISTENCE_GATE_BIN) on free loopback ports, with a
# token and TLS, runs each client against it, and stops it. Exit 77 when a client is missing (see
# tests/suite/common/polyglot.rs).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${EXISTENCE_GATE_BIN:?set EXISTENCE_GATE_BIN to the existence-gate binary}
venv=${EXISTENCE_GATE_INTEROP_VENV:-$root/target/interop-venv}
missing=()
command -v redis-cli >/dev/null || missing+=("redis-cli (apt-get install redis-tools)")
command -v redis-benchmark >/dev/null || missing+=("redis-benchmark (apt-get install redis-tools)")
command -v openssl >/dev/null || missing+=("openssl")
"$venv/bin/python" -c 'import redis' 2>/dev/null || missing+=("redis-py in $venv (.ci/install-interop)")
[ -d "$root/tests/resp/node/node_modules/redis" ] || missing+=("node-redis in tests/resp/node (.ci/install-interop)")
if [ ${#missing[@]} -gt 0 ]; then
    echo "SKIPPED: RESP clients: toolchain missing (install with .ci/install-interop): ${missing[*]}"
    exit 77
fi

work=$(mktemp -d)
gate_pid=
cleanup() {
    [ -n "$gate_pid" ] && kill "$gate_pid" 2>/dev/null && wait "$gate_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# A CA, a server certificate for localhost and a client certificate: mutual TLS, as rediss:// users run it.
(
    cd "$work"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca 2>/dev/null
    for who in server client; do
        openssl req -newkey rsa:2048 -nodes -keyout "$who.key" -out "$who.csr" -subj /CN=localhost 2>/dev/null
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$who.ext"
        openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$who.pem" -days 2 \
            -extfile "$who.ext" 2>/dev/null
    done
)
token=resp-test-token
hash=$("$bin" hash-token "$token" | tail -1)
cat > "$work/gate.toml" <<TOML
[namespaces.users]
expected_keys = 100000

[[tokens]]
name = "app"
sha256 = "$hash"
roles = ["read", "write"]
namespaces = ["*"]
TOML

# Starts the gate with the flags given, and sets resp and grpc to its addresses once it serves.
start_gate() {
    : > "$work/gate.log"
    NO_COLOR=1 RUST_LOG=info EXISTENCE_GATE_DRAIN_DELAY=0s "$bin" serve --in-memory --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
        --resp-listen 127.0.0.1:0 --config "$work/gate.toml" "$@" > "$work/gate.log" 2>&1 &
    gate_pid=$!
    for _ in $(seq 1 300); do
        resp=$(grep -o 'resp_addr=[^ ]*' "$work/gate.log" | head -1 | cut -d= -f2 || true)
        grpc=$(grep -o 'grpc_addr=[^ ]*' "$work/gate.log" | head -1 | cut -d= -f2 || true)
        [ -n "$resp" ] && return 0
        kill -0 "$gate_pid" 2>/dev/null || { cat "$work/gate.log"; return 1; }
        sleep 0.1
    done
    cat "$work/gate.log"
    return 1
}
stop_gate() {
    kill "$gate_pid" && wait "$gate_pid" || true
    gate_pid=
}

echo "== plaintext, with a token"
start_gate
host=${resp%:*}
port=${resp##*:}
# GATE_GRPC: the clients ask gRPC (the binary's `check`) for keys they looked up and compare the answers.
export RESP_HOST=$host RESP_PORT=$port RESP_TOKEN=$token RESP_TLS_DIR= GATE_GRPC=$grpc EXISTENCE_GATE_BIN=$bin
cli() { redis-cli -h "$host" -p "$port" --no-auth-warning -a "$token" "$@"; }

echo "-- redis-cli"
expect() { # expect WANT COMMAND...: the command's output must be WANT
    local want=$1 got
    shift
    got=$("$@" 2>&1)
    if [ "$got" != "$want" ]; then
        echo "FAIL: $* answered '$got', expected '$want'"
        exit 1
    fi
}
expect "NOAUTH Authentication required." redis-cli -h "$host" -p "$port" BF.EXISTS users k
expect 1 cli BF.ADD users cli-key
expect 0 cli BF.ADD users cli-key
expect 1 cli BF.EXISTS users cli-key
expect 0 cli BF.EXISTS users never-added-key
expect "$(printf '1\n0')" cli BF.MEXISTS users cli-key never-added-key
# The same keys through gRPC (the binary's own client): the same answers.
grpc_answers=$("$bin" check --addr "http://$grpc" --token "$token" --namespace users cli-key never-added-key)
echo "$grpc_answers" | grep -q '^cli-key MAY_EXIST' && echo "$grpc_answers" | grep -q '^never-added-key ABSENT' || {
    echo "FAIL: gRPC answered differently from BF.MEXISTS: $grpc_answers"
    exit 1
}
expect PONG cli PING
# 10,000 pipelined commands (redis-cli --pipe reads them as a file of RESP): every reply arrives, none an error.
for i in $(seq 1 10000); do printf 'BF.ADD users pipe-%s\r\n' "$i"; done > "$work/pipe.txt"
printf 'AUTH %s\r\n' "$token" | cat - "$work/pipe.txt" > "$work/pipe-auth.txt"
redis-cli -h "$host" -p "$port" --pipe < "$work/pipe-auth.txt" | tee "$work/pipe.out"
grep -q 'errors: 0, replies: 10001' "$work/pipe.out"
expect 1 cli BF.EXISTS users pipe-10000
# The invalidation of an add, as a Pub/Sub message of redis-cli's SUBSCRIBE.
(timeout 20 redis-cli -h "$host" -p "$port" --no-auth-warning -a "$token" SUBSCRIBE invalidations:users > "$work/sub.out" 2>&1 &)
for _ in $(seq 1 100); do grep -q '^invalidations:users$' "$work/sub.out" 2>/dev/null && break; sleep 0.1; done
cli BF.ADD users watched-key > /dev/null
for _ in $(seq 1 100); do grep -q ' watched-key$' "$work/sub.out" && break; sleep 0.1; done
grep -q '^added [0-9]* watched-key$' "$work/sub.out" || { echo "FAIL: no invalidation in:"; cat "$work/sub.out"; exit 1; }

echo "-- redis-benchmark"
redis-benchmark -h "$host" -p "$port" -a "$token" -n 20000 -c 4 -P 16 -q BF.EXISTS users __rand_int__ \
    | tee "$work/bench.out"
grep -q 'requests per second' "$work/bench.out"

echo "-- redis-py"
"$venv/bin/python" "$root/tests/resp/redis_py.py"

echo "-- node-redis"
(cd "$root/tests/resp/node" && node --test)
stop_gate

echo "== mutual TLS"
start_gate --tls-cert "$work/server.pem" --tls-key "$work/server.key" --tls-client-ca "$work/ca.pem"
host=${resp%:*}
port=${resp##*:}
export RESP_HOST=$host RESP_PORT=$port RESP_TLS_DIR=$work GATE_GRPC=
tls=(--tls --cacert "$work/ca.pem" --cert "$work/client.pem" --key "$work/client.key" --sni localhost)
expect 1 redis-cli -h "$host" -p "$port" "${tls[@]}" --no-auth-warning -a "$token" BF.ADD users tls-key
expect 1 redis-cli -h "$host" -p "$port" "${tls[@]}" --no-auth-warning -a "$token" BF.EXISTS users tls-key
# Without a client certificate: no answer.
if redis-cli -h "$host" -p "$port" --tls --cacert "$work/ca.pem" --sni localhost --no-auth-warning -a "$token" \
    BF.EXISTS users tls-key 2>&1 | grep -qx 1; then
    echo "FAIL: served a TLS client without a certificate"
    exit 1
fi
"$venv/bin/python" "$root/tests/resp/redis_py.py" tls
(cd "$root/tests/resp/node" && node --test)
stop_gate
echo "RESP clients: all passed"
