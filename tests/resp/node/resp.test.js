// The RESP port with node-redis and its bloom commands (@redis/bloom): adds and lookups, a 10,000-command
// pipeline, RESP2 and RESP3, the token, Pub/Sub invalidations and, when RESP_TLS_DIR is set, mutual TLS.
// Run by tests/resp/run.sh, which starts the gate and sets RESP_HOST, RESP_PORT and RESP_TOKEN.
'use strict';
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const { randomUUID } = require('node:crypto');
const { execFileSync } = require('node:child_process');
const { createClient } = require('redis');

const { RESP_HOST: host, RESP_PORT: port, RESP_TOKEN: password, RESP_TLS_DIR: tlsDir } = process.env;

// true or false per key as gRPC answers it (the binary's own client, `existence-gate check`), in order.
function grpcAnswers(keys) {
  const out = execFileSync(process.env.EXISTENCE_GATE_BIN, [
    'check', '--addr', `http://${process.env.GATE_GRPC}`, '--token', password, '--namespace', 'users', ...keys,
  ], { encoding: 'utf8', timeout: 60000 }).trim().split('\n');
  assert.deepStrictEqual(out.map((line) => line.split(/\s+/)[0]), keys, out.join('\n'));
  return out.map((line) => line.split(/\s+/)[1] !== 'ABSENT');
}

function client(RESP) {
  const socket = { host, port: Number(port), reconnectStrategy: false };
  if (tlsDir) {
    Object.assign(socket, {
      tls: true,
      servername: 'localhost',
      ca: fs.readFileSync(`${tlsDir}/ca.pem`),
      cert: fs.readFileSync(`${tlsDir}/client.pem`),
      key: fs.readFileSync(`${tlsDir}/client.key`),
    });
  }
  return createClient({ socket, password, RESP });
}

for (const RESP of [2, 3]) {
  test(`bloom commands, a pipeline and invalidations over RESP${RESP}${tlsDir ? ' and mutual TLS' : ''}`, async () => {
    const redis = await client(RESP).connect();
    const run = randomUUID();
    const key = (i) => `node-${run}-${i}`;
    try {
      assert.strictEqual(await redis.bf.add('users', key(0)), true);
      assert.strictEqual(await redis.bf.add('users', key(0)), false);
      assert.deepStrictEqual(await redis.bf.mAdd('users', [key(1), key(2)]), [true, true]);
      assert.strictEqual(await redis.bf.exists('users', key(1)), true);
      assert.deepStrictEqual(await redis.bf.mExists('users', [key(2), `never-${run}`]), [true, false]);
      assert.deepStrictEqual(await redis.bf.insert('users', [key(3)], { NOCREATE: true }), [true]);
      const info = await redis.bf.info('users');
      assert.strictEqual(Number(info['Capacity'] ?? info.capacity), 100000, JSON.stringify(info));
      await assert.rejects(redis.bf.exists('no-such-namespace', 'k'), /is not configured/);

      // 10,000 commands pipelined: node-redis sends them without waiting, replies come back in order.
      const keys = Array.from({ length: 10000 }, (_, i) => (i % 2 === 0 ? key(i % 4) : `never-${run}-${i}`));
      const answers = await Promise.all(keys.map((k) => redis.bf.exists('users', k)));
      for (let i = 0; i < keys.length; i += 101) {
        assert.strictEqual(answers[i], await redis.bf.exists('users', keys[i]), `command ${i}`);
      }
      assert.ok(answers.filter((a, i) => i % 2 === 0).every((a) => a === true));
      // The same keys through gRPC: the same answers (on the plaintext gate, whose gRPC port needs no client
      // certificate).
      if (process.env.GATE_GRPC) {
        assert.deepStrictEqual(grpcAnswers(keys.slice(0, 64)), answers.slice(0, 64));
      }

      // Invalidations on a subscriber connection: subscribe resolves once the server confirmed it.
      const subscriber = await client(RESP).connect();
      try {
        let heard;
        const seen = new Promise((resolve) => { heard = resolve; });
        await subscriber.subscribe('invalidations:users', (message) => {
          if (message.endsWith(` ${key(9)}`)) heard(message);
        });
        await redis.bf.add('users', key(9));
        let timer;
        const message = await Promise.race([
          seen,
          new Promise((_, reject) => { timer = setTimeout(() => reject(new Error('no invalidation in 20 s')), 20000); }),
        ]);
        clearTimeout(timer);
        assert.match(message, new RegExp(`^added \\d+ ${key(9)}$`));
      } finally {
        await subscriber.quit().catch(() => subscriber.destroy());
      }
    } finally {
      await redis.quit().catch(() => redis.destroy());
    }
  });
}
