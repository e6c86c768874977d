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
  coalesceMaxKeys: 1024,
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
    // Coalescing (see _gather): callers not sent yet, oldest first, and their keys; batches sent and not answered.
    this.queue = [];
    this.queuedKeys = 0;
    this.inFlight = 0;
    this.windowNs = BigInt(Math.round(this.coalesceWindowMs * 1e6));
    this.gatherQueued = false; // a microtask will run _gather
    this.windowTimer = null; // setTimeout (windows of 1 ms or more) ...
    this.windowDue = 0n;
    this.windowImmediate = null; // ... or the setImmediate loop (shorter windows)
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
    return this._enqueue([buffer], true, deadlineAt, options.signal).then((share) => ({
      mayExist: bitAt(share.bitmap, share.offset),
      observedSeq: share.observedSeq,
      warming: share.warming,
      address: share.address,
    }));
  }

  /**
   * Answers for many keys at once, in order, in parts of at most 10,000 keys (sent concurrently). With
   * coalescing on, each part whose keys are all coalescable joins the pending batch as one caller (a batch never
   * splits it), so concurrent small batches share calls; otherwise a part is its own packed BatchMayExist. Each
   * answer carries the smallest observedSeq of the parts (the conservative one to record an absence with) and
   * warming if any part was warming.
   */
  async mayExistMany(keys, options = {}) {
    const buffers = [...keys].map(toKeyBuffer);
    if (buffers.length === 0) return [];
    const deadlineAt = this._deadline(options);
    if (this.closed) throw gateError(grpc.status.CANCELLED, 'the client is closed');
    const parts = [];
    for (let start = 0; start < buffers.length; start += MAX_BATCH_KEYS) {
      const part = buffers.slice(start, start + MAX_BATCH_KEYS);
      const coalesce = this.coalesceWindowMs > 0 && part.every((b) => b.length > 0 && b.length <= MAX_KEY_BYTES);
      parts.push(
        coalesce
          ? this._enqueue(part, false, deadlineAt, options.signal)
          : this._batch(part, deadlineAt, options.signal).then((reply) => ({ ...reply, offset: 0 })),
      );
    }
    const shares = await Promise.all(parts);
    const observedSeq = Math.min(...shares.map((r) => r.observedSeq));
    const warming = shares.some((r) => r.warming);
    const answers = new Array(buffers.length);
    shares.forEach((share, part) => {
      const base = part * MAX_BATCH_KEYS;
      const count = Math.min(MAX_BATCH_KEYS, buffers.length - base);
      for (let i = 0; i < count; i++) {
        answers[base + i] = {
          mayExist: bitAt(share.bitmap, share.offset + i),
          observedSeq,
          warming,
          address: share.address,
        };
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
    this._cancelWindow();
    for (const waiter of this.queue) this._settle(waiter, gateError(grpc.status.CANCELLED, 'the client is closed'));
    this.queue = [];
    this.queuedKeys = 0;
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
  //
  // Callers wait in `queue` (a single-key lookup, or a part of mayExistMany with its keys). The gatherer
  // (_gather) sends the oldest callers as one packed BatchMayExist when (a) no coalesced batch is in flight,
  // (b) the oldest has waited the window, or (c) they hold coalesceMaxKeys keys. It runs in a microtask after a
  // caller arrives (so the callers of one synchronous run share the batch, at no cost in time), when the window
  // ends, and when the last batch in flight is answered. So a lone caller pays one round trip, and under load
  // each batch carries what arrived while the previous ones were out.

  /** Queues `keys` as one caller; resolves its share of a batch's answer: {bitmap, offset, observedSeq, ...}. */
  _enqueue(keys, single, deadlineAt, signal) {
    if (signal && signal.aborted) return Promise.reject(cancelledError(signal));
    return new Promise((resolve, reject) => {
      const waiter = {
        keys,
        single,
        arrived: process.hrtime.bigint(),
        deadlineAt,
        resolve,
        reject,
        settled: false,
        batch: null, // once sent: {abort, open}
        offset: 0, // once sent: where its keys' bits start in the batch's bitmap
        timer: null,
        signal,
        onAbort: null,
      };
      waiter.timer = setTimeout(
        () => this._settle(waiter, gateError(grpc.status.DEADLINE_EXCEEDED, 'Deadline exceeded')),
        Math.max(0, deadlineAt - Date.now()),
      );
      if (signal) {
        waiter.onAbort = () => this._settle(waiter, cancelledError(signal));
        signal.addEventListener('abort', waiter.onAbort, { once: true });
      }
      this.queue.push(waiter);
      this.queuedKeys += keys.length;
      if (!this.gatherQueued) {
        this.gatherQueued = true;
        queueMicrotask(() => {
          this.gatherQueued = false;
          this._gather();
        });
      }
    });
  }

  /** Sends what the rules above say must leave now; otherwise makes sure the window's end is checked. */
  _gather() {
    if (this.closed) return;
    for (;;) {
      // Callers that gave up while queued are dropped (their keys were uncounted when they settled).
      let gone = 0;
      while (gone < this.queue.length && this.queue[gone].settled) gone++;
      if (gone > 0) this.queue.splice(0, gone);
      if (this.queue.length === 0) {
        this._cancelWindow();
        return;
      }
      const due = this.queue[0].arrived + this.windowNs;
      if (this.inFlight === 0 || this.queuedKeys >= this.coalesceMaxKeys || process.hrtime.bigint() >= due) {
        this._send(this._take());
        continue;
      }
      this._scheduleWindow(due);
      return;
    }
  }

  /** The oldest callers, up to coalesceMaxKeys keys (at least one caller, never past 10,000 keys). */
  _take() {
    const batch = [];
    let keys = 0;
    let count = 0;
    for (const waiter of this.queue) {
      if (waiter.settled) {
        count++;
        continue;
      }
      if (batch.length > 0 && (keys >= this.coalesceMaxKeys || keys + waiter.keys.length > MAX_BATCH_KEYS)) break;
      batch.push(waiter);
      keys += waiter.keys.length;
      count++;
    }
    this.queue.splice(0, count);
    this.queuedKeys -= keys;
    return batch;
  }

  /**
   * Checks the window's end. Node's timers have a 1 ms granularity (setTimeout(f, 0.2) fires after about 1 ms),
   * so a window under 1 ms is timed with process.hrtime: _gather runs again on each turn of the event loop
   * (setImmediate, after that turn's I/O callbacks) until the window has passed or the batch in flight is
   * answered. This only happens while a batch is in flight and callers wait. Windows of 1 ms or more use
   * setTimeout.
   */
  _scheduleWindow(due) {
    if (this.coalesceWindowMs >= 1) {
      if (this.windowTimer && this.windowDue === due) return;
      clearTimeout(this.windowTimer);
      this.windowDue = due;
      const ms = Number(due - process.hrtime.bigint()) / 1e6;
      // setTimeout takes at most 2^31 - 1 ms (longer fires at once); a longer window is re-armed.
      this.windowTimer = setTimeout(
        () => {
          this.windowTimer = null;
          this._gather();
        },
        Math.min(Math.max(0, Math.ceil(ms)), 2 ** 31 - 1),
      );
      return;
    }
    if (this.windowImmediate) return;
    this.windowImmediate = setImmediate(() => {
      this.windowImmediate = null;
      this._gather();
    });
  }

  _cancelWindow() {
    if (this.windowTimer) clearTimeout(this.windowTimer);
    if (this.windowImmediate) clearImmediate(this.windowImmediate);
    this.windowTimer = null;
    this.windowImmediate = null;
  }

  /** Sends one batch and answers each of its callers: its keys' bits, or the batch's status. */
  _send(waiters) {
    const keys = [];
    const slots = new Map(); // single keys (latin1) -> position: duplicate lookups share one slot
    let deadlineAt = 0;
    const batch = { abort: new AbortController(), open: waiters.length };
    for (const waiter of waiters) {
      waiter.batch = batch;
      if (waiter.single) {
        const id = waiter.keys[0].toString('latin1');
        let slot = slots.get(id);
        if (slot === undefined) {
          slot = keys.length;
          keys.push(waiter.keys[0]);
          slots.set(id, slot);
        }
        waiter.offset = slot;
      } else {
        waiter.offset = keys.length;
        for (const key of waiter.keys) keys.push(key);
      }
      deadlineAt = Math.max(deadlineAt, waiter.deadlineAt);
    }
    this.counters.batched_keys += keys.length;
    this.inFlight++;
    this._batch(keys, deadlineAt, batch.abort.signal).then(
      (reply) => {
        this._answered();
        for (const waiter of waiters) this._settle(waiter, null, { ...reply, offset: waiter.offset });
      },
      (error) => {
        this._answered();
        for (const waiter of waiters) this._settle(waiter, error);
      },
    );
  }

  /** A batch came back: when none is left in flight, the callers waiting go at once. */
  _answered() {
    this.inFlight--;
    if (this.inFlight === 0 && this.queue.length > 0) this._gather();
  }

  _settle(waiter, error, answer) {
    if (waiter.settled) return;
    waiter.settled = true;
    clearTimeout(waiter.timer);
    if (waiter.onAbort) waiter.signal.removeEventListener('abort', waiter.onAbort);
    if (error) waiter.reject(error);
    else waiter.resolve(answer);
    const batch = waiter.batch;
    if (!batch) {
      this.queuedKeys -= waiter.keys.length; // gave up while queued: its keys will not be sent
      return;
    }
    batch.open--;
    if (batch.open === 0 && error) batch.abort.abort(); // nobody waits any more
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

  /** Whether an address not tried yet in this call is up (asking takes no round-robin turn). */
  _anotherUp(tried) {
    const now = Date.now();
    return this.endpoints.some((endpoint) => !tried.has(endpoint) && endpoint.downUntil <= now);
  }

  /**
   * One call with retries: UNAVAILABLE, or no answer within half of what is left of the deadline while another
   * address not tried yet is up, marks the address down for 1 s and the call goes on to the next address that
   * is up, within the deadline. Resolves {reply, endpoint}.
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
      // An address that accepts and never answers (a stopped replica, its connections open) would hold the
      // call to its deadline: while another untried address is up, it gets half of what remains, then the call
      // moves on. With none up, it gets all of it: a slow replica alone still answers within the deadline.
      const attemptEnds = this._anotherUp(tried) ? Date.now() + (deadlineAt - Date.now()) / 2 : deadlineAt;
      try {
        const reply = await this._unary(endpoint, method, request, attemptEnds, signal);
        endpoint.downUntil = 0;
        return { reply, endpoint };
      } catch (error) {
        const silent = error.code === grpc.status.DEADLINE_EXCEEDED && Date.now() < deadlineAt;
        if (error.code !== grpc.status.UNAVAILABLE && !silent) throw error;
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
