// GatedReader: the read path over a GateClient (clients/README.md is the contract; examples/README.md explains
// the steps):
//  1. a local, bounded, short-TTL cache of absences: a hit means "does not exist", no call at all;
//  2. client.mayExist (coalesced): absent means "does not exist" (and is cached locally, see rememberAbsent);
//  3. may exist: the source, through a per-key single flight; found: the value (Added later if the gate was
//     warming); missing / deleted: RecordAbsent(kind, observed_seq) to the address that answered, cached when
//     RECORDED;
//  4. fail open: any gate error in step 2 reads the source; a gate outage never makes get answer "absent".
// A background SubscribeInvalidations drops cached absences on ADDED, clears them on RESYNC, and resubscribes
// with after_seq = the last seq applied when the stream ends.
'use strict';

const grpc = require('@grpc/grpc-js');
const { toKeyBuffer } = require('./gate_client');

/** At most this many keys found while the gate was warming wait to be added (one Add call's worth). */
const MAX_PENDING_ADDS = 10_000;

/** What a source function resolves to. */
const Found = (value) => ({ status: 'found', value });
const MISSING = Object.freeze({ status: 'missing' }); // recorded as ABSENCE_KIND_MISSING
const DELETED = Object.freeze({ status: 'deleted' }); // recorded as ABSENCE_KIND_DELETED

/** A bounded LRU of keys known to be absent, each kept at most `ttlMs`. */
class AbsenceCache {
  constructor(capacity, ttlMs) {
    this.capacity = capacity;
    this.ttlMs = ttlMs;
    this.expiry = new Map(); // insertion order = LRU order
  }

  get size() {
    return this.expiry.size;
  }

  has(key, now = Date.now()) {
    const expiry = this.expiry.get(key);
    if (expiry === undefined) return false;
    this.expiry.delete(key);
    if (expiry <= now) return false;
    this.expiry.set(key, expiry); // most recently used
    return true;
  }

  /** Like has() without refreshing the entry's LRU position. */
  peek(key, now = Date.now()) {
    const expiry = this.expiry.get(key);
    return expiry !== undefined && expiry > now;
  }

  add(key, now = Date.now()) {
    this.expiry.delete(key);
    this.expiry.set(key, now + this.ttlMs);
    while (this.expiry.size > this.capacity) this.expiry.delete(this.expiry.keys().next().value);
  }

  delete(key) {
    this.expiry.delete(key);
  }

  clear() {
    this.expiry.clear();
  }
}

/** The cache's key for a key: its bytes as a latin1 string (invalidations carry bytes). */
function cacheKey(key) {
  return toKeyBuffer(key).toString('latin1');
}

const SILENT = { info() {}, warn() {} };

class GatedReader {
  /**
   * @param {import('./gate_client').GateClient} client
   * @param {(key: string|Buffer) => Promise<{status: 'found'|'missing'|'deleted', value?: any}>} source
   * @param {object} [options] cacheCapacity (100,000), cacheTtlMs (5,000), subscribe (true),
   *   reconnectDelayMs (200), maxReconnectDelayMs (5,000), logger ({info, warn}; silent by default)
   */
  constructor(client, source, options = {}) {
    const {
      cacheCapacity = 100_000,
      cacheTtlMs = 5_000,
      subscribe = true,
      reconnectDelayMs = 200,
      maxReconnectDelayMs = 5_000,
      logger = SILENT,
    } = options;
    if (typeof source !== 'function') throw new TypeError('GatedReader needs a source function');
    this.client = client;
    this.source = source;
    this.logger = logger || SILENT;
    this.reconnectDelayMs = reconnectDelayMs;
    this.maxReconnectDelayMs = maxReconnectDelayMs;
    this.cache = subscribe ? new AbsenceCache(cacheCapacity, cacheTtlMs) : null; // no subscription: no cache
    this.flights = new Map(); // cache key -> the promise of its running source read
    this.pendingAdds = new Map(); // keys found while the gate was warming: cache key -> key
    this.cursor = 0; // the last seq applied from the stream
    this.live = false;
    this.epoch = 0; // changes whenever the subscription goes up or down
    this.call = null;
    this.closed = false;
    this.timer = null;
    this.delayMs = reconnectDelayMs;
    this.subscriptionIndex = 0; // which address the next subscription goes to
    this.stubs = new Map(); // address -> the subscription's own stub (channel)
    this.subscriptions = 0;
    this.readyWaiters = [];
    this.counters = {
      cache_hits: 0,
      fail_opens: 0,
      source_reads: 0,
      invalidations: 0,
      resubscribes: 0,
      pending_adds_dropped: 0,
      pending_adds_sent: 0,
    };
    if (subscribe) this._subscribe();
  }

  /** The client's counters and the reader's, as one snapshot. */
  stats() {
    return { ...this.client.stats(), ...this.counters };
  }

  /** Resolves true once the invalidation subscription is live (false after `timeoutMs`, or without one). */
  ready(timeoutMs = 10_000) {
    if (this.live) return Promise.resolve(true);
    if (!this.cache || this.closed) return Promise.resolve(false);
    return new Promise((resolve) => {
      const waiter = () => {
        clearTimeout(timer);
        resolve(true);
      };
      const timer = setTimeout(() => {
        const i = this.readyWaiters.indexOf(waiter);
        if (i >= 0) this.readyWaiters.splice(i, 1);
        resolve(false);
      }, timeoutMs);
      this.readyWaiters.push(waiter);
    });
  }

  /** Ends the subscription and its channels (the GateClient is closed by its owner). */
  close() {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.call) this.call.cancel();
    this.live = false;
    this.epoch++;
    for (const stub of this.stubs.values()) stub.close();
    this.stubs.clear();
    for (const ready of this.readyWaiters.splice(0)) ready();
  }

  /**
   * The source's value of `key`, or undefined when it does not exist (or was deleted). Options are passed to
   * the lookup (deadlineMs, deadline, signal); a caller's own cancellation is raised, not failed open.
   */
  async get(key, options = {}) {
    const id = cacheKey(key);
    if (this.cache && this.cache.has(id)) {
      this.counters.cache_hits++;
      return undefined;
    }
    const epoch = this.live ? this.epoch : null;
    let answer = null;
    try {
      answer = await this.client.mayExist(key, options);
    } catch (error) {
      if (options.signal && options.signal.aborted) throw error;
      // Fail open: without the gate every read goes to the source.
      this.counters.fail_opens++;
      this.logger.warn(`existence-gate: lookup of ${JSON.stringify(String(key))} failed (${error.code}); reading the source`);
    }
    if (answer && !answer.warming && this.pendingAdds.size > 0) await this._flushPendingAdds();
    if (answer && !answer.mayExist) {
      this._rememberAbsent(id, answer.observedSeq, epoch);
      return undefined;
    }
    let flight = this.flights.get(id);
    if (!flight) {
      flight = this._loadAndReport(key, answer, epoch, id).finally(() => this.flights.delete(id));
      this.flights.set(id, flight);
    }
    return flight;
  }

  /** The writer's helper: Add before inserting the rows. Errors are raised (a writer that cannot Add must not insert). */
  add(keys, options) {
    return this.client.add(keys, options);
  }

  /** Whether `key` is cached as absent (without touching the LRU order). */
  isCachedAbsent(key) {
    return this.cache !== null && this.cache.peek(cacheKey(key));
  }

  /** Drops the cached absences an invalidation makes wrong (all of them for RESYNC). */
  applyInvalidation(invalidation) {
    const seq = Number(invalidation.seq);
    if (invalidation.cause === 'INVALIDATION_CAUSE_RESYNC') {
      if (this.cache) this.cache.clear();
      this.counters.invalidations++;
      // The stream goes on from the RESYNC's seq, even one below the cursor: a server that restarted without
      // its log, or a replica that could not catch up with the after_seq asked, resyncs at its own latest seq,
      // and keeping the higher cursor would resume from a seq it does not have (another RESYNC) and refuse to
      // cache any answer it gives.
      this.cursor = seq;
    } else {
      for (const key of invalidation.keys) if (this.cache) this.cache.delete(Buffer.from(key).toString('latin1'));
      this.counters.invalidations += invalidation.keys.length;
      this.cursor = Math.max(this.cursor, seq);
    }
  }

  /** Ends the current subscription stream: the reader resubscribes after its last seq, as after any drop. */
  dropSubscription() {
    if (this.call) this.call.cancel();
  }

  // ---------------------------------------------------------------------------------------------------------

  /**
   * Reads the source for a key the gate passed (`answer` is null when the gate could not be asked; `epoch` is
   * the subscription's when the lookup started, null when it was not live).
   */
  async _loadAndReport(key, answer, epoch, id = cacheKey(key)) {
    this.counters.source_reads++;
    const row = await this.source(key);
    const status = row && row.status;
    if (status === 'found') {
      if (answer && answer.warming) {
        // The gate is still loading and may not know this key; it refuses writes until it is ready.
        if (this.pendingAdds.size < MAX_PENDING_ADDS) this.pendingAdds.set(id, key);
        else this.counters.pending_adds_dropped++;
      }
      return row.value;
    }
    if (status !== 'missing' && status !== 'deleted') {
      throw new TypeError(`the source resolved ${JSON.stringify(row)}; use Found(value), MISSING or DELETED`);
    }
    if (answer) {
      try {
        const recorded = await this.client.recordAbsent(key, status, answer.observedSeq, { address: answer.address });
        if (recorded.outcome === 'RECORDED') this._rememberAbsent(id, recorded.seq, epoch);
        // REDUNDANT, SUPERSEDED (an Add raced this read), THROTTLED: nothing stored.
      } catch (error) {
        // INVALID_ARGUMENT for an observed_seq a lagging replica has not reached, or any failure: nothing cached.
        this.logger.warn(`existence-gate: RecordAbsent failed (${error.code})`);
      }
    }
    return undefined;
  }

  /** Adds the keys found while the gate was warming, in one call. */
  async _flushPendingAdds() {
    const entries = [...this.pendingAdds];
    this.pendingAdds.clear();
    try {
      await this.client.add(entries.map(([, key]) => key));
      this.counters.pending_adds_sent += entries.length;
    } catch (error) {
      this.logger.warn(`existence-gate: Add of ${entries.length} keys found while the gate was warming failed (${error.code})`);
      if (error.code === grpc.status.UNAVAILABLE || error.code === grpc.status.DEADLINE_EXCEEDED) {
        for (const [id, key] of entries) {
          if (this.pendingAdds.size < MAX_PENDING_ADDS) this.pendingAdds.set(id, key);
          else this.counters.pending_adds_dropped++;
        }
      }
    }
  }

  _rememberAbsent(id, seq, epoch) {
    // Only if the same live subscription covers everything after `seq`: otherwise an invalidation of this key
    // may already have been applied (or missed), and the entry could outlive the key's absence.
    if (this.cache && epoch !== null && this.live && this.epoch === epoch && this.cursor <= seq) {
      this.cache.add(id);
    }
  }

  _stub(address) {
    let stub = this.stubs.get(address);
    if (!stub) {
      stub = this.client.newSubscriptionStub(address);
      this.stubs.set(address, stub);
    }
    return stub;
  }

  _subscribe() {
    if (this.closed) return;
    if (this.subscriptions++ > 0) this.counters.resubscribes++;
    const afterSeq = this.cursor;
    const addresses = this.client.addresses;
    const address = addresses[this.subscriptionIndex % addresses.length];
    const call = this._stub(address).SubscribeInvalidations(
      { namespace: this.client.namespace, after_seq: afterSeq },
      this.client.metadata(),
    );
    this.call = call;
    // The server sends headers once it has registered the subscription: from then on the stream is live.
    call.on('metadata', () => {
      if (this.call === call) this._wentLive(afterSeq === 0);
    });
    call.on('data', (invalidation) => {
      if (this.call === call) this.applyInvalidation(invalidation);
    });
    call.on('error', () => {}); // the status below says why it ended
    call.on('status', (status) => {
      if (this.call !== call) return;
      this.call = null;
      this._wentDown(status, address);
    });
  }

  _wentLive(fromNow) {
    // Subscribed "from now on": whatever happened while no stream was up is unknown.
    if (fromNow && this.cache) this.cache.clear();
    this.live = true;
    this.epoch++;
    this.delayMs = this.reconnectDelayMs;
    for (const ready of this.readyWaiters.splice(0)) ready();
  }

  _wentDown(status, address) {
    this.live = false;
    this.epoch++;
    if (this.closed) return;
    this.subscriptionIndex++; // the next address
    const delay = this.delayMs;
    this.delayMs = Math.min(this.delayMs * 2, this.maxReconnectDelayMs);
    this.logger.info(
      `existence-gate: invalidation stream from ${address} ended (${status.code} ${status.details}); ` +
        `resubscribing after seq ${this.cursor} in ${delay} ms`,
    );
    this.timer = setTimeout(() => this._subscribe(), delay);
  }
}

module.exports = { GatedReader, AbsenceCache, Found, MISSING, DELETED, MAX_PENDING_ADDS };
