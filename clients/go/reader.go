package existencegate

import (
	"context"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/existence-gate/existence-gate/clients/go/existencepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// SourceStatus is what the source of truth says about a key.
type SourceStatus int

const (
	// Found: the row exists.
	Found SourceStatus = iota
	// Missing: no such row (recorded as MISSING).
	Missing
	// Deleted: the row existed and was deleted (recorded as DELETED).
	Deleted
)

// Source reads one key from the source of truth. Its error is returned by Get as it is.
type Source[V any] func(ctx context.Context, key string) (value V, st SourceStatus, err error)

// Defaults of the GatedReader options.
const (
	DefaultCacheCapacity = 100000
	DefaultCacheTTL      = 5 * time.Second
	// maxPendingAdds bounds the keys found while the gate was warming that wait to be added (one Add's worth).
	maxPendingAdds    = 10000
	resubscribeDelay  = 200 * time.Millisecond
	maxResubscribeGap = 5 * time.Second
)

// ReaderOption tunes a GatedReader.
type ReaderOption func(*readerOptions)

type readerOptions struct {
	capacity  int
	ttl       time.Duration
	subscribe bool
	logger    *log.Logger
}

// WithCacheCapacity sets how many local absences are kept (LRU; default 100,000).
func WithCacheCapacity(n int) ReaderOption { return func(o *readerOptions) { o.capacity = n } }

// WithCacheTTL sets how long a local absence is trusted (default 5 s).
func WithCacheTTL(d time.Duration) ReaderOption { return func(o *readerOptions) { o.ttl = d } }

// WithSubscribe turns the invalidation subscription on (the default) or off; off means no local cache.
func WithSubscribe(on bool) ReaderOption { return func(o *readerOptions) { o.subscribe = on } }

// WithLogger logs the swallowed gate failures (fail-opens, RecordAbsent errors, stream ends); default: none.
func WithLogger(l *log.Logger) ReaderOption { return func(o *readerOptions) { o.logger = l } }

// GatedReader is the read path: local absence cache, coalesced MayExist, single-flight source reads,
// RecordAbsent of what the source lacks, and invalidations from a background subscription. A gate failure
// never makes Get answer "does not exist": the source is read instead.
type GatedReader[V any] struct {
	client *GateClient
	source Source[V]
	opts   readerOptions
	flight singleFlight[V]

	cacheHits, failOpens, sourceReads, absencesRecorded, invalidations, resubscribes, pendingDropped atomic.Uint64

	pendingMu   sync.Mutex
	pendingAdds map[string]struct{} // keys found while the gate was warming, added once it is not

	mu           sync.Mutex    // orders invalidations and cache writes
	absent       *absenceCache // nil when the subscription is off
	cursor       uint64        // the last seq applied from the stream
	live         bool
	epoch        uint64 // changes whenever the subscription goes up or down
	everLive     bool
	cancelStream context.CancelFunc

	liveOnce  sync.Once
	liveCh    chan struct{}
	ctx       context.Context
	stop      context.CancelFunc
	done      chan struct{}
	subConns  []*grpc.ClientConn // the subscription's own channels, by address, opened when first used
	closeOnce sync.Once
}

// NewGatedReader makes a reader over client (whose namespace it reads) and source, and starts its
// invalidation subscription in the background (WaitLive waits for it). Absences are cached only while the
// subscription is live. The client stays the caller's to close.
func NewGatedReader[V any](client *GateClient, source Source[V], opts ...ReaderOption) *GatedReader[V] {
	o := readerOptions{capacity: DefaultCacheCapacity, ttl: DefaultCacheTTL, subscribe: true}
	for _, opt := range opts {
		opt(&o)
	}
	if o.capacity < 1 {
		o.capacity = 1
	}
	ctx, stop := context.WithCancel(context.Background())
	r := &GatedReader[V]{
		client:      client,
		source:      source,
		opts:        o,
		pendingAdds: make(map[string]struct{}),
		liveCh:      make(chan struct{}),
		ctx:         ctx,
		stop:        stop,
		done:        make(chan struct{}),
		subConns:    make([]*grpc.ClientConn, len(client.addrs)),
	}
	if o.subscribe {
		r.absent = newAbsenceCache(o.capacity, o.ttl)
		go r.subscribeLoop()
	} else {
		close(r.done)
	}
	return r
}

// Client is the reader's GateClient.
func (r *GatedReader[V]) Client() *GateClient { return r.client }

// WaitLive waits until the invalidation subscription has gone live once (nil at once when it is off).
func (r *GatedReader[V]) WaitLive(ctx context.Context) error {
	if !r.opts.subscribe {
		return nil
	}
	select {
	case <-r.liveCh:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close ends the subscription and its channels (not the client's).
func (r *GatedReader[V]) Close() {
	r.closeOnce.Do(func() {
		r.stop()
		<-r.done
		for _, conn := range r.subConns {
			if conn != nil {
				conn.Close()
			}
		}
	})
}

// Stats returns the reader's counters together with its client's.
func (r *GatedReader[V]) Stats() Stats {
	s := r.client.Stats()
	s.CacheHits = r.cacheHits.Load()
	s.FailOpens = r.failOpens.Load()
	s.SourceReads = r.sourceReads.Load()
	s.AbsencesRecorded = r.absencesRecorded.Load()
	s.Invalidations = r.invalidations.Load()
	s.Resubscribes = r.resubscribes.Load()
	s.PendingAddsDropped = r.pendingDropped.Load()
	return s
}

func (r *GatedReader[V]) logf(format string, args ...interface{}) {
	if r.opts.logger != nil {
		r.opts.logger.Printf(format, args...)
	}
}

// Get returns the source's value of key; found is false when it does not exist (or was deleted). err is
// the source's error as it is, or the ctx's when the caller gave up; gate failures are never returned.
// Concurrent Gets of one key share one source read (with the first caller's ctx).
func (r *GatedReader[V]) Get(ctx context.Context, key string) (value V, found bool, err error) {
	var epoch uint64
	live := false
	if r.absent != nil {
		r.mu.Lock()
		if r.absent.contains(key, time.Now()) {
			r.mu.Unlock()
			r.cacheHits.Add(1)
			return value, false, nil
		}
		epoch, live = r.epoch, r.live
		r.mu.Unlock()
	}
	answer, gateErr := r.client.MayExist(ctx, key)
	var reply *Answer
	if gateErr != nil {
		if ctx.Err() != nil {
			return value, false, status.FromContextError(ctx.Err()).Err()
		}
		// Fail open: without the gate every read goes to the source.
		r.failOpens.Add(1)
		r.logf("existencegate: MayExist(%q) failed (%v); reading the source", key, gateErr)
	} else {
		reply = &answer
		if !answer.Warming {
			r.flushPendingAdds(ctx)
		}
		if !answer.MayExist {
			if live {
				r.rememberAbsent(key, answer.ObservedSeq, epoch)
			}
			return value, false, nil
		}
	}
	return r.flight.do(key, func() (V, bool, error) {
		return r.loadAndReport(ctx, key, reply, epoch, live)
	})
}

// loadAndReport reads the source for a key the gate passed (reply is nil when the gate failed) and tells
// the gate what it found.
func (r *GatedReader[V]) loadAndReport(ctx context.Context, key string, reply *Answer, epoch uint64, live bool) (V, bool, error) {
	r.sourceReads.Add(1)
	value, st, err := r.source(ctx, key)
	if err != nil {
		return value, false, err
	}
	if st == Found {
		if reply != nil && reply.Warming {
			// The gate is still loading and may not know this key; it refuses writes until it is ready.
			r.pendingMu.Lock()
			if len(r.pendingAdds) < maxPendingAdds {
				r.pendingAdds[key] = struct{}{}
			} else {
				r.pendingDropped.Add(1)
			}
			r.pendingMu.Unlock()
		}
		return value, true, nil
	}
	var zero V
	if reply == nil {
		return zero, false, nil
	}
	kind := AbsenceMissing
	if st == Deleted {
		kind = AbsenceDeleted
	}
	recorded, err := r.client.recordAbsentAt(ctx, reply.addr, key, kind, reply.ObservedSeq)
	switch {
	case err != nil:
		// INVALID_ARGUMENT for an observed_seq ahead of a lagging replica, or any failure: nothing cached.
		r.logf("existencegate: RecordAbsent(%q) failed: %v", key, err)
	case recorded.Outcome == Recorded:
		r.absencesRecorded.Add(1)
		if live {
			r.rememberAbsent(key, recorded.Seq, epoch)
		}
	}
	return zero, false, nil
}

// Add declares keys before the rows are inserted; its error is returned (a writer that cannot Add must
// not insert).
func (r *GatedReader[V]) Add(ctx context.Context, keys []string) (uint64, error) {
	return r.client.Add(ctx, keys)
}

// flushPendingAdds adds the keys found while the gate was warming, in one call.
func (r *GatedReader[V]) flushPendingAdds(ctx context.Context) {
	r.pendingMu.Lock()
	if len(r.pendingAdds) == 0 {
		r.pendingMu.Unlock()
		return
	}
	keys := make([]string, 0, len(r.pendingAdds))
	for key := range r.pendingAdds {
		keys = append(keys, key)
	}
	r.pendingAdds = make(map[string]struct{})
	r.pendingMu.Unlock()

	if _, err := r.client.Add(ctx, keys); err != nil {
		r.logf("existencegate: Add of %d keys found while the gate was warming failed: %v", len(keys), err)
		if code := status.Code(err); code == codes.Unavailable || code == codes.DeadlineExceeded {
			r.pendingMu.Lock()
			for _, key := range keys {
				if len(r.pendingAdds) < maxPendingAdds {
					r.pendingAdds[key] = struct{}{}
				} else {
					r.pendingDropped.Add(1)
				}
			}
			r.pendingMu.Unlock()
		}
	}
}

// rememberAbsent caches an absence only if the same live subscription covers everything after seq:
// otherwise an invalidation of this key may already have been applied (or missed), and the entry could
// outlive the key's absence.
func (r *GatedReader[V]) rememberAbsent(key string, seq, epoch uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.absent != nil && r.live && r.epoch == epoch && r.cursor <= seq {
		r.absent.put(key, time.Now())
	}
}

// CachedAbsent tells whether key is in the local absence cache.
func (r *GatedReader[V]) CachedAbsent(key string) bool {
	if r.absent == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.absent.contains(key, time.Now())
}

// ApplyInvalidation applies one invalidation as if the stream had delivered it: ADDED drops its keys'
// cached absences, RESYNC drops them all. For invalidations relayed by other means, and for tests.
func (r *GatedReader[V]) ApplyInvalidation(inv *existencepb.Invalidation) {
	resync := inv.Cause == existencepb.InvalidationCause_INVALIDATION_CAUSE_RESYNC
	r.mu.Lock()
	if r.absent != nil {
		if resync {
			r.absent.clear()
		} else {
			for _, key := range inv.Keys {
				r.absent.remove(string(key))
			}
		}
	}
	if inv.Seq > r.cursor {
		r.cursor = inv.Seq
	}
	r.mu.Unlock()
	if resync {
		r.invalidations.Add(1)
	} else {
		r.invalidations.Add(uint64(len(inv.Keys)))
	}
}

// Resubscribe ends the current subscription stream; the reader resubscribes after the last seq it
// applied, as after a dropped connection (e.g. to move off an address being drained).
func (r *GatedReader[V]) Resubscribe() {
	r.mu.Lock()
	cancel := r.cancelStream
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

func (r *GatedReader[V]) subscribeLoop() {
	defer close(r.done)
	c := r.client
	delay := resubscribeDelay
	next := 0
	for r.ctx.Err() == nil {
		tried := make([]bool, len(c.addrs))
		i := c.pick(-1, next, tried, true)
		next = i + 1
		if r.subConns[i] == nil {
			conn, err := c.dial(c.addrs[i].target)
			if err != nil { // only for invalid dial options: nothing to retry
				r.logf("existencegate: subscription channel to %s: %v", c.addrs[i].target, err)
				return
			}
			r.subConns[i] = conn
		}
		r.mu.Lock()
		afterSeq := r.cursor
		streamCtx, cancel := context.WithCancel(c.withToken(r.ctx))
		r.cancelStream = cancel
		r.mu.Unlock()
		stream, err := existencepb.NewExistenceGateClient(r.subConns[i]).SubscribeInvalidations(streamCtx,
			&existencepb.SubscribeInvalidationsRequest{Namespace: c.namespace, AfterSeq: afterSeq})
		if err == nil {
			// The server sends the headers once it has registered the subscription.
			_, err = stream.Header()
		}
		if err == nil {
			r.wentLive(afterSeq == 0)
			delay = resubscribeDelay
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
		if status.Code(err) == codes.Unavailable {
			c.addrs[i].markDown(time.Now())
		}
		r.logf("existencegate: invalidation stream on %s ended (%v); resubscribing after seq %d", c.addrs[i].target, err, afterSeq)
		select {
		case <-r.ctx.Done():
			return
		case <-time.After(delay):
		}
		if delay *= 2; delay > maxResubscribeGap {
			delay = maxResubscribeGap
		}
	}
}

func (r *GatedReader[V]) wentLive(fromNow bool) {
	r.mu.Lock()
	if fromNow {
		// Subscribed "from now on": whatever happened while no stream was up is unknown.
		r.absent.clear()
	}
	r.live = true
	r.epoch++
	again := r.everLive
	r.everLive = true
	r.mu.Unlock()
	if again {
		r.resubscribes.Add(1)
	}
	r.liveOnce.Do(func() { close(r.liveCh) })
}

func (r *GatedReader[V]) wentDown() {
	r.mu.Lock()
	r.live = false
	r.epoch++
	r.mu.Unlock()
}
