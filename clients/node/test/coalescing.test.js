// GateClient against a real server: coalescing, unary lookups with the window at 0, direct batches, invalid input.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');
const { GateClient, loadExistencePackage, MAX_KEY_BYTES } = require('..');
const { startServer, stalledAddress, DEADLINE_MS, usersClient, opened } = require('./server');

let server;
let stalled;
const { track, closeAll } = opened();

function client(options = {}) {
  return track(usersClient(server.address, options));
}

/** The server's unary MayExist answer for `key`, through a plain stub. */
function unaryAnswer(stub, key) {
  return new Promise((resolve, reject) =>
    stub.MayExist({ namespace: 'users', key: Buffer.from(key) }, { deadline: Date.now() + 5000 }, (error, reply) =>
      error ? reject(error) : resolve(reply.answer !== 'ANSWER_ABSENT'),
    ),
  );
}

let stub;
const added = Array.from({ length: 32 }, (_, i) => `coalesce:added:${i}`);
const neverAdded = Array.from({ length: 32 }, (_, i) => `coalesce:never:${i}`);

before(async () => {
  server = await startServer();
  stalled = await stalledAddress();
  const { ExistenceGate } = loadExistencePackage();
  stub = new ExistenceGate(server.address, grpc.credentials.createInsecure());
  await client().add(added);
});

after(async () => {
  closeAll();
  if (stub) stub.close();
  if (stalled) await stalled.close();
  if (server) await server.stop();
});

test('64 concurrent single-key lookups share batches and match the unary answers key for key', async () => {
  const c = client(); // the default window: 200 µs
  const keys = [];
  for (let i = 0; i < 32; i++) keys.push(added[i], neverAdded[i]);
  const batchesBefore = await server.metric('BatchMayExist');
  const answers = await Promise.all(keys.map((key) => c.mayExist(key)));
  const expected = await Promise.all(keys.map((key) => unaryAnswer(stub, key)));
  assert.deepEqual(
    answers.map((a) => a.mayExist),
    expected,
  );
  // A never-added key of a namespace with few keys is absent (false positives aside, which both agree on).
  assert.ok(expected.filter((e) => !e).length >= 28, `most never-added keys are absent: ${expected}`);
  for (const a of answers) {
    assert.equal(typeof a.observedSeq, 'number');
    assert.ok(a.observedSeq >= 2);
    assert.equal(a.warming, false);
    assert.equal(a.address, server.address);
  }
  const stats = c.stats();
  assert.equal(stats.lookups, 64);
  assert.ok(stats.gate_calls < stats.lookups, JSON.stringify(stats));
  assert.equal(stats.batched_keys, 64);
  assert.equal((await server.metric('BatchMayExist')) - batchesBefore, stats.gate_calls);
});

test('coalescing off (window 0): each lookup is a unary MayExist', async () => {
  const c = client({ coalesceWindowMs: 0 });
  const before = { unary: await server.metric('MayExist'), batch: await server.metric('BatchMayExist') };
  const keys = [...added.slice(0, 8), ...neverAdded.slice(0, 8)];
  const answers = await Promise.all(keys.map((key) => c.mayExist(key)));
  const expected = await Promise.all(keys.map((key) => unaryAnswer(stub, key)));
  assert.deepEqual(
    answers.map((a) => a.mayExist),
    expected,
  );
  assert.deepEqual(c.stats(), { lookups: 16, gate_calls: 16, batched_keys: 0, retries: 0, absences_recorded: 0 });
  assert.equal((await server.metric('MayExist')) - before.unary, 16 + 16); // ours, and the 16 reference calls
  assert.equal(await server.metric('BatchMayExist'), before.batch);
});

test('a batch is sent as soon as it holds coalesceMaxKeys keys, without waiting for the window', async () => {
  const c = client({ coalesceWindowMs: 10_000, coalesceMaxKeys: 8 });
  const started = Date.now();
  const answers = await Promise.all(added.slice(0, 16).map((key) => c.mayExist(key)));
  assert.ok(Date.now() - started < 5_000, 'the 10 s window was not waited for');
  assert.ok(answers.every((a) => a.mayExist));
  assert.equal(c.stats().gate_calls, 2);
  assert.equal(c.stats().batched_keys, 16);
});

test('a lone caller does not wait for the window: it leaves at once when no batch is in flight', async () => {
  // A window far beyond the deadline: only "nothing in flight, so leave now" answers in time.
  const c = client({ coalesceWindowMs: 3_600_000, deadlineMs: 10_000 });
  for (let i = 0; i < 5; i++) assert.equal((await c.mayExist(neverAdded[i])).mayExist, false);
  assert.deepEqual(c.stats(), { lookups: 5, gate_calls: 5, batched_keys: 5, retries: 0, absences_recorded: 0 });
});

/**
 * A client whose first address never answers: its first lookup stays in flight there for half of `blockerMs`
 * (then it would move on to the live server; each test ends well before), so callers queued meanwhile leave by
 * the window (or coalesceMaxKeys). Round robin sends them to the server.
 */
async function withBatchInFlight(options, blockerMs) {
  const c = track(usersClient([stalled.address, server.address], options));
  let blockerDone = false;
  const blocker = c.mayExist('coalesce:blocker', { deadlineMs: blockerMs }).then(
    () => assert.fail('the stalled address answered'),
    (error) => {
      blockerDone = true;
      return error;
    },
  );
  await new Promise((resolve) => setImmediate(resolve)); // the blocker has left
  assert.equal(c.stats().gate_calls, 1);
  return { c, blocker, blockerDone: () => blockerDone };
}

test('while a batch is in flight, a window of 1 ms or more (setTimeout) gathers lookups across turns', async () => {
  const { c, blocker, blockerDone } = await withBatchInFlight({ coalesceWindowMs: 300 }, 10_000);
  const lookups = [];
  for (let i = 0; i < 8; i++) {
    lookups.push(c.mayExist(added[i]));
    await new Promise((resolve) => setImmediate(resolve));
  }
  const answers = await Promise.all(lookups);
  assert.equal(blockerDone(), false, 'the window, not the answer in flight, sent them');
  assert.ok(answers.every((a) => a.mayExist));
  assert.deepEqual(c.stats(), { lookups: 9, gate_calls: 2, batched_keys: 9, retries: 0, absences_recorded: 0 });
  c.close(); // ends the blocker
  await blocker;
});

test('while a batch is in flight, the sub-millisecond window (setImmediate loop) sends the next one', async () => {
  // The lookups' 10 s deadline is shorter than the blocker's: only the window sends them in time.
  const { c, blocker, blockerDone } = await withBatchInFlight({}, 30_000); // the default 200 µs
  // One synchronous run (one batch: round robin sends it to the server; a second batch would go to the
  // stalled address).
  const answers = await Promise.all(neverAdded.slice(0, 8).map((key) => c.mayExist(key)));
  assert.equal(blockerDone(), false, 'the window, not the answer in flight, sent them');
  assert.deepEqual(
    answers.map((a) => a.mayExist),
    await Promise.all(neverAdded.slice(0, 8).map((key) => unaryAnswer(stub, key))),
  );
  assert.deepEqual(c.stats(), { lookups: 9, gate_calls: 2, batched_keys: 9, retries: 0, absences_recorded: 0 });
  c.close();
  await blocker;
});

test('concurrent mayExistMany calls share batches and each gets the uncoalesced answers', async () => {
  const keys = Array.from({ length: 1000 }, (_, i) => `many:shared:${i}`);
  const writer = client({ coalesceWindowMs: 0 });
  await writer.add(keys.filter((_, i) => i % 3 === 0));
  const expected = (await writer.mayExistMany(keys)).map((a) => a.mayExist);
  assert.ok(expected.filter((e) => e).length >= 334);
  assert.equal(writer.stats().gate_calls, 1); // the direct batch (an Add is not a lookup RPC)
  const c = client();
  const parts = Array.from({ length: 10 }, (_, p) => keys.slice(p * 100, p * 100 + 100));
  const answers = await Promise.all(parts.map((part) => c.mayExistMany(part)));
  answers.forEach((part, p) => {
    assert.deepEqual(
      part.map((a) => a.mayExist),
      expected.slice(p * 100, p * 100 + 100),
      `part ${p}`,
    );
  });
  const stats = c.stats();
  assert.equal(stats.batched_keys, 1000);
  assert.equal(stats.lookups, 0);
  assert.ok(stats.gate_calls < 10, JSON.stringify(stats));
});

test('mayExistMany parts and single lookups share a batch; each caller gets its own bits', async () => {
  const c = client({ coalesceWindowMs: 60_000 });
  const part = [added[3], neverAdded[3], added[4], neverAdded[4]];
  const [single1, many, single2] = await Promise.all([
    c.mayExist(neverAdded[5]),
    c.mayExistMany(part),
    c.mayExist(added[5]),
  ]);
  assert.equal(single1.mayExist, await unaryAnswer(stub, neverAdded[5]));
  assert.deepEqual(
    many.map((a) => a.mayExist),
    await Promise.all(part.map((key) => unaryAnswer(stub, key))),
  );
  assert.equal(single2.mayExist, true);
  assert.deepEqual(c.stats(), { lookups: 2, gate_calls: 1, batched_keys: 6, retries: 0, absences_recorded: 0 });
});

test('mayExistMany with a key that cannot be coalesced sends its part alone and keeps the status', async () => {
  const c = client();
  await assert.rejects(c.mayExistMany([added[0], '']), (error) => error.code === grpc.status.INVALID_ARGUMENT);
  assert.equal(c.stats().batched_keys, 0);
});

test('duplicate keys in one batch are sent once and answered to every caller', async () => {
  const c = client();
  const keys = [added[0], added[0], neverAdded[0], neverAdded[0], added[0]];
  const answers = await Promise.all(keys.map((key) => c.mayExist(key)));
  assert.deepEqual(
    answers.map((a) => a.mayExist),
    [true, true, false, false, true],
  );
  assert.equal(c.stats().batched_keys, 2);
});

test('keys are strings, Buffers or Uint8Arrays; binary keys are kept byte for byte', async () => {
  const c = client();
  const binary = Buffer.from([0, 255, 1, 128, 10]);
  await c.add([binary]);
  const answers = await Promise.all([
    c.mayExist(binary),
    c.mayExist(new Uint8Array([0, 255, 1, 128, 10])),
    c.mayExist(Buffer.from([0, 255, 1, 128, 11])),
  ]);
  assert.deepEqual(
    answers.map((a) => a.mayExist),
    [true, true, await unaryAnswer(stub, Buffer.from([0, 255, 1, 128, 11]))],
  );
  await assert.rejects(c.mayExist(42), TypeError);
});

test('mayExistMany: packed batches split at 10,000 keys; the smallest observedSeq', async () => {
  const c = client();
  const keys = [];
  for (let i = 0; i < 25_000; i++) keys.push(i % 1000 === 7 ? added[i % 32] : `many:never:${i}`);
  const answers = await c.mayExistMany(keys);
  assert.equal(answers.length, keys.length);
  assert.equal(c.stats().gate_calls, 3);
  assert.equal(c.stats().lookups, 0);
  for (let i = 0; i < keys.length; i++) {
    if (i % 1000 === 7) assert.equal(answers[i].mayExist, true, `key ${i}`);
  }
  // False positives aside (1 %), never-added keys are absent.
  const absent = answers.filter((a) => !a.mayExist).length;
  assert.ok(absent > 24_000, `absent ${absent}`);
  // Spot-check against the unary answers.
  for (const i of [0, 1, 9_999, 10_000, 10_007, 19_999, 20_000, 24_999]) {
    assert.equal(answers[i].mayExist, await unaryAnswer(stub, keys[i]), `key ${i}`);
  }
  const seq = answers[0].observedSeq;
  assert.ok(answers.every((a) => a.observedSeq === seq));
  assert.deepEqual(await c.mayExistMany([]), []);
});

test('invalid input keeps its status: an empty key is INVALID_ARGUMENT, and fails only its own caller', async () => {
  for (const window of [0, 0.2]) {
    const c = client({ coalesceWindowMs: window });
    await assert.rejects(c.mayExist(''), (error) => {
      assert.equal(error.code, grpc.status.INVALID_ARGUMENT);
      assert.match(error.details, /empty/);
      return true;
    });
    const tooLong = 'k'.repeat(MAX_KEY_BYTES + 1);
    const [empty, long, good] = await Promise.allSettled([c.mayExist(''), c.mayExist(tooLong), c.mayExist(added[1])]);
    assert.equal(empty.reason.code, grpc.status.INVALID_ARGUMENT);
    assert.equal(long.reason.code, grpc.status.INVALID_ARGUMENT);
    assert.equal(good.value.mayExist, true);
    await assert.rejects(c.add(['']), (error) => error.code === grpc.status.INVALID_ARGUMENT);
  }
});

test('add resolves the seq, which every later answer has reached', async () => {
  const c = client();
  const seq = await c.add(['seq:a', 'seq:b']);
  const answer = await c.mayExist('seq:a');
  assert.equal(answer.mayExist, true);
  assert.ok(answer.observedSeq >= seq);
});

test('recordAbsent: RECORDED, then the gate answers ABSENT; REDUNDANT for a key the filter already rules out', async () => {
  const c = client();
  await c.add(['record:known']); // the gate may-exists it; the source lacks it
  const answer = await c.mayExist('record:known');
  assert.equal(answer.mayExist, true);
  const recorded = await c.recordAbsent('record:known', 'missing', answer.observedSeq, { address: answer.address });
  assert.equal(recorded.outcome, 'RECORDED');
  assert.ok(recorded.seq > answer.observedSeq);
  assert.ok(recorded.expiresInMs > 0);
  assert.equal((await c.mayExist('record:known')).mayExist, false);
  const never = await c.mayExist('record:never');
  assert.equal((await c.recordAbsent('record:never', 'deleted', never.observedSeq)).outcome, 'REDUNDANT');
  assert.equal(c.stats().absences_recorded, 1);
  await assert.rejects(c.recordAbsent('x', 'gone', 1), TypeError);
});

test('an unknown namespace fails every caller of the batch with the same NOT_FOUND', async () => {
  const c = track(new GateClient(server.address, { namespace: 'no_such_namespace', deadlineMs: DEADLINE_MS }));
  const results = await Promise.allSettled(Array.from({ length: 8 }, (_, i) => c.mayExist(`k${i}`)));
  // Lookups of one synchronous run share a batch (the gatherer runs in a microtask after the first).
  assert.equal(c.stats().gate_calls, 1);
  const details = results[0].reason.details;
  assert.match(details, /no_such_namespace/);
  for (const r of results) {
    assert.equal(r.status, 'rejected');
    assert.equal(r.reason.code, grpc.status.NOT_FOUND);
    assert.equal(r.reason.details, details);
  }
});
