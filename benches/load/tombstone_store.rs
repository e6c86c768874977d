//! The tombstone store, measured in a second, fresh gate: its memory as it fills to its bound, set against
//! Redis' null markers, and lookups that probe it and miss, before and after evictions.

use super::*;

/// Redis' null markers of the write comparison: a cache of misses keeps one where the gate keeps a
/// tombstone, so their memory is set against the store's.
pub(crate) struct RedisMarkers {
    /// `SET NX` calls made, each of a fresh key.
    pub(crate) set: u64,
    /// Growth of Redis' `used_memory` over them.
    pub(crate) used_memory_growth: u64,
}

/// A second, fresh gate whose only work is the tombstone store: its RSS growth while the store fills to its
/// bound is the store's memory; then lookups of never-added keys (which probe the store and miss) are
/// measured against a namespace without tombstones, before and after half a store's worth of evictions.
/// The store's memory goes into the report beside `redis_markers`, the same thing kept in Redis.
pub(crate) async fn tombstone_store(report: &mut Report, redis_markers: RedisMarkers) {
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
pub(crate) async fn warm_up_without_tombstones(server: &Server, clients: &Clients) {
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
pub(crate) async fn fill_store(server: &Server, record: &Op) -> (u64, NamespaceStats) {
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
pub(crate) async fn store_lookups(
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
