package existencegate

import (
	"context"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultMirrorMaxFilterBytes is the most filter bytes a mirror holds unless told otherwise.
const DefaultMirrorMaxFilterBytes = 1 << 30

// MirrorOptions tune a Mirror.
type MirrorOptions struct {
	// MaxFilterBytes is the most filter bytes the mirror holds (0: DefaultMirrorMaxFilterBytes,
	// math.MaxUint64: no limit). The gate refuses a larger filter before sending any
	// (RESOURCE_EXHAUSTED), and a copy that grows past it is dropped; either way the mirror answers
	// nothing locally and tries again (backing off to 5 s).
	MaxFilterBytes uint64
}

// Mirror is an in-process copy of the client's namespace's filter, kept by the gate's Mirror.Attach stream
// (docs/mirrors.md). While it holds a sub-lease, a key its copy answers ABSENT for is ABSENT at once, with
// no call; every other lookup is the client's (coalesced) call. The gate acknowledges an Add only once
// every mirror holding a sub-lease has applied it (or that sub-lease has ended), so a mirror never answers
// ABSENT for an acknowledged key.
//
// A goroutine keeps the copy: it attaches to the client's first address that is up, downloads the filter,
// applies every later Add in seq order and acknowledges each, asks for a sub-lease every quarter of one, and
// when the stream ends (a restart, a RESYNC after a rebuild) drops the sub-lease at once and attaches again,
// backing off from 200 ms to 5 s; an address that answered UNAVAILABLE is marked down (1 s) as the client's
// calls mark it, so the next attach goes to the next address that is up. Lookups are safe from any number of goroutines. Memory: the filter's
// bytes (the gate's filter_bytes for the namespace).
type Mirror struct {
	client  *GateClient
	options MirrorOptions
	clock   monotonicClock
	// ticks is the clock lookups read where it is the monotonic clock (nil elsewhere: they read clock).
	ticks *tickClock

	// copy is the filter and its hash (nil until downloaded, and after the stream ends), replaced whole
	// on each attach.
	copy atomic.Pointer[mirrorCopy]
	// holdsUntil is the sub-lease's end on clock (0: none holds). Stored after the filter changes it
	// covers and read before the filter: a lookup that sees it holding sees those changes.
	holdsUntil atomic.Uint64
	// holdsUntilTicks is the same end in ticks (0: none holds), never later, when lookups read ticks.
	holdsUntilTicks atomic.Uint64
	// nowMs is the gate's time at the latest grant: which windows are live.
	nowMs atomic.Uint64
	// applied is the seq the copy has applied through.
	applied atomic.Uint64
	// observable is the highest seq a local answer may claim (the latest grant's bound; MaxUint64: none).
	observable atomic.Uint64
	// touched keeps what AbsentLocallyMany's early loads read, so that the compiler keeps the loads.
	touched atomic.Uint64

	// mu guards state, the latest outcome of attaching, and changed, closed and replaced whenever the
	// mirror's standing changes (for WaitReady).
	mu      sync.Mutex
	state   mirrorState
	changed chan struct{}

	stop context.CancelFunc
	done chan struct{}
}

type mirrorState struct {
	attached bool
	// err is what the latest attachment ended with (nil once a download succeeds).
	err error
}

// mirrorCopy is the filter and the hash its bits were set with.
type mirrorCopy struct {
	filter *windowedFilter
	hasher filterHasher
}

// Mirror makes a mirror of the client's namespace, attached to the client's first address that is up (a
// single server or a replica with [mirrors] max_per_namespace set; with tokens, the token needs the mirror role).
// It attaches in the background: WaitReady waits until it answers locally. Close it before the client.
func (c *GateClient) Mirror(options MirrorOptions) (*Mirror, error) {
	select {
	case <-c.closed:
		return nil, closedError()
	default:
	}
	if options.MaxFilterBytes == 0 {
		options.MaxFilterBytes = DefaultMirrorMaxFilterBytes
	}
	ctx, stop := context.WithCancel(context.Background())
	clock := newMonotonicClock()
	m := &Mirror{client: c, options: options, clock: clock, ticks: newTickClock(clock),
		changed: make(chan struct{}), stop: stop, done: make(chan struct{})}
	go m.keep(ctx)
	return m, nil
}

// Close ends the stream and frees the copy; later lookups go to the gate.
func (m *Mirror) Close() error {
	m.stop()
	<-m.done
	return nil
}

// AbsentLocally reports whether key is ABSENT by the local copy under a live sub-lease, with no call:
// true means ABSENT (basis FILTER); false means only that the gate must be asked. The sub-lease is read
// before the filter: read after, a lookup could pair a stale copy with a lease that covers later Adds.
func (m *Mirror) AbsentLocally(key string) bool {
	if !m.HoldsSublease() {
		return false
	}
	copy := m.copy.Load()
	return copy != nil && !copy.filter.contains(copy.hasher.hash(key), m.nowMs.Load())
}

// AbsentLocallyMany is AbsentLocally for each of keys, in order, with the sub-lease and the copy read
// once for them all: every answer is as of that one reading, as a single lookup's is as of its own. All
// false while no sub-lease holds.
func (m *Mirror) AbsentLocallyMany(keys []string) []bool {
	absent := make([]bool, len(keys))
	if !m.HoldsSublease() {
		return absent
	}
	copy := m.copy.Load()
	if copy == nil {
		return absent
	}
	hashes := make([]uint64, len(keys))
	for i, key := range keys {
		hashes[i] = copy.hasher.hash(key)
	}
	m.touched.Store(copy.filter.containsMany(hashes, m.nowMs.Load(), absent))
	for i := range absent {
		absent[i] = !absent[i]
	}
	return absent
}

// MayExist answers ABSENT from the local copy when it can (Answer.Local set), else asks the gate through
// the client (coalesced). The seq a local answer claims is read before the copy: the copy then holds at
// least that much, and a claim past what the lookup read could let a RecordAbsent stand over a later Add.
func (m *Mirror) MayExist(ctx context.Context, key string) (Answer, error) {
	observed := observableSeq(m.applied.Load(), m.observable.Load())
	if m.AbsentLocally(key) {
		m.client.lookups.Add(1)
		m.client.mirrorAnswers.Add(1)
		return Answer{ObservedSeq: observed, Local: true}, nil
	}
	return m.client.MayExist(ctx, key)
}

// HoldsSublease reports whether a sub-lease holds now: lookups the copy answers ABSENT need no call.
func (m *Mirror) HoldsSublease() bool {
	if m.ticks != nil {
		until := m.holdsUntilTicks.Load()
		return until != 0 && cpuTicks() < until
	}
	until := m.holdsUntil.Load()
	return until != 0 && m.clock.now() < until
}

// setHoldsUntil publishes the sub-lease's end (0: none holds) for lookups.
func (m *Mirror) setHoldsUntil(end uint64) {
	m.holdsUntil.Store(end)
	if m.ticks != nil {
		m.holdsUntilTicks.Store(m.ticks.until(end))
	}
}

// Attached reports whether the copy is downloaded and following the gate (it may hold no sub-lease yet).
func (m *Mirror) Attached() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state.attached
}

// Err is what the latest attachment ended with: nil while attached, a gRPC status otherwise — e.g.
// PERMISSION_DENIED (the token lacks the mirror role), RESOURCE_EXHAUSTED (the filter is larger than
// MaxFilterBytes, or the namespace has max_per_namespace mirrors), FAILED_PRECONDITION (mirrors off).
func (m *Mirror) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state.err
}

// WaitReady waits until the mirror holds a sub-lease (it answers ABSENT locally), and returns nil; or
// returns the gate's refusal when an attachment was refused (any status but UNAVAILABLE: a gate that
// is down is waited for), or ctx's error.
func (m *Mirror) WaitReady(ctx context.Context) error {
	for {
		m.mu.Lock()
		err, changed := m.state.err, m.changed
		m.mu.Unlock()
		if m.HoldsSublease() {
			return nil
		}
		if err != nil && status.Code(err) != codes.Unavailable {
			return err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// setState records the mirror's standing and wakes WaitReady.
func (m *Mirror) setState(state mirrorState) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.state = state
	m.notifyLocked()
}

// notify wakes WaitReady after every grant, not only one that made the sub-lease hold again: a renewal
// that arrives just as the previous sub-lease runs out would otherwise wake no one.
func (m *Mirror) notify() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.notifyLocked()
}

func (m *Mirror) notifyLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}
