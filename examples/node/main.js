// A small service's read path over existence-gate, with an in-memory Map standing in for the database.
//
//   node examples/node/main.js --addr 127.0.0.1:50051 --namespace default
//
// Runs a short self-check against the server (each step prints ok/FAIL) and exits 0 when every step passed.
// Use a namespace nobody else writes to: the checks expect to be the only writer of the keys they use.
'use strict';

const path = require('path');
const { parseArgs } = require('util');
const grpc = require('@grpc/grpc-js');
const { loadGateClient, GatedReader, Found, MISSING, DELETED } = require('./gated_reader');

const PROTO_ROOT = path.resolve(__dirname, '../../proto');

/** The source of truth: rows by key; a deleted row is kept as a marker (a soft delete). */
class Database {
  constructor() {
    this.rows = new Map();
    this.reads = new Map();
    this.delayMs = 0;
  }

  async load(key) {
    if (this.delayMs > 0) await new Promise((resolve) => setTimeout(resolve, this.delayMs));
    this.reads.set(key, (this.reads.get(key) || 0) + 1);
    if (!this.rows.has(key)) return MISSING;
    const row = this.rows.get(key);
    return row === DELETED ? DELETED : Found(row);
  }

  insert(key, value) {
    this.rows.set(key, value);
  }

  delete(key) {
    this.rows.set(key, DELETED);
  }

  readsOf(key) {
    return this.reads.get(key) || 0;
  }

  totalReads() {
    let total = 0;
    for (const n of this.reads.values()) total += n;
    return total;
  }
}

/** Calls a unary method as a promise. */
function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + 5000 }, (error, reply) => (error ? reject(error) : resolve(reply)));
  });
}

/** The write path: Add the key to the gate before the insert becomes visible in the source. */
class Writer {
  constructor(client, namespace, db) {
    Object.assign(this, { client, namespace, db });
  }

  async create(key, value) {
    await unary(this.client, 'Add', { namespace: this.namespace, keys: [Buffer.from(key)] });
    this.db.insert(key, value);
  }

  /** The Add succeeded but the insert then failed: the gate holds a key the source lacks. */
  async createFailed(key) {
    await unary(this.client, 'Add', { namespace: this.namespace, keys: [Buffer.from(key)] });
  }
}

let passed = 0;
let failed = 0;

function check(name, ok, detail = '') {
  if (ok) {
    passed++;
    console.log(`ok   ${name}`);
  } else {
    failed++;
    console.log(`FAIL ${name} ${typeof detail === 'string' ? detail : JSON.stringify(detail)}`);
  }
}

async function eventually(condition, timeoutMs = 5000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (condition()) return true;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return condition();
}

async function selfCheck(client, namespace) {
  const db = new Database();
  const writer = new Writer(client, namespace, db);
  const reader = new GatedReader({ client, namespace, load: (key) => db.load(key) });
  const gateAnswer = async (key) => {
    const reply = await unary(client, 'MayExist', { namespace, key: Buffer.from(key) });
    return `${reply.answer} ${reply.basis}`;
  };
  // The namespace's latest seq, which every answer carries (never 0: seqs start at 1).
  const latestSeq = async () =>
    (await unary(client, 'MayExist', { namespace, key: Buffer.from('user:0') })).observed_seq;

  try {
    check('the invalidation subscription goes live', await reader.start(10_000));

    await writer.create('user:1', 'Ada');
    check('an added row is read from the source', (await reader.get('user:1')) === 'Ada');
    check('... with one source read', db.totalReads() === 1, [...db.reads]);

    check('a key never added does not exist', (await reader.get('user:404')) === undefined);
    check('... and the gate spared the source', db.totalReads() === 1, [...db.reads]);
    check('... and the absence is cached locally', reader.isCachedAbsent('user:404'));
    const calls = reader.stats.gate_calls;
    check(
      'a second read of it is a local hit',
      (await reader.get('user:404')) === undefined && reader.stats.gate_calls === calls,
    );

    await writer.createFailed('user:2');
    check('a key the gate knows but the source lacks does not exist', (await reader.get('user:2')) === undefined);
    check('... the source was read once', db.readsOf('user:2') === 1, [...db.reads]);
    check('... and the absence RECORDED at the gate', reader.stats.absences_recorded === 1, reader.stats);
    check('... so the gate now answers it', (await gateAnswer('user:2')) === 'ANSWER_ABSENT BASIS_TOMBSTONE');
    await reader.get('user:2');
    check('... and the next read is a local hit', db.readsOf('user:2') === 1, [...db.reads]);

    await writer.create('user:3', 'Grace');
    db.delayMs = 300;
    const results = await Promise.all(Array.from({ length: 8 }, () => reader.get('user:3')));
    db.delayMs = 0;
    check('8 concurrent reads of one key all get the row', results.every((r) => r === 'Grace'), results);
    check('... through a single source read', db.readsOf('user:3') === 1, [...db.reads]);

    check('user:404 is cached absent', reader.isCachedAbsent('user:404'));
    await writer.create('user:404', 'Linus');
    check('ADDED drops the cached absence', await eventually(() => !reader.isCachedAbsent('user:404')));
    check('... and the new row is read', (await reader.get('user:404')) === 'Linus');

    check(
      'user:405 does not exist yet',
      (await reader.get('user:405')) === undefined && reader.isCachedAbsent('user:405'),
    );
    const subscriptions = reader.stats.subscriptions;
    reader.resubscribe(); // as if the connection dropped
    await writer.create('user:405', 'Barbara'); // lands while the reader is reconnecting
    check(
      'an Add made while reconnecting reaches the reader (resumed by after_seq)',
      await eventually(() => !reader.isCachedAbsent('user:405')),
    );
    check('... over a new subscription', await eventually(() => reader.stats.subscriptions > subscriptions));
    check('... and the new row is read', (await reader.get('user:405')) === 'Barbara');

    db.delete('user:1');
    check('a deleted row does not exist', (await reader.get('user:1')) === undefined);
    check('... its absence RECORDED as DELETED', (await gateAnswer('user:1')) === 'ANSWER_ABSENT BASIS_TOMBSTONE');
    check('... and cached locally', reader.isCachedAbsent('user:1'));

    // While the gate loads its state it answers MAY_EXIST + WARMING for every key and refuses writes; a row
    // found then is added with the first answer that is not WARMING. (This server is warm: the check feeds
    // the reader such an answer.)
    db.insert('user:legacy', 'Edsger');
    check('a row the gate does not know is ABSENT there', (await gateAnswer('user:legacy')).startsWith('ANSWER_ABSENT'));
    // Such an answer carries the seq loaded so far; here, the latest.
    const warming = { answer: 'ANSWER_MAY_EXIST', basis: 'BASIS_WARMING', observed_seq: await latestSeq() };
    check('read while the gate warms: found', (await reader.loadAndReport('user:legacy', warming, null)) === 'Edsger');
    check(
      '... and not added yet',
      (await gateAnswer('user:legacy')).startsWith('ANSWER_ABSENT') && reader.stats.adds === undefined,
    );
    await reader.get('user:406'); // the gate is ready: this answer is not WARMING
    check(
      '... added with the next answer',
      (await gateAnswer('user:legacy')).startsWith('ANSWER_MAY_EXIST') && reader.stats.adds === 1,
    );

    // RESYNC (events were missed, e.g. a long disconnection) clears every cached absence.
    check('some absences are cached', reader.isCachedAbsent('user:2'));
    // A RESYNC carries the namespace's latest seq.
    reader.applyInvalidation({ namespace, keys: [], seq: await latestSeq(), cause: 'INVALIDATION_CAUSE_RESYNC' });
    check('RESYNC drops them all', !reader.isCachedAbsent('user:2') && !reader.isCachedAbsent('user:1'));
    console.log('reader stats:', JSON.stringify(reader.stats));
  } finally {
    reader.close();
  }
}

async function main() {
  const { values } = parseArgs({
    options: {
      addr: { type: 'string', default: '127.0.0.1:50051' },
      namespace: { type: 'string', default: 'default' },
    },
  });
  const ExistenceGate = loadGateClient(PROTO_ROOT);
  const client = new ExistenceGate(values.addr, grpc.credentials.createInsecure());
  try {
    await selfCheck(client, values.namespace);
  } catch (error) {
    check('self-check ran to the end', false, String(error && error.stack ? error.stack : error));
  } finally {
    client.close();
  }
  console.log(`example: ${passed} passed, ${failed} failed`);
  process.exit(failed > 0 || passed === 0 ? 1 : 0);
}

main();
