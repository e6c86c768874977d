#!/usr/bin/env bash
# The bootstrap benchmark: how fast `existence-gate load` fills a gate from PostgreSQL and from a file, the
# database, the gate and the loader all on this machine (which is what the figures mean: on 2 cores they
# share the cores). Writes benches/results/bootstrap.md.
#
#   cargo build --release && scripts/bench-bootstrap.sh
#
# It starts a throwaway PostgreSQL 15 cluster (as the postgres user when run as root: PostgreSQL refuses
# root) with a table users(id bigint primary key) of ROWS rows, then for each of RUNS runs: a fresh gate with
# a data directory and the default durability (--sync always), `load --postgres ... --query "SELECT id::text
# FROM users"` into it; a fresh gate again and `load` of a file holding the same ids, one per line. Every
# figure is the loader's own summary (keys, seconds from the source opening to the last acknowledged Add) and
# the whole command's wall time and CPU (/usr/bin/time).
#
# Environment: EXISTENCE_GATE_BIN (default target/release/existence-gate), PG_BIN (default
# /usr/lib/postgresql/15/bin), ROWS (default 10000000), RUNS (default 3), BATCH (default 1000, load's
# default), IN_FLIGHT (default 4, load's default), PORT_BASE (default 15432: PostgreSQL on it, the gate on
# +1 and +2, the feed's HTTP port on +3). Each run also times `check` of the file against the loaded gate,
# and the change feed's `--initial-load` of the same table into a fresh gate. Everything lives in a temporary directory removed at exit.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
gate=${EXISTENCE_GATE_BIN:-$root/target/release/existence-gate}
pg_bin=${PG_BIN:-/usr/lib/postgresql/15/bin}
rows=${ROWS:-10000000}
runs=${RUNS:-3}
batch=${BATCH:-1000}
in_flight=${IN_FLIGHT:-4}
base=${PORT_BASE:-15432}
pg_port=$base
grpc_port=$((base + 1))
http_port=$((base + 2))
results=$root/benches/results/bootstrap.md

if [ ! -x "$gate" ]; then
    echo "$gate is missing: run cargo build --release, or set EXISTENCE_GATE_BIN" >&2
    exit 1
fi
if [ ! -x /usr/bin/time ]; then
    echo "/usr/bin/time is missing: apt-get install -y time" >&2
    exit 1
fi
if [ ! -x "$pg_bin/initdb" ]; then
    echo "PostgreSQL 15 is missing in $pg_bin: apt-get install -y postgresql-15, or set PG_BIN" >&2
    exit 1
fi

load_at_start=$(cut -d' ' -f1-3 /proc/loadavg)
dir=$(mktemp -d -t bench-bootstrap.XXXXXX)
as_postgres=()
if [ "$(id -u)" = 0 ]; then
    chown postgres:postgres "$dir"
    as_postgres=(runuser -u postgres --)
fi
gate_pid=
feed_pid=

stop() {
    if [ -n "$feed_pid" ]; then kill -TERM "$feed_pid" 2>/dev/null || true; wait "$feed_pid" 2>/dev/null || true; fi
    if [ -n "$gate_pid" ]; then kill -TERM "$gate_pid" 2>/dev/null || true; wait "$gate_pid" 2>/dev/null || true; fi
    "${as_postgres[@]}" "$pg_bin/pg_ctl" -D "$dir/pg" stop -m immediate >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap stop EXIT

echo "PostgreSQL: a cluster in $dir/pg on port $pg_port"
"${as_postgres[@]}" "$pg_bin/initdb" -D "$dir/pg" -U postgres --auth=trust --no-sync -E UTF8 --locale=C >/dev/null
"${as_postgres[@]}" "$pg_bin/pg_ctl" -D "$dir/pg" -l "$dir/pg.log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $pg_port -c unix_socket_directories=$dir -c wal_level=logical -c shared_buffers=512MB" \
    start >/dev/null
dsn="postgres://postgres@127.0.0.1:$pg_port/postgres"
psql() { "$pg_bin/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres "$@"; }

echo "PostgreSQL: users(id bigint primary key) with $rows rows"
started=$(date +%s.%N)
psql -c "CREATE TABLE users (id bigint PRIMARY KEY)" \
    -c "INSERT INTO users SELECT generate_series(1, $rows)" \
    -c "VACUUM ANALYZE users"
echo "  made in $(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
seq 1 "$rows" > "$dir/ids.txt"
file_bytes=$(stat -c %s "$dir/ids.txt")

cat > "$dir/gate.toml" <<EOF
[namespaces.users]
expected_keys = $rows
EOF

# Starts a gate on an empty data directory and waits until it is SERVING.
start_gate() {
    rm -rf "$dir/gate-data"
    "$gate" serve --listen "127.0.0.1:$grpc_port" --http-listen "127.0.0.1:$http_port" --resp-listen off \
        --config "$dir/gate.toml" --data-dir "$dir/gate-data" > "$dir/gate.log" 2>&1 &
    gate_pid=$!
    for _ in $(seq 1 300); do
        if "$gate" probe --addr "127.0.0.1:$grpc_port" 2>/dev/null; then return; fi
        sleep 0.1
    done
    echo "the gate did not start: $(cat "$dir/gate.log")" >&2
    exit 1
}

stop_gate() {
    kill -TERM "$gate_pid"
    wait "$gate_pid" || true
    gate_pid=
}

# Runs one load with the given source arguments; prints "seconds keys_per_second wall_seconds loader_cpu_seconds".
load() {
    local summary
    summary=$(/usr/bin/time -f "%e %U %S" -o "$dir/time" "$gate" load --addr "http://127.0.0.1:$grpc_port" \
        -n users --batch "$batch" --in-flight "$in_flight" --json "$@")
    local keys seconds rate wall cpu
    keys=$(echo "$summary" | sed 's/.*"keys":\([0-9]*\).*/\1/')
    seconds=$(echo "$summary" | sed 's/.*"seconds":\([0-9.e-]*\).*/\1/')
    rate=$(echo "$summary" | sed 's/.*"keys_per_second":\([0-9]*\).*/\1/')
    wall=$(awk '{print $1}' "$dir/time")
    cpu=$(awk '{print $2 + $3}' "$dir/time")
    if [ "$keys" != "$rows" ]; then
        echo "loaded $keys keys, expected $rows: $summary" >&2
        exit 1
    fi
    echo "$seconds $rate $wall $cpu"
}

# Runs the change feed's --initial-load of the same table on a new slot, from its start to its log line
# "initial load done"; prints "seconds keys_per_second".
feed_initial_load() {
    local started finished
    started=$(date +%s.%N)
    "$gate" feed --addr "http://127.0.0.1:$grpc_port" --postgres "$dsn" --table public.users:id=users \
        --slot bench_slot --publication bench_publication --initial-load --batch "$batch" \
        --http-listen "127.0.0.1:$((base + 3))" > "$dir/feed.log" 2>&1 &
    feed_pid=$!
    until grep -q "initial load done" "$dir/feed.log"; do
        if ! kill -0 "$feed_pid" 2>/dev/null; then
            echo "the feed stopped: $(cat "$dir/feed.log")" >&2
            exit 1
        fi
        sleep 0.02
    done
    finished=$(date +%s.%N)
    kill -TERM "$feed_pid"
    wait "$feed_pid" || true
    feed_pid=
    psql -c "SELECT pg_drop_replication_slot('bench_slot')" -c "DROP PUBLICATION bench_publication" >/dev/null
    awk -v a="$started" -v b="$finished" -v rows="$rows" 'BEGIN {printf "%.2f %d\n", b - a, rows / (b - a)}'
}

# Looks every key of a file up with `check` (answers written to /dev/null); prints "wall_seconds cpu_seconds".
check() {
    /usr/bin/time -f "%e %U %S" -o "$dir/time" "$gate" check --addr "http://127.0.0.1:$grpc_port" -n users \
        < "$1" > "$dir/answers.txt"
    if [ "$(wc -l < "$dir/answers.txt")" != "$rows" ]; then
        echo "check printed $(wc -l < "$dir/answers.txt") lines, expected $rows" >&2
        exit 1
    fi
    awk '{print $1, $2 + $3}' "$dir/time"
}

pg_lines=()
file_lines=()
check_lines=()
feed_lines=()
for run in $(seq 1 "$runs"); do
    start_gate
    read -r seconds rate wall cpu < <(load --postgres "$dsn" --query "SELECT id::text FROM users")
    echo "run $run, PostgreSQL: $rows keys in $seconds s ($rate keys/s), command $wall s, loader CPU $cpu s"
    pg_lines+=("| $run | PostgreSQL query | $(printf %.2f "$seconds") | $rate | $wall | $cpu |")
    stop_gate
    start_gate
    read -r seconds rate wall cpu < <(load "$dir/ids.txt")
    echo "run $run, file: $rows keys in $seconds s ($rate keys/s), command $wall s, loader CPU $cpu s"
    file_lines+=("| $run | file ($file_bytes bytes) | $(printf %.2f "$seconds") | $rate | $wall | $cpu |")
    read -r wall cpu < <(check "$dir/ids.txt")
    rate=$(awk -v rows="$rows" -v s="$wall" 'BEGIN {printf "%d", rows / s}')
    echo "run $run, check of the file: $rows keys in $wall s ($rate keys/s), checker CPU $cpu s"
    check_lines+=("| $run | \`check\` of the file, answers to /dev/null | $wall | $rate | $wall | $cpu |")
    stop_gate
    start_gate
    read -r seconds rate < <(feed_initial_load)
    echo "run $run, feed --initial-load: $rows keys in $seconds s ($rate keys/s)"
    feed_lines+=("| $run | \`feed --initial-load\` | $seconds | $rate | – | – |")
    stop_gate
done

{
    echo "# Bootstrap results"
    echo
    echo "\`scripts/bench-bootstrap.sh\`, $(date -u +%Y-%m-%d) — $(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), Linux $(uname -r); load average $load_at_start at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end (a load above the benchmark's own, about 2, is other work sharing the cores)."
    echo
    echo "$rows ids (\`bigint\`, \`1..$rows\`) loaded into a fresh gate (its own data directory, \`--sync always\`, namespace \`users\` sized for $rows keys) with \`existence-gate load --batch $batch --in-flight $in_flight\`: from PostgreSQL 15 (\`--postgres ... --query \"SELECT id::text FROM users\"\`, streamed with COPY) and from a file of the same ids, one per line. PostgreSQL, the gate and the loader share this machine's cores, as they would in a bootstrap run beside the database. \"seconds\" and keys/s are the loader's summary: from the moment its source is open (the gate connected, the query planned and its COPY started) to the last acknowledged \`Add\`; \"command\" is the whole process, start to exit; loader CPU is its user + system time."
    echo
    echo "| run | source | seconds | keys/s | command (s) | loader CPU (s) |"
    echo "|---:|---|---:|---:|---:|---:|"
    for line in "${pg_lines[@]}" "${file_lines[@]}" "${check_lines[@]}" "${feed_lines[@]}"; do echo "$line"; done
    echo
    echo "\`check\` rows: every key of the file looked up by \`existence-gate check -n users < ids.txt\` (\`BatchMayExist\` of 1,000 keys with their bases, 4 in flight, one line per key in input order) against the gate just loaded; seconds are the whole command."
    echo
    echo "\`feed --initial-load\` rows: the change feed started on a new slot (\`--table public.users:id=users --initial-load --batch $batch\`, its Adds 4 in flight), timed from its start to its log line \"initial load done\" (the slot created with an exported snapshot, the table read with COPY within it, every Add acknowledged); then stopped, and its slot and publication dropped."
} > "$results"
echo "written to $results"
