// A gate that requires a bearer token: the client sends `token` on every call and on the subscription.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('crypto');
const grpc = require('@grpc/grpc-js');
const { GatedReader, Found, MISSING } = require('..');
const { startServer, opened, usersClient } = require('./server');

const TOKEN = 'node-client-test-token';
let server;
const { track, closeAll } = opened();

before(async () => {
  const sha256 = crypto.createHash('sha256').update(TOKEN).digest('hex');
  server = await startServer({
    extraConfig: `[[tokens]]\nname = "node-tests"\nsha256 = "${sha256}"\nroles = ["read", "write"]\nnamespaces = ["users"]\n`,
  });
});

after(async () => {
  closeAll();
  if (server) await server.stop();
});

test('with the token: lookups, Add, RecordAbsent and the subscription are admitted', async () => {
  const client = track(usersClient(server.address, { token: TOKEN }));
  await client.add(['token:a']);
  const answers = await Promise.all([client.mayExist('token:a'), client.mayExist('token:never')]);
  assert.deepEqual(
    answers.map((a) => a.mayExist),
    [true, false],
  );
  const reader = track(new GatedReader(client, async (key) => (key === 'token:a' ? Found('A') : MISSING)));
  assert.equal(await reader.ready(), true);
  assert.equal(await reader.get('token:a'), 'A');
  assert.equal(await reader.get('token:never'), undefined);
  assert.equal(reader.isCachedAbsent('token:never'), true);
});

test('without it: UNAUTHENTICATED, returned as it is (no retry); the reader fails open', async () => {
  const client = track(usersClient(server.address));
  await assert.rejects(client.mayExist('token:a'), (error) => {
    assert.equal(error.code, grpc.status.UNAUTHENTICATED);
    return true;
  });
  await assert.rejects(client.add(['token:b']), (error) => error.code === grpc.status.UNAUTHENTICATED);
  assert.equal(client.stats().retries, 0);
  const reader = track(new GatedReader(client, async () => Found('from the source'), { subscribe: false }));
  assert.equal(await reader.get('token:a'), 'from the source');
  assert.equal(reader.stats().fail_opens, 1);
});
