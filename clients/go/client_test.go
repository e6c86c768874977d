package existencegate

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/existence-gate/existence-gate/clients/go/existencepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// methodCounter is a unary interceptor counting the RPCs sent, by method name.
type methodCounter struct {
	mu    sync.Mutex
	calls map[string]int
}

func (m *methodCounter) option() Option {
	m.calls = map[string]int{}
	return WithDialOptions(grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply interface{},
		cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		m.mu.Lock()
		m.calls[method[strings.LastIndex(method, "/")+1:]]++
		m.mu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	}))
}

func (m *methodCounter) count(method string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[method]
}

// batchHold is a unary interceptor recording the keys of each BatchMayExist sent and, when holding,
// keeping the first one from the gate until released: a batch stays in flight as long as the test wants.
type batchHold struct {
	holding bool
	held    chan struct{} // closed once the first batch is held
	free    chan struct{} // closed to let it go
	once    sync.Once

	mu    sync.Mutex
	sizes []int
}

func newBatchHold(t *testing.T, holding bool) *batchHold {
	h := &batchHold{holding: holding, held: make(chan struct{}), free: make(chan struct{})}
	t.Cleanup(h.release) // registered before the client's Close, so it runs first
	return h
}

func (h *batchHold) option() Option {
	return WithDialOptions(grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply interface{},
		cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*existencepb.BatchMayExistRequest); ok {
			keys := 0
			for packed := r.PackedKeys; len(packed) > 0; keys++ {
				n, size := binary.Uvarint(packed)
				packed = packed[size+int(n):]
			}
			h.mu.Lock()
			h.sizes = append(h.sizes, keys)
			first := len(h.sizes) == 1
			h.mu.Unlock()
			if first && h.holding {
				close(h.held)
				select {
				case <-h.free:
				case <-ctx.Done():
				}
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}))
}

func (h *batchHold) release() { h.once.Do(func() { close(h.free) }) }

// batches returns the number of keys of each BatchMayExist sent so far, in order.
func (h *batchHold) batches() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.sizes...)
}

// wantBatches fails t unless the batches sent so far had the sizes want, e.g. "[1 8 7]".
func (h *batchHold) wantBatches(t *testing.T, want string) {
	t.Helper()
	if got := fmt.Sprint(h.batches()); got != want {
		t.Errorf("batches of %s keys, want %s", got, want)
	}
}

// waitHeld waits until the first batch is held.
func (h *batchHold) waitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-h.held:
	case <-time.After(patience):
		t.Fatalf("no batch held within %v", patience)
	}
}

// waitPending waits until keys keys wait for a batch.
func waitPending(t *testing.T, c *GateClient, keys int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d keys pending", keys), func() bool { return c.pendingKeys() == keys })
}

// lookupAll runs one MayExist per key from its own goroutine, all released at once.
func lookupAll(c *GateClient, keys []string) ([]Answer, []error) {
	answers := make([]Answer, len(keys))
	errs := make([]error, len(keys))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Add(1)
		go func(i int, key string) {
			defer wg.Done()
			<-start
			answers[i], errs[i] = c.MayExist(context.Background(), key)
		}(i, key)
	}
	close(start)
	wg.Wait()
	return answers, errs
}

func TestCoalescingUnderConcurrencyMatchesUnaryAnswers(t *testing.T) {
	ns := "coalesce"
	waitReady(t, shared.addr, ns)
	unary := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(0))
	var added, keys []string
	for i := 0; i < 32; i++ {
		added = append(added, fmt.Sprintf("coalesce:added:%d", i))
		keys = append(keys, added[i], fmt.Sprintf("coalesce:never:%d", i))
	}
	seq, err := unary.Add(context.Background(), added)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, key := range keys {
		a, err := unary.MayExist(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		want[key] = a.MayExist
	}
	for _, key := range added {
		if !want[key] {
			t.Fatalf("the gate answers ABSENT for the added %q", key)
		}
	}

	coalescing := newClient(t, []string{shared.addr}, ns) // the defaults: 200 µs, 1,024 keys
	const rounds = 4
	for round := 0; round < rounds; round++ {
		answers, errs := lookupAll(coalescing, keys)
		for i, key := range keys {
			if errs[i] != nil {
				t.Fatalf("MayExist(%q): %v", key, errs[i])
			}
			if answers[i].MayExist != want[key] {
				t.Errorf("MayExist(%q) = %v coalesced, %v unary", key, answers[i].MayExist, want[key])
			}
			if answers[i].ObservedSeq < seq || answers[i].Warming {
				t.Errorf("MayExist(%q): observed_seq %d (the Add's seq is %d), warming %v", key,
					answers[i].ObservedSeq, seq, answers[i].Warming)
			}
		}
	}
	s := coalescing.Stats()
	t.Logf("%d lookups in %d gate calls (%d batched keys)", s.Lookups, s.GateCalls, s.BatchedKeys)
	if s.Lookups != rounds*uint64(len(keys)) || s.BatchedKeys != s.Lookups {
		t.Errorf("stats %+v: want %d lookups, all batched", s, rounds*len(keys))
	}
	if s.GateCalls >= s.Lookups {
		t.Errorf("no batch held more than one key: %d gate calls for %d lookups", s.GateCalls, s.Lookups)
	}
}

func TestCoalesceMaxKeysSendsAFullBatchAtOnce(t *testing.T) {
	ns := "coalesce"
	waitReady(t, shared.addr, ns)
	// A window far longer than the test, and the first batch kept in flight: only full batches can leave.
	hold := newBatchHold(t, true)
	c := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(time.Hour), WithCoalesceMaxKeys(8),
		WithDeadline(10*time.Second), hold.option())
	var wg sync.WaitGroup
	errs := make([]error, 64)
	lookup := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = c.MayExist(context.Background(), fmt.Sprintf("max-keys:%d", i))
		}()
	}
	lookup(0) // no batch in flight: it leaves at once, and is held
	hold.waitHeld(t)
	for i := 1; i < 64; i++ {
		lookup(i)
	}
	// 63 callers: 7 full batches of 8 leave while the first is held; 7 keys wait (window, not full).
	eventually(t, "7 full batches sent", func() bool { return len(hold.batches()) == 8 && c.pendingKeys() == 7 })
	hold.release() // nothing in flight any more: the 7 leave at once
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	hold.wantBatches(t, "[1 8 8 8 8 8 8 8 7]")
	if s := c.Stats(); s.GateCalls != 9 || s.BatchedKeys != 64 || s.Lookups != 64 {
		t.Errorf("stats %+v: want 9 batches, 64 keys", s)
	}
}

func TestALoneCallerDoesNotWaitForTheWindow(t *testing.T) {
	ns := "coalesce"
	waitReady(t, shared.addr, ns)
	u := uniq()
	// A window far beyond the deadline: a caller that waited for it would get DEADLINE_EXCEEDED.
	c := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(time.Hour), WithDeadline(10*time.Second))
	seq, err := c.Add(context.Background(), []string{u + "lone:0", u + "lone:2", u + "lone:4"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		a, err := c.MayExist(context.Background(), fmt.Sprintf("%slone:%d", u, i))
		if err != nil {
			t.Fatalf("lookup %d: %v", i, err)
		}
		if i%2 == 0 && !a.MayExist || a.ObservedSeq < seq {
			t.Errorf("lookup %d: %+v (the Add's seq is %d)", i, a, seq)
		}
	}
	answers, err := c.MayExistMany(context.Background(), []string{u + "lone:0", u + "lone:2"})
	if err != nil || len(answers) != 2 || !answers[0].MayExist || !answers[1].MayExist {
		t.Errorf("MayExistMany alone: %+v, %v", answers, err)
	}
	if s := c.Stats(); s.Lookups != 5 || s.GateCalls != 6 || s.BatchedKeys != 7 {
		t.Errorf("stats %+v: want 6 batches (5 lookups and one MayExistMany of 2 keys)", s)
	}
}

// manyKeys is callers × perCaller keys, one in three added (by unary), and the gate's uncoalesced answers.
func manyKeys(t *testing.T, ns string, callers, perCaller int) ([][]string, [][]Answer) {
	t.Helper()
	u := uniq()
	unary := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(0), WithDeadline(10*time.Second))
	keys := make([][]string, callers)
	var added []string
	for i := range keys {
		for k := 0; k < perCaller; k++ {
			key := fmt.Sprintf("%smany:%d:%d", u, i, k)
			keys[i] = append(keys[i], key)
			if (i*perCaller+k)%3 == 0 {
				added = append(added, key)
			}
		}
	}
	if _, err := unary.Add(context.Background(), added); err != nil {
		t.Fatal(err)
	}
	want := make([][]Answer, callers)
	for i := range keys {
		var err error
		if want[i], err = unary.MayExistMany(context.Background(), keys[i]); err != nil {
			t.Fatal(err)
		}
		for k, a := range want[i] {
			if (i*perCaller+k)%3 == 0 && !a.MayExist {
				t.Fatalf("the gate answers ABSENT for the added %q", keys[i][k])
			}
		}
	}
	if s := unary.Stats(); s.BatchedKeys != 0 {
		t.Errorf("an uncoalesced client batched keys: %+v", s)
	}
	return keys, want
}

func sameAnswers(t *testing.T, caller int, got, want []Answer) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("caller %d: %d answers, want %d", caller, len(got), len(want))
		return
	}
	for k := range got {
		if got[k].MayExist != want[k].MayExist || got[k].Warming {
			t.Errorf("caller %d key %d: %+v coalesced, %+v uncoalesced", caller, k, got[k], want[k])
		}
	}
}

// Ten callers at once: the first one's keys leave alone (no batch in flight) and are held at the gate until
// the other nine have queued theirs, which then leave together as the second batch. Held, not timed: left to
// the scheduler, a loaded machine could answer each call before the next caller arrived.
func TestConcurrentMayExistManyShareBatches(t *testing.T) {
	ns := "batching"
	waitReady(t, shared.addr, ns)
	keys, want := manyKeys(t, ns, 10, 100)

	hold := newBatchHold(t, true)
	c := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(time.Hour), hold.option())
	got := make([][]Answer, len(keys))
	errs := make([]error, len(keys))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range keys {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			got[i], errs[i] = c.MayExistMany(context.Background(), keys[i])
		}(i)
	}
	close(start)
	hold.waitHeld(t)
	waitPending(t, c, 900)
	hold.release()
	wg.Wait()
	for i := range keys {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		sameAnswers(t, i, got[i], want[i])
	}
	hold.wantBatches(t, "[100 900]")
	s := c.Stats()
	if s.BatchedKeys != 1000 || s.Lookups != 0 || s.GateCalls != 2 {
		t.Errorf("stats %+v: want 1,000 batched keys in 2 gate calls, no lookups", s)
	}
}

func TestMayExistManyPartsAndLookupsShareABatchWhole(t *testing.T) {
	ns := "batching"
	waitReady(t, shared.addr, ns)
	keys, want := manyKeys(t, ns, 4, 100)
	hold := newBatchHold(t, true)
	c := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(time.Hour), WithDeadline(10*time.Second),
		WithCoalesceMaxKeys(256), hold.option())
	got := make([][]Answer, len(keys))
	errs := make([]error, len(keys))
	single := make([]Answer, len(keys))
	singleErrs := make([]error, len(keys))
	var wg sync.WaitGroup
	// In order, each queued before the next: caller 0's 100 keys (held in flight), then caller 1's 100, a
	// single key, caller 2's 100, a single key, caller 3's 100: 100 + 1 + 100 + 1 = 202 < 256 keys, so
	// caller 3's part joins whole (302 keys), which makes the batch full: it leaves while the first is held.
	pending := 0
	for i := range keys {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			got[i], errs[i] = c.MayExistMany(context.Background(), keys[i])
		}(i)
		if i == 0 {
			hold.waitHeld(t)
			continue
		}
		pending += len(keys[i])
		if i == len(keys)-1 {
			eventually(t, "a full batch sent", func() bool { return len(hold.batches()) == 2 && c.pendingKeys() == 0 })
			break
		}
		waitPending(t, c, pending)
		if i == 1 || i == 2 {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				single[i], singleErrs[i] = c.MayExist(context.Background(), keys[i][0])
			}(i)
			pending++
			waitPending(t, c, pending)
		}
	}
	hold.release()
	wg.Wait()
	for i := range keys {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		sameAnswers(t, i, got[i], want[i])
	}
	for _, i := range []int{1, 2} {
		if singleErrs[i] != nil || single[i].MayExist != want[i][0].MayExist {
			t.Errorf("MayExist(%q) between the parts: %+v, %v (want %v)", keys[i][0], single[i], singleErrs[i],
				want[i][0].MayExist)
		}
	}
	hold.wantBatches(t, "[100 302]")
	if s := c.Stats(); s.BatchedKeys != 402 || s.Lookups != 2 || s.GateCalls != 2 {
		t.Errorf("stats %+v: want 2 batches of 402 keys, 2 lookups", s)
	}
}

func TestACoalescedBatchNeverExceedsTheServersLimit(t *testing.T) {
	ns := "batching"
	waitReady(t, shared.addr, ns)
	keys, want := manyKeys(t, ns, 3, 4000)
	hold := newBatchHold(t, true)
	// CoalesceMaxKeys beyond the limit is the limit.
	c := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(time.Hour), WithCoalesceMaxKeys(50000),
		WithDeadline(10*time.Second), hold.option())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := c.MayExist(context.Background(), "limit:first"); err != nil {
			t.Error(err)
		}
	}()
	hold.waitHeld(t)
	got := make([][]Answer, len(keys))
	errs := make([]error, len(keys))
	for i := range keys {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			got[i], errs[i] = c.MayExistMany(context.Background(), keys[i])
		}(i)
		if i < 2 {
			waitPending(t, c, 4000*(i+1))
		}
	}
	// 12,000 keys reach the limit: a batch of 8,000 leaves (a third part would exceed 10,000), 4,000 wait.
	eventually(t, "a batch of 8,000 keys sent", func() bool { return len(hold.batches()) == 2 && c.pendingKeys() == 4000 })
	hold.release()
	wg.Wait()
	for i := range keys {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		sameAnswers(t, i, got[i], want[i])
	}
	hold.wantBatches(t, "[1 8000 4000]")
}

func TestCoalescingOffSendsUnaryCalls(t *testing.T) {
	ns := "unary"
	waitReady(t, shared.addr, ns)
	var methods methodCounter
	c := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(0), methods.option())
	if _, err := c.Add(context.Background(), []string{"unary:1"}); err != nil {
		t.Fatal(err)
	}
	keys := []string{"unary:1", "unary:2", "unary:3", "unary:4", "unary:5", "unary:6", "unary:7", "unary:8"}
	answers, errs := lookupAll(c, keys)
	for i, key := range keys {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if answers[i].MayExist != (key == "unary:1") {
			t.Errorf("MayExist(%q) = %v", key, answers[i].MayExist)
		}
	}
	if methods.count("MayExist") != len(keys) || methods.count("BatchMayExist") != 0 {
		t.Errorf("sent %v: want %d MayExist and no BatchMayExist", methods.calls, len(keys))
	}
	if s := c.Stats(); s.Lookups != 8 || s.GateCalls != 8 || s.BatchedKeys != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestCallerDeadlineAndCancellationLeaveTheBatchToTheOthers(t *testing.T) {
	ns := "cancel"
	waitReady(t, shared.addr, ns)
	// The first batch is held in flight and the window is long: the others wait in the next batch.
	hold := newBatchHold(t, true)
	c := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(time.Hour), WithDeadline(10*time.Second),
		hold.option())
	if _, err := c.Add(context.Background(), []string{"cancel:added"}); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		answer  Answer
		err     error
		elapsed time.Duration
	}
	var wg, leaving sync.WaitGroup
	run := func(ctx context.Context, key string, out *outcome, wg *sync.WaitGroup) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			started := time.Now()
			out.answer, out.err = c.MayExist(ctx, key)
			out.elapsed = time.Since(started)
		}()
	}
	var others [4]outcome
	var timedOut, cancelled outcome
	for i := range others {
		key := "cancel:never"
		if i%2 == 0 {
			key = "cancel:added"
		}
		run(context.Background(), key, &others[i], &wg)
		if i == 0 {
			hold.waitHeld(t)
		}
	}
	shortCtx, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	run(shortCtx, "cancel:timed-out", &timedOut, &leaving)
	cancelCtx, cancel := context.WithCancel(context.Background())
	run(cancelCtx, "cancel:cancelled", &cancelled, &leaving)
	waitPending(t, c, 5) // every caller but the held one waits for the next batch
	cancel()
	leaving.Wait() // both leave while their batch has not even been sent
	hold.release()
	wg.Wait()

	const soon = 5 * time.Second // the client's deadline is 10 s
	if status.Code(timedOut.err) != codes.DeadlineExceeded || timedOut.elapsed >= soon {
		t.Errorf("the caller whose deadline passed: %v after %v (want DEADLINE_EXCEEDED before the window ends)",
			timedOut.err, timedOut.elapsed)
	}
	if status.Code(cancelled.err) != codes.Canceled || cancelled.elapsed >= soon {
		t.Errorf("the cancelled caller: %v after %v (want CANCELED at once)", cancelled.err, cancelled.elapsed)
	}
	for i, o := range others {
		if o.err != nil || o.answer.MayExist != (i%2 == 0) {
			t.Errorf("caller %d of the same batch: %+v, %v", i, o.answer, o.err)
		}
	}
	hold.wantBatches(t, "[1 5]") // the keys of the callers that left are still sent
	if s := c.Stats(); s.GateCalls != 2 || s.BatchedKeys != 6 {
		t.Errorf("stats %+v: want the 6 callers in 2 batches", s)
	}
}

func TestAFailedBatchFailsEveryCallerWithItsStatus(t *testing.T) {
	waitReady(t, shared.addr, "cancel")
	hold := newBatchHold(t, true)
	c := newClient(t, []string{shared.addr}, "no_such_namespace", WithCoalesceWindow(time.Hour),
		WithDeadline(10*time.Second), hold.option())
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Add(1)
		go func(i int, key string) {
			defer wg.Done()
			_, errs[i] = c.MayExist(context.Background(), key)
		}(i, key)
		if i == 0 {
			hold.waitHeld(t)
		}
	}
	waitPending(t, c, 7)
	hold.release()
	wg.Wait()
	first := status.Convert(errs[0])
	for i, err := range errs {
		st := status.Convert(err)
		if st.Code() != codes.NotFound || st.Message() != first.Message() {
			t.Errorf("caller %d: %v (want NOT_FOUND, as every caller: %v)", i, err, errs[0])
		}
	}
	if s := c.Stats(); s.GateCalls != 2 || fmt.Sprint(hold.batches()) != "[1 7]" {
		t.Errorf("stats %+v, batches %v: want the first caller's batch and one of the 7 others", s, hold.batches())
	}
	t.Logf("every caller got: %v", errs[0])
}

func TestInvalidInputKeepsItsStatus(t *testing.T) {
	ns := "invalid"
	waitReady(t, shared.addr, ns)
	c := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(50*time.Millisecond))
	// An empty key shares no batch: its INVALID_ARGUMENT is its own, the others' lookups are answered.
	_, errs := lookupAll(c, []string{"", "invalid:fine", strings.Repeat("k", MaxKeyBytes+1), "invalid:fine2"})
	for i, err := range errs {
		invalid := i == 0 || i == 2
		if invalid && status.Code(err) != codes.InvalidArgument {
			t.Errorf("lookup %d: %v, want INVALID_ARGUMENT", i, err)
		}
		if !invalid && err != nil {
			t.Errorf("lookup %d: %v", i, err)
		}
	}
	t.Logf("empty key: %v", errs[0])
	unary := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(0))
	if _, err := unary.MayExist(context.Background(), ""); status.Code(err) != codes.InvalidArgument {
		t.Errorf("unary MayExist of an empty key: %v", err)
	}
	if _, err := c.MayExistMany(context.Background(), []string{"x", ""}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("MayExistMany with an empty key: %v", err)
	}
	if _, err := c.Add(context.Background(), nil); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Add of no keys: %v", err)
	}
	if _, err := c.RecordAbsent(context.Background(), "", AbsenceMissing, 0); status.Code(err) != codes.InvalidArgument {
		t.Errorf("RecordAbsent of an empty key: %v", err)
	}
	// An observed_seq the gate never reached: refused as INVALID_ARGUMENT, message unchanged.
	_, err := c.RecordAbsent(context.Background(), "invalid:ahead", AbsenceMissing, 1<<40)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "ahead") {
		t.Errorf("RecordAbsent ahead of the gate: %v", err)
	}
}

func TestMayExistManySplitsAtTheServersLimit(t *testing.T) {
	ns := "many"
	waitReady(t, shared.addr, ns)
	var methods methodCounter
	c := newClient(t, []string{shared.addr}, ns, methods.option(), WithDeadline(10*time.Second))
	keys := make([]string, MaxBatchKeys+5)
	for i := range keys {
		keys[i] = fmt.Sprintf("many:%d", i)
	}
	if _, err := c.Add(context.Background(), []string{keys[3], keys[MaxBatchKeys+2]}); err != nil {
		t.Fatal(err)
	}
	answers, err := c.MayExistMany(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(answers) != len(keys) {
		t.Fatalf("%d answers for %d keys", len(answers), len(keys))
	}
	maybe := 0
	for i, a := range answers {
		if a.MayExist {
			maybe++
		}
		if a.ObservedSeq != answers[0].ObservedSeq {
			t.Errorf("answer %d observed seq %d, answer 0 %d: want the smallest for all", i, a.ObservedSeq, answers[0].ObservedSeq)
			break
		}
	}
	if !answers[3].MayExist || !answers[MaxBatchKeys+2].MayExist || maybe > 50 {
		t.Errorf("added keys answered %v %v; %d may exist", answers[3].MayExist, answers[MaxBatchKeys+2].MayExist, maybe)
	}
	if methods.count("BatchMayExist") != 2 {
		t.Errorf("sent %v: want 2 BatchMayExist", methods.calls)
	}
	if none, err := c.MayExistMany(context.Background(), nil); err != nil || len(none) != 0 {
		t.Errorf("no keys: %v %v", none, err)
	}
}

// A coalesced lookup of a gate that accepts connections and never answers ends with DEADLINE_EXCEEDED at the
// client's deadline: the batch gives up at its oldest waiter's deadline (no timer per lookup).
func TestAGateThatNeverAnswersIsADeadlineExceededWithinTheDeadline(t *testing.T) {
	c := newClient(t, []string{silentAddress(t)}, "silent", WithDeadline(300*time.Millisecond))
	answered := make(chan error, 1)
	go func() {
		_, err := c.MayExist(context.Background(), "k")
		answered <- err
	}()
	select {
	case err := <-answered:
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("MayExist of a silent gate: %v, want DEADLINE_EXCEEDED", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no answer 15 s after a lookup with a 300 ms deadline")
	}
}

func TestGateDownIsUnavailable(t *testing.T) {
	c := newClient(t, []string{deadAddress(t), deadAddress(t)}, "failopen")
	started := time.Now()
	_, err := c.MayExist(context.Background(), "k")
	if status.Code(err) != codes.Unavailable {
		t.Errorf("MayExist with every address down: %v", err)
	}
	if elapsed := time.Since(started); elapsed > 2*DefaultDeadline {
		t.Errorf("took %v", elapsed)
	}
	if s := c.Stats(); s.Retries != 1 {
		t.Errorf("stats %+v: want the call retried once on the other address", s)
	}
	// Both are down now: the next call still tries one (the one down longest), and only it.
	_, err = c.MayExist(context.Background(), "k")
	if status.Code(err) != codes.Unavailable || c.Stats().Retries != 1 {
		t.Errorf("with every address down: %v, stats %+v", err, c.Stats())
	}
}

// A replica that accepts connections and never answers (SIGSTOPped) beside a live one: a call sent to it
// moves on to the live one after half its deadline instead of failing at the deadline, and the silent
// address is then avoided: every lookup is answered, one retry in all.
func TestASilentAddressCostsACallHalfItsDeadlineAndIsThenAvoided(t *testing.T) {
	ns, key := "multi", uniq()+"present"
	waitReady(t, shared.addr, ns)
	c := newClient(t, []string{silentAddress(t), shared.addr}, ns, WithDeadline(400*time.Millisecond),
		WithCoalesceWindow(0))
	if _, err := c.Add(context.Background(), []string{key}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		a, err := c.MayExist(context.Background(), key)
		if err != nil || !a.MayExist {
			t.Fatalf("lookup %d: %+v %v", i, a, err)
		}
	}
	if s := c.Stats(); s.Retries != 1 {
		t.Errorf("stats %+v: want the silent address tried once", s)
	}
}

// With every other address down, the one left gets the whole deadline: a replica that is slow but alone must
// still be able to answer. (Here it never answers, so each call ends at its deadline, not at half of it; a
// lower bound on the time, which a loaded machine only lengthens.)
func TestTheOnlyAddressUpGetsTheWholeDeadline(t *testing.T) {
	deadline := 300 * time.Millisecond
	c := newClient(t, []string{deadAddress(t), silentAddress(t)}, "multi", WithDeadline(deadline),
		WithCoalesceWindow(0))
	for i := 0; i < 2; i++ {
		started := time.Now()
		_, err := c.MayExist(context.Background(), "k")
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("call %d: %v", i, err)
		}
		if waited := time.Since(started); waited < deadline*9/10 {
			t.Errorf("call %d gave up after %v, before its deadline of %v", i, waited, deadline)
		}
	}
}

func TestMultiAddressRetriesOnTheLiveOne(t *testing.T) {
	ns := "multi"
	waitReady(t, shared.addr, ns)
	for _, policy := range []AddressPolicy{RoundRobin, PickFirst} {
		t.Run(policy.String(), func(t *testing.T) {
			c := newClient(t, []string{deadAddress(t), shared.addr}, ns, WithAddressPolicy(policy))
			if _, err := c.Add(context.Background(), []string{"multi:1"}); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 10; i++ {
				a, err := c.MayExist(context.Background(), "multi:1")
				if err != nil || !a.MayExist {
					t.Fatalf("lookup %d: %+v %v", i, a, err)
				}
			}
			s := c.Stats()
			// The dead address is tried once, then avoided for a second.
			if s.Retries != 1 {
				t.Errorf("stats %+v: want 1 retry", s)
			}
		})
	}
	t.Run("pick_first_uses_the_first", func(t *testing.T) {
		var methods methodCounter
		c := newClient(t, []string{shared.addr, deadAddress(t)}, ns, WithAddressPolicy(PickFirst), methods.option(),
			WithCoalesceWindow(0))
		for i := 0; i < 10; i++ {
			if _, err := c.MayExist(context.Background(), "multi:1"); err != nil {
				t.Fatal(err)
			}
		}
		if s := c.Stats(); s.Retries != 0 || s.GateCalls != 10 {
			t.Errorf("stats %+v: want every call answered by the first address", s)
		}
	})
}

func TestTokenIsSent(t *testing.T) {
	server := resyncServer(t)
	without := newClient(t, []string{server.addr}, "resync")
	_, err := without.MayExist(context.Background(), "k")
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("without a token: %v", err)
	}
	with := newClient(t, []string{server.addr}, "resync", WithToken(resyncToken))
	eventually(t, "the gate answers with the token", func() bool {
		a, err := with.MayExist(context.Background(), "k")
		return err == nil && !a.Warming
	})
}

func TestClosedClientCancels(t *testing.T) {
	c, err := NewGateClient([]string{shared.addr}, "closing")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	_, err = c.MayExist(context.Background(), "k")
	if status.Code(err) != codes.Canceled || !strings.Contains(err.Error(), ErrClosed.Error()) {
		t.Errorf("after Close: %v", err)
	}
	if _, err := NewGateClient(nil, "x"); err == nil {
		t.Error("no address accepted")
	}
}
