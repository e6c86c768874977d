// Loads existence.proto with @grpc/proto-loader (the stubs are made at load time, Node's idiom).
'use strict';

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const RELATIVE = path.join('existence', 'v1', 'existence.proto');
const PACKAGE_DIR = path.resolve(__dirname, '..');

/** Field names as in the proto, enums as their names, seqs as JavaScript numbers (exact up to 2^53). */
const LOAD_OPTIONS = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };

/**
 * Where existence/v1/existence.proto is looked for, in order: an explicit directory (option `protoDir` or
 * $EXISTENCE_GATE_PROTO_DIR), the copy shipped in this package (proto/, made by `npm run prepare`), and the
 * repository's proto/ when this package is used in place (clients/node of a checkout, or a link to it).
 */
function protoCandidates(protoDir) {
  const dirs = [];
  if (protoDir) dirs.push(path.resolve(protoDir));
  else if (process.env.EXISTENCE_GATE_PROTO_DIR) dirs.push(path.resolve(process.env.EXISTENCE_GATE_PROTO_DIR));
  dirs.push(path.join(PACKAGE_DIR, 'proto'), path.resolve(PACKAGE_DIR, '..', '..', 'proto'));
  return dirs;
}

const cache = new Map();

/** The `existence.v1` package (ExistenceGate, Admin client classes) loaded from the first proto found. */
function loadExistencePackage(protoDir) {
  const key = protoDir || process.env.EXISTENCE_GATE_PROTO_DIR || '';
  if (cache.has(key)) return cache.get(key);
  const candidates = protoCandidates(protoDir);
  const root = candidates.find((dir) => fs.existsSync(path.join(dir, RELATIVE)));
  if (!root) {
    throw new Error(
      `existence-gate-client: ${RELATIVE} not found in ${candidates.join(', ')}; ` +
        'run `npm run prepare` in the package (it copies the repository proto/), or set protoDir / ' +
        'EXISTENCE_GATE_PROTO_DIR to a directory holding existence/v1/existence.proto',
    );
  }
  const definition = protoLoader.loadSync(RELATIVE.split(path.sep).join('/'), { ...LOAD_OPTIONS, includeDirs: [root] });
  const pkg = grpc.loadPackageDefinition(definition).existence.v1;
  cache.set(key, pkg);
  return pkg;
}

module.exports = { loadExistencePackage, protoCandidates, LOAD_OPTIONS };
