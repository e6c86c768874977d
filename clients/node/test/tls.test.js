// A gate that serves gRPC over TLS and requires client certificates (mutual TLS): the client's `credentials`
// (grpc.credentials.createSsl) carry the CA, the client certificate and its key, for the lookups and the
// subscription alike. The PKI is a throwaway one made here with openssl: a CA, a server certificate for
// `localhost` (subjectAltName DNS:localhost), a client certificate.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const { GateClient, GatedReader, Found, MISSING } = require('..');
const { startServer, opened, usersClient } = require('./server');

let dir;
let server;
const { track, closeAll } = opened();

function openssl(...args) {
  execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'], timeout: 60_000 });
}

/** A key and a certificate NAME signed by the CA, with the given x509v3 extensions. */
function issue(name, subject, extensions) {
  fs.writeFileSync(path.join(dir, `${name}.ext`), extensions);
  openssl('req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
    '-keyout', `${name}.key`, '-subj', subject, '-out', `${name}.csr`);
  openssl('x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial',
    '-days', '2', '-sha256', '-extfile', `${name}.ext`, '-out', `${name}.pem`);
}

const read = (name) => fs.readFileSync(path.join(dir, name));

/**
 * The server certificate names `localhost` while the tests dial 127.0.0.1: grpc-js checks the certificate
 * against the name this option gives (and sends it as SNI).
 */
const LOCALHOST = { 'grpc.ssl_target_name_override': 'localhost', 'grpc.default_authority': 'localhost' };

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'existence-gate-node-tls-'));
  openssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
    '-keyout', 'ca.key', '-subj', '/CN=existence-gate test CA', '-days', '2', '-sha256',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign',
    '-out', 'ca.pem');
  issue('server', '/CN=localhost',
    'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost\n');
  issue('client', '/CN=node-client-tests',
    'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n');
  server = await startServer({
    extraArgs: [
      '--tls-cert', path.join(dir, 'server.pem'),
      '--tls-key', path.join(dir, 'server.key'),
      '--tls-client-ca', path.join(dir, 'ca.pem'),
    ],
  });
});

after(async () => {
  closeAll();
  if (server) await server.stop();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

test('mutual TLS: a client trusting the CA and presenting its certificate adds, looks up and subscribes', async () => {
  const credentials = grpc.credentials.createSsl(read('ca.pem'), read('client.key'), read('client.pem'));
  const client = track(
    usersClient(server.address, { credentials, channelOptions: LOCALHOST }),
  );
  assert.ok((await client.add(['tls:a', 'tls:b'])) > 0);
  // Coalesced (the default): concurrent lookups share batches.
  const keys = [];
  for (let i = 0; i < 32; i++) keys.push(i % 2 === 0 ? (i % 4 === 0 ? 'tls:a' : 'tls:b') : `tls:never:${i}`);
  const answers = await Promise.all(keys.map((key) => client.mayExist(key)));
  assert.deepEqual(
    answers.map((a) => a.mayExist),
    keys.map((key) => !key.startsWith('tls:never')),
  );
  const stats = client.stats();
  assert.equal(stats.lookups, keys.length);
  assert.ok(stats.gate_calls < stats.lookups, `gate_calls ${stats.gate_calls} < lookups ${stats.lookups}`);

  // The reader's subscription (a channel of its own) uses the same credentials.
  const reader = track(new GatedReader(client, async (key) => (key === 'tls:a' ? Found('A') : MISSING)));
  assert.equal(await reader.ready(), true);
  assert.equal(await reader.get('tls:a'), 'A');
  assert.equal(await reader.get('tls:never:1'), undefined);
  assert.equal(reader.isCachedAbsent('tls:never:1'), true);
});

test('mutual TLS: a client without a client certificate is refused', async () => {
  const credentials = grpc.credentials.createSsl(read('ca.pem'));
  const client = track(
    usersClient(server.address, { credentials, channelOptions: LOCALHOST }),
  );
  // With TLS 1.3 the server's refusal arrives after the client's handshake is done, so it surfaces as
  // UNAVAILABLE (or UNKNOWN) on the first call rather than as a handshake failure.
  await assert.rejects(client.mayExist('tls:a'), (error) => {
    assert.notEqual(error.code, grpc.status.OK);
    return true;
  });
  await assert.rejects(client.add(['tls:c']));
});

test('dialing 127.0.0.1 without the name override: the certificate (for localhost) does not match', async () => {
  const credentials = grpc.credentials.createSsl(read('ca.pem'), read('client.key'), read('client.pem'));
  const client = track(usersClient(server.address, { credentials }));
  await assert.rejects(client.mayExist('tls:a'), (error) => {
    assert.equal(error.code, grpc.status.UNAVAILABLE);
    assert.match(error.message, /altnames|does not match/i);
    return true;
  });
});

test('a plaintext client is refused by the TLS gate', async () => {
  const client = track(new GateClient(server.address, { namespace: 'users', deadlineMs: 2_000 }));
  await assert.rejects(client.mayExist('tls:a'), (error) => typeof error.code === 'number' && error.code !== grpc.status.OK);
});
