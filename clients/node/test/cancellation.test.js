// Cancellation and deadlines of coalesced and unary lookups: a caller that gives up gets its error at once, and
// the batch goes on for the others.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');
const { startServer, stalledAddress, usersClient, opened } = require('./server');

let server;
let stalled;
const { track, closeAll } = opened();

function client(options = {}) {
  return track(usersClient(server.address, options));
}

before(async () => {
  server = await startServer();
  stalled = await stalledAddress();
  await client().add(['cancel:a', 'cancel:b']);
});

after(async () => {
  closeAll();
  if (stalled) await stalled.close();
  if (server) await server.stop();
});

/**
 * A client whose first address never answers: its first lookup (the blocker) stays in flight there for half of
 * `blockerMs`, so the callers queued meanwhile gather (a batch leaves at once only when none is in flight);
 * then it moves on to the live server, which answers it. Round robin sends the next batch to the live server.
 * The blocker resolves to its answer.
 */
async function withBatchInFlight(options, blockerMs) {
  const c = track(usersClient([stalled.address, server.address], options));
  const blocker = c.mayExist('cancel:blocker', { deadlineMs: blockerMs });
  await new Promise((resolve) => setImmediate(resolve)); // the blocker has left
  assert.equal(c.stats().gate_calls, 1);
  return { c, blocker };
}

test("a caller whose deadline passes gets DEADLINE_EXCEEDED at once; the others' batch goes on", async () => {
  const { c, blocker } = await withBatchInFlight({ coalesceWindowMs: 60_000 }, 1000);
  const started = Date.now();
  const hurried = c.mayExist('cancel:hurried', { deadlineMs: 20 }).then(
    () => assert.fail('the hurried caller got an answer'),
    (error) => ({ error, elapsed: Date.now() - started }),
  );
  const others = [c.mayExist('cancel:a'), c.mayExist('cancel:b'), c.mayExist('cancel:never')];
  const { error, elapsed } = await hurried;
  assert.equal(error.code, grpc.status.DEADLINE_EXCEEDED);
  assert.ok(elapsed < 900, `the deadline error came after ${elapsed} ms, while the batch still gathered`);
  // The others leave as soon as the blocker's batch is answered (by the live server, after half its
  // deadline), not after the window.
  const answers = await Promise.all(others);
  assert.equal((await blocker).address, server.address);
  assert.deepEqual(
    answers.map((a) => a.mayExist),
    [true, true, false],
  );
  // The blocker's key (sent twice: to the stalled address, then the live one), then the others' three: the
  // hurried caller's key was not sent.
  assert.deepEqual(c.stats(), { lookups: 5, gate_calls: 3, batched_keys: 4, retries: 1, absences_recorded: 0 });
});

test('a caller cancelled by its AbortSignal gets CANCELLED at once; the others are answered', async () => {
  const { c, blocker } = await withBatchInFlight({ coalesceWindowMs: 60_000 }, 1000);
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
  assert.equal((await blocker).address, server.address);
  // Only the key still wanted was sent (after the blocker's).
  assert.equal(c.stats().batched_keys, 2);
});

test('callers of a batch in flight that all give up cancel its RPC; the next lookup leaves at once', async () => {
  const c = track(usersClient([stalled.address, server.address], { coalesceWindowMs: 60_000 }));
  const controller = new AbortController();
  // One batch (the same synchronous run), sent to the stalled address; its RPC deadline is the later one, 10 s.
  const cancelled = c.mayExist('cancel:a', { signal: controller.signal });
  const hurried = c.mayExist('cancel:b', { deadlineMs: 200 });
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(c.stats().gate_calls, 1);
  controller.abort();
  await assert.rejects(cancelled, (error) => error.code === grpc.status.CANCELLED);
  await assert.rejects(hurried, (error) => error.code === grpc.status.DEADLINE_EXCEEDED);
  // Were the batch still in flight, this lookup would gather for the 60 s window and miss its 5 s deadline.
  assert.equal((await c.mayExist('cancel:a', { deadlineMs: 5_000 })).mayExist, true);
  assert.equal(c.stats().gate_calls, 2);
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
  const { c, blocker } = await withBatchInFlight({ coalesceWindowMs: 60_000 }, 300);
  const controller = new AbortController();
  const lookups = ['cancel:a', 'cancel:b'].map((key) => c.mayExist(key, { signal: controller.signal }));
  controller.abort();
  for (const lookup of lookups) await assert.rejects(lookup, (error) => error.code === grpc.status.CANCELLED);
  // When the blocker is answered nothing is left to send: its own two attempts are the only RPCs.
  assert.equal((await blocker).address, server.address);
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(c.stats().gate_calls, 2);
  assert.equal(c.stats().retries, 1);
  assert.equal(c.stats().batched_keys, 1);
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
  const c = usersClient(server.address, { coalesceWindowMs: 1000 });
  const lookup = c.mayExist('cancel:a');
  c.close();
  await assert.rejects(lookup, (error) => error.code === grpc.status.CANCELLED);
  await assert.rejects(c.mayExist('cancel:a'), (error) => error.code === grpc.status.CANCELLED);
});
