// npm's `prepare` step of existence-gate-client. npm runs it on `npm ci` / `npm install` in this directory, on
// `npm pack`, and in this directory when another project installs it from a path (`npm install ./clients/node`,
// linked or packed).
//
// 1. Copies the repository's proto/existence/v1/existence.proto into this package (proto/, git-ignored), so a
//    packed or copied package carries the proto it loads. Outside the repository (no ../../proto) an existing
//    copy is kept.
// 2. When npm links this directory into another project (`npm install ./clients/node` without
//    --install-links), npm does not install the dependencies of a linked directory outside that project, so
//    the package could not load @grpc/grpc-js: it installs them here, from package-lock.json.
'use strict';

const fs = require('fs');
const path = require('path');
const { spawnSync } = require('child_process');

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

const installed = ['@grpc/grpc-js', '@grpc/proto-loader'].every((name) =>
  fs.existsSync(path.join(packageDir, 'node_modules', name, 'package.json')),
);
if (!installed && process.env.npm_execpath && process.argv[2] !== '--copy-only') {
  const command = fs.existsSync(path.join(packageDir, 'package-lock.json')) ? 'ci' : 'install';
  const result = spawnSync(
    process.execPath,
    [process.env.npm_execpath, command, '--omit=dev', '--ignore-scripts', '--no-audit', '--no-fund', '--loglevel=error'],
    { cwd: packageDir, stdio: 'inherit' },
  );
  if (result.status !== 0) {
    console.error(`existence-gate-client: npm ${command} of the package's own dependencies failed`);
    process.exit(result.status || 1);
  }
}
