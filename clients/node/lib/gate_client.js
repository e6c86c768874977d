// GateClient: the gate's calls over one channel per address, with single-key lookups coalesced into packed
// BatchMayExist calls (clients/README.md is the contract).
'use strict';

const grpc = require('@grpc/grpc-js');
const { loadExistencePackage } = require('./proto');

/** The server's default max_batch_keys: direct batches are split at this size. */
const MAX_BATCH_KEYS = 10_000;
/**
 * The server's default max_key_bytes. A key that is empty or longer is sent alone (unary MayExist), never in a
 * coalesced batch: the server's INVALID_ARGUMENT is then that caller's alone instead of failing its batch.
 */
const MAX_KEY_BYTES = 1024;
/** How long an address that answered UNAVAILABLE (or could not be reached) is skipped. */
const DOWN_MS = 1000;

const DEFAULTS = Object.freeze({
  coalesceWindowMs: 0.2,
  coalesceMaxKeys: 256,
  deadlineMs: 500,
  addressPolicy: 'round_robin',
});

const STATUS_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([name, code]) => [code, name]));

/** An error shaped like @grpc/grpc-js's ServiceError (code, details, metadata), for statuses made here. */
function gateError(code, details) {
  const error = new Error(`${code} ${STATUS_NAMES[code] || 'UNKNOWN'}: ${details}`);
  error.code = code;
  error.details = details;
  error.metadata = new grpc.Metadata();
  return error;
}

function toKeyBuffer(key) {
  if (typeof key === 'string') return Buffer.from(key, 'utf8');
  if (Buffer.isBuffer(key)) return key;
  if (key instanceof Uint8Array) return Buffer.from(key.buffer, key.byteOffset, key.byteLength);
  throw new TypeError(`a key is a string, Buffer or Uint8Array, not ${typeof key}`);
}

function varintLength(n) {
  let length = 1;
  while (n >= 0x80) {
    n >>>= 7;
    length++;
  }
  return length;
}

/** The keys as `packed_keys`: each preceded by its length as a protobuf varint. */
function packKeys(buffers) {
  let size = 0;
  for (const b of buffers) size += varintLength(b.length) + b.length;
  const out = Buffer.allocUnsafe(size);
  let offset = 0;
  for (const b of buffers) {
    let n = b.length;
    while (n >= 0x80) {
      out[offset++] = (n & 0x7f) | 0x80;
      n >>>= 7;
    }
    out[offset++] = n;
    offset += b.copy(out, offset);
  }
  return out;
}

/** Bit i of `may_exist_bitmap` (byte i / 8, bit i % 8, least significant first). */
function bitAt(bitmap, i) {
  return ((bitmap[i >> 3] >> (i & 7)) & 1) === 1;
}

function cancelledError(signal) {
  const reason = signal && signal.reason;
  const details = reason instanceof Error ? reason.message : reason !== undefined ? String(reason) : 'cancelled';
  return gateError(grpc.status.CANCELLED, `Cancelled on client: ${details}`);
}

const KINDS = {
  missing: 'ABSENCE_KIND_MISSING',
  deleted: 'ABSENCE_KIND_DELETED',
  ABSENCE_KIND_MISSING: 'ABSENCE_KIND_MISSING',
  ABSENCE_KIND_DELETED: 'ABSENCE_KIND_DELETED',
  ABSENCE_KIND_UNSPECIFIED: 'ABSENCE_KIND_UNSPECIFIED',
};

class Endpoint {
  constructor(address, stub) {
    this.address = address;
    this.stub = stub;
    this.downUntil = 0; // ms since the epoch; up when <= now
    this.downSince = 0;
  }
}

class GateClient {
  /**
   * @param {string|string[]} addresses gate addresses (host:port), replicas of one deployment
   * @param {object} [options] see index.d.ts / README (namespace, coalesceWindowMs, coalesceMaxKeys, deadlineMs,
   *   addressPolicy, token, credentials, channelOptions, protoDir)
   */
  constructor(addresses, options = {}) {
    const list = typeof addresses === 'string' ? [addresses] : [...(addresses || [])];
    if (list.length === 0) throw new TypeError('GateClient needs at least one address');
    const opts = { ...DEFAULTS, ...options };
    if (opts.addressPolicy !== 'round_robin' && opts.addressPolicy !== 'pick_first') {
      throw new TypeError(`addressPolicy is 'round_robin' or 'pick_first', not ${JSON.stringify(opts.addressPolicy)}`);
    }
    if (!(opts.coalesceWindowMs >= 0)) throw new TypeError('coalesceWindowMs must be >= 0');
    if (!(opts.coalesceMaxKeys >= 1)) throw new TypeError('coalesceMaxKeys must be >= 1');
    if (!(opts.deadlineMs > 0)) throw new TypeError('deadlineMs must be > 0');
    this.namespace = opts.namespace || '';
    this.addresses = list;
    this.coalesceWindowMs = opts.coalesceWindowMs;
    this.coalesceMaxKeys = Math.min(Math.floor(opts.coalesceMaxKeys), MAX_BATCH_KEYS);
    this.deadlineMs = opts.deadlineMs;
    this.addressPolicy = opts.addressPolicy;
    this.token = opts.token || null;
    this.credentials = opts.credentials || grpc.credentials.createInsecure();
    this.channelOptions = opts.channelOptions || {};
    this.ExistenceGate = loadExistencePackage(opts.protoDir).ExistenceGate;
    this.endpoints = list.map(
      (address) => new Endpoint(address, new this.ExistenceGate(address, this.credentials, this.channelOptions)),
    );
    this.next = 0; // round robin position
    this.pending = null; // the batch gathering single-key lookups
    this.closed = false;
    this.counters = { lookups: 0, gate_calls: 0, batched_keys: 0, retries: 0, absences_recorded: 0 };
  }

  /** A snapshot of this client's counters. */
  stats() {
    return { ...this.counters };
  }

  /**
   * Can `key` exist? Resolves {mayExist, observedSeq, warming, address}. Coalesced with concurrent calls
   * unless coalesceWindowMs is 0. Options: deadlineMs (from now) or deadline (Date / ms since the epoch), signal.
   */
  mayExist(key, options = {}) {
    this.counters.lookups++;
    let buffer;
    try {
      buffer = toKeyBuffer(key);
    } catch (error) {
      return Promise.reject(error);
    }
    const deadlineAt = this._deadline(options);
    if (this.closed) return Promise.reject(gateError(grpc.status.CANCELLED, 'the client is closed'));
    if (this.coalesceWindowMs <= 0 || buffer.length === 0 || buffer.length > MAX_KEY_BYTES) {
      return this._unaryMayExist(buffer, deadlineAt, options.signal);
    }
    return this._enqueue(buffer, deadlineAt, options.signal);
  }

  /**
   * Answers for many keys at once, in order: packed BatchMayExist calls of at most 10,000 keys (sent
   * concurrently). Each answer carries the smallest observedSeq of the parts (the conservative one to record
   * an absence with) and warming if any part was warming.
   */
  async mayExistMany(keys, options = {}) {
    const buffers = [...keys].map(toKeyBuffer);
    if (buffers.length === 0) return [];
    const deadlineAt = this._deadline(options);
    const parts = [];
    for (let start = 0; start < buffers.length; start += MAX_BATCH_KEYS) {
      parts.push(this._batch(buffers.slice(start, start + MAX_BATCH_KEYS), deadlineAt, options.signal));
    }
    const replies = await Promise.all(parts);
    const observedSeq = Math.min(...replies.map((r) => r.observedSeq));
    const warming = replies.some((r) => r.warming);
    const answers = new Array(buffers.length);
    replies.forEach((reply, part) => {
      const base = part * MAX_BATCH_KEYS;
      const count = Math.min(MAX_BATCH_KEYS, buffers.length - base);
      for (let i = 0; i < count; i++) {
        answers[base + i] = { mayExist: bitAt(reply.bitmap, i), observedSeq, warming, address: reply.address };
      }
    });
    return answers;
  }

  /**
   * Declares that keys exist (a writer calls it before inserting the rows). Resolves the Add's seq; more than
   * 10,000 keys are sent as several Adds (in order), resolving the last seq.
   */
  async add(keys, options = {}) {
    const buffers = (Array.isArray(keys) ? keys : [keys]).map(toKeyBuffer);
    const deadlineAt = this._deadline(options);
    let seq = 0;
    let start = 0;
    do {
      const part = buffers.slice(start, start + MAX_BATCH_KEYS);
      const { reply } = await this._call(
        'Add',
        { namespace: this.namespace, keys: part },
        { deadlineAt, signal: options.signal },
      );
      seq = Math.max(seq, reply.seq);
      start += MAX_BATCH_KEYS;
    } while (start < buffers.length);
    return seq;
  }

  /**
   * Records that the source said `key` does not exist. `kind` is 'missing' or 'deleted'; `observedSeq` the
   * lookup answer's. Option `address`: send it to that address first (the one that answered the lookup).
   * Resolves {outcome: 'RECORDED'|'REDUNDANT'|'SUPERSEDED'|'THROTTLED', seq, expiresInMs}.
   */
  async recordAbsent(key, kind = 'missing', observedSeq = 0, options = {}) {
    const kindName = KINDS[kind];
    if (!kindName) throw new TypeError(`kind is 'missing' or 'deleted', not ${JSON.stringify(kind)}`);
    const { reply } = await this._call(
      'RecordAbsent',
      { namespace: this.namespace, key: toKeyBuffer(key), kind: kindName, observed_seq: observedSeq || 0 },
      { deadlineAt: this._deadline(options), signal: options.signal, prefer: options.address },
    );
    const outcome = String(reply.outcome).replace(/^RECORD_OUTCOME_/, '');
    if (outcome === 'RECORDED') this.counters.absences_recorded++;
    return { outcome, seq: reply.seq, expiresInMs: reply.expires_in_ms };
  }

  /** Closes the channels; lookups still gathering fail with CANCELLED. */
  close() {
    if (this.closed) return;
    this.closed = true;
    const batch = this.pending;
    this.pending = null;
    if (batch) {
      batch.sent = true;
      clearTimeout(batch.timer);
      clearImmediate(batch.immediate);
      for (const waiter of batch.waiters) this._settle(waiter, gateError(grpc.status.CANCELLED, 'the client is closed'));
    }
    for (const endpoint of this.endpoints) endpoint.stub.close();
  }

  /**
   * A stub on a channel of its own (not shared with the lookups), for the invalidation subscription of
   * `address`. The caller closes it.
   */
  newSubscriptionStub(address) {
    return new this.ExistenceGate(address, this.credentials, {
      ...this.channelOptions,
      'grpc.use_local_subchannel_pool': 1,
    });
  }

  /** The call metadata (the bearer token, if any). */
  metadata() {
    const metadata = new grpc.Metadata();
    if (this.token) metadata.set('authorization', `Bearer ${this.token}`);
    return metadata;
  }

  // ---------------------------------------------------------------------------------------------------------

  _deadline(options) {
    if (options.deadline !== undefined) {
      return options.deadline instanceof Date ? options.deadline.getTime() : Number(options.deadline);
    }
    return Date.now() + (options.deadlineMs !== undefined ? options.deadlineMs : this.deadlineMs);
  }

  async _unaryMayExist(buffer, deadlineAt, signal) {
    const { reply, endpoint } = await this._call(
      'MayExist',
      { namespace: this.namespace, key: buffer },
      { deadlineAt, signal },
    );
    return {
      mayExist: reply.answer !== 'ANSWER_ABSENT',
      observedSeq: reply.observed_seq,
      warming: reply.basis === 'BASIS_WARMING',
      address: endpoint.address,
    };
  }

  /** One packed BatchMayExist: {bitmap, observedSeq, warming, address}. */
  async _batch(buffers, deadlineAt, signal) {
    const { reply, endpoint } = await this._call(
      'BatchMayExist',
      { namespace: this.namespace, packed_keys: packKeys(buffers) },
      { deadlineAt, signal },
    );
    const bitmap = reply.may_exist_bitmap || Buffer.alloc(0);
    if (bitmap.length * 8 < buffers.length) {
      throw gateError(
        grpc.status.INTERNAL,
        `BatchMayExist answered ${bitmap.length} bitmap bytes for ${buffers.length} keys`,
      );
    }
    return { bitmap, observedSeq: reply.observed_seq, warming: reply.warming === true, address: endpoint.address };
  }

  // --- coalescing -------------------------------------------------------------------------------------------

  _enqueue(buffer, deadlineAt, signal) {
    if (signal && signal.aborted) return Promise.reject(cancelledError(signal));
    return new Promise((resolve, reject) => {
      let batch = this.pending;
      if (!batch) {
        batch = {
          keys: [],
          index: new Map(), // key bytes (latin1) -> position in keys: duplicates share one slot
          waiters: [],
          started: process.hrtime.bigint(),
          sent: false,
          timer: null,
          immediate: null,
          abort: null, // cancels the RPC once every waiter has gone
          open: 0, // waiters not settled yet
        };
        this.pending = batch;
        this._schedule(batch);
      }
      const id = buffer.toString('latin1');
      let slot = batch.index.get(id);
      if (slot === undefined) {
        slot = batch.keys.length;
        batch.keys.push(buffer);
        batch.index.set(id, slot);
      }
      const waiter = { batch, slot, deadlineAt, resolve, reject, settled: false, timer: null, signal, onAbort: null };
      waiter.timer = setTimeout(
        () => this._settle(waiter, gateError(grpc.status.DEADLINE_EXCEEDED, 'Deadline exceeded')),
        Math.max(0, deadlineAt - Date.now()),
      );
      if (signal) {
        waiter.onAbort = () => this._settle(waiter, cancelledError(signal));
        signal.addEventListener('abort', waiter.onAbort, { once: true });
      }
      batch.waiters.push(waiter);
      batch.open++;
      if (batch.keys.length >= this.coalesceMaxKeys) this._flush(batch);
    });
  }

  /**
   * Sends the batch when its window ends. Node's timers have a 1 ms granularity (setTimeout(f, 0.2) fires
   * after about 1 ms), so a window under 1 ms is timed with process.hrtime: the batch is re-checked on each
   * turn of the event loop (setImmediate, after that turn's I/O callbacks) until the window has passed.
   * Windows of 1 ms or more use setTimeout.
   */
  _schedule(batch) {
    if (this.coalesceWindowMs >= 1) {
      batch.timer = setTimeout(() => this._flush(batch), this.coalesceWindowMs);
      return;
    }
    const windowNs = BigInt(Math.round(this.coalesceWindowMs * 1e6));
    const check = () => {
      batch.immediate = null;
      if (batch.sent) return;
      if (process.hrtime.bigint() - batch.started >= windowNs) this._flush(batch);
      else batch.immediate = setImmediate(check);
    };
    batch.immediate = setImmediate(check);
  }

  _flush(batch) {
    if (batch.sent) return;
    batch.sent = true;
    if (this.pending === batch) this.pending = null;
    clearTimeout(batch.timer);
    if (batch.immediate) clearImmediate(batch.immediate);
    // Keys of callers that already gave up are not sent.
    const waiters = batch.waiters.filter((w) => !w.settled);
    if (waiters.length === 0) return;
    const keys = [];
    const remap = new Map();
    let deadlineAt = 0;
    for (const waiter of waiters) {
      let slot = remap.get(waiter.slot);
      if (slot === undefined) {
        slot = keys.length;
        keys.push(batch.keys[waiter.slot]);
        remap.set(waiter.slot, slot);
      }
      waiter.slot = slot;
      deadlineAt = Math.max(deadlineAt, waiter.deadlineAt);
    }
    this.counters.batched_keys += keys.length;
    batch.abort = new AbortController();
    this._batch(keys, deadlineAt, batch.abort.signal).then(
      (reply) => {
        for (const waiter of waiters) {
          this._settle(waiter, null, {
            mayExist: bitAt(reply.bitmap, waiter.slot),
            observedSeq: reply.observedSeq,
            warming: reply.warming,
            address: reply.address,
          });
        }
      },
      (error) => {
        for (const waiter of waiters) this._settle(waiter, error);
      },
    );
  }

  _settle(waiter, error, answer) {
    if (waiter.settled) return;
    waiter.settled = true;
    clearTimeout(waiter.timer);
    if (waiter.onAbort) waiter.signal.removeEventListener('abort', waiter.onAbort);
    if (error) waiter.reject(error);
    else waiter.resolve(answer);
    const batch = waiter.batch;
    batch.open--;
    if (batch.open === 0 && batch.sent && batch.abort && error) batch.abort.abort(); // nobody waits any more
  }

  // --- addresses and retries --------------------------------------------------------------------------------

  /** The next address to try: up and not tried yet in this call; null when there is none to retry on. */
  _pick(tried) {
    const now = Date.now();
    const n = this.endpoints.length;
    const start = this.addressPolicy === 'pick_first' ? 0 : this.next++ % n;
    if (this.next >= Number.MAX_SAFE_INTEGER) this.next = 0;
    for (let j = 0; j < n; j++) {
      const endpoint = this.endpoints[(start + j) % n];
      if (!tried.has(endpoint) && endpoint.downUntil <= now) return endpoint;
    }
    if (tried.size > 0) return null;
    // Every address is down: try the one down the longest.
    let oldest = this.endpoints[0];
    for (const endpoint of this.endpoints) if (endpoint.downSince < oldest.downSince) oldest = endpoint;
    return oldest;
  }

  /**
   * One call with retries: UNAVAILABLE marks the address down for 1 s and the call goes on to the next address
   * that is up, within the deadline. Resolves {reply, endpoint}.
   */
  async _call(method, request, { deadlineAt, signal, prefer }) {
    const tried = new Set();
    let endpoint = null;
    if (prefer) {
      endpoint = this.endpoints.find((e) => e.address === prefer && e.downUntil <= Date.now()) || null;
    }
    if (!endpoint) endpoint = this._pick(tried);
    for (;;) {
      tried.add(endpoint);
      if (method === 'MayExist' || method === 'BatchMayExist') this.counters.gate_calls++;
      try {
        const reply = await this._unary(endpoint, method, request, deadlineAt, signal);
        endpoint.downUntil = 0;
        return { reply, endpoint };
      } catch (error) {
        if (error.code !== grpc.status.UNAVAILABLE) throw error;
        const now = Date.now();
        if (endpoint.downUntil <= now) endpoint.downSince = now;
        endpoint.downUntil = now + DOWN_MS;
        if (now >= deadlineAt || (signal && signal.aborted) || this.closed) throw error;
        const next = this._pick(tried);
        if (!next) throw error;
        this.counters.retries++;
        endpoint = next;
      }
    }
  }

  _unary(endpoint, method, request, deadlineAt, signal) {
    return new Promise((resolve, reject) => {
      if (signal && signal.aborted) {
        reject(cancelledError(signal));
        return;
      }
      let onAbort = null;
      const call = endpoint.stub[method](request, this.metadata(), { deadline: deadlineAt }, (error, reply) => {
        if (onAbort) signal.removeEventListener('abort', onAbort);
        if (error) reject(error);
        else resolve(reply);
      });
      if (signal) {
        onAbort = () => call.cancel();
        signal.addEventListener('abort', onAbort, { once: true });
      }
    });
  }
}

module.exports = {
  GateClient,
  gateError,
  toKeyBuffer,
  packKeys,
  bitAt,
  DEFAULTS,
  MAX_BATCH_KEYS,
  MAX_KEY_BYTES,
  DOWN_MS,
};
