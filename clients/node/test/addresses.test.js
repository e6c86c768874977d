// Several addresses, dead ones among them, and a gate that is down: retries, policies, fail-open.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');
const { GateClient, GatedReader, Found, MISSING } = require('..');
const { startServer, deadAddress, stalledAddress, eventually, opened, usersClient } = require('./server');

let server;
let dead;
const { track, closeAll } = opened();

before(async () => {
  [server, dead] = await Promise.all([startServer(), deadAddress()]);
  const c = track(usersClient(server.address));
  await c.add(['addr:a', 'addr:b']);
});

after(async () => {
  closeAll();
  if (server) await server.stop();
});

test('round robin over a dead and a live address: every lookup succeeds, the dead address is retried around', async () => {
  const c = track(usersClient([dead, server.address]));
  for (let i = 0; i < 6; i++) {
    const answers = await Promise.all([c.mayExist('addr:a'), c.mayExist('addr:never'), c.mayExist('addr:b')]);
    assert.deepEqual(
      answers.map((a) => a.mayExist),
      [true, false, true],
    );
    assert.ok(answers.every((a) => a.address === server.address));
  }
  const stats = c.stats();
  // The first batch went to the dead address and was retried; then it is down for 1 s and skipped.
  assert.ok(stats.retries >= 1, JSON.stringify(stats));
  assert.equal(stats.gate_calls, 6 + stats.retries);
  assert.ok((await c.add(['addr:c'])) > 0);
  assert.equal((await c.mayExistMany(['addr:c', 'addr:never']))[0].mayExist, true);
});

test('a silent address (a stopped replica) costs a call half its deadline, then is skipped', async () => {
  const silent = await stalledAddress();
  try {
    const c = track(usersClient([silent.address, server.address], { deadlineMs: 400, coalesceWindowMs: 0 }));
    for (let i = 0; i < 4; i++) {
      assert.equal((await c.mayExist('addr:a')).address, server.address);
    }
    assert.equal(c.stats().retries, 1);
    c.close();
  } finally {
    await silent.close();
  }
});

test('pick_first: the first healthy address takes every call', async () => {
  const live = track(usersClient([server.address, dead], { addressPolicy: 'pick_first', coalesceWindowMs: 0 }));
  for (let i = 0; i < 10; i++) assert.equal((await live.mayExist('addr:a')).mayExist, true);
  assert.equal(live.stats().retries, 0);

  const deadFirst = track(usersClient([dead, server.address], { addressPolicy: 'pick_first', coalesceWindowMs: 0 }));
  const started = Date.now();
  for (let i = 0; i < 10; i++) assert.equal((await deadFirst.mayExist('addr:a')).mayExist, true);
  // One retry marks the dead address down for 1 s; the next calls go straight to the live one (unless the
  // machine is so loaded that the 10 calls took more than that second).
  const { retries, gate_calls: calls } = deadFirst.stats();
  if (Date.now() - started < 1000) assert.equal(retries, 1);
  else assert.ok(retries >= 1);
  assert.equal(calls, 10 + retries);
});

test('every address down: UNAVAILABLE, returned as it is', async () => {
  const c = track(usersClient([dead]));
  for (const key of ['addr:a', 'addr:b']) {
    await assert.rejects(c.mayExist(key), (error) => {
      assert.equal(error.code, grpc.status.UNAVAILABLE);
      return true;
    });
  }
  assert.equal(c.stats().retries, 0);
  await assert.rejects(c.add(['x']), (error) => error.code === grpc.status.UNAVAILABLE);
});

test('fail open: with the gate down the reader reads the source and never answers "absent" by itself', async () => {
  const c = track(new GateClient([dead], { namespace: 'users', deadlineMs: 200 }));
  const rows = new Map([['row:1', 'Ada']]);
  let reads = 0;
  const reader = track(
    new GatedReader(c, async (key) => {
      reads++;
      return rows.has(key) ? Found(rows.get(key)) : MISSING;
    }),
  );
  for (let i = 0; i < 3; i++) {
    assert.equal(await reader.get('row:1'), 'Ada');
    assert.equal(await reader.get('row:404'), undefined); // the source's answer
  }
  assert.equal(reads, 6);
  const stats = reader.stats();
  assert.equal(stats.fail_opens, 6);
  assert.equal(stats.cache_hits, 0);
  assert.equal(reader.isCachedAbsent('row:404'), false);
  // The source's own errors are the caller's.
  const failing = track(new GatedReader(c, async () => {
    throw new Error('database down');
  }));
  await assert.rejects(failing.get('row:1'), /database down/);
});

test('a lookup deadline at a gate that does not answer in time fails open too', async () => {
  // A live server, but a deadline no call can meet.
  const c = track(new GateClient(server.address, { namespace: 'users', deadlineMs: 0.001, coalesceWindowMs: 0 }));
  const reader = track(new GatedReader(c, async () => Found('v'), { subscribe: false }));
  assert.equal(await reader.get('addr:never'), 'v');
  assert.equal(reader.stats().fail_opens, 1);
});

test('the subscription moves to the next address when its stream ends: a dead first address, then the live one', async () => {
  const c = track(usersClient([dead, server.address]));
  const reader = track(new GatedReader(c, async () => MISSING));
  assert.equal(await reader.ready(), true, 'live on the second address');
  assert.ok(reader.stats().resubscribes >= 1);
  assert.equal(await reader.get('addr:never'), undefined);
  assert.equal(reader.isCachedAbsent('addr:never'), true);
  const writer = track(usersClient(server.address));
  await writer.add(['addr:never']);
  assert.ok(await eventually(() => !reader.isCachedAbsent('addr:never')), 'invalidated over the second address');
});
