// GatedReader against a real server: the read path, single flight, RecordAbsent, invalidations, resubscription,
// RESYNC, warming, and the rule for caching an absence.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');
const { GatedReader, AbsenceCache, Found, MISSING, DELETED, loadExistencePackage } = require('..');
const { startServer, eventually, opened, usersClient } = require('./server');

let server;
let stub;
const { track, closeAll } = opened();

/** The source of truth: rows by key; a deleted row is kept as a marker (a soft delete). */
class Database {
  constructor() {
    this.rows = new Map();
    this.reads = new Map();
    this.delayMs = 0;
  }

  async load(key) {
    if (this.delayMs > 0) await new Promise((resolve) => setTimeout(resolve, this.delayMs));
    this.reads.set(key, (this.reads.get(key) || 0) + 1);
    if (!this.rows.has(key)) return MISSING;
    const row = this.rows.get(key);
    return row === DELETED ? DELETED : Found(row);
  }

  readsOf(key) {
    return this.reads.get(key) || 0;
  }
}

/** A reader (live subscription) over its own client and database, on `address`. */
async function newReader(options = {}, address = server.address) {
  const client = track(usersClient(address));
  const db = new Database();
  const reader = track(new GatedReader(client, (key) => db.load(key), options));
  if (options.subscribe !== false) assert.equal(await reader.ready(), true, 'the subscription went live');
  return { client, db, reader };
}

/** The gate's own answer for `key` (answer and basis), through a plain stub. */
function gateAnswer(key) {
  return new Promise((resolve, reject) =>
    stub.MayExist({ namespace: 'users', key: Buffer.from(key) }, { deadline: Date.now() + 5000 }, (error, reply) =>
      error ? reject(error) : resolve(`${reply.answer} ${reply.basis}`),
    ),
  );
}

before(async () => {
  server = await startServer();
  const { ExistenceGate } = loadExistencePackage();
  stub = new ExistenceGate(server.address, grpc.credentials.createInsecure());
});

after(async () => {
  closeAll();
  if (stub) stub.close();
  if (server) await server.stop();
});

test('an absent key: no source read, cached, then a local hit without a gate call', async () => {
  const { db, reader } = await newReader();
  assert.equal(await reader.get('read:never'), undefined);
  assert.equal(db.readsOf('read:never'), 0);
  assert.equal(reader.isCachedAbsent('read:never'), true);
  const calls = reader.stats().gate_calls;
  assert.equal(await reader.get('read:never'), undefined);
  assert.equal(reader.stats().gate_calls, calls);
  assert.equal(reader.stats().cache_hits, 1);
  assert.equal(reader.stats().lookups, 1);
});

test('a found key is read from the source once per get, and not cached', async () => {
  const { db, reader } = await newReader();
  await reader.add(['read:found']); // the writer's Add before the insert
  db.rows.set('read:found', 'Ada');
  assert.equal(await reader.get('read:found'), 'Ada');
  assert.equal(db.readsOf('read:found'), 1);
  assert.equal(reader.stats().source_reads, 1);
  assert.equal(reader.isCachedAbsent('read:found'), false);
});

test('single flight: 8 concurrent gets of a slow key make one source read; an error is shared too', async () => {
  const { db, reader } = await newReader();
  await reader.add(['read:slow', 'read:broken']);
  db.rows.set('read:slow', 'Grace');
  db.delayMs = 300;
  const results = await Promise.all(Array.from({ length: 8 }, () => reader.get('read:slow')));
  db.delayMs = 0;
  assert.deepEqual(results, Array(8).fill('Grace'));
  assert.equal(db.readsOf('read:slow'), 1);
  assert.equal(reader.stats().source_reads, 1);
  // The 8 lookups went to the gate in one coalesced batch.
  assert.equal(reader.stats().gate_calls, 1);

  let calls = 0;
  const failing = track(
    new GatedReader(reader.client, async () => {
      calls++;
      await new Promise((resolve) => setTimeout(resolve, 100));
      throw new Error('source timeout');
    }),
  );
  const settled = await Promise.allSettled(Array.from({ length: 4 }, () => failing.get('read:broken')));
  assert.ok(settled.every((s) => s.status === 'rejected' && s.reason.message === 'source timeout'));
  assert.equal(calls, 1);
});

test('a missing key the gate knows: RecordAbsent RECORDED, the gate answers ABSENT, then a local hit', async () => {
  const { db, reader } = await newReader();
  await reader.add(['read:failed-insert']); // the Add succeeded, the insert did not
  // Its invalidation must arrive before the absence is cached, or it would (rightly) drop it.
  assert.ok(await eventually(() => reader.stats().invalidations >= 1), 'the Add\'s invalidation arrived');
  assert.equal(await reader.get('read:failed-insert'), undefined);
  assert.equal(db.readsOf('read:failed-insert'), 1);
  assert.equal(reader.stats().absences_recorded, 1);
  assert.equal(await gateAnswer('read:failed-insert'), 'ANSWER_ABSENT BASIS_TOMBSTONE');
  assert.equal(reader.isCachedAbsent('read:failed-insert'), true);
  assert.equal(await reader.get('read:failed-insert'), undefined);
  assert.equal(db.readsOf('read:failed-insert'), 1);
});

test('a deleted row is recorded as DELETED and cached', async () => {
  const { db, reader } = await newReader();
  await reader.add(['read:deleted']);
  // Its invalidation must arrive before the absence is cached, or it would (rightly) drop it.
  assert.ok(await eventually(() => reader.stats().invalidations >= 1), 'the Add\'s invalidation arrived');
  db.rows.set('read:deleted', DELETED);
  assert.equal(await reader.get('read:deleted'), undefined);
  assert.equal(await gateAnswer('read:deleted'), 'ANSWER_ABSENT BASIS_TOMBSTONE');
  assert.equal(reader.isCachedAbsent('read:deleted'), true);
});

test("another client's Add drops a cached absence (ADDED), and the new row is read", async () => {
  const { db, reader } = await newReader();
  assert.equal(await reader.get('read:later'), undefined);
  assert.equal(reader.isCachedAbsent('read:later'), true);
  const writer = track(usersClient(server.address));
  await writer.add(['read:later']);
  db.rows.set('read:later', 'Linus');
  assert.ok(await eventually(() => !reader.isCachedAbsent('read:later')), 'the ADDED invalidation arrived');
  assert.ok(reader.stats().invalidations >= 1);
  assert.equal(await reader.get('read:later'), 'Linus');
});

test('a dropped stream resubscribes after the last seq: an Add made in the gap is still delivered', async () => {
  const { db, reader } = await newReader();
  // Move the cursor past 0 so the resumption is by after_seq, not "from now on".
  const writer = track(usersClient(server.address));
  await writer.add(['read:gap-warmup']);
  assert.ok(await eventually(() => reader.cursor > 0));
  assert.equal(await reader.get('read:gap'), undefined);
  assert.equal(reader.isCachedAbsent('read:gap'), true);
  const resubscribes = reader.stats().resubscribes;
  reader.dropSubscription(); // as if the connection dropped
  await writer.add(['read:gap']); // lands while the reader is reconnecting (it waits 200 ms first)
  db.rows.set('read:gap', 'Barbara');
  assert.ok(await eventually(() => !reader.isCachedAbsent('read:gap')), 'the Add reached the reader');
  assert.ok(await eventually(() => reader.stats().resubscribes > resubscribes));
  assert.ok(await eventually(() => reader.live));
  assert.equal(await reader.get('read:gap'), 'Barbara');
});

test('an absence is cached only while the same subscription is live and has applied no later seq', async () => {
  // Before the subscription is live: not cached.
  const client = track(usersClient(server.address));
  const early = track(new GatedReader(client, async () => MISSING));
  assert.equal(await early.get('rule:early'), undefined);
  assert.equal(early.isCachedAbsent('rule:early'), false);
  assert.equal(await early.ready(), true);
  assert.equal(await early.get('rule:early'), undefined);
  assert.equal(early.isCachedAbsent('rule:early'), true);

  // The subscription drops while the lookup is in flight: not cached.
  const { reader } = await newReader();
  const lookup = reader.get('rule:dropped');
  reader.dropSubscription();
  assert.equal(await lookup, undefined);
  assert.equal(reader.isCachedAbsent('rule:dropped'), false);

  // The stream applied a seq beyond the answer's observed_seq: not cached.
  const { reader: ahead } = await newReader();
  ahead.applyInvalidation({ keys: [], seq: 1e12, cause: 'INVALIDATION_CAUSE_ADDED' });
  assert.equal(await ahead.get('rule:ahead'), undefined);
  assert.equal(ahead.isCachedAbsent('rule:ahead'), false);
});

test('RecordAbsent with an observed_seq the gate has not reached (a lagging replica) is swallowed: nothing cached', async () => {
  const { db, reader } = await newReader();
  await reader.add(['rule:lagging']);
  const answer = { mayExist: true, observedSeq: 1e12, warming: false, address: server.address };
  const epoch = reader.epoch;
  assert.equal(await reader._loadAndReport('rule:lagging', answer, epoch), undefined);
  assert.equal(db.readsOf('rule:lagging'), 1);
  assert.equal(reader.isCachedAbsent('rule:lagging'), false);
  assert.equal(reader.stats().absences_recorded, 0);
});

test('a row found while the gate was warming is Added with the next answer that is not', async () => {
  const { db, reader } = await newReader();
  db.rows.set('warm:legacy', 'Edsger');
  assert.match(await gateAnswer('warm:legacy'), /^ANSWER_ABSENT/);
  // This server is warm: the reader is fed such an answer (MAY_EXIST, warming, the seq loaded so far).
  const warming = { mayExist: true, observedSeq: 1, warming: true, address: server.address };
  assert.equal(await reader._loadAndReport('warm:legacy', warming, null), 'Edsger');
  assert.match(await gateAnswer('warm:legacy'), /^ANSWER_ABSENT/);
  assert.equal(reader.stats().pending_adds_sent, 0);
  await reader.get('warm:other'); // a real answer: not warming
  assert.match(await gateAnswer('warm:legacy'), /^ANSWER_MAY_EXIST/);
  assert.equal(reader.stats().pending_adds_sent, 1);
});

test('subscribe off: no local cache at all', async () => {
  const { reader } = await newReader({ subscribe: false });
  assert.equal(await reader.ready(50), false);
  assert.equal(await reader.get('off:never'), undefined);
  assert.equal(await reader.get('off:never'), undefined);
  assert.equal(reader.isCachedAbsent('off:never'), false);
  assert.equal(reader.stats().gate_calls, 2);
  assert.equal(reader.stats().cache_hits, 0);
});

test('a local absence expires after cacheTtlMs', async () => {
  const { reader } = await newReader({ cacheTtlMs: 50 });
  await reader.get('ttl:never');
  assert.equal(reader.isCachedAbsent('ttl:never'), true);
  assert.ok(await eventually(() => !reader.isCachedAbsent('ttl:never'), 5_000));
  await reader.get('ttl:never');
  assert.equal(reader.stats().gate_calls, 2);
});

test('AbsenceCache is a bounded LRU', () => {
  const cache = new AbsenceCache(2, 1000);
  cache.add('a', 0);
  cache.add('b', 0);
  assert.equal(cache.has('a', 1), true); // a is now the most recent
  cache.add('c', 1); // evicts b
  assert.equal(cache.has('b', 1), false);
  assert.equal(cache.has('a', 1), true);
  assert.equal(cache.has('c', 1), true);
  assert.equal(cache.has('c', 1001), false); // expired
  assert.equal(cache.size, 1);
});

test('RESYNC drops every cached absence', async () => {
  const { reader } = await newReader();
  await reader.get('resync:a');
  await reader.get('resync:b');
  assert.equal(reader.isCachedAbsent('resync:a'), true);
  const seq = (await reader.client.mayExist('resync:a')).observedSeq;
  reader.applyInvalidation({ keys: [], seq, cause: 'INVALIDATION_CAUSE_RESYNC' });
  assert.equal(reader.isCachedAbsent('resync:a'), false);
  assert.equal(reader.isCachedAbsent('resync:b'), false);
  assert.equal(reader.cursor, seq);
});

test('the server restarts (without its log) on the same address: the reader resumes, gets a RESYNC, and goes on', async () => {
  let first = await startServer();
  const address = first.address;
  let second = null;
  try {
    const { db, reader } = await newReader({}, address);
    const writer = track(usersClient(address));
    for (let i = 0; i < 5; i++) await writer.add([`restart:warmup:${i}`]);
    assert.ok(await eventually(() => reader.cursor >= 6));
    assert.equal(await reader.get('restart:a'), undefined);
    assert.equal(reader.isCachedAbsent('restart:a'), true);
    const invalidations = reader.stats().invalidations;
    await first.stop();
    first = null;
    assert.ok(await eventually(() => !reader.live), 'the stream ended with the server');
    second = await startServer({ listen: address });
    // The new server's log starts again: after_seq is ahead of it, so it answers RESYNC at its own seq.
    assert.ok(await eventually(() => reader.live), 'resubscribed to the new server');
    assert.ok(await eventually(() => reader.stats().invalidations > invalidations));
    assert.equal(reader.isCachedAbsent('restart:a'), false, 'the RESYNC dropped the cached absence');
    assert.ok(reader.cursor < 6, `the cursor follows the new server (${reader.cursor})`);
    assert.ok(reader.stats().resubscribes >= 1);
    // And it works on: an absence is cached again, and an Add on the new server invalidates it.
    assert.ok(await eventually(async () => (await reader.get('restart:b').then(() => reader.isCachedAbsent('restart:b'), () => false))));
    await eventually(() => writer.add(['restart:b']).then(() => true, () => false));
    db.rows.set('restart:b', 'Hedy');
    assert.ok(await eventually(() => !reader.isCachedAbsent('restart:b')));
    assert.equal(await reader.get('restart:b'), 'Hedy');
  } finally {
    if (first) await first.stop();
    if (second) await second.stop();
  }
});
