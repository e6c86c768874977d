// A small service's read path over existence-gate with the Node client library (clients/node), with an
// in-memory Map standing in for the database.
//
//   (cd examples/node && npm ci) && node examples/node/main.js --addr 127.0.0.1:50051 --namespace default
//
// Runs a short self-check against the server (each step prints ok/FAIL) and exits 0 when every step passed.
// Use a namespace nobody else writes to: the checks expect to be the only writer of the keys they use.
'use strict';

const { parseArgs } = require('util');
const { GateClient, GatedReader, Found, MISSING, DELETED } = require('existence-gate-client');

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

/** The write path: Add the key to the gate before the insert becomes visible in the source. */
class Writer {
  constructor(client, db) {
    Object.assign(this, { client, db });
  }

  async create(key, value) {
    await this.client.add([key]);
    this.db.insert(key, value);
  }

  /** The Add succeeded but the insert then failed: the gate holds a key the source lacks. */
  async createFailed(key) {
    await this.client.add([key]);
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

async function selfCheck(addr, namespace) {
  const db = new Database();
  // The reader's client coalesces its lookups (200 µs window); the writer and the checks use their own.
  const client = new GateClient(addr, { namespace });
  const writerClient = new GateClient(addr, { namespace });
  const probe = new GateClient(addr, { namespace, coalesceWindowMs: 0 });
  const writer = new Writer(writerClient, db);
  const reader = new GatedReader(client, (key) => db.load(key));
  const gateSaysAbsent = async (key) => !(await probe.mayExist(key)).mayExist;
  // The namespace's latest seq, which every answer carries (never 0: seqs start at 1).
  const latestSeq = async () => (await probe.mayExist('user:0')).observedSeq;

  try {
    check('the invalidation subscription goes live', await reader.ready(10_000));

    await writer.create('user:1', 'Ada');
    check('an added row is read from the source', (await reader.get('user:1')) === 'Ada');
    check('... with one source read', db.totalReads() === 1, [...db.reads]);

    check('a key never added does not exist', (await reader.get('user:404')) === undefined);
    check('... and the gate spared the source', db.totalReads() === 1, [...db.reads]);
    check('... and the absence is cached locally', reader.isCachedAbsent('user:404'));
    const calls = reader.stats().gate_calls;
    check(
      'a second read of it is a local hit',
      (await reader.get('user:404')) === undefined && reader.stats().gate_calls === calls,
    );

    await writer.createFailed('user:2');
    check('a key the gate knows but the source lacks does not exist', (await reader.get('user:2')) === undefined);
    check('... the source was read once', db.readsOf('user:2') === 1, [...db.reads]);
    check('... and the absence RECORDED at the gate', reader.stats().absences_recorded === 1, reader.stats());
    // The filter holds user:2 (it was added): an ABSENT answer now rests on the tombstone.
    check('... so the gate now answers it ABSENT', await gateSaysAbsent('user:2'));
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
    const resubscribes = reader.stats().resubscribes;
    reader.dropSubscription(); // as if the connection dropped
    await writer.create('user:405', 'Barbara'); // lands while the reader is reconnecting
    check(
      'an Add made while reconnecting reaches the reader (resumed by after_seq)',
      await eventually(() => !reader.isCachedAbsent('user:405')),
    );
    check('... over a new subscription', await eventually(() => reader.stats().resubscribes > resubscribes));
    check('... and the new row is read', (await reader.get('user:405')) === 'Barbara');

    db.delete('user:1');
    check('a deleted row does not exist', (await reader.get('user:1')) === undefined);
    check('... its absence RECORDED (as DELETED): the gate answers it ABSENT', await gateSaysAbsent('user:1'));
    check('... and cached locally', reader.isCachedAbsent('user:1'));

    // While the gate loads its state it answers MAY_EXIST + WARMING for every key and refuses writes; a row
    // found then is added with the first answer that is not WARMING. (This server is warm: the check feeds
    // the reader's source step such an answer.)
    db.insert('user:legacy', 'Edsger');
    check('a row the gate does not know is ABSENT there', await gateSaysAbsent('user:legacy'));
    // Such an answer carries the seq loaded so far; here, the latest.
    const warming = { mayExist: true, observedSeq: await latestSeq(), warming: true, address: addr };
    check('read while the gate warms: found', (await reader._loadAndReport('user:legacy', warming, null)) === 'Edsger');
    check(
      '... and not added yet',
      (await gateSaysAbsent('user:legacy')) && reader.stats().pending_adds_sent === 0,
    );
    await reader.get('user:406'); // the gate is ready: this answer is not WARMING
    check(
      '... added with the next answer',
      !(await gateSaysAbsent('user:legacy')) && reader.stats().pending_adds_sent === 1,
    );

    // RESYNC (events were missed, e.g. a long disconnection) clears every cached absence.
    // user:1's absence is cached as DELETED (10 minutes here); user:2's MISSING one may have expired by now
    // (1 s in the interop configuration).
    check('some absences are cached', reader.isCachedAbsent('user:1'));
    // A RESYNC carries the namespace's latest seq.
    reader.applyInvalidation({ namespace, keys: [], seq: await latestSeq(), cause: 'INVALIDATION_CAUSE_RESYNC' });
    check('RESYNC drops them all', !reader.isCachedAbsent('user:2') && !reader.isCachedAbsent('user:1'));
    console.log('reader stats:', JSON.stringify(reader.stats()));
  } finally {
    reader.close();
    for (const c of [client, writerClient, probe]) c.close();
  }
}

async function main() {
  const { values } = parseArgs({
    options: {
      addr: { type: 'string', default: '127.0.0.1:50051' },
      namespace: { type: 'string', default: 'default' },
    },
  });
  try {
    await selfCheck(values.addr, values.namespace);
  } catch (error) {
    check('self-check ran to the end', false, String(error && error.stack ? error.stack : error));
  }
  console.log(`example: ${passed} passed, ${failed} failed`);
  process.exit(failed > 0 || passed === 0 ? 1 : 0);
}

main();
