package existencegate

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

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

	coalescing := newClient(t, []string{shared.addr}, ns) // the defaults: 200 µs, 256 keys
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
	// A window far longer than the test: only full batches can answer quickly.
	c := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(time.Minute), WithCoalesceMaxKeys(8),
		WithDeadline(10*time.Second))
	var keys []string
	for i := 0; i < 64; i++ {
		keys = append(keys, fmt.Sprintf("max-keys:%d", i))
	}
	started := time.Now()
	_, errs := lookupAll(c, keys)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if elapsed := time.Since(started); elapsed > 20*time.Second {
		t.Errorf("full batches waited for the window: %v", elapsed)
	}
	if s := c.Stats(); s.GateCalls != 8 || s.BatchedKeys != 64 {
		t.Errorf("stats %+v: want 8 batches of 8 keys", s)
	}
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
	window := time.Second
	c := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(window), WithDeadline(10*time.Second))
	if _, err := c.Add(context.Background(), []string{"cancel:added"}); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		answer  Answer
		err     error
		elapsed time.Duration
	}
	var wg sync.WaitGroup
	run := func(ctx context.Context, key string, out *outcome) {
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
		run(context.Background(), key, &others[i])
	}
	shortCtx, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	run(shortCtx, "cancel:timed-out", &timedOut)
	cancelCtx, cancel := context.WithCancel(context.Background())
	run(cancelCtx, "cancel:cancelled", &cancelled)
	time.Sleep(50 * time.Millisecond) // let the callers join the batch (the window is far longer)
	cancel()
	wg.Wait()

	if status.Code(timedOut.err) != codes.DeadlineExceeded || timedOut.elapsed >= window {
		t.Errorf("the caller whose deadline passed: %v after %v (want DEADLINE_EXCEEDED before the window ends)",
			timedOut.err, timedOut.elapsed)
	}
	if status.Code(cancelled.err) != codes.Canceled || cancelled.elapsed >= window {
		t.Errorf("the cancelled caller: %v after %v (want CANCELED at once)", cancelled.err, cancelled.elapsed)
	}
	for i, o := range others {
		if o.err != nil || o.answer.MayExist != (i%2 == 0) {
			t.Errorf("caller %d of the same batch: %+v, %v", i, o.answer, o.err)
		}
	}
	if s := c.Stats(); s.GateCalls != 1 || s.BatchedKeys != 6 {
		t.Errorf("stats %+v: want the 6 callers in one batch", s)
	}
}

func TestAFailedBatchFailsEveryCallerWithItsStatus(t *testing.T) {
	waitReady(t, shared.addr, "cancel")
	c := newClient(t, []string{shared.addr}, "no_such_namespace", WithCoalesceWindow(50*time.Millisecond),
		WithDeadline(10*time.Second))
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	_, errs := lookupAll(c, keys)
	first := status.Convert(errs[0])
	for i, err := range errs {
		st := status.Convert(err)
		if st.Code() != codes.NotFound || st.Message() != first.Message() {
			t.Errorf("caller %d: %v (want NOT_FOUND, as every caller: %v)", i, err, errs[0])
		}
	}
	if s := c.Stats(); s.GateCalls != 1 {
		t.Errorf("stats %+v: want one batch", s)
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
