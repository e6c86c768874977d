//! The load harness: the gate's release binary under gRPC load, next to a trivial tonic server (the ceiling
//! of any tonic service of this contract) and Redis, all measured side by side in one run.
//!
//! `cargo bench --bench load` builds the gate with the bench profile, starts the three servers as separate
//! processes on loopback ports, drives each workload for a fixed time from a fixed number of connections and
//! calls in flight, and writes `benches/results/load.md` (one table of throughput, server CPU per call and
//! per key from `/proc/<pid>/stat`, latency percentiles and memory, with ratios against the baselines) and
//! `benches/results/throughput-vs-batch.svg`. The run takes three to four minutes after the build. Redis is
//! Debian's `redis-server` (`apt-get install -y redis-server`); without it the Redis rows are skipped. The
//! tombstone store's memory and its lookups under eviction are measured in a second, fresh gate process,
//! so that its RSS growth is the store's own.
//!
//! Figures that compare two servers come from the same run, measured in alternating stretches (A, B, A,
//! B) so a change in the machine's load hits both. The client runs on the same machine and takes CPU from
//! the server, so end-to-end throughput understates what a server does on its own; server CPU per call or
//! per key is the figure the targets are about.
//!
//! Under `cargo test --benches` (no `--bench` argument) it does nothing.

mod baseline;
mod callers;
mod calls;
mod clients;
mod memory;
mod mirror;
mod overload;
mod report;
mod resp;
mod targets;
mod tombstone_store;
mod workloads;

// The processes, load generators, keys and report text, shared with the replicated and feed benches.
use existence_gate_testkit::{drive, keys, procs, text};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use existence_gate::proto::admin_client::AdminClient;
use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use existence_gate::proto::{
    AbsenceKind, AddRequest, Basis, BatchMayExistRequest, MayExistRequest, NamespaceStats,
    RecordAbsentRequest, RecordOutcome, StatsRequest,
};
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use drive::{Op, Sample, Until};
use keys::{key_bytes, keys, mix, pack};
use procs::Server;
use report::{Report, Row, Target};

use calls::*;
use targets::*;
use tombstone_store::*;
use workloads::*;

/// Connections per server, and calls in flight on each (closed loop).
const CONNECTIONS: usize = 4;
const IN_FLIGHT: usize = 16;
/// Each side of a comparison is measured in `ROUNDS` alternating stretches of `STRETCH`.
const ROUNDS: usize = 4;
const STRETCH: Duration = Duration::from_millis(1_500);
/// The batch-size sweep's shorter stretches.
const SWEEP_STRETCH: Duration = Duration::from_millis(750);
/// Load before each stretch that is not measured (connections warm, caches filled).
const WARM_UP: Duration = Duration::from_millis(200);

/// Keys added to the `default` namespace before lookups (its filter is sized for them at 1%).
const FILLED_KEYS: u64 = 10_000_000;
const FALSE_POSITIVE_RATE: f64 = 0.01;
/// Keys per `Add` when filling.
const ADD_BATCH: u64 = 10_000;
/// Keys per `BatchMayExist` in the decode and Redis comparisons.
const LOOKUP_BATCH: usize = 1_000;
/// Batch sizes of the sweep (the plot).
const SWEEP: [usize; 5] = [1, 10, 100, 1_000, 10_000];
/// Distinct keys unary lookups cycle through.
const UNARY_POOL: usize = 1 << 16;
/// Keys of prebuilt batches (per batch size) that calls cycle through.
const BATCH_POOL_KEYS: usize = 64_000;

/// `RecordAbsent` throughput is measured in namespace `writes`, whose store never fills during the run, on
/// keys drawn from this many added ones (`RecordAbsent` stores nothing for a key the filter rejects).
const WRITE_CANDIDATES: u64 = 2_000_000;
/// The tombstone store is measured in a second, fresh gate process (so its RSS growth is the store's, not
/// memory freed earlier and reused): one namespace holding at most this many tombstones gets twice as many
/// recorded (a key may live only in its 16-slot bucket, so the first pass leaves some buckets short of full;
/// the second fills them), then half as many more, each evicting one.
const TOMBSTONE_CAPACITY: u64 = 131_072;
/// Distinct keys recorded into the second gate's store.
const TOMBSTONE_RECORDS: u64 = TOMBSTONE_CAPACITY * 5 / 2;
/// Lookups of tombstoned keys (namespace `tomb` of the main gate) cycle through this many; `tomb` holds
/// four times as many, so that no 16-slot bucket overflows and evicts one of them.
const TOMBSTONE_LOOKUPS: u64 = 65_536;
/// How often the harness scrapes the gate's `/metrics`, as Prometheus would (its histograms buffer every
/// sample until a scrape).
const SCRAPE_EVERY: Duration = Duration::from_secs(1);

/// The rotating namespace's span (its retention over `windows - 1 = 1`).
const ROTATION_SPAN_MS: u64 = 10_000;
/// Adds during the tail-latency run: one call of this many keys every `ADD_EVERY`.
const ROTATION_ADD_KEYS: u64 = 100;
const ADD_EVERY: Duration = Duration::from_millis(10);

/// Key spaces: keys added to `default`, keys never added, keys of `tomb`, `rot` and `writes`.
const PRESENT: u64 = 0;
const ABSENT: u64 = 1 << 40;
const TOMB: u64 = 1 << 41;
const ROT: u64 = 1 << 42;
const WRITES: u64 = 1 << 43;

/// The Redis bitmap of the Redisson-style Bloom filter.
const BLOOM_KEY: &str = "bloom";

/// The gate's configuration for the run.
fn gate_config() -> String {
    format!(
        r#"[limits]
max_batch_keys = 10000

[namespaces.default]
expected_keys = {FILLED_KEYS}
false_positive_rate = {FALSE_POSITIVE_RATE}

[namespaces.writes]
expected_keys = {WRITE_CANDIDATES}
max_tombstones = 4000000
max_tombstone_rate = 100000000

[namespaces.tomb]
expected_keys = {TOMBSTONE_LOOKUPS}
max_tombstones = {}
max_tombstone_rate = 100000000
missing_ttl = "10m"

[namespaces.rot]
expected_keys = 1000000
retention = "{}s"
windows = 2
"#,
        TOMBSTONE_LOOKUPS * 4,
        ROTATION_SPAN_MS / 1_000
    )
}

/// The configuration of the second gate, which measures the tombstone store: `default` holds the store,
/// `plain` never gets a tombstone. The invalidation replay buffer is kept small so that the Adds before
/// the measurement leave little behind.
fn store_config() -> String {
    format!(
        r#"[limits]
replay_buffer_bytes = 65536

[namespaces.default]
expected_keys = {}
max_tombstones = {TOMBSTONE_CAPACITY}
max_tombstone_rate = 100000000
missing_ttl = "10m"

[namespaces.plain]
expected_keys = {}
"#,
        TOMBSTONE_RECORDS,
        TOMBSTONE_CAPACITY * 2
    )
}

/// The `j`-th key of a lookup: even `j` are added keys of `default`, odd `j` keys never added.
fn lookup_index(j: u64) -> u64 {
    if j & 1 == 0 {
        PRESENT + (j / 2).wrapping_mul(7_919) % FILLED_KEYS
    } else {
        ABSENT + j
    }
}

type Clients = Arc<Vec<ExistenceGateClient<Channel>>>;
type RedisConnections = Arc<Vec<MultiplexedConnection>>;

async fn connect(server: &Server) -> Clients {
    connect_n(server, CONNECTIONS).await
}

/// `connections` clients, each on its own HTTP/2 connection.
async fn connect_n(server: &Server, connections: usize) -> Clients {
    let mut clients = Vec::new();
    for _ in 0..connections {
        // One Channel is one HTTP/2 connection.
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
            .expect("a valid address")
            .tcp_nodelay(true)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", server.name));
        clients.push(
            ExistenceGateClient::new(channel)
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20),
        );
    }
    Arc::new(clients)
}

async fn connect_redis(server: &Server) -> RedisConnections {
    connect_redis_n(server, CONNECTIONS).await
}

/// `connections` multiplexed Redis connections.
async fn connect_redis_n(server: &Server, connections: usize) -> RedisConnections {
    let client = redis::Client::open(format!("redis://{}/", server.addr)).expect("a redis URL");
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(Duration::from_secs(5)));
    let mut opened = Vec::new();
    for _ in 0..connections {
        opened.push(
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .expect("a Redis connection"),
        );
    }
    Arc::new(opened)
}

fn status(error: tonic::Status) -> String {
    format!("{:?}: {}", error.code(), error.message())
}

// ---------------------------------------------------------------------------------------------------------
// Measurement helpers

/// One side of a comparison: a server and the call to drive it with.
struct Side<'a> {
    server: &'a Server,
    op: Op,
}

/// Measures every side in `ROUNDS` alternating stretches of `stretch`; returns one sample per side.
async fn compare(sides: &[Side<'_>], stretch: Duration) -> Vec<Sample> {
    let mut samples = vec![Sample::default(); sides.len()];
    for _ in 0..ROUNDS {
        for (side, total) in sides.iter().zip(&mut samples) {
            let pid = side.server.pid();
            drive::closed_loop(CONNECTIONS, IN_FLIGHT, WARM_UP, pid, &side.op).await;
            total.merge(drive::closed_loop(CONNECTIONS, IN_FLIGHT, stretch, pid, &side.op).await);
        }
    }
    samples.iter_mut().for_each(Sample::sort);
    samples
}

/// Adds `count` keys `base + i` to `namespace` in batches of `ADD_BATCH`, two calls in flight per connection.
async fn fill(
    clients: &Clients,
    server: &Server,
    namespace: &'static str,
    base: u64,
    count: u64,
) -> Sample {
    let batches = count.div_ceil(ADD_BATCH);
    let next = Arc::new(AtomicU64::new(0));
    let server_before = server.cpu_seconds();
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONNECTIONS * 2)
        .map(|t| {
            let (clients, next) = (Arc::clone(clients), Arc::clone(&next));
            tokio::spawn(async move {
                let mut client = clients[t % CONNECTIONS].clone();
                loop {
                    let b = next.fetch_add(1, Ordering::Relaxed);
                    if b >= batches {
                        break;
                    }
                    let end = ((b + 1) * ADD_BATCH).min(count);
                    let request = AddRequest {
                        namespace: namespace.to_string(),
                        keys: keys((b * ADD_BATCH..end).map(|i| base + i)),
                        ..Default::default()
                    };
                    client.add(request).await.expect("Add while filling");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a fill task panicked");
    }
    Sample {
        calls: batches,
        keys: count,
        wall: started.elapsed().as_secs_f64(),
        server_cpu: server.cpu_seconds() - server_before,
        ..Sample::default()
    }
}

/// Calls `op` `count` times from `CONNECTIONS × IN_FLIGHT` tasks (not measured: it prepares state); every
/// call must succeed.
async fn repeat(op: &Op, count: u64, what: &'static str) {
    let until = Until::Calls(count);
    let done = drive::closed_loop_until(CONNECTIONS, IN_FLIGHT, until, &[], op).await;
    assert_eq!(
        done.errors, 0,
        "{what}: calls failed (the first failure is printed above)"
    );
}

/// One `GET /metrics` of the server at `addr`, read to the end.
async fn scrape_once(addr: std::net::SocketAddr) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return;
    };
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_ok() {
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response).await;
    }
}

/// Scrapes `http://addr/metrics` every `every` until the task is aborted.
fn scrape_metrics(addr: std::net::SocketAddr, every: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        loop {
            ticks.tick().await;
            scrape_once(addr).await;
        }
    })
}

/// The gate's bench-profile binary with the configuration `config`, its `default` filled with
/// [`FILLED_KEYS`] keys as the main run fills it.
async fn filled_gate(config: &str) -> Server {
    let file = tempfile::NamedTempFile::new().expect("a temporary file");
    std::fs::write(file.path(), config).expect("writing the configuration");
    // The gate reads its configuration once, at start.
    let gate = procs::start_gate(&procs::gate_binary(), file.path(), None);
    println!("filling the gate with {FILLED_KEYS} keys...");
    fill(&connect_n(&gate, 4).await, &gate, "", 0, FILLED_KEYS).await;
    gate
}

async fn stats(server: &Server, namespace: &str) -> NamespaceStats {
    let mut admin = AdminClient::connect(format!("http://{}", server.addr))
        .await
        .expect("the admin service");
    admin
        .stats(StatsRequest {
            namespace: namespace.to_string(),
        })
        .await
        .expect("Stats")
        .into_inner()
        .namespaces
        .remove(0)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

// ---------------------------------------------------------------------------------------------------------
// The run

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("baseline-server") {
        return baseline::serve();
    }
    if !args.iter().any(|a| a == "--bench") {
        // `cargo test --benches`: the load run is minutes long and its figures are not pass/fail.
        println!("load harness: run it with `cargo bench --bench load`");
        return;
    }
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    if args.iter().any(|a| a == "overload") {
        return runtime.block_on(overload::run());
    }
    if args.iter().any(|a| a == "callers") {
        return runtime.block_on(callers::run());
    }
    if args.iter().any(|a| a == "clients") {
        return runtime.block_on(clients::run());
    }
    if args.iter().any(|a| a == "resp") {
        let durable = args.iter().any(|a| a == "durable");
        return runtime.block_on(resp::run(durable));
    }
    if args.iter().any(|a| a == "memory") {
        return runtime.block_on(memory::run());
    }
    if args.iter().any(|a| a == "mirror") {
        return runtime.block_on(mirror::run());
    }
    runtime.block_on(run());
}

/// The load run, one step per part of the report, in the order they are measured. The steps share the
/// servers; comparisons made later reuse samples of earlier steps (the unary and 1,000-key lookups), and
/// the targets are judged once everything is measured.
async fn run() {
    let started = Instant::now();
    let mut report = Report::new(CONNECTIONS, IN_FLIGHT, ROUNDS, STRETCH);
    let bench = Bench::start(&mut report).await;
    bench.fill_namespaces(&mut report).await;
    bench.measure_false_positives(&mut report).await;
    bench.fill_redis_bloom(&mut report).await;
    let (unary, scraper) = bench.unary_lookups(&mut report).await;
    let batch = bench.batch_lookups(&mut report).await;
    bench.batch_size_sweep(&mut report, &batch).await;
    let redis_markers = bench.record_absent_writes(&mut report).await;
    bench.tombstoned_lookups(&mut report, &unary).await;
    tombstone_store(&mut report, redis_markers).await;
    bench.tail_latency(&mut report).await;
    judge_targets(&mut report, &unary, &batch);
    write_results(&mut report, started);
    if let Some(scraper) = scraper {
        scraper.abort();
    }
}
