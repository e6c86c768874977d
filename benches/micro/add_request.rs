//! An `Add` of 1,000 16-byte keys (the size of a UUID) sent as `keys` (a protobuf field per key) and as
//! `packed_keys` (one field: each key preceded by its varint length): what the caller spends building and
//! encoding the request, and what the gate spends decoding it into its keys (`AddKeys`, the `Add` route's
//! reading of the request: every key into one packed buffer, as the `Add` hands them on), beside the
//! generated type's decoding (a `Bytes` per key) that it replaced. `cargo bench --bench add_request`;
//! figures in docs/performance.md.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use existence_gate::core::keys::PackedKeys;
use existence_gate::proto::AddRequest;
use existence_gate::service::request_keys::unpack_keys;
use existence_gate::service::request_keys::AddKeys;
// The load harness's keys: 16 random-looking bytes each, sliced from one buffer.
use existence_gate_testkit::keys;
use prost::Message;

const KEYS: usize = 1_000;

fn encode_keys(keys: &[Bytes]) -> Bytes {
    let request = AddRequest {
        keys: keys.to_vec(),
        ..Default::default()
    };
    request.encode_to_vec().into()
}

fn encode_packed(keys: &[Bytes]) -> Bytes {
    let request = AddRequest {
        packed_keys: keys::pack(keys),
        ..Default::default()
    };
    request.encode_to_vec().into()
}

/// The gate's side: the request read, then its keys as the `Add` hands them on.
fn read(body: &Bytes) -> PackedKeys {
    AddKeys::decode(body.clone())
        .unwrap()
        .into_parts(KEYS)
        .unwrap()
        .1
}

/// The generated type's decoding, as the gate did before `AddKeys`: a `Bytes` per key.
fn decode(body: &Bytes) -> Vec<Bytes> {
    let request = AddRequest::decode(body.clone()).unwrap();
    if request.packed_keys.is_empty() {
        return request.keys;
    }
    let packed = &request.packed_keys;
    unpack_keys(packed, KEYS)
        .unwrap()
        .into_iter()
        .map(|key| packed.slice_ref(key))
        .collect()
}

fn add_request(c: &mut Criterion) {
    let keys = keys::keys(0..KEYS as u64);
    let mut group = c.benchmark_group("add_1000_keys");
    group.throughput(Throughput::Elements(KEYS as u64));
    group.bench_function("caller_encodes_keys", |b| b.iter(|| encode_keys(&keys)));
    group.bench_function("caller_encodes_packed_keys", |b| {
        b.iter(|| encode_packed(&keys))
    });
    let (plain, packed) = (encode_keys(&keys), encode_packed(&keys));
    assert_eq!(
        decode(&plain),
        decode(&packed),
        "both forms carry the same keys"
    );
    assert_eq!(
        read(&plain),
        read(&packed),
        "both forms carry the same keys"
    );
    assert_eq!(read(&plain), PackedKeys::pack(&keys));
    group.bench_function("gate_reads_keys", |b| b.iter(|| read(&plain)));
    group.bench_function("gate_reads_packed_keys", |b| b.iter(|| read(&packed)));
    group.bench_function("generated_type_decodes_keys", |b| b.iter(|| decode(&plain)));
    group.bench_function("generated_type_decodes_packed_keys", |b| {
        b.iter(|| decode(&packed))
    });
    group.finish();
}

criterion_group!(benches, add_request);
criterion_main!(benches);
