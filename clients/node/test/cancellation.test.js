// Cancellation and deadlines of coalesced and unary lookups: a caller that gives up gets its error at once, and
// the batch goes on for the others.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');
const { GateClient } = require('..');
const { startServer, DEADLINE_MS } = require('./server');

let server;
const clients = [];

function client(options = {}) {
  const c = new GateClient(server.address, { namespace: 'users', deadlineMs: DEADLINE_MS, ...options });
  clients.push(c);
  return c;
}

before(async () => {
  server = await startServer();
  await client().add(['cancel:a', 'cancel:b']);
});

after(async () => {
  for (const c of clients) c.close();
  if (server) await server.stop();
});

test("a caller whose deadline passes gets DEADLINE_EXCEEDED at once; the others' batch goes on", async () => {
  const c = client({ coalesceWindowMs: 2000 });
  const started = Date.now();
  const hurried = c.mayExist('cancel:a', { deadlineMs: 20 }).then(
    () => assert.fail('the hurried caller got an answer'),
    (error) => ({ error, elapsed: Date.now() - started }),
  );
  const others = [c.mayExist('cancel:a'), c.mayExist('cancel:b'), c.mayExist('cancel:never')];
  const { error, elapsed } = await hurried;
  assert.equal(error.code, grpc.status.DEADLINE_EXCEEDED);
  assert.ok(elapsed < 1500, `the deadline error came after ${elapsed} ms, before the 2 s window ended`);
  const answers = await Promise.all(others);
  assert.deepEqual(
    answers.map((a) => a.mayExist),
    [true, true, false],
  );
  assert.equal(c.stats().gate_calls, 1);
});

test('a caller cancelled by its AbortSignal gets CANCELLED at once; the others are answered', async () => {
  const c = client({ coalesceWindowMs: 1000 });
  const controller = new AbortController();
  const cancelled = c.mayExist('cancel:b', { signal: controller.signal });
  const other = c.mayExist('cancel:a');
  setTimeout(() => controller.abort(new Error('the request went away')), 5);
  await assert.rejects(cancelled, (error) => {
    assert.equal(error.code, grpc.status.CANCELLED);
    assert.match(error.details, /the request went away/);
    return true;
  });
  assert.equal((await other).mayExist, true);
  // Only the key still wanted was sent.
  assert.equal(c.stats().batched_keys, 1);
});

test('an already aborted signal fails at once, coalesced or not', async () => {
  for (const window of [0, 0.2]) {
    const c = client({ coalesceWindowMs: window });
    await assert.rejects(c.mayExist('cancel:a', { signal: AbortSignal.abort() }), (error) => {
      assert.equal(error.code, grpc.status.CANCELLED);
      return true;
    });
  }
});

test('a batch whose callers all gave up is not sent', async () => {
  const c = client({ coalesceWindowMs: 50 });
  const controller = new AbortController();
  const lookups = ['cancel:a', 'cancel:b'].map((key) => c.mayExist(key, { signal: controller.signal }));
  controller.abort();
  for (const lookup of lookups) await assert.rejects(lookup, (error) => error.code === grpc.status.CANCELLED);
  await new Promise((resolve) => setTimeout(resolve, 80)); // past the window
  assert.equal(c.stats().gate_calls, 0);
});

test('unary lookups (window 0) honour the deadline and the signal', async () => {
  const c = client({ coalesceWindowMs: 0 });
  // A deadline already past: grpc-js fails the call with DEADLINE_EXCEEDED.
  await assert.rejects(c.mayExist('cancel:a', { deadline: Date.now() - 1 }), (error) => {
    assert.equal(error.code, grpc.status.DEADLINE_EXCEEDED);
    return true;
  });
  const controller = new AbortController();
  const lookup = c.mayExist('cancel:a', { signal: controller.signal });
  controller.abort();
  await assert.rejects(lookup, (error) => error.code === grpc.status.CANCELLED);
  assert.equal((await c.mayExist('cancel:a')).mayExist, true);
});

test('close() fails the lookups still gathering with CANCELLED', async () => {
  const c = new GateClient(server.address, { namespace: 'users', deadlineMs: DEADLINE_MS, coalesceWindowMs: 1000 });
  const lookup = c.mayExist('cancel:a');
  c.close();
  await assert.rejects(lookup, (error) => error.code === grpc.status.CANCELLED);
  await assert.rejects(c.mayExist('cancel:a'), (error) => error.code === grpc.status.CANCELLED);
});
