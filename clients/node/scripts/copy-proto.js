// Copies the repository's proto/existence/v1/existence.proto into this package (proto/, git-ignored), so a
// packed or copied package carries the proto it loads. Run by npm as `prepare` (npm ci / npm install in this
// directory, npm pack, and installs of this directory that pack it). Outside the repository (no ../../proto),
// an existing copy is kept.
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
