// Type declarations of existence-gate-client (hand-written; the runtime is plain JavaScript).
import type { ChannelCredentials, ChannelOptions, Metadata, ServiceError, status as grpcStatus } from '@grpc/grpc-js';

/** A key: a string (sent as UTF-8) or its bytes. */
export type Key = string | Buffer | Uint8Array;

/** Per-call options. */
export interface CallOptions {
  /** Milliseconds from now (default: the client's deadlineMs, 500). Covers retries and the coalescing window. */
  deadlineMs?: number;
  /** An absolute deadline (a Date or milliseconds since the epoch); wins over deadlineMs. */
  deadline?: Date | number;
  /** Cancels this call: it fails with CANCELLED at once (a coalesced batch goes on for the others). */
  signal?: AbortSignal;
}

export interface GateClientOptions {
  /** The namespace ("" = "default"). */
  namespace?: string;
  /**
   * While a coalesced batch is in flight, how long a lookup waits at most for others to share its batch (with
   * none in flight it leaves at once); 0 = unary MayExist. Default 0.2 (200 µs).
   */
  coalesceWindowMs?: number;
  /** A batch is sent as soon as it holds this many keys. Default 1,024. */
  coalesceMaxKeys?: number;
  /** Per call, retries included. Default 500. */
  deadlineMs?: number;
  /** Default 'round_robin'. */
  addressPolicy?: 'round_robin' | 'pick_first';
  /** Sent as `authorization: Bearer <token>`. */
  token?: string;
  /** Default: insecure (plaintext). */
  credentials?: ChannelCredentials;
  /** @grpc/grpc-js channel options. */
  channelOptions?: ChannelOptions;
  /** A directory holding existence/v1/existence.proto (default: the package's copy, or the repository's). */
  protoDir?: string;
}

export interface MayExistAnswer {
  /** false: the key does not exist (skip the source); true: ask the source. */
  mayExist: boolean;
  /** The namespace's latest applied seq when the answer was computed (pass it to recordAbsent). */
  observedSeq: number;
  /** The gate was still loading its state (every answer is then mayExist). */
  warming: boolean;
  /** The address that answered. */
  address: string;
}

export type RecordOutcome = 'RECORDED' | 'REDUNDANT' | 'SUPERSEDED' | 'THROTTLED';

export interface RecordAbsentResult {
  outcome: RecordOutcome;
  /** The tombstone's seq when RECORDED; otherwise the namespace's latest seq. */
  seq: number;
  expiresInMs: number;
}

export interface ClientStats {
  lookups: number;
  gate_calls: number;
  batched_keys: number;
  retries: number;
  absences_recorded: number;
}

export interface ReaderStats extends ClientStats {
  cache_hits: number;
  fail_opens: number;
  source_reads: number;
  invalidations: number;
  resubscribes: number;
  pending_adds_dropped: number;
  pending_adds_sent: number;
}

/** Errors are @grpc/grpc-js ServiceErrors (code, details, metadata), unchanged. */
export type GateError = ServiceError;

export declare const DEFAULTS: Readonly<{
  coalesceWindowMs: number;
  coalesceMaxKeys: number;
  deadlineMs: number;
  addressPolicy: 'round_robin' | 'pick_first';
}>;
export declare const MAX_BATCH_KEYS: number;
export declare const MAX_KEY_BYTES: number;
export declare const status: typeof grpcStatus;

export declare class GateClient {
  constructor(addresses: string | string[], options?: GateClientOptions);
  readonly namespace: string;
  readonly addresses: string[];
  mayExist(key: Key, options?: CallOptions): Promise<MayExistAnswer>;
  /** Parts of at most 10,000 keys; with coalescing on, each part joins the coalesced batches as one caller. */
  mayExistMany(keys: Iterable<Key>, options?: CallOptions): Promise<MayExistAnswer[]>;
  add(keys: Key | Key[], options?: CallOptions): Promise<number>;
  recordAbsent(
    key: Key,
    kind?: 'missing' | 'deleted',
    observedSeq?: number,
    options?: CallOptions & { address?: string },
  ): Promise<RecordAbsentResult>;
  stats(): ClientStats;
  metadata(): Metadata;
  close(): void;
}

export type SourceResult<V> = { status: 'found'; value: V } | { status: 'missing' } | { status: 'deleted' };
export declare function Found<V>(value: V): { status: 'found'; value: V };
export declare const MISSING: { readonly status: 'missing' };
export declare const DELETED: { readonly status: 'deleted' };

export interface Logger {
  info(message: string): void;
  warn(message: string): void;
}

export interface GatedReaderOptions {
  /** Local absences kept (LRU). Default 100,000. */
  cacheCapacity?: number;
  /** How long a local absence is trusted. Default 5,000. */
  cacheTtlMs?: number;
  /** Keep SubscribeInvalidations open; false = no local cache at all. Default true. */
  subscribe?: boolean;
  /** Resubscription backoff, doubling from reconnectDelayMs (200) to maxReconnectDelayMs (5,000). */
  reconnectDelayMs?: number;
  maxReconnectDelayMs?: number;
  /** Default: silent (the counters tell). */
  logger?: Logger;
}

export declare class GatedReader<V = unknown> {
  constructor(client: GateClient, source: (key: Key) => Promise<SourceResult<V>>, options?: GatedReaderOptions);
  readonly client: GateClient;
  /** The value, or undefined when the key does not exist. */
  get(key: Key, options?: CallOptions): Promise<V | undefined>;
  /** The writer's helper: Add before inserting the rows (errors are raised). */
  add(keys: Key | Key[], options?: CallOptions): Promise<number>;
  /** Resolves true once the invalidation subscription is live; false after timeoutMs (default 10,000). */
  ready(timeoutMs?: number): Promise<boolean>;
  isCachedAbsent(key: Key): boolean;
  applyInvalidation(invalidation: { keys: Uint8Array[]; seq: number; cause: string }): void;
  /** Ends the current stream; the reader resubscribes after its last seq. */
  dropSubscription(): void;
  stats(): ReaderStats;
  /** Ends the subscription and its channels (not the GateClient's). */
  close(): void;
}

export declare class AbsenceCache {
  constructor(capacity: number, ttlMs: number);
  readonly size: number;
  has(key: string, now?: number): boolean;
  peek(key: string, now?: number): boolean;
  add(key: string, now?: number): void;
  delete(key: string): void;
  clear(): void;
}

export declare function gateError(code: number, details: string): ServiceError;
/** The existence.v1 package loaded by @grpc/proto-loader (ExistenceGate and Admin client constructors). */
export declare function loadExistencePackage(protoDir?: string): any;
