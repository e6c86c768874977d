package main

// GatedReader: the recommended existence-gate read path for Go services.
//
//	reader := NewGatedReader(conn, "users", db.LoadUser, Options{})
//	reader.Start(10 * time.Second) // subscribe first: absences are cached only while the stream is live
//	defer reader.Close()
//	user, found, err := reader.Get(ctx, "user:42")
//
// Get(key):
//  1. a local, bounded, short-TTL cache of absences: a hit means "does not exist", no call at all;
//  2. MayExist: ABSENT means "does not exist" (and is cached locally);
//  3. MAY_EXIST: read the source through a per-key single flight, so a burst of reads of one key costs one
//     source read; found: return it (and Add it if the gate did not know it: it answered WARMING, i.e. it
//     was still loading and refuses writes until it is done, so the key is added with the first answer
//     that is not WARMING); not found: RecordAbsent(kind, observed_seq), and when the gate RECORDED it cache it locally too;
//  4. a background SubscribeInvalidations drops cached absences on ADDED, clears them all on RESYNC, and
//     reconnects with after_seq = the last seq seen, so no Add is missed across a reconnect.
//
// The gate is an optimisation, never a dependency: when it cannot be reached Get reads the source.
//
// A local absence is cached only when no invalidation of the key can have been applied before the entry is
// written: the same subscription must be live from before the MayExist until the write, and must not have
// applied any seq past the one the answer was computed at.

import (
	"container/list"
	"context"
	"log"
	"sync"
	"sync/atomic"
	"time"

	existencev1 "example.com/existence-gate/gen/existence/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// SourceStatus is what the source of truth says about a key.
type SourceStatus int

const (
	// Found: the row exists.
	Found SourceStatus = iota
	// Missing: no such row (recorded as ABSENCE_KIND_MISSING).
	Missing
	// Deleted: the row existed and was deleted (recorded as ABSENCE_KIND_DELETED).
	Deleted
)

// LoadFunc reads one key from the source of truth.
type LoadFunc func(ctx context.Context, key string) (value string, st SourceStatus, err error)

// maxPendingAdds bounds the keys found while the gate was warming that wait to be added (one Add's worth).
const maxPendingAdds = 10000

// Options tune a GatedReader; zero values take the defaults.
type Options struct {
	CacheSize         int           // cached absences kept (default 100,000)
	CacheTTL          time.Duration // how long one is trusted (default 5 s)
	CallTimeout       time.Duration // deadline of each gate call (default 500 ms)
	ReconnectDelay    time.Duration // first delay before resubscribing (default 200 ms), doubled up to...
	MaxReconnectDelay time.Duration // ... this (default 5 s)
	Logger            *log.Logger   // default: log.Default()
}

// Stats count what the reader did.
type Stats struct {
	LocalHits, GateCalls, GateAbsent, GateErrors, SourceReads atomic.Int64
	AbsencesRecorded, AbsencesNotStored, Adds                 atomic.Int64
	Invalidations, Resyncs, Subscriptions                     atomic.Int64
}

// GatedReader reads through the gate: local absence cache, MayExist, single-flight source reads.
type GatedReader struct {
	client    existencev1.ExistenceGateClient
	namespace string
	load      LoadFunc
	opts      Options
	flight    singleFlight
	Stats     Stats

	pendingMu   sync.Mutex
	pendingAdds map[string]struct{} // keys found while the gate was warming, added once it is ready

	mu           sync.Mutex // guards the cache and the subscription state, ordering invalidations and inserts
	absent       *absenceCache
	cursor       uint64 // the last seq applied from the stream
	live         bool
	epoch        uint64 // changes whenever the subscription goes up or down
	cancelStream context.CancelFunc

	ready     chan struct{}
	readyOnce sync.Once
	ctx       context.Context
	stop      context.CancelFunc
	done      chan struct{}
}

// NewGatedReader makes a reader of namespace over conn; call Start to subscribe to invalidations.
func NewGatedReader(conn grpc.ClientConnInterface, namespace string, load LoadFunc, opts Options) *GatedReader {
	if opts.CacheSize <= 0 {
		opts.CacheSize = 100000
	}
	if opts.CacheTTL <= 0 {
		opts.CacheTTL = 5 * time.Second
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 500 * time.Millisecond
	}
	if opts.ReconnectDelay <= 0 {
		opts.ReconnectDelay = 200 * time.Millisecond
	}
	if opts.MaxReconnectDelay <= 0 {
		opts.MaxReconnectDelay = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = log.Default()
	}
	ctx, stop := context.WithCancel(context.Background())
	return &GatedReader{
		client:      existencev1.NewExistenceGateClient(conn),
		namespace:   namespace,
		load:        load,
		opts:        opts,
		absent:      newAbsenceCache(opts.CacheSize, opts.CacheTTL),
		pendingAdds: make(map[string]struct{}),
		ready:       make(chan struct{}),
		ctx:         ctx,
		stop:        stop,
		done:        make(chan struct{}),
	}
}

// Start subscribes to invalidations in the background and waits up to timeout for the stream to be live.
// Reads work either way; absences are cached only while it is live.
func (r *GatedReader) Start(timeout time.Duration) bool {
	go r.subscribeLoop()
	select {
	case <-r.ready:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Close ends the subscription.
func (r *GatedReader) Close() {
	r.stop()
	<-r.done
}

// Get returns the source's value of key; found is false when it does not exist (or was deleted).
func (r *GatedReader) Get(ctx context.Context, key string) (value string, found bool, err error) {
	r.mu.Lock()
	if r.absent.contains(key, time.Now()) {
		r.mu.Unlock()
		r.Stats.LocalHits.Add(1)
		return "", false, nil
	}
	epoch, live := r.epoch, r.live
	r.mu.Unlock()

	callCtx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	reply, err := r.client.MayExist(callCtx, &existencev1.MayExistRequest{Namespace: r.namespace, Key: []byte(key)})
	cancel()
	r.Stats.GateCalls.Add(1)
	if err != nil {
		// Fail open: without the gate every read goes to the source.
		r.Stats.GateErrors.Add(1)
		r.opts.Logger.Printf("MayExist(%q) failed (%s); reading the source", key, status.Code(err))
		reply = nil
	} else if reply.Basis != existencev1.Basis_BASIS_WARMING {
		r.flushPendingAdds(ctx)
	}
	if reply != nil && reply.Answer == existencev1.Answer_ANSWER_ABSENT {
		r.Stats.GateAbsent.Add(1)
		if live {
			r.rememberAbsent(key, reply.ObservedSeq, epoch)
		}
		return "", false, nil
	}
	return r.flight.do(key, func() (string, bool, error) {
		return r.loadAndReport(ctx, key, reply, epoch, live)
	})
}

// loadAndReport reads the source for a key the gate passed (reply is nil when the gate could not be asked)
// and tells the gate what it found.
func (r *GatedReader) loadAndReport(ctx context.Context, key string, reply *existencev1.MayExistResponse,
	epoch uint64, live bool) (string, bool, error) {
	r.Stats.SourceReads.Add(1)
	value, st, err := r.load(ctx, key)
	if err != nil || reply == nil {
		return value, err == nil && st == Found, err
	}
	callCtx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	switch st {
	case Missing, Deleted:
		kind := existencev1.AbsenceKind_ABSENCE_KIND_MISSING
		if st == Deleted {
			kind = existencev1.AbsenceKind_ABSENCE_KIND_DELETED
		}
		recorded, err := r.client.RecordAbsent(callCtx, &existencev1.RecordAbsentRequest{
			Namespace: r.namespace, Key: []byte(key), Kind: kind, ObservedSeq: reply.ObservedSeq,
		})
		switch {
		case err != nil:
			r.Stats.GateErrors.Add(1)
			r.opts.Logger.Printf("RecordAbsent(%q) failed: %s", key, status.Code(err))
		case recorded.Outcome == existencev1.RecordOutcome_RECORD_OUTCOME_RECORDED:
			r.Stats.AbsencesRecorded.Add(1)
			if live {
				r.rememberAbsent(key, recorded.Seq, epoch)
			}
		default: // REDUNDANT, SUPERSEDED (an Add raced this read), THROTTLED: nothing stored
			r.Stats.AbsencesNotStored.Add(1)
		}
		return "", false, nil
	default:
		if reply.Basis == existencev1.Basis_BASIS_WARMING {
			// The gate is still loading and may not know this key; it refuses writes until it is ready.
			r.pendingMu.Lock()
			if len(r.pendingAdds) < maxPendingAdds {
				r.pendingAdds[key] = struct{}{}
			}
			r.pendingMu.Unlock()
		}
		return value, true, nil
	}
}

// flushPendingAdds adds the keys found while the gate was warming, in one call.
func (r *GatedReader) flushPendingAdds(ctx context.Context) {
	r.pendingMu.Lock()
	if len(r.pendingAdds) == 0 {
		r.pendingMu.Unlock()
		return
	}
	keys := make([][]byte, 0, len(r.pendingAdds))
	for key := range r.pendingAdds {
		keys = append(keys, []byte(key))
	}
	r.pendingAdds = make(map[string]struct{})
	r.pendingMu.Unlock()

	callCtx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	if _, err := r.client.Add(callCtx, &existencev1.AddRequest{Namespace: r.namespace, Keys: keys}); err != nil {
		r.Stats.GateErrors.Add(1)
		r.opts.Logger.Printf("Add of %d keys found while the gate was warming failed: %s", len(keys), status.Code(err))
		if status.Code(err) == codes.Unavailable {
			r.pendingMu.Lock()
			for _, key := range keys {
				if len(r.pendingAdds) < maxPendingAdds {
					r.pendingAdds[string(key)] = struct{}{}
				}
			}
			r.pendingMu.Unlock()
		}
		return
	}
	r.Stats.Adds.Add(int64(len(keys)))
}

func (r *GatedReader) rememberAbsent(key string, seq, epoch uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Only if the same live subscription covers everything after seq: otherwise an invalidation of this key
	// may already have been applied (or missed), and the entry could outlive the key's absence.
	if r.live && r.epoch == epoch && r.cursor <= seq {
		r.absent.put(key, time.Now())
	}
}

// IsCachedAbsent tells whether key is in the local absence cache.
func (r *GatedReader) IsCachedAbsent(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.absent.contains(key, time.Now())
}

// ApplyInvalidation drops the cached absences an invalidation makes wrong (all of them for RESYNC).
func (r *GatedReader) ApplyInvalidation(inv *existencev1.Invalidation) {
	r.mu.Lock()
	if inv.Cause == existencev1.InvalidationCause_INVALIDATION_CAUSE_RESYNC {
		r.absent.clear()
	} else {
		for _, key := range inv.Keys {
			r.absent.remove(string(key))
		}
	}
	if inv.Seq > r.cursor {
		r.cursor = inv.Seq
	}
	r.mu.Unlock()
	if inv.Cause == existencev1.InvalidationCause_INVALIDATION_CAUSE_RESYNC {
		r.Stats.Resyncs.Add(1)
	} else {
		r.Stats.Invalidations.Add(1)
	}
}

// Resubscribe ends the current subscription stream; the reader reconnects from its last seq, as after any
// dropped connection.
func (r *GatedReader) Resubscribe() {
	r.mu.Lock()
	cancel := r.cancelStream
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

func (r *GatedReader) subscribeLoop() {
	defer close(r.done)
	delay := r.opts.ReconnectDelay
	for r.ctx.Err() == nil {
		r.mu.Lock()
		afterSeq := r.cursor
		streamCtx, cancel := context.WithCancel(r.ctx)
		r.cancelStream = cancel
		r.mu.Unlock()
		stream, err := r.client.SubscribeInvalidations(streamCtx,
			&existencev1.SubscribeInvalidationsRequest{Namespace: r.namespace, AfterSeq: afterSeq})
		if err == nil {
			// The server sends headers once it has registered the subscription.
			_, err = stream.Header()
		}
		if err == nil {
			r.wentLive(afterSeq == 0)
			delay = r.opts.ReconnectDelay
			for {
				inv, recvErr := stream.Recv()
				if recvErr != nil {
					err = recvErr
					break
				}
				r.ApplyInvalidation(inv)
			}
		}
		cancel()
		r.wentDown()
		if r.ctx.Err() != nil {
			return
		}
		r.mu.Lock()
		cursor := r.cursor
		r.mu.Unlock()
		r.opts.Logger.Printf("invalidation stream ended (%s); resubscribing after seq %d", status.Code(err), cursor)
		select {
		case <-r.ctx.Done():
			return
		case <-time.After(delay):
		}
		if delay *= 2; delay > r.opts.MaxReconnectDelay {
			delay = r.opts.MaxReconnectDelay
		}
	}
}

func (r *GatedReader) wentLive(fromNow bool) {
	r.mu.Lock()
	if fromNow {
		// Subscribed "from now on": whatever happened while no stream was up is unknown.
		r.absent.clear()
	}
	r.live = true
	r.epoch++
	r.mu.Unlock()
	r.Stats.Subscriptions.Add(1)
	r.readyOnce.Do(func() { close(r.ready) })
}

func (r *GatedReader) wentDown() {
	r.mu.Lock()
	r.live = false
	r.epoch++
	r.mu.Unlock()
}

// absenceCache is a bounded LRU of absent keys, each kept at most ttl. Not safe for concurrent use.
type absenceCache struct {
	max     int
	ttl     time.Duration
	order   *list.List // front = most recently used
	entries map[string]*list.Element
}

type absenceEntry struct {
	key     string
	expires time.Time
}

func newAbsenceCache(max int, ttl time.Duration) *absenceCache {
	return &absenceCache{max: max, ttl: ttl, order: list.New(), entries: make(map[string]*list.Element)}
}

func (c *absenceCache) contains(key string, now time.Time) bool {
	el, ok := c.entries[key]
	if !ok {
		return false
	}
	if !now.Before(el.Value.(*absenceEntry).expires) {
		c.order.Remove(el)
		delete(c.entries, key)
		return false
	}
	c.order.MoveToFront(el)
	return true
}

func (c *absenceCache) put(key string, now time.Time) {
	if el, ok := c.entries[key]; ok {
		el.Value.(*absenceEntry).expires = now.Add(c.ttl)
		c.order.MoveToFront(el)
		return
	}
	c.entries[key] = c.order.PushFront(&absenceEntry{key: key, expires: now.Add(c.ttl)})
	for c.order.Len() > c.max {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.entries, oldest.Value.(*absenceEntry).key)
	}
}

func (c *absenceCache) remove(key string) {
	if el, ok := c.entries[key]; ok {
		c.order.Remove(el)
		delete(c.entries, key)
	}
}

func (c *absenceCache) clear() {
	c.order.Init()
	c.entries = make(map[string]*list.Element)
}

// singleFlight runs one load per key at a time; concurrent callers of the same key share its result.
type singleFlight struct {
	mu    sync.Mutex
	calls map[string]*flightCall
}

type flightCall struct {
	wg    sync.WaitGroup
	value string
	found bool
	err   error
}

func (g *singleFlight) do(key string, fn func() (string, bool, error)) (string, bool, error) {
	g.mu.Lock()
	if g.calls == nil {
		g.calls = make(map[string]*flightCall)
	}
	if c, ok := g.calls[key]; ok {
		g.mu.Unlock()
		c.wg.Wait()
		return c.value, c.found, c.err
	}
	c := &flightCall{}
	c.wg.Add(1)
	g.calls[key] = c
	g.mu.Unlock()

	defer func() {
		g.mu.Lock()
		delete(g.calls, key)
		g.mu.Unlock()
		c.wg.Done()
	}()
	c.value, c.found, c.err = fn()
	return c.value, c.found, c.err
}
