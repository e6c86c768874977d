// The conformance cases every client library runs (clients/conformance/cases.txt, the behaviours of
// clients/README.md written once), against a real gate started with clients/conformance/gate.toml.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const { GateClient, GatedReader, Found, MISSING } = require('..');
const { startServer, deadAddress, eventually, DEADLINE_MS, WAIT_MS } = require('./server');

const HERE = path.join(__dirname, '..', '..', 'conformance');

/** The cases: {number, name, lines: [{line, words}]}. */
function cases() {
  const parsed = [];
  fs.readFileSync(path.join(HERE, 'cases.txt'), 'utf8')
    .split('\n')
    .forEach((text, index) => {
      const words = text.split('#')[0].split(/\s+/).filter((w) => w.length > 0);
      if (words.length === 0) return;
      if (words[0] === 'case') parsed.push({ number: parsed.length + 1, name: words.slice(1).join(' '), lines: [] });
      else parsed[parsed.length - 1].lines.push({ line: index + 1, words });
    });
  return parsed;
}

/** The words before and after `->`. */
function splitArrow(words) {
  const arrow = words.indexOf('->');
  assert.ok(arrow >= 0, 'a line with ->');
  return [words.slice(0, arrow), words.slice(arrow + 1)];
}

function codeName(code) {
  return Object.keys(grpc.status).find((name) => grpc.status[name] === code) || String(code);
}

let server;
let dead;

before(async () => {
  server = await startServer({ namespaces: [], extraConfig: fs.readFileSync(path.join(HERE, 'gate.toml'), 'utf8') });
  dead = await deadAddress();
});

after(async () => {
  if (server) await server.stop();
});

/** A case being run: its options until the first call, then its client (and reader). */
class Run {
  constructor(kase) {
    this.kase = kase;
    this.options = { namespace: 'users', deadlineMs: DEADLINE_MS };
    this.addresses = [server.address];
    this.table = new Map();
  }

  key(word) {
    if (word === '<empty>') return '';
    if (word === '<oversized>') return 'x'.repeat(1025);
    return `${this.kase.number}:${word}`;
  }

  client() {
    if (!this.gate) this.gate = new GateClient(this.addresses, this.options);
    return this.gate;
  }

  stats() {
    return (this.reader || this.gate).stats();
  }

  async line(words) {
    const [verb, ...rest] = words;
    switch (verb) {
      case 'option':
        return this.option(rest[0], rest[1]);
      case 'add':
        return this.client().add(rest.map((w) => this.key(w)));
      case 'lookup':
        return this.lookup(rest);
      case 'many':
        return this.many(rest);
      case 'stats':
        return this.checkStats(rest);
      case 'reader':
        this.reader = new GatedReader(this.client(), async (key) =>
          this.table.has(key) ? Found(this.table.get(key)) : MISSING,
        );
        return undefined;
      case 'row':
        this.table.set(this.key(rest[0]), rest[1]);
        return undefined;
      case 'get': {
        const [question, answer] = splitArrow(rest);
        assert.equal(await this.get(question[0]), answer[0]);
        return undefined;
      }
      case 'eventually':
        return this.eventually(rest);
      default:
        throw new Error(`no such line: ${verb}`);
    }
  }

  option(name, value) {
    assert.ok(!this.gate, 'options come before the first call');
    const set = {
      coalesce_window_ms: () => (this.options.coalesceWindowMs = Number(value)),
      deadline_ms: () => (this.options.deadlineMs = Number(value)),
      namespace: () => (this.options.namespace = value),
      address_policy: () => (this.options.addressPolicy = value),
      addresses: () =>
        (this.addresses = value.split(',').map((a) => ({ gate: server.address, dead })[a] || assert.fail(`no address ${a}`))),
    }[name];
    assert.ok(set, `no option ${name}`);
    set();
  }

  async lookup(words) {
    const [keys, expected] = splitArrow(words);
    const client = this.client();
    const results = await Promise.allSettled(keys.map((k) => client.mayExist(this.key(k))));
    const answers = results.map((r) => (r.status === 'fulfilled' ? String(r.value.mayExist) : codeName(r.reason.code)));
    assert.deepEqual(answers, expected, `answers for ${keys}`);
  }

  async many(words) {
    const [[count, prefix], [calls]] = splitArrow(words);
    const names = Array.from({ length: Number(count) }, (_, i) => `${prefix}${i}`);
    const client = this.client();
    const before = client.stats().gate_calls;
    const answers = await client.mayExistMany(names.map((n) => this.key(n)));
    assert.equal(answers.length, Number(count));
    for (const { words: added } of this.kase.lines.filter((l) => l.words[0] === 'add')) {
      for (const name of added.slice(1)) assert.equal(answers[names.indexOf(name)].mayExist, true, `${name} was added`);
    }
    assert.equal(String(client.stats().gate_calls - before), calls, 'calls sent');
  }

  checkStats(checks) {
    const stats = this.stats();
    for (const check of checks) {
      const [, name, op, value] = /^(\w+)(>=|=)(\d+)$/.exec(check);
      assert.ok(name in stats, `no counter ${name}`);
      const holds = op === '>=' ? stats[name] >= Number(value) : stats[name] === Number(value);
      assert.ok(holds, `${check}: ${name} is ${stats[name]} (${JSON.stringify(stats)})`);
    }
  }

  async get(word) {
    const value = await this.reader.get(this.key(word));
    return value === undefined ? 'missing' : value;
  }

  async eventually(words) {
    const holds = async () => {
      if (words[0] === 'get') {
        const [question, answer] = splitArrow(words.slice(1));
        return (await this.get(question[0])) === answer[0];
      }
      assert.equal(words[0], 'cached', `no such eventually: ${words[0]}`);
      const hits = this.reader.stats().cache_hits;
      assert.equal(await this.get(words[1]), 'missing');
      return this.reader.stats().cache_hits > hits;
    };
    assert.ok(await eventually(holds, WAIT_MS), `not within ${WAIT_MS} ms`);
  }

  close() {
    if (this.reader) this.reader.close();
    if (this.gate) this.gate.close();
  }
}

for (const kase of cases()) {
  test(`case ${kase.number}: ${kase.name}`, async () => {
    const run = new Run(kase);
    try {
      for (const { line, words } of kase.lines) {
        try {
          await run.line(words);
        } catch (error) {
          error.message = `cases.txt line ${line} \`${words.join(' ')}\`: ${error.message}`;
          throw error;
        }
      }
    } finally {
      run.close();
    }
  });
}
