//! The calls the load run makes: gRPC `MayExist`, `BatchMayExist` and `RecordAbsent` of the gate (and the
//! trivial server of the same contract), and the Redis operations set beside them — `GETBIT` probes of a
//! Redisson-style bitmap, `GET`s of a cache of misses, `SET NX` markers — each as a [`drive::Op`].

use super::*;

/// Unary `MayExist` of `keys` in `namespace`; with `want`, an answer on another basis is an error.
pub(crate) fn may_exist(
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
pub(crate) fn batch_may_exist(
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
pub(crate) fn lookup_requests(
    namespace: &str,
    batch: usize,
    packed: bool,
) -> Arc<Vec<BatchMayExistRequest>> {
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
pub(crate) fn absent_requests(namespace: &str, batch: usize) -> Arc<Vec<BatchMayExistRequest>> {
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
pub(crate) fn record_absent(
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
pub(crate) async fn fill_redis_bitmap(connection: &mut MultiplexedConnection) -> (u64, u32) {
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
pub(crate) fn redisson_indexes(key: &[u8], probes: u32, size: u64) -> impl Iterator<Item = u64> {
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
pub(crate) fn redisson_geometry(keys: u64, p: f64) -> (u64, u32) {
    let ln2 = std::f64::consts::LN_2;
    let bits = (-(keys as f64) * p.ln() / (ln2 * ln2)) as u64;
    let probes = ((bits as f64 / keys as f64 * ln2).round() as u32).max(1);
    (bits, probes)
}

/// Redis `GETBIT` pipelines (k per key) cycling through prebuilt pipelines of `batch` keys each.
pub(crate) fn getbit(connections: &RedisConnections, batch: usize) -> Op {
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
pub(crate) fn redis_get(connections: &RedisConnections, keys: Arc<Vec<Bytes>>) -> Op {
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
pub(crate) fn redis_set_nx(connections: &RedisConnections, next: Arc<AtomicU64>) -> Op {
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
