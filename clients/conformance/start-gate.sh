# Sourced by the client libraries' test.sh: start_conformance_gate LOG starts "$EXISTENCE_GATE_BIN serve" in
# memory on free loopback ports with this directory's gate.toml (namespace users), logging to LOG, and sets
# gate_pid and addr (its gRPC address, read from its log). If it does not serve, it prints the log and
# returns 1. Stopping it is the caller's part (kill -TERM "$gate_pid").
conformance_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

start_conformance_gate() {
    local log=$1
    EXISTENCE_GATE_DRAIN_DELAY=0s "$EXISTENCE_GATE_BIN" serve --in-memory --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 \
        --resp-listen 127.0.0.1:0 --config "$conformance_dir/gate.toml" >"$log" 2>&1 &
    gate_pid=$!
    addr=
    for _ in $(seq 1 300); do
        addr=$(sed -nE 's/.*grpc_addr=([0-9.:]+).*/\1/p' "$log" | head -n 1)
        [ -n "$addr" ] && return 0
        kill -0 "$gate_pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "FAIL: the gate did not serve; its log:"
    cat "$log"
    return 1
}
