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
mod clients;
mod memory;
mod overload;
mod report;
mod resp;

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
// Calls

/// Unary `MayExist` of `keys` in `namespace`; with `want`, an answer on another basis is an error.
fn may_exist(
    clients: &Clients,
    namespace: &'static str,
    keys: Arc<Vec<Bytes>>,
    want: Option<Basis>,
) -> Op {
    let clients = Arc::clone(clients);
    drive::op(move |c, n| {
        let mut client = clients[c].clone();
        let key = keys[n as usize % keys.len()].clone();
        async move {
            let request = MayExistRequest {
                namespace: namespace.to_string(),
                key,
            };
            let reply = client
                .may_exist(request)
                .await
                .map_err(status)?
                .into_inner();
            match want {
                Some(basis) if reply.basis != basis as i32 => {
                    Err(format!("basis {} instead of {basis:?}", reply.basis))
                }
                _ => Ok(1),
            }
        }
    })
}

/// `BatchMayExist` cycling through prebuilt `requests` of `batch` keys each.
fn batch_may_exist(
    clients: &Clients,
    requests: Arc<Vec<BatchMayExistRequest>>,
    batch: usize,
) -> Op {
    let clients = Arc::clone(clients);
    drive::op(move |c, n| {
        let mut client = clients[c].clone();
        let request = requests[n as usize % requests.len()].clone();
        async move {
            let reply = client
                .batch_may_exist(request)
                .await
                .map_err(status)?
                .into_inner();
            if reply.answers.len() == batch || reply.may_exist_bitmap.len() == batch.div_ceil(8) {
                Ok(batch as u64)
            } else {
                Err(format!(
                    "{} answers and {} bitmap bytes for {batch} keys",
                    reply.answers.len(),
                    reply.may_exist_bitmap.len()
                ))
            }
        }
    })
}

/// Prebuilt lookup batches of `batch` keys, as `keys` or as `packed_keys`.
fn lookup_requests(namespace: &str, batch: usize, packed: bool) -> Arc<Vec<BatchMayExistRequest>> {
    let count = (BATCH_POOL_KEYS / batch).clamp(4, 64);
    Arc::new(
        (0..count)
            .map(|b| {
                let batch_keys =
                    keys((0..batch as u64).map(|i| lookup_index((b * batch) as u64 + i)));
                BatchMayExistRequest {
                    namespace: namespace.to_string(),
                    keys: if packed {
                        Vec::new()
                    } else {
                        batch_keys.clone()
                    },
                    packed_keys: if packed {
                        pack(&batch_keys)
                    } else {
                        Bytes::new()
                    },
                    ..Default::default()
                }
            })
            .collect(),
    )
}

/// Packed lookup batches of never-added keys in `namespace` (no tombstone matches them, so lookups change
/// nothing in the store).
fn absent_requests(namespace: &str, batch: usize) -> Arc<Vec<BatchMayExistRequest>> {
    let count = (BATCH_POOL_KEYS / batch).clamp(4, 64);
    Arc::new(
        (0..count as u64)
            .map(|b| BatchMayExistRequest {
                namespace: namespace.to_string(),
                keys: Vec::new(),
                packed_keys: pack(&keys(
                    (0..batch as u64).map(|i| ABSENT + b * batch as u64 + i),
                )),
                ..Default::default()
            })
            .collect(),
    )
}

/// `RecordAbsent` in `namespace` of key `base + next % modulus` (`next` counts calls), expecting `RECORDED`.
fn record_absent(
    clients: &Clients,
    namespace: &'static str,
    base: u64,
    modulus: u64,
    next: Arc<AtomicU64>,
) -> Op {
    let clients = Arc::clone(clients);
    drive::op(move |c, _| {
        let mut client = clients[c].clone();
        let index = next.fetch_add(1, Ordering::Relaxed) % modulus;
        async move {
            let request = RecordAbsentRequest {
                namespace: namespace.to_string(),
                key: Bytes::copy_from_slice(&key_bytes(base + index)),
                kind: AbsenceKind::Missing as i32,
                observed_seq: 0,
                ttl_seconds: 0,
            };
            let reply = client
                .record_absent(request)
                .await
                .map_err(status)?
                .into_inner();
            if reply.outcome == RecordOutcome::Recorded as i32 {
                Ok(1)
            } else {
                Err(format!("outcome {} instead of RECORDED", reply.outcome))
            }
        }
    })
}

/// Writes the Redisson-sized Bloom bitmap for `FILLED_KEYS` at `FALSE_POSITIVE_RATE` (pseudo-random bytes: a
/// probe's cost does not depend on the bits' values) under `BLOOM_KEY`: its (bits, probes).
async fn fill_redis_bitmap(connection: &mut MultiplexedConnection) -> (u64, u32) {
    let (bits, probes) = redisson_geometry(FILLED_KEYS, FALSE_POSITIVE_RATE);
    let bytes = bits.div_ceil(8);
    let chunk = 1u64 << 20;
    for offset in (0..bytes).step_by(chunk as usize) {
        let len = chunk.min(bytes - offset);
        let data: Vec<u8> = (0..len).map(|i| mix(offset + i) as u8).collect();
        let _: i64 = redis::cmd("SETRANGE")
            .arg(BLOOM_KEY)
            .arg(offset)
            .arg(data)
            .query_async(connection)
            .await
            .expect("SETRANGE");
    }
    (bits, probes)
}

/// Bit positions of a key the way Redisson's `RBloomFilter` derives them: a 128-bit hash split into two
/// longs, then `k` indexes `(h & Long.MAX_VALUE) % size` with `h` advanced alternately by the two halves.
/// (Redisson hashes with HighwayHash-128; XXH3-128 stands in — a client-side cost either way.)
fn redisson_indexes(key: &[u8], probes: u32, size: u64) -> impl Iterator<Item = u64> {
    let hash = xxhash_rust::xxh3::xxh3_128(key);
    let (hash1, hash2) = (hash as u64 as i64, (hash >> 64) as u64 as i64);
    let mut h = hash1;
    (0..probes).map(move |i| {
        let index = (h & i64::MAX) as u64 % size;
        h = h.wrapping_add(if i % 2 == 0 { hash2 } else { hash1 });
        index
    })
}

/// Redisson's sizing for `keys` at rate `p`: (bits, probes).
fn redisson_geometry(keys: u64, p: f64) -> (u64, u32) {
    let ln2 = std::f64::consts::LN_2;
    let bits = (-(keys as f64) * p.ln() / (ln2 * ln2)) as u64;
    let probes = ((bits as f64 / keys as f64 * ln2).round() as u32).max(1);
    (bits, probes)
}

/// Redis `GETBIT` pipelines (k per key) cycling through prebuilt pipelines of `batch` keys each.
fn getbit(connections: &RedisConnections, batch: usize) -> Op {
    let (bits, probes) = redisson_geometry(FILLED_KEYS, FALSE_POSITIVE_RATE);
    let count = (BATCH_POOL_KEYS / batch).clamp(4, 64);
    let pipelines: Arc<Vec<redis::Pipeline>> = Arc::new(
        (0..count)
            .map(|b| {
                let mut pipeline = redis::pipe();
                for key in keys((0..batch as u64).map(|i| lookup_index((b * batch) as u64 + i))) {
                    for index in redisson_indexes(&key, probes, bits) {
                        pipeline.cmd("GETBIT").arg(BLOOM_KEY).arg(index);
                    }
                }
                pipeline
            })
            .collect(),
    );
    let connections = Arc::clone(connections);
    drive::op(move |c, n| {
        let mut connection = connections[c].clone();
        let pipelines = Arc::clone(&pipelines);
        async move {
            let pipeline = &pipelines[n as usize % pipelines.len()];
            let bits: Vec<i64> = pipeline
                .query_async(&mut connection)
                .await
                .map_err(|e| e.to_string())?;
            // A key may exist when all of its k bits are set.
            let _may_exist = bits
                .chunks(probes as usize)
                .filter(|c| c.iter().all(|&b| b == 1))
                .count();
            if bits.len() == batch * probes as usize {
                Ok(batch as u64)
            } else {
                Err(format!("{} bits for {batch} keys", bits.len()))
            }
        }
    })
}

/// Redis `GET` of the null markers of `keys`, expecting the empty marker.
fn redis_get(connections: &RedisConnections, keys: Arc<Vec<Bytes>>) -> Op {
    let connections = Arc::clone(connections);
    drive::op(move |c, n| {
        let mut connection = connections[c].clone();
        let key = keys[n as usize % keys.len()].clone();
        async move {
            let value: Option<Vec<u8>> = redis::cmd("GET")
                .arg(&key[..])
                .query_async(&mut connection)
                .await
                .map_err(|e| e.to_string())?;
            match value {
                Some(marker) if marker.is_empty() => Ok(1),
                other => Err(format!("GET returned {other:?}")),
            }
        }
    })
}

/// Redis `SET key "" NX EX 60` of a fresh key per call.
fn redis_set_nx(connections: &RedisConnections, next: Arc<AtomicU64>) -> Op {
    let connections = Arc::clone(connections);
    drive::op(move |c, _| {
        let mut connection = connections[c].clone();
        let key = key_bytes(WRITES + next.fetch_add(1, Ordering::Relaxed));
        async move {
            let reply: Option<String> = redis::cmd("SET")
                .arg(&key[..])
                .arg("")
                .arg("NX")
                .arg("EX")
                .arg(60)
                .query_async(&mut connection)
                .await
                .map_err(|e| e.to_string())?;
            match reply {
                Some(_) => Ok(1),
                None => Err("SET NX found the key".to_string()),
            }
        }
    })
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
// The tombstone store, in a second gate

/// Redis' null markers of the write comparison: a cache of misses keeps one where the gate keeps a
/// tombstone, so their memory is set against the store's.
struct RedisMarkers {
    /// `SET NX` calls made, each of a fresh key.
    set: u64,
    /// Growth of Redis' `used_memory` over them.
    used_memory_growth: u64,
}

/// A second, fresh gate whose only work is the tombstone store: its RSS growth while the store fills to its
/// bound is the store's memory; then lookups of never-added keys (which probe the store and miss) are
/// measured against a namespace without tombstones, before and after half a store's worth of evictions.
/// The store's memory goes into the report beside `redis_markers`, the same thing kept in Redis.
async fn tombstone_store(report: &mut Report, redis_markers: RedisMarkers) {
    println!("tombstone store (second gate): fill to {TOMBSTONE_CAPACITY}, lookups, evictions...");
    let config = tempfile::NamedTempFile::new().expect("a temporary file");
    std::fs::write(config.path(), store_config()).expect("writing the configuration");
    let server = procs::start_gate(&procs::gate_binary(), config.path(), None);
    let clients = connect(&server).await;
    fill(&clients, &server, "default", TOMB, TOMBSTONE_RECORDS).await;
    warm_up_without_tombstones(&server, &clients).await;
    // Flush the metrics buffers the warm-up filled before the baseline reading, and keep them flushed.
    let http = server.http_addr.expect("the gate logs its HTTP address");
    let scraper = scrape_metrics(http, Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let record = record_absent(
        &clients,
        "default",
        TOMB,
        TOMBSTONE_RECORDS,
        Arc::new(AtomicU64::new(0)),
    );
    let (rss_delta, full) = fill_store(&server, &record).await;
    store_lookups(report, &server, &clients, &record, full.tombstones).await;
    scraper.abort();
    report.tombstones = Some(report::TombstoneMemory {
        capacity: TOMBSTONE_CAPACITY,
        recorded: TOMBSTONE_CAPACITY * 2,
        stored: full.tombstones,
        table_bytes: full.tombstone_bytes,
        rss_delta,
        redis_markers: redis_markers.set,
        redis_delta: redis_markers.used_memory_growth,
    });
}

/// A second of lookups in `plain`, which never gets a tombstone, so that the connections and the runtime
/// are warm before the store's baseline RSS is read.
async fn warm_up_without_tombstones(server: &Server, clients: &Clients) {
    let absent = Arc::new(keys((0..UNARY_POOL as u64).map(|i| ABSENT + i)));
    let warm = may_exist(clients, "plain", absent, None);
    drive::closed_loop(
        CONNECTIONS,
        IN_FLIGHT,
        Duration::from_secs(1),
        server.pid(),
        &warm,
    )
    .await;
}

/// Calls `record` until the store is full (twice its bound: see `TOMBSTONE_CAPACITY`); returns the
/// server's RSS growth meanwhile and the store's `Stats` once full.
async fn fill_store(server: &Server, record: &Op) -> (u64, NamespaceStats) {
    let rss_before = server.rss_bytes();
    repeat(
        record,
        TOMBSTONE_CAPACITY * 2,
        "RecordAbsent into the store",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_after = server.rss_bytes();
    (
        rss_after.saturating_sub(rss_before),
        stats(server, "default").await,
    )
}

/// Packed `BatchMayExist` of never-added keys in the full store's namespace against the same in `plain`
/// (server CPU per key): what a full store costs lookups that probe it and miss, measured once with the
/// `stored` tombstones and again after half a store's worth of `record` calls, each evicting one.
async fn store_lookups(
    report: &mut Report,
    server: &Server,
    clients: &Clients,
    record: &Op,
    stored: u64,
) {
    let sides = [
        Side {
            server,
            op: batch_may_exist(
                clients,
                absent_requests("plain", LOOKUP_BATCH),
                LOOKUP_BATCH,
            ),
        },
        Side {
            server,
            op: batch_may_exist(
                clients,
                absent_requests("default", LOOKUP_BATCH),
                LOOKUP_BATCH,
            ),
        },
    ];
    let row = |workload: String, samples: &[Sample]| {
        Row::new(&workload, "gate (2nd)", &samples[1], server.rss_bytes())
            .per_key_vs(&samples[0], "no tombstones")
    };
    let before = compare(&sides, SWEEP_STRETCH).await;
    report.rows.push(row(
        format!("BatchMayExist {LOOKUP_BATCH} never-added keys, packed, namespace with a full store ({stored} tombstones)"),
        &before,
    ));
    let evictions = TOMBSTONE_CAPACITY / 2;
    repeat(record, evictions, "RecordAbsent into the full store").await;
    let after = compare(&sides, SWEEP_STRETCH).await;
    report.rows.push(row(
        format!("same, after {evictions} more RecordAbsent (each evicting a tombstone)"),
        &after,
    ));
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
        return runtime.block_on(resp::run());
    }
    if args.iter().any(|a| a == "memory") {
        return runtime.block_on(memory::run());
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

/// The servers of the main run and the connections to each; dropping it stops the servers.
struct Bench {
    gate: Server,
    trivial: Server,
    /// `None` when `redis-server` is not installed: the Redis rows are skipped.
    redis: Option<Server>,
    gate_clients: Clients,
    trivial_clients: Clients,
    redis_connections: Option<RedisConnections>,
    /// The gate's configuration file, kept until the gate has stopped.
    _config: tempfile::NamedTempFile,
}

/// The 1,000-key batch comparison, whose samples the sweep and the targets read again.
struct BatchLookups {
    gate_keyed: Sample,
    trivial_keyed: Sample,
    gate_packed: Sample,
    trivial_packed: Sample,
    /// Redis `GETBIT` pipelines probing the same keys, if Redis ran.
    getbit: Option<Sample>,
}

// The steps of the run, in its order.
impl Bench {
    /// Starts the gate, the trivial tonic server and Redis (if installed), each its own process, and
    /// connects to each; notes the gate's configuration and Redis' version in the report.
    async fn start(report: &mut Report) -> Self {
        let config = tempfile::NamedTempFile::new().expect("a temporary file");
        std::fs::write(config.path(), gate_config()).expect("writing the configuration");
        report.config = gate_config();

        let gate = procs::start_gate(&procs::gate_binary(), config.path(), None);
        let trivial = baseline::start();
        let redis = procs::start_redis();
        if redis.is_none() {
            eprintln!("redis-server is not installed (apt-get install -y redis-server): Redis rows are skipped");
        }
        report.redis_version = redis.as_ref().map(|_| procs::redis_version());
        let gate_clients = connect(&gate).await;
        let trivial_clients = connect(&trivial).await;
        let redis_connections = match &redis {
            Some(redis) => Some(connect_redis(redis).await),
            None => None,
        };
        println!(
            "servers: gate {} (pid {}), trivial tonic {} (pid {}){}",
            gate.addr,
            gate.pid(),
            trivial.addr,
            trivial.pid(),
            redis.as_ref().map_or(String::new(), |r| format!(
                ", redis {} (pid {})",
                r.addr,
                r.pid()
            ))
        );
        Self {
            gate,
            trivial,
            redis,
            gate_clients,
            trivial_clients,
            redis_connections,
            _config: config,
        }
    }

    /// Fills `default` with `FILLED_KEYS` keys, measuring the Adds (keys/s, server CPU per key) and the
    /// gate's RSS empty and filled; then fills, unmeasured, the namespaces later steps look up or write to.
    async fn fill_namespaces(&self, report: &mut Report) {
        let rss_empty = self.gate.rss_bytes();
        println!("filling: {FILLED_KEYS} keys into `default` in Adds of {ADD_BATCH}...");
        let filled = fill(
            &self.gate_clients,
            &self.gate,
            "default",
            PRESENT,
            FILLED_KEYS,
        )
        .await;
        println!(
            "  {:.1} s, {:.2} M keys/s, {:.3} µs server CPU per key",
            filled.wall,
            filled.keys_per_second() / 1e6,
            filled.server_us_per_key()
        );
        let rss_filled = self.gate.rss_bytes();
        let default_stats = stats(&self.gate, "default").await;
        for (namespace, base, count) in [
            ("writes", WRITES, WRITE_CANDIDATES),
            ("tomb", TOMB, TOMBSTONE_LOOKUPS),
            ("rot", ROT, 100_000),
        ] {
            fill(&self.gate_clients, &self.gate, namespace, base, count).await;
        }
        report.add_fill(&filled, rss_empty, rss_filled, &default_stats);
    }

    /// Sanity before anything is timed: added keys answer MAY_EXIST (or every later figure measures a
    /// broken filter), and the false-positive rate of never-added keys, measured through the server,
    /// should be near `FALSE_POSITIVE_RATE`.
    async fn measure_false_positives(&self, report: &mut Report) {
        let requests = lookup_requests("", LOOKUP_BATCH, true);
        let (mut present_hits, mut absent_hits, mut checked) = (0u64, 0u64, 0u64);
        let mut client = self.gate_clients[0].clone();
        for request in requests.iter().take(32) {
            let reply = client
                .batch_may_exist(request.clone())
                .await
                .expect("BatchMayExist")
                .into_inner();
            for i in 0..LOOKUP_BATCH {
                let bit = reply.may_exist_bitmap[i / 8] >> (i % 8) & 1;
                if i % 2 == 0 {
                    present_hits += u64::from(bit);
                } else {
                    absent_hits += u64::from(bit);
                }
            }
            checked += LOOKUP_BATCH as u64 / 2;
        }
        assert_eq!(present_hits, checked, "an added key answered ABSENT");
        report.measured_fp = absent_hits as f64 / checked as f64;
    }

    /// The Redisson-style bitmap the `GETBIT` comparisons probe: sized for the same keys and rate, filled
    /// with random bits (the state of a full filter; GETBIT costs the same whatever the bits are). Its
    /// `used_memory` growth is the Redis side of the filter's memory.
    async fn fill_redis_bloom(&self, report: &mut Report) {
        let Some(connections) = &self.redis_connections else {
            return;
        };
        let before = self.redis_used_memory().await;
        let (bits, probes) = fill_redis_bitmap(&mut connections[0].clone()).await;
        let after = self.redis_used_memory().await;
        report.redis_bloom = Some((bits, probes, after.saturating_sub(before)));
    }

    /// Unary `MayExist`, gate against trivial tonic: server CPU per call (target 3). Nothing has scraped
    /// `/metrics` before it, so the gate's RSS growth over it is what its request histograms buffer when
    /// unscraped; right after, one scrape's cost is measured, and from then on the harness scrapes as a
    /// deployment's Prometheus would. Returns the samples (gate, trivial) and the scraper, which runs to
    /// the end.
    async fn unary_lookups(&self, report: &mut Report) -> (Vec<Sample>, Option<JoinHandle<()>>) {
        println!("unary MayExist: gate vs trivial tonic...");
        let unary_keys = Arc::new(keys((0..UNARY_POOL as u64).map(lookup_index)));
        let rss_before_unary = self.gate.rss_bytes();
        let unary = compare(
            &self.gate_and_trivial(|clients| may_exist(clients, "", Arc::clone(&unary_keys), None)),
            STRETCH,
        )
        .await;
        // Nothing has scraped /metrics yet: the request histograms have buffered every call's sample.
        report.unbuffered_growth = Some((
            self.gate.rss_bytes().saturating_sub(rss_before_unary),
            unary[0].calls + unary[0].errors,
        ));
        report.rows.push(
            self.gate_row("MayExist (unary)", &unary[0])
                .per_call_vs(&unary[1], "trivial"),
        );
        self.measure_scrape_cost(report).await;
        // From here on /metrics is scraped, as a deployment's Prometheus does.
        let scraper = self
            .gate
            .http_addr
            .map(|addr| scrape_metrics(addr, SCRAPE_EVERY));
        report
            .rows
            .push(self.trivial_row("MayExist (unary)", &unary[1]));
        (unary, scraper)
    }

    /// The gate's CPU per `/metrics` scrape, the average of a few made while nothing else runs, and the
    /// filter bytes it held then (a scrape that counted filter bits would grow with them).
    async fn measure_scrape_cost(&self, report: &mut Report) {
        const SCRAPES: u32 = 20;
        let Some(http) = self.gate.http_addr else {
            return;
        };
        scrape_once(http).await;
        let before = self.gate.cpu_seconds();
        for _ in 0..SCRAPES {
            scrape_once(http).await;
        }
        let seconds = (self.gate.cpu_seconds() - before) / f64::from(SCRAPES);
        let mut admin = AdminClient::connect(format!("http://{}", self.gate.addr))
            .await
            .expect("the admin service");
        let filter_bytes: u64 = admin
            .stats(StatsRequest {
                namespace: String::new(),
            })
            .await
            .expect("Stats")
            .into_inner()
            .namespaces
            .iter()
            .map(|n| n.filter_bytes)
            .sum();
        report.scrape_cpu = Some((seconds, filter_bytes));
    }

    /// `BatchMayExist` of `LOOKUP_BATCH` keys, as repeated `keys` and as `packed_keys`, gate against trivial
    /// tonic: server CPU per key against the trivial server's packed ceiling (targets 2 and 4a); and Redis
    /// `GETBIT` pipelines probing the same keys the way Redisson's Bloom filter does (target 4b).
    async fn batch_lookups(&self, report: &mut Report) -> BatchLookups {
        println!("BatchMayExist of {LOOKUP_BATCH} keys (repeated bytes, packed) vs trivial tonic and Redis GETBIT...");
        let keyed = lookup_requests("", LOOKUP_BATCH, false);
        let packed = lookup_requests("", LOOKUP_BATCH, true);
        let sides = self
            .gate_and_trivial(|clients| batch_may_exist(clients, Arc::clone(&keyed), LOOKUP_BATCH))
            .into_iter()
            .chain(self.gate_and_trivial(|clients| {
                batch_may_exist(clients, Arc::clone(&packed), LOOKUP_BATCH)
            }))
            .collect();
        let (samples, getbit) = self
            .compare_with_redis(sides, |c| getbit(c, LOOKUP_BATCH), STRETCH)
            .await;
        let [gate_keyed, trivial_keyed, gate_packed, trivial_packed] =
            <[Sample; 4]>::try_from(samples).expect("one sample per side");
        let batch = BatchLookups {
            gate_keyed,
            trivial_keyed,
            gate_packed,
            trivial_packed,
            getbit,
        };
        self.push_batch_rows(report, &batch);
        batch
    }

    /// The batch comparison's rows: the gate and the trivial server in each encoding against the trivial
    /// server's packed ceiling, then Redis against the gate's packed batches.
    fn push_batch_rows(&self, report: &mut Report, batch: &BatchLookups) {
        let ceiling = &batch.trivial_packed;
        let label = format!("BatchMayExist {LOOKUP_BATCH} keys, `keys`");
        report.rows.push(
            self.gate_row(&label, &batch.gate_keyed)
                .per_key_vs(ceiling, "trivial packed"),
        );
        report.rows.push(
            self.trivial_row(&label, &batch.trivial_keyed)
                .per_key_vs(ceiling, "trivial packed"),
        );
        let label = format!("BatchMayExist {LOOKUP_BATCH} keys, `packed_keys`");
        report.rows.push(
            self.gate_row(&label, &batch.gate_packed)
                .per_key_vs(ceiling, "trivial packed"),
        );
        report.rows.push(self.trivial_row(&label, ceiling));
        let (_, probes) = redisson_geometry(FILLED_KEYS, FALSE_POSITIVE_RATE);
        let label = format!("{LOOKUP_BATCH} keys × {probes} GETBIT, pipelined");
        report.rows.extend(
            self.redis_row(&label, batch.getbit.as_ref())
                .map(|row| row.throughput_vs(&batch.gate_packed, "gate packed")),
        );
    }

    /// Packed `BatchMayExist` against Redis `GETBIT` pipelines at each batch size of `SWEEP` (the plot):
    /// where batching stops paying, and how the gap to Redis changes with it. The `LOOKUP_BATCH` point is
    /// the batch comparison's.
    async fn batch_size_sweep(&self, report: &mut Report, batch: &BatchLookups) {
        println!("batch size sweep {SWEEP:?}: gate packed vs Redis GETBIT...");
        for size in SWEEP {
            let (gate_sample, redis_sample) = if size == LOOKUP_BATCH {
                (batch.gate_packed.clone(), batch.getbit.clone())
            } else {
                let gate = self.gate_side(|clients| {
                    batch_may_exist(clients, lookup_requests("", size, true), size)
                });
                let (mut samples, redis_sample) = self
                    .compare_with_redis(vec![gate], |c| getbit(c, size), SWEEP_STRETCH)
                    .await;
                (samples.remove(0), redis_sample)
            };
            report.sweep.push((size, gate_sample, redis_sample));
        }
    }

    /// `RecordAbsent` of a new key per call, gate against trivial tonic (server CPU per call), and what a
    /// cache of misses does instead, Redis `SET key "" NX EX 60`; returns the markers Redis now holds and
    /// its memory growth over them, which the tombstone-store step sets against tombstones'.
    async fn record_absent_writes(&self, report: &mut Report) -> RedisMarkers {
        println!("RecordAbsent vs Redis SET NX EX 60...");
        let used_memory_before = self.redis_used_memory().await;
        let markers = Arc::new(AtomicU64::new(0));
        let sides = self.gate_and_trivial(|clients| {
            record_absent(
                clients,
                "writes",
                WRITES,
                WRITE_CANDIDATES,
                Arc::new(AtomicU64::new(0)),
            )
        });
        let (writes, set) = self
            .compare_with_redis(
                sides.into(),
                |c| redis_set_nx(c, Arc::clone(&markers)),
                STRETCH,
            )
            .await;
        let used_memory_growth = self
            .redis_used_memory()
            .await
            .saturating_sub(used_memory_before);
        let label = "RecordAbsent (unary, new key each)";
        report.rows.push(
            self.gate_row(label, &writes[0])
                .per_call_vs(&writes[1], "trivial"),
        );
        report.rows.push(self.trivial_row(label, &writes[1]));
        report.rows.extend(
            self.redis_row(
                "SET key \"\" NX EX 60 (16 in flight per connection)",
                set.as_ref(),
            )
            .map(|row| row.throughput_vs(&writes[0], "gate RecordAbsent")),
        );
        RedisMarkers {
            set: markers.load(Ordering::Relaxed),
            used_memory_growth,
        }
    }

    /// Unary `MayExist` of keys holding a live tombstone: server CPU per call against the trivial server's
    /// unary lookups (`unary`, of the unary step), and Redis `GET` of the same keys' null markers, the
    /// lookup a cache of misses makes.
    async fn tombstoned_lookups(&self, report: &mut Report, unary: &[Sample]) {
        println!("tombstoned MayExist vs Redis GET of null markers...");
        let tomb_keys = self.record_tombstones_and_markers().await;
        report.tombstone_lookup_keys = tomb_keys.len();
        let gate = self.gate_side(|clients| {
            may_exist(
                clients,
                "tomb",
                Arc::clone(&tomb_keys),
                Some(Basis::Tombstone),
            )
        });
        let (tomb_lookups, get) = self
            .compare_with_redis(
                vec![gate],
                |c| redis_get(c, Arc::clone(&tomb_keys)),
                STRETCH,
            )
            .await;
        report.rows.push(
            self.gate_row("MayExist of tombstoned keys (unary)", &tomb_lookups[0])
                .per_call_vs(&unary[1], "trivial"),
        );
        report.rows.extend(
            self.redis_row(
                "GET null marker (16 in flight per connection)",
                get.as_ref(),
            )
            .map(|row| row.throughput_vs(&tomb_lookups[0], "gate tombstone MayExist")),
        );
    }

    /// Records a tombstone in `tomb` for each of `TOMBSTONE_LOOKUPS` keys and sets the same keys' null
    /// markers in Redis, so that every lookup of the tombstoned-lookup step finds one; returns the keys.
    async fn record_tombstones_and_markers(&self) -> Arc<Vec<Bytes>> {
        repeat(
            &record_absent(
                &self.gate_clients,
                "tomb",
                TOMB,
                TOMBSTONE_LOOKUPS,
                Arc::new(AtomicU64::new(0)),
            ),
            TOMBSTONE_LOOKUPS,
            "RecordAbsent into `tomb`",
        )
        .await;
        let tomb_keys = Arc::new(keys((0..TOMBSTONE_LOOKUPS).map(|i| TOMB + i)));
        if let Some(connections) = &self.redis_connections {
            let mut connection = connections[0].clone();
            let mut pipeline = redis::pipe();
            for key in tomb_keys.iter() {
                pipeline
                    .cmd("SET")
                    .arg(&key[..])
                    .arg("")
                    .arg("EX")
                    .arg(600)
                    .ignore();
            }
            let () = pipeline
                .query_async(&mut connection)
                .await
                .expect("SET markers");
        }
        tomb_keys
    }

    /// Tail latency of unary `MayExist` in `rot`, offered open loop at half the gate's capacity while Adds
    /// run and a window rotation passes (target 5: the rotation must not stall readers), and the trivial
    /// server at the same rate for the floor of the stack on this machine.
    async fn tail_latency(&self, report: &mut Report) {
        let rot_keys = Arc::new(keys((0..UNARY_POOL as u64).map(|j| {
            if j & 1 == 0 {
                ROT + j / 2
            } else {
                ABSENT + j
            }
        })));
        let lookups = may_exist(&self.gate_clients, "rot", Arc::clone(&rot_keys), None);
        let capacity = self.capacity(&lookups).await;
        let rate = capacity / 2.0;
        let now = unix_ms();
        let boundary = (now + 3_000).div_ceil(ROTATION_SPAN_MS) * ROTATION_SPAN_MS;
        let duration = Duration::from_millis(boundary + 5_000 - now);
        println!(
            "tail latency: MayExist at {rate:.0}/s (half of {capacity:.0}/s) for {:.1} s with Adds; rotation at +{:.1} s...",
            duration.as_secs_f64(),
            (boundary - now) as f64 / 1e3
        );
        let adder = add_to_rot_for(&self.gate_clients, duration);
        let (mut tail, timed) =
            drive::open_loop(rate, CONNECTIONS, duration, self.gate.pid(), &lookups).await;
        tail.sort();
        let add_latencies = adder.await.expect("the Add task panicked");
        let rot_stats = stats(&self.gate, "rot").await;
        let trivial = self.trivial_tail(rate, rot_keys).await;
        report.tail = Some(report::Tail {
            rate,
            capacity,
            rotation_at: (boundary - now) as f64 / 1e3,
            sample: tail,
            timed,
            adds: add_latencies,
            add_keys: ROTATION_ADD_KEYS,
            add_every: ADD_EVERY,
            trivial,
            windows: rot_stats.windows,
        });
    }

    /// The gate's closed-loop calls/s of `lookups`, measured right before the tail-latency run: the
    /// machine's other load changes over minutes.
    async fn capacity(&self, lookups: &Op) -> f64 {
        let pid = self.gate.pid();
        drive::closed_loop(CONNECTIONS, IN_FLIGHT, WARM_UP, pid, lookups).await;
        drive::closed_loop(CONNECTIONS, IN_FLIGHT, Duration::from_secs(2), pid, lookups)
            .await
            .calls_per_second()
    }

    /// The trivial server's latencies at the tail-latency run's `rate` (sorted).
    async fn trivial_tail(&self, rate: f64, rot_keys: Arc<Vec<Bytes>>) -> Sample {
        println!("tail latency: trivial tonic at the same rate...");
        let lookups = may_exist(&self.trivial_clients, "rot", rot_keys, None);
        let (mut tail, _) = drive::open_loop(
            rate,
            CONNECTIONS,
            Duration::from_secs(6),
            self.trivial.pid(),
            &lookups,
        )
        .await;
        tail.sort();
        tail
    }
}

// What the steps share: sides of comparisons, rows, Redis' memory.
impl Bench {
    /// The gate, driven by `op` on its connections.
    fn gate_side(&self, op: impl FnOnce(&Clients) -> Op) -> Side<'_> {
        Side {
            server: &self.gate,
            op: op(&self.gate_clients),
        }
    }

    /// The gate's and the trivial server's sides of a comparison, each driven by `op` on its connections.
    fn gate_and_trivial(&self, op: impl Fn(&Clients) -> Op) -> [Side<'_>; 2] {
        [
            self.gate_side(&op),
            Side {
                server: &self.trivial,
                op: op(&self.trivial_clients),
            },
        ]
    }

    /// Measures `sides` and, if Redis runs, Redis driven by `redis_op`, in alternating stretches; returns
    /// the samples of `sides` in order, and Redis' apart.
    async fn compare_with_redis<'a>(
        &'a self,
        mut sides: Vec<Side<'a>>,
        redis_op: impl FnOnce(&RedisConnections) -> Op,
        stretch: Duration,
    ) -> (Vec<Sample>, Option<Sample>) {
        let redis_index = sides.len();
        if let (Some(redis), Some(connections)) = (&self.redis, &self.redis_connections) {
            sides.push(Side {
                server: redis,
                op: redis_op(connections),
            });
        }
        let mut samples = compare(&sides, stretch).await;
        drop(sides);
        let redis = (samples.len() > redis_index).then(|| samples.remove(redis_index));
        (samples, redis)
    }

    /// A row of the gate's `sample`, with the gate's RSS now.
    fn gate_row(&self, workload: &str, sample: &Sample) -> Row {
        Row::new(workload, "gate", sample, self.gate.rss_bytes())
    }

    /// A row of the trivial server's `sample`, with its RSS now.
    fn trivial_row(&self, workload: &str, sample: &Sample) -> Row {
        Row::new(workload, "trivial tonic", sample, self.trivial.rss_bytes())
    }

    /// A row of Redis' `sample`, with its RSS now; `None` if Redis did not run.
    fn redis_row(&self, workload: &str, sample: Option<&Sample>) -> Option<Row> {
        let (sample, redis) = (sample?, self.redis.as_ref()?);
        Some(Row::new(workload, "redis", sample, redis.rss_bytes()))
    }

    /// Redis' `used_memory` (0 without Redis).
    async fn redis_used_memory(&self) -> u64 {
        let Some(connections) = &self.redis_connections else {
            return 0;
        };
        let mut connection = connections[0].clone();
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut connection)
            .await
            .expect("INFO memory");
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// One Add of `ROTATION_ADD_KEYS` new keys to `rot` every `ADD_EVERY` for `duration`: the writes beside the
/// tail-latency lookups (the first Add after the window boundary builds the new window). The task returns
/// the Adds' latencies, sorted.
fn add_to_rot_for(clients: &Clients, duration: Duration) -> JoinHandle<Vec<u64>> {
    let clients = Arc::clone(clients);
    let deadline = Instant::now() + duration;
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(ADD_EVERY);
        let mut client = clients[0].clone();
        let (mut next, mut latencies) = (1_000_000u64, Vec::new());
        while Instant::now() < deadline {
            ticks.tick().await;
            let request = AddRequest {
                namespace: "rot".to_string(),
                keys: keys((next..next + ROTATION_ADD_KEYS).map(|i| ROT + i)),
                ..Default::default()
            };
            let sent = Instant::now();
            client
                .add(request)
                .await
                .expect("Add during the latency run");
            latencies.push(sent.elapsed().as_nanos() as u64);
            next += ROTATION_ADD_KEYS;
        }
        latencies.sort_unstable();
        latencies
    })
}

// ---------------------------------------------------------------------------------------------------------
// Targets and output

/// Judges the tracker issue's targets, in its numbering, on what the steps measured.
fn judge_targets(report: &mut Report, unary: &[Sample], batch: &BatchLookups) {
    report.targets.push(batch.packed_ceiling_target());
    report.targets.push(unary_target(unary));
    report.targets.push(batch.keys_per_core_target());
    report.targets.extend(batch.redis_target());
    let tombstone_target = report.tombstones.as_ref().map(tombstone_memory_target);
    report.targets.extend(tombstone_target);
}

impl BatchLookups {
    /// Target 2: the gate's server CPU per key within 2x of the trivial server's with packed keys.
    fn packed_ceiling_target(&self) -> Target {
        let (gate_keyed, gate_packed) = (&self.gate_keyed, &self.gate_packed);
        let ceiling = &self.trivial_packed;
        Target::at_most(
            "2",
            "BatchMayExist (1,000 keys, `packed_keys`): server CPU per key within 2x of the trivial tonic handler's packed-bytes ceiling",
            gate_packed.server_us_per_key() / ceiling.server_us_per_key(),
            2.0,
            format!(
                "{:.4} µs vs {:.4} µs per key; with `keys` (repeated bytes): {:.4} µs, {:.2}x the packed ceiling ({:.2}x the trivial handler with `keys`)",
                gate_packed.server_us_per_key(),
                ceiling.server_us_per_key(),
                gate_keyed.server_us_per_key(),
                gate_keyed.server_us_per_key() / ceiling.server_us_per_key(),
                gate_keyed.server_us_per_key() / self.trivial_keyed.server_us_per_key(),
            ),
        )
    }

    /// Target 4a: 20M keys/s per server core with packed keys.
    fn keys_per_core_target(&self) -> Target {
        let (gate_keyed, gate_packed) = (&self.gate_keyed, &self.gate_packed);
        Target::at_most(
            "4a",
            "Batches: ≥ 20M keys/s per server core (≤ 0.045 µs server CPU per key), `packed_keys`, 1,000 keys",
            gate_packed.server_us_per_key(),
            0.045,
            format!(
                "{:.4} µs per key = {:.1}M keys/s per server core (`keys`: {:.4} µs = {:.1}M)",
                gate_packed.server_us_per_key(),
                gate_packed.keys_per_server_core_second() / 1e6,
                gate_keyed.server_us_per_key(),
                gate_keyed.keys_per_server_core_second() / 1e6
            ),
        )
    }

    /// Target 4b, if Redis ran: 5x the keys/s of Redis `GETBIT` pipelines.
    fn redis_target(&self) -> Option<Target> {
        let (gate_packed, getbit) = (&self.gate_packed, self.getbit.as_ref()?);
        Some(Target::at_least(
            "4b",
            "Batches: ≥ 5x the keys/s of a Redis GETBIT pipeline (Redisson RBloomFilter probes), same run",
            gate_packed.keys_per_second() / getbit.keys_per_second(),
            5.0,
            format!(
                "end to end {:.2}M vs {:.2}M keys/s; per server core {:.1}M vs {:.2}M keys/s ({:.0}x)",
                gate_packed.keys_per_second() / 1e6,
                getbit.keys_per_second() / 1e6,
                gate_packed.keys_per_server_core_second() / 1e6,
                getbit.keys_per_server_core_second() / 1e6,
                gate_packed.keys_per_server_core_second() / getbit.keys_per_server_core_second()
            ),
        ))
    }
}

/// Target 3: unary server CPU per call within 1.2x of the trivial server's (`unary` is gate, trivial).
fn unary_target(unary: &[Sample]) -> Target {
    Target::at_most(
        "3",
        "Unary MayExist: server CPU per call within 1.2x of the trivial tonic handler's",
        unary[0].server_us_per_call() / unary[1].server_us_per_call(),
        1.2,
        format!(
            "{:.2} µs vs {:.2} µs per call",
            unary[0].server_us_per_call(),
            unary[1].server_us_per_call()
        ),
    )
}

/// Target 4c: at most 40 bytes of RSS per tombstone.
fn tombstone_memory_target(memory: &report::TombstoneMemory) -> Target {
    let per_tombstone = memory.rss_delta as f64 / memory.stored.max(1) as f64;
    Target::at_most(
        "4c",
        "≤ 40 bytes per tombstone (RSS growth of a fresh server while its store fills to its bound)",
        per_tombstone,
        40.0,
        format!(
            "{per_tombstone:.1} B per tombstone by RSS, {:.1} B by table size; Redis null marker {:.1} B (used_memory)",
            memory.table_bytes as f64 / memory.stored.max(1) as f64,
            memory.redis_delta as f64 / memory.redis_markers.max(1) as f64
        ),
    )
}

/// Writes `benches/results/load.md` and the plot, and prints the report.
fn write_results(report: &mut Report, started: Instant) {
    report.elapsed = started.elapsed();
    let results = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results");
    std::fs::create_dir_all(&results).expect("benches/results");
    let markdown = report.markdown();
    std::fs::write(results.join("load.md"), &markdown).expect("writing load.md");
    report::plot(&report.sweep, &results.join("throughput-vs-batch.svg"))
        .expect("writing the plot");
    println!("\n{markdown}");
    println!(
        "written: {} and {} ({:.0} s)",
        results.join("load.md").display(),
        results.join("throughput-vs-batch.svg").display(),
        started.elapsed().as_secs_f64()
    );
}
