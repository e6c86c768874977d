// npm's `prepare` step of existence-gate-client: copies the repository's proto/existence/v1/existence.proto into
// this package (proto/, git-ignored, listed in `files`), so that a packed package carries the proto it loads.
// npm runs it on `npm pack` / `npm publish`, on `npm ci` / `npm install` in this directory, and when another
// project installs this directory (`npm install --install-links ./clients/node`, which packs it) or links it.
// Outside the repository (no ../../proto) an existing copy is kept. It installs nothing: the package's
// dependencies are installed by whoever installs the package (@grpc/grpc-js is a peer dependency: the
// application's own copy is the one the client uses).
'use strict';

const fs = require('fs');
const path = require('path');

const RELATIVE = path.join('existence', 'v1', 'existence.proto');
const packageDir = path.resolve(__dirname, '..');
const source = path.resolve(packageDir, '..', '..', 'proto', RELATIVE);
const target = path.join(packageDir, 'proto', RELATIVE);

if (fs.existsSync(source)) {
  fs.mkdirSync(path.dirname(target), { recursive: true });
  fs.copyFileSync(source, target);
} else if (!fs.existsSync(target)) {
  console.error(`existence-gate-client: neither ${source} nor ${target} exists; cannot ship the proto`);
  process.exit(1);
}
