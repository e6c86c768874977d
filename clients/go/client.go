package existencegate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/existence-gate/existence-gate/clients/go/existencepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Defaults of the GateClient options.
const (
	DefaultCoalesceWindow  = 200 * time.Microsecond
	DefaultCoalesceMaxKeys = 1024
	DefaultDeadline        = 500 * time.Millisecond
	// MaxBatchKeys is where MayExistMany splits its batches (the server's default max_batch_keys).
	MaxBatchKeys = 10000
	// MaxKeyBytes is the server's default max_key_bytes. A lookup of a key that is empty or longer is sent
	// on its own (a unary MayExist), so that its INVALID_ARGUMENT cannot fail the batch it would share.
	MaxKeyBytes = 1024
	// downFor is how long an address that answered UNAVAILABLE (or could not be reached) is avoided.
	downFor = time.Second
)

// AddressPolicy chooses the address of each call or batch.
type AddressPolicy int

const (
	// RoundRobin sends each call or batch to the next address that is up.
	RoundRobin AddressPolicy = iota
	// PickFirst sends every call to the first address that is up, in the order given.
	PickFirst
)

func (p AddressPolicy) String() string {
	if p == PickFirst {
		return "pick_first"
	}
	return "round_robin"
}

// Option tunes a GateClient.
type Option func(*clientOptions)

type clientOptions struct {
	window      time.Duration
	maxKeys     int
	deadline    time.Duration
	policy      AddressPolicy
	token       string
	creds       credentials.TransportCredentials
	dialOptions []grpc.DialOption
}

// WithCoalesceWindow sets the longest a lookup waits for others to share its BatchMayExist while another
// batch is in flight (default 200 µs; with none in flight it leaves at once); 0 turns coalescing off: each
// lookup is a unary MayExist, each MayExistMany part its own BatchMayExist.
func WithCoalesceWindow(d time.Duration) Option {
	return func(o *clientOptions) { o.window = d }
}

// WithCoalesceMaxKeys sets the number of keys at which a batch is sent at once (default 1,024; at most
// MaxBatchKeys).
func WithCoalesceMaxKeys(n int) Option {
	return func(o *clientOptions) { o.maxKeys = n }
}

// WithDeadline sets the deadline of each call, retries included (default 500 ms).
func WithDeadline(d time.Duration) Option {
	return func(o *clientOptions) { o.deadline = d }
}

// WithAddressPolicy chooses RoundRobin (the default) or PickFirst.
func WithAddressPolicy(p AddressPolicy) Option {
	return func(o *clientOptions) { o.policy = p }
}

// WithToken sends "authorization: Bearer <token>" with every call.
func WithToken(token string) Option {
	return func(o *clientOptions) { o.token = token }
}

// WithTransportCredentials makes every channel use creds (e.g. credentials.NewTLS(&tls.Config{RootCAs: ...,
// ServerName: "localhost", Certificates: ...}) for TLS, with a client certificate for mutual TLS) instead of
// plaintext. Set ServerName when the addresses are IPs and the certificate names a host.
func WithTransportCredentials(creds credentials.TransportCredentials) Option {
	return func(o *clientOptions) { o.creds = creds }
}

// WithDialOptions adds gRPC dial options (interceptors, ..., or grpc.WithTransportCredentials) to every
// channel. Without transport credentials (here or from WithTransportCredentials) the channels are plaintext.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *clientOptions) { o.dialOptions = append(o.dialOptions, opts...) }
}

// Answer is the gate's answer for one key.
type Answer struct {
	// MayExist is false when the key definitely does not exist (ABSENT), true when the source must be asked.
	MayExist bool
	// ObservedSeq is the namespace's seq the answer was computed at: pass it to RecordAbsent.
	ObservedSeq uint64
	// Warming is true while the gate is still loading (every answer is then MAY_EXIST).
	Warming bool
	// Local is true when a Mirror answered with no call: ABSENT by its copy of the filter (basis FILTER)
	// under a sub-lease.
	Local bool
	addr  int // the address that answered (RecordAbsent of this key goes there); -1 when unknown
}

// AbsenceKind says why the source lacks a key.
type AbsenceKind int

const (
	// AbsenceMissing: the source said "not found".
	AbsenceMissing AbsenceKind = iota
	// AbsenceDeleted: the entity was deleted.
	AbsenceDeleted
)

// RecordOutcome is what RecordAbsent did.
type RecordOutcome int

const (
	// OutcomeUnspecified: a server that sent no outcome.
	OutcomeUnspecified RecordOutcome = iota
	// Recorded: a tombstone was stored.
	Recorded
	// Redundant: the filter already answers ABSENT for the key; nothing stored.
	Redundant
	// Superseded: an Add of the key may have been applied after observed_seq; nothing stored.
	Superseded
	// Throttled: the namespace's tombstone admission rate was exceeded; nothing stored.
	Throttled
)

func (o RecordOutcome) String() string {
	switch o {
	case Recorded:
		return "RECORDED"
	case Redundant:
		return "REDUNDANT"
	case Superseded:
		return "SUPERSEDED"
	case Throttled:
		return "THROTTLED"
	}
	return "UNSPECIFIED"
}

// RecordResult is RecordAbsent's answer.
type RecordResult struct {
	Outcome RecordOutcome
	// Seq is the tombstone's seq when Recorded; otherwise the namespace's latest seq.
	Seq uint64
	// ExpiresIn is the tombstone's TTL when Recorded.
	ExpiresIn time.Duration
}

// Stats is a snapshot of monotonically increasing counters. A GateClient fills the first four and its
// mirrors' (Mirror*); a GatedReader's Stats adds its own to its client's.
type Stats struct {
	Lookups     uint64 // single-key lookups asked of the client (a Mirror's included)
	GateCalls   uint64 // lookup RPCs sent (MayExist or BatchMayExist)
	BatchedKeys uint64 // keys sent in coalesced batches (BatchedKeys / GateCalls = mean batch size)
	Retries     uint64 // calls retried on another address

	MirrorAnswers  uint64 // lookups a Mirror answered ABSENT with no call (also counted in Lookups)
	MirrorAttaches uint64 // filters a Mirror downloaded (its first attachment and each one after a stream ended)
	MirrorResyncs  uint64 // RESYNCs a Mirror was sent (a rebuild, a restore, or it fell behind)
	MirrorGrants   uint64 // sub-leases granted to a Mirror (refusals not counted)

	CacheHits          uint64 // Gets answered by the local absence cache
	FailOpens          uint64 // Gets that read the source because the gate failed
	SourceReads        uint64 // source reads (after single flight)
	AbsencesRecorded   uint64 // RecordAbsent answered RECORDED
	Invalidations      uint64 // ADDED keys applied, plus one per RESYNC
	Resubscribes       uint64 // subscriptions reopened
	PendingAddsDropped uint64 // keys found while the gate was warming that could not wait to be added
}

// ErrClosed is the cause of the status (CANCELED) a closed client answers with.
var ErrClosed = errors.New("existencegate: client closed")

type address struct {
	target string
	conn   *grpc.ClientConn
	stub   existencepb.ExistenceGateClient

	mu        sync.Mutex
	downSince time.Time // zero while up
	downUntil time.Time
}

func (a *address) state(now time.Time) (up bool, since time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.downSince.IsZero() || !now.Before(a.downUntil), a.downSince
}

func (a *address) markDown(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.downSince.IsZero() {
		a.downSince = now
	}
	a.downUntil = now.Add(downFor)
}

func (a *address) markUp() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.downSince = time.Time{}
}

// GateClient makes the gate's calls for one namespace over one channel per address, coalescing concurrent
// single-key lookups into BatchMayExist calls. It is safe for concurrent use.
type GateClient struct {
	namespace string
	opts      clientOptions
	addrs     []*address
	rr        atomic.Uint64

	lookups, gateCalls, batchedKeys, retries atomic.Uint64

	mirrorAnswers, mirrorAttaches, mirrorResyncs, mirrorGrants atomic.Uint64

	coal      *coalescer // nil with coalescing off
	closed    chan struct{}
	closeOnce sync.Once
	inFlight  sync.WaitGroup // the coalesced batches in flight
}

// NewGateClient makes a client of namespace ("" is "default") over the given addresses (host:port,
// replicas of one deployment). Channels connect lazily: an unreachable address is no error here.
func NewGateClient(addresses []string, namespace string, opts ...Option) (*GateClient, error) {
	if len(addresses) == 0 {
		return nil, errors.New("existencegate: no address")
	}
	o := clientOptions{window: DefaultCoalesceWindow, maxKeys: DefaultCoalesceMaxKeys, deadline: DefaultDeadline}
	for _, opt := range opts {
		opt(&o)
	}
	if o.window < 0 || o.maxKeys < 1 || o.deadline <= 0 {
		return nil, fmt.Errorf("existencegate: invalid options (window %v, max keys %d, deadline %v)", o.window, o.maxKeys, o.deadline)
	}
	if o.maxKeys > MaxBatchKeys {
		o.maxKeys = MaxBatchKeys
	}
	c := &GateClient{namespace: namespace, opts: o, closed: make(chan struct{})}
	for _, target := range addresses {
		conn, err := c.dial(target)
		if err != nil {
			c.closeConns()
			return nil, err
		}
		c.addrs = append(c.addrs, &address{target: target, conn: conn, stub: existencepb.NewExistenceGateClient(conn)})
	}
	if o.window > 0 {
		c.coal = &coalescer{maxKeys: o.maxKeys, window: o.window}
	}
	return c, nil
}

// dial opens a channel to target with the client's options (also used for a reader's subscription).
func (c *GateClient) dial(target string) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{
		// Reconnect soon after an outage: the default backoff grows to two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
	if c.opts.creds != nil {
		opts = append(opts, grpc.WithTransportCredentials(c.opts.creds))
	}
	opts = append(opts, c.opts.dialOptions...)
	conn, err := grpc.Dial(target, opts...)
	if err != nil && c.opts.creds == nil && strings.Contains(err.Error(), "no transport security set") {
		// No credentials among the dial options: plaintext. (grpc-go 1.33, Debian's, refuses WithInsecure
		// together with WithTransportCredentials, so plaintext is only asked for when nothing else is.)
		conn, err = grpc.Dial(target, append(opts, grpc.WithInsecure())...)
	}
	if err != nil {
		return nil, fmt.Errorf("existencegate: %s: %w", target, err)
	}
	return conn, nil
}

// Namespace is the client's namespace as given.
func (c *GateClient) Namespace() string { return c.namespace }

// Stats returns the client's counters (the reader's are zero).
func (c *GateClient) Stats() Stats {
	return Stats{Lookups: c.lookups.Load(), GateCalls: c.gateCalls.Load(), BatchedKeys: c.batchedKeys.Load(),
		Retries: c.retries.Load(), MirrorAnswers: c.mirrorAnswers.Load(), MirrorAttaches: c.mirrorAttaches.Load(),
		MirrorResyncs: c.mirrorResyncs.Load(), MirrorGrants: c.mirrorGrants.Load()}
}

// Close fails the lookups still waiting for a batch with CANCELED, waits for the batches in flight and
// closes the channels.
func (c *GateClient) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		if c.coal != nil {
			c.closeCoalescer()
		}
		c.inFlight.Wait()
		c.closeConns()
	})
	return nil
}

func (c *GateClient) closeConns() {
	for _, a := range c.addrs {
		a.conn.Close()
	}
}

func (c *GateClient) withToken(ctx context.Context) context.Context {
	if c.opts.token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.opts.token)
}

// invoke runs call on an address chosen by the policy (prefer first, if it is up and not negative),
// within one deadline; an UNAVAILABLE answer, or no answer within half of what is left of the deadline while
// another address is up, marks the address down and the call moves to the next address that is up. It
// returns the index of the address that answered last.
func (c *GateClient) invoke(ctx context.Context, prefer int, call func(ctx context.Context, a *address) error) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.deadline)
	defer cancel()
	ctx = c.withToken(ctx)
	n := len(c.addrs)
	start := 0
	if c.opts.policy == RoundRobin {
		start = int((c.rr.Add(1) - 1) % uint64(n))
	}
	tried := make([]bool, n)
	var lastErr error
	for attempt := 0; ; attempt++ {
		i := c.pick(prefer, start, tried, attempt == 0)
		if i < 0 {
			return -1, lastErr
		}
		if attempt > 0 {
			c.retries.Add(1)
		}
		tried[i] = true
		a := c.addrs[i]
		// An address that accepts and never answers (a stopped replica) would hold the call to its deadline:
		// while another untried address is up, it gets half of what remains, then the call moves on. With
		// none up, it gets all of it: a slow replica alone still answers within the deadline.
		attemptCtx, attemptCancel := ctx, context.CancelFunc(func() {})
		if deadline, ok := ctx.Deadline(); ok && c.anotherUp(tried) {
			attemptCtx, attemptCancel = context.WithTimeout(ctx, time.Until(deadline)/2)
		}
		err := call(attemptCtx, a)
		attemptCancel()
		if err == nil {
			a.markUp()
			return i, nil
		}
		silent := status.Code(err) == codes.DeadlineExceeded && ctx.Err() == nil
		if status.Code(err) != codes.Unavailable && !silent {
			return i, err
		}
		a.markDown(time.Now())
		lastErr = err
		if ctx.Err() != nil {
			return i, err
		}
	}
}

// anotherUp reports whether an address not yet tried by a call is up.
func (c *GateClient) anotherUp(tried []bool) bool {
	now := time.Now()
	for i, a := range c.addrs {
		if up, _ := a.state(now); up && !tried[i] {
			return true
		}
	}
	return false
}

// firstUp is the first address that is up, or, with every address down, the one down longest: where a
// mirror attaches.
func (c *GateClient) firstUp() int {
	return c.pick(-1, 0, make([]bool, len(c.addrs)), true)
}

// pick chooses the next address of a call: prefer if up, else the first up and untried one from start
// (round robin) or from 0 (pick first); on the first attempt with every address down, the one down longest.
func (c *GateClient) pick(prefer, start int, tried []bool, first bool) int {
	now := time.Now()
	n := len(c.addrs)
	if prefer >= 0 && prefer < n && !tried[prefer] {
		if up, _ := c.addrs[prefer].state(now); up {
			return prefer
		}
	}
	for k := 0; k < n; k++ {
		i := (start + k) % n
		if tried[i] {
			continue
		}
		if up, _ := c.addrs[i].state(now); up {
			return i
		}
	}
	if !first {
		return -1
	}
	longest := -1
	var longestSince time.Time
	for i, a := range c.addrs {
		if _, since := a.state(now); longest < 0 || since.Before(longestSince) {
			longest, longestSince = i, since
		}
	}
	return longest
}

// MayExist asks whether key may exist. With coalescing on, concurrent calls share BatchMayExist calls (a
// lone caller's leaves at once); a caller whose ctx ends gets its error at once, the batch goes on for the
// others.
func (c *GateClient) MayExist(ctx context.Context, key string) (Answer, error) {
	c.lookups.Add(1)
	if c.coal == nil || !coalescable(key) {
		return c.mayExistUnary(ctx, key)
	}
	answers, err := c.shared(ctx, []string{key})
	if err != nil {
		return Answer{}, err
	}
	return answers[0], nil
}

// coalescable says whether key may share a batch: the gate refuses an empty or over-long key with
// INVALID_ARGUMENT for the whole batch, so such a key is sent alone and its caller alone is refused.
func coalescable(key string) bool { return len(key) > 0 && len(key) <= MaxKeyBytes }

// shared queues keys (one waiter) for a coalesced batch and waits for their answers, within ctx. The
// client's deadline needs no timer per lookup: a batch gives up at its oldest waiter's deadline (sendBatch),
// and every waiter of a batch arrived after its oldest, so each is answered within its own deadline.
// Without the timer per lookup (context.WithTimeout) a lookup costs 6.7-7.3 instead of 8.3-8.8 µs of client
// CPU at 64 goroutines (bench.sh, the two builds interleaved).
func (c *GateClient) shared(ctx context.Context, keys []string) ([]Answer, error) {
	done, err := c.submit(keys)
	if err != nil {
		return nil, err
	}
	select {
	case r := <-done:
		return r.answers, r.err
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

func closedError() error { return status.Error(codes.Canceled, ErrClosed.Error()) }

func (c *GateClient) mayExistUnary(ctx context.Context, key string) (Answer, error) {
	var reply *existencepb.MayExistResponse
	i, err := c.invoke(ctx, -1, func(ctx context.Context, a *address) (err error) {
		c.gateCalls.Add(1)
		reply, err = a.stub.MayExist(ctx, &existencepb.MayExistRequest{Namespace: c.namespace, Key: []byte(key)})
		return err
	})
	if err != nil {
		return Answer{}, err
	}
	return Answer{
		MayExist:    reply.Answer != existencepb.Answer_ANSWER_ABSENT,
		ObservedSeq: reply.ObservedSeq,
		Warming:     reply.Basis == existencepb.Basis_BASIS_WARMING,
		addr:        i,
	}, nil
}

// MayExistMany answers many keys at once with packed BatchMayExist calls of at most MaxBatchKeys keys;
// every answer carries the smallest observed_seq of the parts (the conservative one to record an absence
// with). With coalescing on, each part whose keys are all coalescable joins the coalesced batches as one
// waiter (a batch never splits it), so concurrent small MayExistMany calls and MayExist calls share gate
// calls. An error of any part is returned as it is.
func (c *GateClient) MayExistMany(ctx context.Context, keys []string) ([]Answer, error) {
	answers := make([]Answer, 0, len(keys))
	var minSeq uint64
	for begin := 0; begin < len(keys); begin += MaxBatchKeys {
		end := begin + MaxBatchKeys
		if end > len(keys) {
			end = len(keys)
		}
		var part []Answer
		var err error
		if c.coal != nil && allCoalescable(keys[begin:end]) {
			part, err = c.shared(ctx, keys[begin:end])
		} else {
			part, err = c.batch(ctx, keys[begin:end])
		}
		if err != nil {
			return nil, err
		}
		if begin == 0 || part[0].ObservedSeq < minSeq {
			minSeq = part[0].ObservedSeq
		}
		answers = append(answers, part...)
	}
	for i := range answers {
		answers[i].ObservedSeq = minSeq
	}
	return answers, nil
}

func allCoalescable(keys []string) bool {
	for _, key := range keys {
		if !coalescable(key) {
			return false
		}
	}
	return true
}

// batch sends one packed BatchMayExist (keys not empty).
func (c *GateClient) batch(ctx context.Context, keys []string) ([]Answer, error) {
	size := 0
	for _, key := range keys {
		size += binary.MaxVarintLen64 + len(key)
	}
	packed := make([]byte, 0, size)
	for _, key := range keys {
		packed = binary.AppendUvarint(packed, uint64(len(key)))
		packed = append(packed, key...)
	}
	var reply *existencepb.BatchMayExistResponse
	i, err := c.invoke(ctx, -1, func(ctx context.Context, a *address) (err error) {
		c.gateCalls.Add(1)
		reply, err = a.stub.BatchMayExist(ctx, &existencepb.BatchMayExistRequest{Namespace: c.namespace, PackedKeys: packed})
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(reply.MayExistBitmap) < (len(keys)+7)/8 {
		return nil, status.Errorf(codes.Internal, "existencegate: a bitmap of %d bytes answered %d keys",
			len(reply.MayExistBitmap), len(keys))
	}
	answers := make([]Answer, len(keys))
	for k := range keys {
		answers[k] = Answer{
			MayExist:    reply.MayExistBitmap[k/8]&(1<<(k%8)) != 0,
			ObservedSeq: reply.ObservedSeq,
			Warming:     reply.Warming,
			addr:        i,
		}
	}
	return answers, nil
}

// Add declares that keys exist and returns the Add's seq.
func (c *GateClient) Add(ctx context.Context, keys []string) (uint64, error) {
	raw := make([][]byte, len(keys))
	for i, key := range keys {
		raw[i] = []byte(key)
	}
	var reply *existencepb.AddResponse
	_, err := c.invoke(ctx, -1, func(ctx context.Context, a *address) (err error) {
		reply, err = a.stub.Add(ctx, &existencepb.AddRequest{Namespace: c.namespace, Keys: raw})
		return err
	})
	if err != nil {
		return 0, err
	}
	return reply.Seq, nil
}

// RecordAbsent records that the source lacks key, with the ObservedSeq of the answer that sent the caller
// to the source (0: unknown).
func (c *GateClient) RecordAbsent(ctx context.Context, key string, kind AbsenceKind, observedSeq uint64) (RecordResult, error) {
	return c.recordAbsentAt(ctx, -1, key, kind, observedSeq)
}

// recordAbsentAt prefers the address that answered the lookup: its seqs are the ones observedSeq counts.
func (c *GateClient) recordAbsentAt(ctx context.Context, prefer int, key string, kind AbsenceKind, observedSeq uint64) (RecordResult, error) {
	pbKind := existencepb.AbsenceKind_ABSENCE_KIND_MISSING
	if kind == AbsenceDeleted {
		pbKind = existencepb.AbsenceKind_ABSENCE_KIND_DELETED
	}
	var reply *existencepb.RecordAbsentResponse
	_, err := c.invoke(ctx, prefer, func(ctx context.Context, a *address) (err error) {
		reply, err = a.stub.RecordAbsent(ctx, &existencepb.RecordAbsentRequest{
			Namespace: c.namespace, Key: []byte(key), Kind: pbKind, ObservedSeq: observedSeq,
		})
		return err
	})
	if err != nil {
		return RecordResult{}, err
	}
	outcome := OutcomeUnspecified
	switch reply.Outcome {
	case existencepb.RecordOutcome_RECORD_OUTCOME_RECORDED:
		outcome = Recorded
	case existencepb.RecordOutcome_RECORD_OUTCOME_REDUNDANT:
		outcome = Redundant
	case existencepb.RecordOutcome_RECORD_OUTCOME_SUPERSEDED:
		outcome = Superseded
	case existencepb.RecordOutcome_RECORD_OUTCOME_THROTTLED:
		outcome = Throttled
	}
	return RecordResult{Outcome: outcome, Seq: reply.Seq, ExpiresIn: time.Duration(reply.ExpiresInMs) * time.Millisecond}, nil
}
