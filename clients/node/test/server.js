// Test helper: real existence-gate servers ($EXISTENCE_GATE_BIN) on free loopback ports, stopped with SIGTERM.
'use strict';

const { spawn } = require('child_process');
const fs = require('fs');
const http = require('http');
const net = require('net');
const os = require('os');
const path = require('path');

const WAIT_MS = 30_000;
/**
 * The tests' call deadline: generous, since a loaded 2-core machine can take most of a second for a fresh
 * channel's first call (the library's default is 500 ms). Tests of deadlines set their own.
 */
const DEADLINE_MS = 10_000;

const NAMESPACE = `
expected_keys = 100000
missing_ttl = "2s"
deleted_ttl = "10m"
ttl_jitter = 0.0
max_ttl = "1h"
`;

const running = new Set();
process.on('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

/** Polls `condition` (sync or async) every `everyMs` until it is truthy or `timeoutMs` passed. */
async function eventually(condition, timeoutMs = WAIT_MS, everyMs = 10) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await condition();
    if (value) return value;
    if (Date.now() >= deadline) return value;
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}

function httpGet(address, pathname) {
  return new Promise((resolve) => {
    const request = http.get(`http://${address}${pathname}`, { timeout: 2000 }, (response) => {
      let body = '';
      response.setEncoding('utf8');
      response.on('data', (chunk) => (body += chunk));
      response.on('end', () => resolve({ status: response.statusCode, body }));
    });
    request.on('error', () => resolve({ status: 0, body: '' }));
    request.on('timeout', () => request.destroy());
  });
}

/** A loopback port nothing listens on (bound, noted, closed). */
function deadAddress() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(`127.0.0.1:${port}`));
    });
  });
}

/**
 * A loopback address that accepts connections and never answers: a call sent there stays in flight until its
 * deadline (or cancellation). Resolves {address, close()}.
 */
function stalledAddress() {
  return new Promise((resolve, reject) => {
    const sockets = new Set();
    const server = net.createServer((socket) => {
      sockets.add(socket);
      socket.on('error', () => {});
      socket.on('close', () => sockets.delete(socket));
    });
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      const close = () =>
        new Promise((done) => {
          for (const socket of sockets) socket.destroy();
          server.close(() => done());
        });
      resolve({ address: `127.0.0.1:${port}`, close });
    });
  });
}

/**
 * Starts a server with the given namespaces (each with the config above) and waits for /readyz.
 * Options: listen (a fixed "127.0.0.1:PORT", e.g. to restart on the same address), extraConfig (TOML put
 * before the namespaces, e.g. [[tokens]]), extraArgs (more `serve` flags, e.g. --tls-cert). Resolves
 * {address, httpAddress, stop(), metric(rpc, code)}.
 */
async function startServer({ namespaces = ['users'], listen = '127.0.0.1:0', extraConfig = '', extraArgs = [] } = {}) {
  const bin = process.env.EXISTENCE_GATE_BIN;
  if (!bin) throw new Error('EXISTENCE_GATE_BIN is not set');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'existence-gate-node-'));
  const config = path.join(dir, 'config.toml');
  fs.writeFileSync(config, extraConfig + '\n' + namespaces.map((name) => `[namespaces.${name}]${NAMESPACE}`).join('\n'));
  const child = spawn(
    bin,
    ['serve', '--in-memory', '--listen', listen, '--http-listen', '127.0.0.1:0', '--resp-listen', '127.0.0.1:0', '--config', config, ...extraArgs],
    // Stopped at once on SIGTERM: these tests are about the client, not the drain delay a balancer needs.
    { env: { ...process.env, NO_COLOR: '1', EXISTENCE_GATE_DRAIN_DELAY: '0s' }, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  running.add(child);
  let log = '';
  let exited = null;
  const exit = new Promise((resolve) =>
    child.on('exit', (code, signal) => {
      running.delete(child);
      exited = { code, signal };
      resolve(exited);
    }),
  );
  const onData = (chunk) => (log += chunk.toString('utf8'));
  child.stdout.on('data', onData);
  child.stderr.on('data', onData);
  const stop = async () => {
    if (exited) return exited;
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    const result = await exit;
    clearTimeout(timer);
    fs.rmSync(dir, { recursive: true, force: true });
    return result;
  };
  const match = await eventually(() => exited || /grpc_addr=(\S+) http_addr=(\S+)/.exec(log), WAIT_MS, 20);
  if (!match || exited) {
    await stop();
    throw new Error(`the server did not start (${JSON.stringify(exited)}); its log:\n${log}`);
  }
  const [, address, httpAddress] = match;
  const ready = await eventually(async () => (await httpGet(httpAddress, '/readyz')).status === 200, WAIT_MS, 20);
  if (!ready) {
    await stop();
    throw new Error(`the server did not become ready; its log:\n${log}`);
  }
  /** The server's existence_requests_total for one rpc and status code. */
  const metric = async (rpc, code = 'OK') => {
    const { body } = await httpGet(httpAddress, '/metrics');
    const line = body.split('\n').find((l) => l.startsWith(`existence_requests_total{rpc="${rpc}",code="${code}"}`));
    return line ? Number(line.split(' ').pop()) : 0;
  };
  return { address, httpAddress, stop, metric, log: () => log };
}

// What a test file opens (clients, readers): `track(x)` returns x; `closeAll()`, for its `after`, closes
// them last first (a reader before the client it reads through).
function opened() {
  const open = [];
  return {
    track(x) {
      open.push(x);
      return x;
    },
    closeAll() {
      for (const x of open.reverse()) x.close();
    },
  };
}

/**
 * A `GateClient` of the namespace the test servers configure (`users`) with the tests' deadline; `options`
 * add to or override those.
 */
function usersClient(addresses, options = {}) {
  const { GateClient } = require('..');
  return new GateClient(addresses, { namespace: 'users', deadlineMs: DEADLINE_MS, ...options });
}

module.exports = { startServer, deadAddress, stalledAddress, eventually, opened, usersClient, WAIT_MS, DEADLINE_MS };
