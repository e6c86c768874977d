// existence-gate-client: the existence-gate's calls for Node services, single-key lookups coalesced into
// packed batches, and the recommended read path (GatedReader). See README.md.
'use strict';

const grpc = require('@grpc/grpc-js');
const { GateClient, gateError, DEFAULTS, MAX_BATCH_KEYS, MAX_KEY_BYTES } = require('./lib/gate_client');
const { GatedReader, AbsenceCache, Found, MISSING, DELETED } = require('./lib/gated_reader');
const { loadExistencePackage } = require('./lib/proto');

module.exports = {
  GateClient,
  GatedReader,
  AbsenceCache,
  Found,
  MISSING,
  DELETED,
  DEFAULTS,
  MAX_BATCH_KEYS,
  MAX_KEY_BYTES,
  gateError,
  loadExistencePackage,
  /** @grpc/grpc-js's status codes, to compare with `error.code`. */
  status: grpc.status,
};
