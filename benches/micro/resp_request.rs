//! The RESP port's request reader beside `redis-protocol` 6 (the most used RESP codec crate) on what Redis
//! clients send: pipelines of `BF.EXISTS` (16 deep, as `redis-benchmark -P 16`) and one `BF.MEXISTS` of 100
//! keys. Both read from a `BytesMut` and hand out the arguments as `Bytes` slices of it (no copy), as the
//! port needs them. `cargo bench --bench resp_request`; figures in docs/resp.md.

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use existence_gate::service::resp::request::{take_command, RequestLimits};
use redis_protocol::resp2::decode::decode_bytes_mut;
use redis_protocol::resp2::types::BytesFrame;

const LIMITS: RequestLimits = RequestLimits {
    max_args: 10_016,
    max_arg_bytes: 4_096,
    max_inline_bytes: 65_536,
    unauthenticated: false,
};

fn encode(args: &[&[u8]], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

fn key(i: usize) -> Vec<u8> {
    format!("user:{i:010}").into_bytes()
}

/// Every command in `input` with the port's reader.
fn ours(mut input: BytesMut) -> usize {
    let mut args = 0;
    while let Some(command) = take_command(&mut input, &LIMITS).unwrap() {
        args += command.len();
    }
    args
}

/// Every command in `input` with redis-protocol's, its arguments gathered as the port would need them.
fn theirs(mut input: BytesMut) -> usize {
    let mut args = 0;
    while let Some((frame, _, _)) = decode_bytes_mut(&mut input).unwrap() {
        let BytesFrame::Array(frames) = frame else {
            panic!("a request is an array");
        };
        let command: Vec<Bytes> = frames
            .into_iter()
            .map(|f| match f {
                BytesFrame::BulkString(b) => b,
                _ => panic!("arguments are bulk strings"),
            })
            .collect();
        args += command.len();
    }
    args
}

fn bench(c: &mut Criterion) {
    let mut pipeline = Vec::new();
    for i in 0..16 {
        encode(&[b"BF.EXISTS", b"users", &key(i)], &mut pipeline);
    }
    let keys: Vec<Vec<u8>> = (0..100).map(key).collect();
    let mut mexists = Vec::new();
    let mut args: Vec<&[u8]> = vec![b"BF.MEXISTS", b"users"];
    args.extend(keys.iter().map(|k| k.as_slice()));
    encode(&args, &mut mexists);

    for (name, input, commands) in [
        ("16 pipelined BF.EXISTS", &pipeline, 16u64),
        ("BF.MEXISTS of 100 keys", &mexists, 1),
    ] {
        assert_eq!(
            ours(BytesMut::from(&input[..])),
            theirs(BytesMut::from(&input[..]))
        );
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Elements(commands));
        group.bench_function("take_command (ours)", |b| {
            b.iter_batched(|| BytesMut::from(&input[..]), ours, BatchSize::SmallInput)
        });
        group.bench_function("redis-protocol 6", |b| {
            b.iter_batched(|| BytesMut::from(&input[..]), theirs, BatchSize::SmallInput)
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
