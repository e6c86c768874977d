// The interop scenario (tests/interop/README.md) from Node: @grpc/proto-loader loads proto/ at start-up and
// @grpc/grpc-js makes the client from it.
//
// Usage: node interop.js ADDR NAMESPACE
// Prints one line per check and a closing "node: N passed, N failed"; exits 1 on any failure.
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const health = require('grpc-health-check');

const PROTO_ROOT = path.resolve(__dirname, '../../../proto');
const WAIT_MS = 10_000; // how long to wait for a streamed message
const LOAD_OPTIONS = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };
// Lengths of the packed batch's long keys: most take a 2-byte varint (the server's max_key_bytes is 1,024).
const LONG_LENGTHS = [127, 128, 129, 255, 256, 300, 1000, 1024];
// Every namespace's seq before its first mutation (GENESIS_SEQ in src/log.rs): a fresh namespace answers at
// GENESIS, its first Add gets GENESIS + 1. Never 0, which in RecordAbsent means "not observed".
const GENESIS = 1;

let passed = 0;
let failed = 0;

function check(name, ok, detail = '') {
  if (ok) {
    passed++;
    console.log(`ok   ${name}`);
  } else {
    failed++;
    console.log(`FAIL ${name}: ${typeof detail === 'string' ? detail : JSON.stringify(detail)}`);
  }
  return ok;
}

function codeName(code) {
  return Object.keys(grpc.status).find((name) => grpc.status[name] === code) || String(code);
}

async function expectError(name, promise, code, needle) {
  try {
    await promise;
    check(name, false, `succeeded, want ${codeName(code)}`);
  } catch (error) {
    const details = error.details || '';
    check(
      name,
      error.code === code && details.includes(needle),
      `got ${codeName(error.code)} ${JSON.stringify(details)}, want ${codeName(code)} containing ${JSON.stringify(needle)}`,
    );
  }
}

/** Calls a unary method as a promise. */
function unary(client, method, request, options = {}) {
  return new Promise((resolve, reject) => {
    client[method](request, options, (error, reply) => (error ? reject(error) : resolve(reply)));
  });
}

/** Queues a server stream's messages and its end, for checks that wait with timeouts. */
class StreamReader {
  constructor(call) {
    this.call = call;
    this.items = [];
    this.waiters = [];
    this.headers = new Promise((resolve) => {
      call.on('metadata', resolve);
      call.on('status', resolve);
    });
    call.on('data', (message) => this.push(message));
    call.on('error', (error) => this.push({ error }));
    call.on('end', () => this.push({ end: true }));
  }

  push(item) {
    const waiter = this.waiters.shift();
    if (waiter) waiter(item);
    else this.items.push(item);
  }

  next(timeoutMs = WAIT_MS) {
    if (this.items.length > 0) return Promise.resolve(this.items.shift());
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.waiters.splice(this.waiters.indexOf(waiter), 1);
        resolve({ timeout: timeoutMs });
      }, timeoutMs);
      const waiter = (item) => {
        clearTimeout(timer);
        resolve(item);
      };
      this.waiters.push(waiter);
    });
  }

  cancel() {
    this.call.cancel();
  }
}

async function subscribe(gate, namespace, afterSeq) {
  const reader = new StreamReader(gate.SubscribeInvalidations({ namespace, after_seq: afterSeq }));
  // Headers arrive once the server has registered the subscription.
  await reader.headers;
  return reader;
}

function describe(item) {
  if (item && item.cause) {
    return `Invalidation(ns=${item.namespace}, seq=${item.seq}, cause=${item.cause}, keys=${item.keys.length})`;
  }
  return JSON.stringify(item && item.error ? { code: codeName(item.error.code), details: item.error.details } : item);
}

function invalidationIs(item, namespace, seq, cause, keys) {
  return (
    item &&
    item.namespace === namespace &&
    item.seq === seq &&
    item.cause === cause &&
    (keys === undefined ||
      (item.keys.length === keys.length && item.keys.every((key, i) => key.equals(Buffer.from(keys[i])))))
  );
}

const keysOf = (...texts) => texts.map((text) => Buffer.from(text));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const equal = (a, b) => JSON.stringify(a) === JSON.stringify(b);

/** BatchMayExist's packed_keys: each key preceded by its length as a protobuf (unsigned LEB128) varint. */
function packKeys(keys) {
  const parts = [];
  for (const key of keys) {
    const prefix = [];
    let length = key.length;
    while (length >= 0x80) {
      prefix.push(0x80 | (length & 0x7f));
      length >>>= 7;
    }
    prefix.push(length);
    parts.push(Buffer.from(prefix), key);
  }
  return Buffer.concat(parts);
}

/** The first n bits of may_exist_bitmap: bit i is byte i / 8, bit i % 8, least significant first. */
const bitsOf = (bitmap, n) => Array.from({ length: n }, (_, i) => (bitmap[i >> 3] >> (i & 7)) & 1);

/** The j-th long key of a kind, 127 to 1,024 bytes. */
const longKey = (kind, j) =>
  Buffer.from(`long-${kind}-${String(j).padStart(3, '0')}-`.padEnd(LONG_LENGTHS[j % LONG_LENGTHS.length], '.'));

async function run(addr, ns) {
  const definition = protoLoader.loadSync('existence/v1/existence.proto', { ...LOAD_OPTIONS, includeDirs: [PROTO_ROOT] });
  const existence = grpc.loadPackageDefinition(definition).existence.v1;
  const healthProto = grpc.loadPackageDefinition(protoLoader.loadSync(health.protoPath, LOAD_OPTIONS));
  const credentials = grpc.credentials.createInsecure();
  const gate = new existence.ExistenceGate(addr, credentials, { 'grpc.max_receive_message_length': 64 << 20 });
  const healthClient = new healthProto.grpc.health.v1.Health(addr, credentials);
  await new Promise((resolve, reject) =>
    gate.waitForReady(Date.now() + 10_000, (error) => (error ? reject(error) : resolve())),
  );
  const M = 'ANSWER_MAY_EXIST';
  const A = 'ANSWER_ABSENT';
  const mayExist = (key) => unary(gate, 'MayExist', { namespace: ns, key: Buffer.from(key) });
  const add = (...keys) => unary(gate, 'Add', { namespace: ns, keys: keysOf(...keys) });
  const recordAbsent = (request) => unary(gate, 'RecordAbsent', { namespace: ns, ...request });
  const streams = [];

  try {
    // Health, as load balancers ask it.
    for (const service of ['', 'existence.v1.ExistenceGate']) {
      const reply = await unary(healthClient, 'Check', { service }, { deadline: Date.now() + 5000 });
      check(`health "${service}" is SERVING`, reply.status === 'SERVING', reply);
    }
    await expectError(
      'health of an unknown service is NOT_FOUND',
      unary(healthClient, 'Check', { service: 'no.such.Service' }),
      grpc.status.NOT_FOUND,
      '',
    );

    // A fresh namespace starts empty at the genesis seq, 1.
    let reply = await mayExist('a');
    check(
      'fresh key is ABSENT by FILTER at seq 1 (genesis)',
      reply.answer === A && reply.basis === 'BASIS_FILTER' && reply.observed_seq === GENESIS,
      reply,
    );

    // A live subscription from now on.
    const live = await subscribe(gate, ns, 0);
    streams.push(live);
    let added = await add('a', 'b');
    check('Add gets seq 2', added.seq === GENESIS + 1 && added.tombstones_cleared === 0, added);
    added = await add('c');
    check('next Add gets seq 3', added.seq === GENESIS + 2, added);
    let item = await live.next();
    check(
      'live stream: ADDED seq 2 [a, b]',
      invalidationIs(item, ns, GENESIS + 1, 'INVALIDATION_CAUSE_ADDED', ['a', 'b']),
      describe(item),
    );
    item = await live.next();
    check(
      'live stream: ADDED seq 3 [c]',
      invalidationIs(item, ns, GENESIS + 2, 'INVALIDATION_CAUSE_ADDED', ['c']),
      describe(item),
    );
    reply = await mayExist('a');
    check(
      'added key MAY_EXIST by FILTER at seq 3',
      reply.answer === M && reply.basis === 'BASIS_FILTER' && reply.observed_seq === GENESIS + 2,
      reply,
    );

    // Resuming by after_seq is exact: after the first Add's seq comes the second Add. A seq the server never
    // issued gets RESYNC.
    const resumed = await subscribe(gate, ns, GENESIS + 1);
    item = await resumed.next();
    check(
      'resumed after_seq=2 (the first Add): ADDED seq 3 [c]',
      invalidationIs(item, ns, GENESIS + 2, 'INVALIDATION_CAUSE_ADDED', ['c']),
      describe(item),
    );
    resumed.cancel();
    const future = await subscribe(gate, ns, 1000);
    streams.push(future);
    item = await future.next();
    check(
      'after_seq=1000: RESYNC at the latest seq 3, no keys',
      invalidationIs(item, ns, GENESIS + 2, 'INVALIDATION_CAUSE_RESYNC', []),
      describe(item),
    );
    added = await add('d');
    check('Add gets seq 4', added.seq === GENESIS + 3, added);
    item = await future.next();
    check(
      'after RESYNC the stream continues: ADDED seq 4 [d]',
      invalidationIs(item, ns, GENESIS + 3, 'INVALIDATION_CAUSE_ADDED', ['d']),
      describe(item),
    );
    future.cancel();

    // Batches answer in request order, duplicates allowed, up to 10,000 keys.
    let batch = await unary(gate, 'BatchMayExist', { namespace: ns, keys: keysOf('a', 'zzz', 'c', 'a', 'd') });
    check(
      'batch answers in order with duplicates',
      equal(batch.answers, [M, A, M, M, M]) && batch.observed_seq === GENESIS + 3,
      batch,
    );
    batch = await unary(gate, 'BatchMayExist', { namespace: ns });
    check('empty batch gets no answers', batch.answers.length === 0, batch);
    const full = Array.from({ length: 10_000 }, (_, i) => Buffer.from(`batch-${String(i).padStart(5, '0')}`));
    added = await unary(gate, 'Add', { namespace: ns, keys: full.slice(0, 5_000) });
    check('Add of 5,000 keys gets seq 5', added.seq === GENESIS + 4, added);
    batch = await unary(gate, 'BatchMayExist', { namespace: ns, keys: full });
    check(
      'batch of 10,000: 10,000 answers at seq 5',
      batch.answers.length === 10_000 && batch.observed_seq === GENESIS + 4,
      `${batch.answers.length} answers, seq ${batch.observed_seq}`,
    );
    check('batch of 10,000: every added key MAY_EXIST', batch.answers.slice(0, 5_000).every((a) => a === M));
    const rest = batch.answers.slice(5_000);
    const falsePositives = rest.filter((a) => a === M).length;
    check(
      'batch of 10,000: under 200 false positives in 5,000',
      falsePositives < 200 && rest.every((a) => a === M || a === A),
      String(falsePositives),
    );

    // RecordAbsent outcomes.
    let rec = await recordAbsent({ key: Buffer.from('ghost'), kind: 'ABSENCE_KIND_MISSING', observed_seq: GENESIS + 4 });
    check(
      'RecordAbsent of a key the filter rules out: REDUNDANT, latest seq 5',
      rec.outcome === 'RECORD_OUTCOME_REDUNDANT' && rec.seq === GENESIS + 4 && rec.expires_in_ms === 0,
      rec,
    );
    await add('gone'); // seq 6
    const looked = await mayExist('gone');
    check('gone MAY_EXIST at seq 6', looked.answer === M && looked.observed_seq === GENESIS + 5, looked);
    rec = await recordAbsent({ key: Buffer.from('gone'), kind: 'ABSENCE_KIND_MISSING', observed_seq: looked.observed_seq });
    const recordedAt = Date.now();
    check(
      "RecordAbsent MISSING: RECORDED, seq 7, the namespace's 1 s TTL",
      rec.outcome === 'RECORD_OUTCOME_RECORDED' && rec.seq === GENESIS + 6 && rec.expires_in_ms === 1000,
      rec,
    );
    reply = await mayExist('gone');
    check(
      'tombstoned key ABSENT by TOMBSTONE at seq 7',
      reply.answer === A && reply.basis === 'BASIS_TOMBSTONE' && reply.observed_seq === GENESIS + 6,
      reply,
    );
    await add('del'); // seq 8
    rec = await recordAbsent({ key: Buffer.from('del'), kind: 'ABSENCE_KIND_DELETED', observed_seq: GENESIS + 7 });
    check(
      'RecordAbsent DELETED: RECORDED, seq 9, the 10 min deleted_ttl',
      rec.outcome === 'RECORD_OUTCOME_RECORDED' && rec.seq === GENESIS + 8 && rec.expires_in_ms === 600_000,
      rec,
    );
    added = await add('del');
    check(
      're-Add clears the tombstone: seq 10, tombstones_cleared 1',
      added.seq === GENESIS + 9 && added.tombstones_cleared === 1,
      added,
    );
    rec = await recordAbsent({ key: Buffer.from('del'), kind: 'ABSENCE_KIND_MISSING', observed_seq: GENESIS + 7 });
    check(
      'RecordAbsent observed before that Add: SUPERSEDED, latest seq 10',
      rec.outcome === 'RECORD_OUTCOME_SUPERSEDED' && rec.seq === GENESIS + 9 && rec.expires_in_ms === 0,
      rec,
    );
    reply = await mayExist('del');
    check('superseded key still MAY_EXIST', reply.answer === M, reply);
    rec = await recordAbsent({ key: Buffer.from('b'), kind: 'ABSENCE_KIND_UNSPECIFIED', ttl_seconds: 1_000_000 });
    check(
      'RecordAbsent with a huge TTL: RECORDED, seq 11, clamped to max_ttl 1 h',
      rec.outcome === 'RECORD_OUTCOME_RECORDED' && rec.seq === GENESIS + 10 && rec.expires_in_ms === 3_600_000,
      rec,
    );

    // The 1 s tombstone expires.
    await sleep(Math.max(0, recordedAt + 1300 - Date.now()));
    reply = await mayExist('gone');
    check(
      'after its TTL the tombstone is gone: MAY_EXIST by FILTER at seq 11',
      reply.answer === M && reply.basis === 'BASIS_FILTER' && reply.observed_seq === GENESIS + 10,
      reply,
    );

    // Errors: precise statuses and messages, no state change.
    const INVALID = grpc.status.INVALID_ARGUMENT;
    await expectError('empty key: INVALID_ARGUMENT', mayExist(''), INVALID, 'key is empty');
    await expectError(
      '1,025-byte key: INVALID_ARGUMENT naming max_key_bytes',
      mayExist('x'.repeat(1025)),
      INVALID,
      'max_key_bytes = 1024',
    );
    await expectError(
      'Add with an empty key at index 1: INVALID_ARGUMENT keys[1]',
      add('ok', '', 'ok'),
      INVALID,
      'keys[1] is empty',
    );
    const over = Array.from({ length: 10_001 }, (_, i) => Buffer.from(`k${i}`));
    await expectError(
      'batch of 10,001 keys: INVALID_ARGUMENT naming max_batch_keys',
      unary(gate, 'BatchMayExist', { namespace: ns, keys: over }),
      INVALID,
      'max_batch_keys = 10000',
    );
    await expectError(
      'unknown AbsenceKind 9: INVALID_ARGUMENT',
      recordAbsent({ key: Buffer.from('k'), kind: 9 }),
      INVALID,
      'kind 9',
    );
    await expectError(
      'RecordAbsent with an observed_seq ahead of the latest seq: INVALID_ARGUMENT naming both',
      recordAbsent({ key: Buffer.from('a'), kind: 'ABSENCE_KIND_MISSING', observed_seq: GENESIS + 11 }),
      INVALID,
      `observed_seq ${GENESIS + 11} is ahead of namespace "${ns}"'s latest seq ${GENESIS + 10}`,
    );
    // A body that does not decode: field 1 (namespace) holding the byte 0xff, which is not UTF-8, sent as raw
    // bytes (identity serializers) on MayExist's method.
    const undecodable = new Promise((resolve, reject) => {
      const raw = (body) => body;
      const body = Buffer.from([0x0a, 0x01, 0xff]);
      gate.makeUnaryRequest('/existence.v1.ExistenceGate/MayExist', raw, raw, body, (error, reply) =>
        error ? reject(error) : resolve(reply),
      );
    });
    await expectError(
      'request body that does not decode (namespace not UTF-8): INVALID_ARGUMENT',
      undecodable,
      INVALID,
      'failed to decode Protobuf message',
    );
    await expectError(
      'unknown namespace: NOT_FOUND naming it',
      unary(gate, 'MayExist', { namespace: 'no_such_namespace', key: Buffer.from('k') }),
      grpc.status.NOT_FOUND,
      '"no_such_namespace"',
    );
    const unknown = new StreamReader(
      gate.SubscribeInvalidations({ namespace: 'no_such_namespace' }, { deadline: Date.now() + WAIT_MS }),
    );
    item = await unknown.next();
    await expectError(
      'subscription to an unknown namespace: NOT_FOUND naming it',
      item.error ? Promise.reject(item.error) : Promise.resolve(item),
      grpc.status.NOT_FOUND,
      '"no_such_namespace"',
    );
    reply = await mayExist('a');
    check('refused requests used no seq', reply.observed_seq === GENESIS + 10, reply);

    // A client deadline ends a quiet stream with DEADLINE_EXCEEDED.
    const started = Date.now();
    const quiet = new StreamReader(gate.SubscribeInvalidations({ namespace: ns }, { deadline: Date.now() + 300 }));
    item = await quiet.next();
    await expectError(
      'subscription with a 300 ms deadline: DEADLINE_EXCEEDED',
      item.error ? Promise.reject(item.error) : Promise.resolve(item),
      grpc.status.DEADLINE_EXCEEDED,
      '',
    );
    const elapsed = Date.now() - started;
    check('the deadline ended the stream in time', elapsed >= 250 && elapsed < 5000, `${elapsed} ms`);

    // The live stream saw exactly one ADDED per Add, in seq order (tombstones emit nothing).
    const seqs = [GENESIS + 1, GENESIS + 2];
    for (;;) {
      const next = await live.next(1000);
      if (!next.cause) break;
      seqs.push(next.seq);
    }
    check(
      'live stream: one ADDED per Add seq (2, 3, 4, 5, 6, 8, 10)',
      equal(seqs, [1, 2, 3, 4, 5, 7, 9].map((n) => GENESIS + n)),
      seqs,
    );

    // Packed batches: packed_keys in, may_exist_bitmap out.
    const head = packKeys(keysOf('a', 'x'.repeat(300))).subarray(0, 4);
    check(
      'packing: each key preceded by its varint length (300 = ac 02)',
      head.equals(Buffer.from([0x01, 0x61, 0xac, 0x02])),
      head.toString('hex'),
    );
    const longAdded = Array.from({ length: 100 }, (_, j) => longKey('added', j));
    const longNever = Array.from({ length: 100 }, (_, j) => longKey('never', j));
    added = await unary(gate, 'Add', { namespace: ns, keys: [...longAdded, Buffer.from('packed-tomb')] });
    check('Add of 100 long keys and packed-tomb gets seq 12', added.seq === GENESIS + 11, added);
    // 10,000 keys alternating added (even positions) and never added (odd positions).
    const addedKeys = [...longAdded, ...keysOf('a', 'c', 'd', 'gone', 'del'), ...full.slice(0, 4_895)];
    const neverKeys = [...longNever, ...full.slice(5_000, 9_900)];
    const mixed = addedKeys.flatMap((key, i) => [key, neverKeys[i]]);
    batch = await unary(gate, 'BatchMayExist', { namespace: ns, packed_keys: packKeys(mixed) });
    const bitmap = batch.may_exist_bitmap;
    if (
      !check(
        'packed batch of 10,000: a 1,250-byte bitmap at seq 12, no answers',
        bitmap.length === 1_250 && batch.observed_seq === GENESIS + 11 && batch.answers.length === 0,
        `${bitmap.length} bytes, seq ${batch.observed_seq}, ${batch.answers.length} answers`,
      )
    ) {
      throw new Error('packed batch of 10,000: no bitmap to check');
    }
    const packedBits = bitsOf(bitmap, mixed.length);
    const zeroAt = packedBits.flatMap((bit, i) => (i % 2 === 0 && bit === 0 ? [i] : []));
    check(
      "packed batch of 10,000: every added key's bit is 1, 127- to 1,024-byte keys included",
      zeroAt.length === 0,
      `zero bits at ${zeroAt.slice(0, 10)}`,
    );
    const packedFalsePositives = packedBits.filter((bit, i) => i % 2 === 1 && bit === 1).length;
    check(
      'packed batch of 10,000: under 200 false positives in 5,000',
      packedFalsePositives < 200,
      String(packedFalsePositives),
    );
    batch = await unary(gate, 'BatchMayExist', { namespace: ns, keys: mixed });
    const disagree = batch.answers.flatMap((a, i) => ((a === M ? 1 : 0) === packedBits[i] ? [] : [i]));
    check(
      'packed batch of 10,000: the bitmap agrees key for key with the same keys sent as keys',
      batch.answers.length === 10_000 && batch.observed_seq === GENESIS + 11 && disagree.length === 0,
      `${batch.answers.length} answers at seq ${batch.observed_seq}; disagree at ${disagree.slice(0, 10)}`,
    );

    // Tombstones drive bits to 0: b was recorded absent (seq 11), packed-tomb is about to be.
    const tombBatch = keysOf('a', 'packed-tomb', 'c', 'b', 'd', 'packed-tomb', 'gone', 'del', 'packed-tomb', 'a');
    batch = await unary(gate, 'BatchMayExist', { namespace: ns, packed_keys: packKeys(tombBatch) });
    check(
      'packed batch of 10: 2 bytes, tombstoned b is 0, packed-tomb is 1',
      batch.may_exist_bitmap.length === 2 &&
        batch.observed_seq === GENESIS + 11 &&
        equal(bitsOf(batch.may_exist_bitmap, 10), [1, 1, 1, 0, 1, 1, 1, 1, 1, 1]),
      `${batch.may_exist_bitmap.toString('hex')} at seq ${batch.observed_seq}`,
    );
    rec = await recordAbsent({
      key: Buffer.from('packed-tomb'),
      kind: 'ABSENCE_KIND_DELETED',
      observed_seq: GENESIS + 11,
    });
    check(
      'RecordAbsent packed-tomb DELETED: RECORDED, seq 13',
      rec.outcome === 'RECORD_OUTCOME_RECORDED' && rec.seq === GENESIS + 12,
      rec,
    );
    batch = await unary(gate, 'BatchMayExist', { namespace: ns, packed_keys: packKeys(tombBatch) });
    check(
      'packed batch of 10 after RecordAbsent: every packed-tomb bit is 0, at seq 13',
      batch.may_exist_bitmap.length === 2 &&
        batch.observed_seq === GENESIS + 12 &&
        equal(bitsOf(batch.may_exist_bitmap, 10), [1, 0, 1, 0, 1, 0, 1, 1, 0, 1]),
      `${batch.may_exist_bitmap.toString('hex')} at seq ${batch.observed_seq}`,
    );
    batch = await unary(gate, 'BatchMayExist', { namespace: ns, keys: tombBatch });
    check(
      'the same 10 keys sent as keys: the same answers',
      equal(batch.answers, [M, A, M, A, M, A, M, M, A, M]),
      batch.answers,
    );

    // Malformed packings: INVALID_ARGUMENT naming the problem, no state change.
    const packedBatch = (packed, keys = []) =>
      unary(gate, 'BatchMayExist', { namespace: ns, keys, packed_keys: packed });
    await expectError(
      'keys and packed_keys both set: INVALID_ARGUMENT',
      packedBatch(packKeys(keysOf('a')), keysOf('a')),
      INVALID,
      'send keys or packed_keys, not both',
    );
    await expectError(
      'packing ending inside a varint: INVALID_ARGUMENT naming the byte',
      packedBatch(Buffer.concat([packKeys(keysOf('a')), Buffer.from([0x80])])),
      INVALID,
      'packed_keys has a malformed length at byte 2',
    );
    const whole = packKeys(keysOf('a', 'c', 'y'.repeat(128)));
    await expectError(
      'packing whose last length runs past the end: INVALID_ARGUMENT naming key and bytes',
      packedBatch(whole.subarray(0, whole.length - 1)),
      INVALID,
      'packed_keys[2] at byte 4 claims 128 bytes, but only 127 remain',
    );
    await expectError(
      'packing with an empty key at index 1: INVALID_ARGUMENT keys[1]',
      packedBatch(packKeys(keysOf('a', '', 'c'))),
      INVALID,
      'keys[1] is empty',
    );
    await expectError(
      'packing with a 1,025-byte key: INVALID_ARGUMENT naming max_key_bytes',
      packedBatch(packKeys(keysOf('a', 'x'.repeat(1025)))),
      INVALID,
      'keys[1] is 1025 bytes; the limit is max_key_bytes = 1024',
    );
    await expectError(
      'packing of 10,001 keys: INVALID_ARGUMENT naming max_batch_keys',
      packedBatch(packKeys(over)),
      INVALID,
      'max_batch_keys = 10000',
    );
    reply = await mayExist('a');
    check('refused packed batches used no seq', reply.observed_seq === GENESIS + 12, reply);
  } finally {
    for (const stream of streams) stream.cancel();
    gate.close();
    healthClient.close();
  }
}

async function main() {
  if (process.argv.length !== 4) {
    console.error('usage: node interop.js ADDR NAMESPACE');
    process.exit(2);
  }
  try {
    await run(process.argv[2], process.argv[3]);
  } catch (error) {
    check('scenario ran to the end', false, String(error && error.stack ? error.stack : error));
  }
  console.log(`node: ${passed} passed, ${failed} failed`);
  process.exit(failed > 0 || passed === 0 ? 1 : 0);
}

main();
