// The recommended existence-gate read path for Node services (@grpc/grpc-js + @grpc/proto-loader).
//
//   const { loadGateClient, GatedReader } = require('./gated_reader');
//   const ExistenceGate = loadGateClient('path/to/proto');
//   const client = new ExistenceGate('gate:50051', grpc.credentials.createInsecure());
//   const reader = new GatedReader({ client, namespace: 'users', load: (key) => db.loadUser(key) });
//   await reader.start(); // subscribe first: absences are cached only while the stream is live
//   const user = await reader.get('user:42'); // undefined when the key does not exist
//
// get(key):
//  1. a local, bounded, short-TTL cache of absences: a hit means "does not exist", no call at all;
//  2. MayExist: ABSENT means "does not exist" (and is cached locally);
//  3. MAY_EXIST: read the source through a per-key single flight, so a burst of reads of one key costs one
//     source read; found: return it (and Add it if the gate did not know it: it answered WARMING, i.e. it was
//     still loading and refuses writes until it is done, so the key is added with the first answer that is
//     not WARMING); not found: RecordAbsent(kind, observed_seq), and when the gate RECORDED it cache it locally too;
//  4. a background SubscribeInvalidations drops cached absences on ADDED, clears them all on RESYNC, and
//     reconnects with after_seq = the last seq seen, so no Add is missed across a reconnect.
//
// The gate is an optimisation, never a dependency: when it cannot be reached the reader goes to the source.
//
// A local absence is cached only when no invalidation of the key can have been applied before the entry is
// written: the same subscription must be live from before the MayExist until the write, and must not have
// applied any seq past the one the answer was computed at.
//
// Seqs are loaded as JavaScript numbers (`longs: Number`): exact up to 2^53, far beyond any namespace's seq.
'use strict';

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

/** Options for loading existence.proto: field names as in the proto, enums as their names. */
const LOAD_OPTIONS = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };

/** Loads proto/existence/v1/existence.proto from `protoRoot` and returns the ExistenceGate client class. */
function loadGateClient(protoRoot) {
  const definition = protoLoader.loadSync('existence/v1/existence.proto', { ...LOAD_OPTIONS, includeDirs: [protoRoot] });
  return grpc.loadPackageDefinition(definition).existence.v1.ExistenceGate;
}

/** At most this many keys found while the gate was warming wait to be added (one Add call's worth). */
const MAX_PENDING_ADDS = 10_000;

/** What a source loader resolves to. */
const Found = (value) => ({ status: 'found', value });
const MISSING = Object.freeze({ status: 'missing' }); // recorded as ABSENCE_KIND_MISSING
const DELETED = Object.freeze({ status: 'deleted' }); // recorded as ABSENCE_KIND_DELETED

/** A bounded LRU of keys known to be absent, each kept at most `ttlMs`. */
class AbsenceCache {
  constructor(maxEntries, ttlMs) {
    this.maxEntries = maxEntries;
    this.ttlMs = ttlMs;
    this.expiry = new Map(); // insertion order = LRU order
  }

  has(key, now = Date.now()) {
    const expiry = this.expiry.get(key);
    if (expiry === undefined) return false;
    this.expiry.delete(key);
    if (expiry <= now) return false;
    this.expiry.set(key, expiry); // most recently used
    return true;
  }

  add(key, now = Date.now()) {
    this.expiry.delete(key);
    this.expiry.set(key, now + this.ttlMs);
    while (this.expiry.size > this.maxEntries) {
      this.expiry.delete(this.expiry.keys().next().value);
    }
  }

  delete(key) {
    this.expiry.delete(key);
  }

  clear() {
    this.expiry.clear();
  }
}

class GatedReader {
  /**
   * @param {object} options
   * @param {grpc.Client} options.client an ExistenceGate client (see loadGateClient)
   * @param {string} options.namespace
   * @param {(key: string) => Promise<{status: 'found'|'missing'|'deleted', value?: any}>} options.load
   */
  constructor({
    client,
    namespace,
    load,
    cacheSize = 100_000,
    cacheTtlMs = 5_000,
    callTimeoutMs = 500,
    reconnectDelayMs = 200,
    maxReconnectDelayMs = 5_000,
    logger = console,
  }) {
    this.client = client;
    this.namespace = namespace;
    this.loadSource = load;
    this.callTimeoutMs = callTimeoutMs;
    this.reconnectDelayMs = reconnectDelayMs;
    this.maxReconnectDelayMs = maxReconnectDelayMs;
    this.logger = logger;
    this.absent = new AbsenceCache(cacheSize, cacheTtlMs);
    this.flights = new Map(); // key -> the promise of its running source read
    this.pendingAdds = new Set(); // keys found while the gate was warming, added once it is ready
    this.cursor = 0; // the last seq applied from the stream
    this.live = false;
    this.epoch = 0; // changes whenever the subscription goes up or down
    this.call = null;
    this.closed = false;
    this.timer = null;
    this.delayMs = reconnectDelayMs;
    this.stats = {};
    this.readyWaiters = [];
  }

  count(name) {
    this.stats[name] = (this.stats[name] || 0) + 1;
  }

  /** Starts the invalidation subscription; resolves true once it is live, false after `timeoutMs`. */
  start(timeoutMs = 10_000) {
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(false), timeoutMs);
      this.readyWaiters.push(() => {
        clearTimeout(timer);
        resolve(true);
      });
      this.subscribe();
    });
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.call) this.call.cancel();
  }

  /** The source's value of `key`, or undefined when it does not exist (or was deleted). */
  async get(key) {
    if (this.absent.has(key)) {
      this.count('local_hits');
      return undefined;
    }
    const epoch = this.live ? this.epoch : null;
    let reply = null;
    try {
      reply = await this.unary('MayExist', { namespace: this.namespace, key: Buffer.from(key) });
      this.count('gate_calls');
      if (reply.basis !== 'BASIS_WARMING' && this.pendingAdds.size > 0) await this.flushPendingAdds();
    } catch (error) {
      // Fail open: without the gate every read goes to the source.
      this.count('gate_errors');
      this.logger.warn(`MayExist(${key}) failed (${error.code}); reading the source`);
    }
    if (reply && reply.answer === 'ANSWER_ABSENT') {
      this.count('gate_absent');
      this.rememberAbsent(key, reply.observed_seq, epoch);
      return undefined;
    }
    let flight = this.flights.get(key);
    if (!flight) {
      flight = this.loadAndReport(key, reply, epoch).finally(() => this.flights.delete(key));
      this.flights.set(key, flight);
    }
    return flight;
  }

  /** Reads the source for a key the gate passed (`reply` is null when the gate could not be asked). */
  async loadAndReport(key, reply, epoch) {
    this.count('source_reads');
    const row = await this.loadSource(key);
    if (row.status !== 'found') {
      if (reply) {
        try {
          const recorded = await this.unary('RecordAbsent', {
            namespace: this.namespace,
            key: Buffer.from(key),
            kind: row.status === 'deleted' ? 'ABSENCE_KIND_DELETED' : 'ABSENCE_KIND_MISSING',
            observed_seq: reply.observed_seq,
          });
          if (recorded.outcome === 'RECORD_OUTCOME_RECORDED') {
            this.count('absences_recorded');
            this.rememberAbsent(key, recorded.seq, epoch);
          } else {
            // REDUNDANT, SUPERSEDED (an Add raced this read), THROTTLED: nothing stored.
            this.count('absences_not_stored');
          }
        } catch (error) {
          this.count('gate_errors');
          this.logger.warn(`RecordAbsent(${key}) failed: ${error.code}`);
        }
      }
      return undefined;
    }
    if (reply && reply.basis === 'BASIS_WARMING' && this.pendingAdds.size < MAX_PENDING_ADDS) {
      // The gate is still loading and may not know this key; it refuses writes until it is ready.
      this.pendingAdds.add(key);
    }
    return row.value;
  }

  /** Adds the keys found while the gate was warming, in one call. */
  async flushPendingAdds() {
    const keys = [...this.pendingAdds];
    this.pendingAdds.clear();
    try {
      await this.unary('Add', { namespace: this.namespace, keys: keys.map((key) => Buffer.from(key)) });
      this.stats.adds = (this.stats.adds || 0) + keys.length;
    } catch (error) {
      this.count('gate_errors');
      this.logger.warn(`Add of ${keys.length} keys found while the gate was warming failed: ${error.code}`);
      if (error.code === grpc.status.UNAVAILABLE) {
        for (const key of keys) if (this.pendingAdds.size < MAX_PENDING_ADDS) this.pendingAdds.add(key);
      }
    }
  }

  rememberAbsent(key, seq, epoch) {
    // Only if the same live subscription covers everything after `seq`: otherwise an invalidation of this key
    // may already have been applied (or missed), and the entry could outlive the key's absence.
    if (epoch !== null && this.live && this.epoch === epoch && this.cursor <= seq) {
      this.absent.add(key);
    }
  }

  isCachedAbsent(key) {
    return this.absent.has(key);
  }

  /** Drops the cached absences an invalidation makes wrong (all of them for RESYNC). */
  applyInvalidation(invalidation) {
    if (invalidation.cause === 'INVALIDATION_CAUSE_RESYNC') {
      this.absent.clear();
      this.count('resyncs');
    } else {
      for (const key of invalidation.keys) this.absent.delete(key.toString('utf8'));
      this.count('invalidations');
    }
    this.cursor = Math.max(this.cursor, invalidation.seq);
  }

  /** Ends the current subscription stream; the reader reconnects from its last seq, as after any drop. */
  resubscribe() {
    if (this.call) this.call.cancel();
  }

  unary(method, request) {
    return new Promise((resolve, reject) => {
      this.client[method](request, { deadline: Date.now() + this.callTimeoutMs }, (error, reply) =>
        error ? reject(error) : resolve(reply),
      );
    });
  }

  subscribe() {
    if (this.closed) return;
    const afterSeq = this.cursor;
    const call = this.client.SubscribeInvalidations({ namespace: this.namespace, after_seq: afterSeq });
    this.call = call;
    // The server sends headers once it has registered the subscription: from then on the stream is live.
    call.on('metadata', () => this.wentLive(afterSeq === 0));
    call.on('data', (invalidation) => this.applyInvalidation(invalidation));
    call.on('error', () => {}); // the status below says why it ended
    call.on('status', (status) => {
      if (this.call === call) this.call = null;
      this.wentDown(status);
    });
  }

  wentLive(fromNow) {
    if (fromNow) {
      // Subscribed "from now on": whatever happened while no stream was up is unknown.
      this.absent.clear();
    }
    this.live = true;
    this.epoch++;
    this.delayMs = this.reconnectDelayMs;
    this.count('subscriptions');
    for (const ready of this.readyWaiters.splice(0)) ready();
  }

  wentDown(status) {
    this.live = false;
    this.epoch++;
    if (this.closed) return;
    const delay = this.delayMs;
    this.delayMs = Math.min(this.delayMs * 2, this.maxReconnectDelayMs);
    this.logger.info(
      `invalidation stream ended (${status.code} ${status.details}); resubscribing after seq ${this.cursor}`,
    );
    this.timer = setTimeout(() => this.subscribe(), delay);
  }
}

module.exports = { loadGateClient, GatedReader, AbsenceCache, Found, MISSING, DELETED, LOAD_OPTIONS };
