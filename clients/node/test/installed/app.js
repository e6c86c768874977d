// The application of a fresh project that installed existence-gate-client from its packed tarball, beside its
// own @grpc/grpc-js (clients/node/test.sh copies it there and runs `node app.js PATH/TO/test/server.js`).
// It checks what a service gets: the installed package (not a link into the repository) with its proto and
// type declarations, one @grpc/grpc-js shared by the application and the client (so credentials made with
// the application's grpc-js are accepted), and real calls to a server started from $EXISTENCE_GATE_BIN.
'use strict';

const assert = require('assert');
const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const gate = require('existence-gate-client');
const { startServer } = require(process.argv[2]); // builtins only: it loads no grpc-js of its own

const clientDir = path.dirname(require.resolve('existence-gate-client/package.json'));
const manifest = require('existence-gate-client/package.json');
assert.ok(
  fs.realpathSync(clientDir).startsWith(fs.realpathSync(path.join(__dirname, 'node_modules'))),
  `existence-gate-client resolves to ${fs.realpathSync(clientDir)}, outside this project (a link?)`,
);
for (const file of ['proto/existence/v1/existence.proto', manifest.types || 'index.d.ts']) {
  assert.ok(fs.existsSync(path.join(clientDir, file)), `the installed package lacks ${file}`);
}
assert.equal(manifest.types, 'index.d.ts', 'package.json "types" names the declarations');
const clientsGrpc = require.resolve('@grpc/grpc-js', { paths: [path.join(clientDir, 'lib')] });
assert.equal(clientsGrpc, require.resolve('@grpc/grpc-js'), "the client loads another @grpc/grpc-js than the application's");
assert.strictEqual(gate.status, grpc.status, "the client's grpc status codes are not the application's grpc-js");

async function main() {
  const server = await startServer({ namespaces: ['users'] });
  const client = new gate.GateClient(server.address, {
    namespace: 'users',
    deadlineMs: 10_000,
    // Made with the application's grpc-js: a second copy inside the package would reject it (instanceof).
    credentials: grpc.credentials.createInsecure(),
  });
  let reader;
  try {
    await client.add(['user:1']);
    assert.equal((await client.mayExist('user:1')).mayExist, true, 'an added key may exist');
    const absent = await client.mayExist('user:never-added');
    assert.equal(absent.mayExist, false, 'a key never added is absent');
    reader = new gate.GatedReader(client, async (key) => (String(key) === 'user:1' ? gate.Found('row 1') : gate.MISSING));
    assert.equal(await reader.ready(), true, 'the invalidation subscription went live');
    assert.equal(await reader.get('user:1'), 'row 1');
    assert.equal(await reader.get('user:2'), undefined);
    const error = await client.mayExist(Buffer.alloc(0)).then(() => null, (e) => e);
    assert.ok(error && error.code === grpc.status.INVALID_ARGUMENT, `an empty key: ${error}`);
  } finally {
    if (reader) reader.close();
    client.close();
    await server.stop();
  }
  console.log(
    `installed existence-gate-client ${manifest.version} with @grpc/grpc-js ${require('@grpc/grpc-js/package.json').version} ` +
      '(one copy): proto and index.d.ts shipped, calls answered by the gate',
  );
}

main().catch((error) => {
  console.error(`FAIL: ${error && error.stack ? error.stack : error}`);
  process.exit(1);
});
