package existencegate

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/existence-gate/existence-gate/clients/go/existencepb"
	"google.golang.org/grpc"
)

func waitLive[V any](t *testing.T, r *GatedReader[V]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := r.WaitLive(ctx); err != nil {
		t.Fatalf("the invalidation subscription did not go live: %v", err)
	}
}

func newReader(t *testing.T, c *GateClient, src *memorySource, opts ...ReaderOption) *GatedReader[string] {
	t.Helper()
	r := NewGatedReader(c, src.load, opts...)
	t.Cleanup(r.Close)
	return r
}

func getter(t *testing.T, r *GatedReader[string]) func(key string) (string, bool) {
	return func(key string) (string, bool) {
		t.Helper()
		value, found, err := r.Get(context.Background(), key)
		if err != nil {
			t.Fatalf("Get(%q): %v", key, err)
		}
		return value, found
	}
}

func mustAdd(t *testing.T, c *GateClient, keys ...string) uint64 {
	t.Helper()
	seq, err := c.Add(context.Background(), keys)
	if err != nil {
		t.Fatalf("Add(%v): %v", keys, err)
	}
	return seq
}

func TestReaderReadPath(t *testing.T) {
	u := uniq()
	ns := "reader"
	waitReady(t, shared.addr, ns)
	src := newMemorySource()
	writer := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(0))
	raw := rawStub(t, shared.addr)
	r := newReader(t, newClient(t, []string{shared.addr}, ns), src, WithCacheTTL(time.Minute))
	waitLive(t, r)
	get := getter(t, r)

	// A key never added: absent without a source read, then from the local cache without a gate call.
	if _, found := get(u + "reader:never"); found || src.readsOf(u+"reader:never") != 0 {
		t.Fatalf("a key never added: found %v, %d source reads", found, src.readsOf(u+"reader:never"))
	}
	if !r.CachedAbsent(u + "reader:never") {
		t.Fatal("the absence is not cached")
	}
	calls := r.Stats().GateCalls
	if _, found := get(u + "reader:never"); found {
		t.Fatal("found on the second read")
	}
	if s := r.Stats(); s.GateCalls != calls || s.CacheHits != 1 {
		t.Errorf("the second read: stats %+v, want a cache hit and no gate call", s)
	}

	// A found key: read from the source once.
	mustAdd(t, writer, u+"reader:1")
	src.set(u+"reader:1", "Ada")
	if value, found := get(u + "reader:1"); !found || value != "Ada" || src.readsOf(u+"reader:1") != 1 {
		t.Errorf("an added row: %q %v, %d source reads", value, found, src.readsOf(u+"reader:1"))
	}

	// Single flight: 8 concurrent reads of a slow key make one source read.
	mustAdd(t, writer, u+"reader:slow")
	src.set(u+"reader:slow", "Grace")
	src.setDelay(300 * time.Millisecond)
	values := make([]string, 8)
	var wg sync.WaitGroup
	for i := range values {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			values[i], _, _ = r.Get(context.Background(), u+"reader:slow")
		}(i)
	}
	wg.Wait()
	src.setDelay(0)
	if strings.Join(values, ",") != strings.Repeat("Grace,", 7)+"Grace" || src.readsOf(u+"reader:slow") != 1 {
		t.Errorf("8 concurrent reads: %v with %d source reads", values, src.readsOf(u+"reader:slow"))
	}

	// A key the gate knows but the source lacks: read once, RECORDED, then the gate answers it. Its Add's
	// invalidation must arrive before the absence is cached, or it would (rightly) drop it.
	invalidationsBeforeAdd := r.Stats().Invalidations
	mustAdd(t, writer, u+"reader:2")
	eventually(t, "the Add's invalidation arrives", func() bool { return r.Stats().Invalidations > invalidationsBeforeAdd })
	if _, found := get(u + "reader:2"); found {
		t.Fatal("a key the source lacks was found")
	}
	if s := r.Stats(); s.AbsencesRecorded != 1 || src.readsOf(u+"reader:2") != 1 {
		t.Errorf("stats %+v, %d source reads: want 1 absence recorded after 1 read", s, src.readsOf(u+"reader:2"))
	}
	if reply := rawAnswer(t, raw, ns, u+"reader:2"); reply.Answer != existencepb.Answer_ANSWER_ABSENT ||
		reply.Basis != existencepb.Basis_BASIS_TOMBSTONE {
		t.Errorf("the gate answers %v %v for the recorded absence", reply.Answer, reply.Basis)
	}
	get(u + "reader:2")
	if !r.CachedAbsent(u+"reader:2") || src.readsOf(u+"reader:2") != 1 {
		t.Errorf("the recorded absence is not a local hit (%d source reads)", src.readsOf(u+"reader:2"))
	}

	// A deleted row: recorded (as DELETED) and cached.
	mustAdd(t, writer, u+"reader:3")
	src.set(u+"reader:3", "Edsger")
	if _, found := get(u + "reader:3"); !found {
		t.Fatal(u + "reader:3 not found")
	}
	src.remove(u + "reader:3")
	if _, found := get(u + "reader:3"); found || !r.CachedAbsent(u+"reader:3") || r.Stats().AbsencesRecorded != 2 {
		t.Errorf("a deleted row: found %v, cached %v, stats %+v", found, r.CachedAbsent(u+"reader:3"), r.Stats())
	}

	// Another client's Add drops a cached absence (ADDED), and the new row is read.
	before := r.Stats().Invalidations
	mustAdd(t, writer, u+"reader:never")
	src.set(u+"reader:never", "Linus")
	eventually(t, "ADDED drops the cached absence", func() bool { return !r.CachedAbsent(u + "reader:never") })
	if value, found := get(u + "reader:never"); !found || value != "Linus" {
		t.Errorf("after the Add: %q %v", value, found)
	}
	if s := r.Stats(); s.Invalidations <= before || s.FailOpens != 0 || s.Resubscribes != 0 {
		t.Errorf("stats %+v", s)
	}
	t.Logf("reader stats: %+v", r.Stats())
}

func TestReaderWithoutSubscriptionCachesNothing(t *testing.T) {
	u := uniq()
	ns := "reader"
	waitReady(t, shared.addr, ns)
	src := newMemorySource()
	r := newReader(t, newClient(t, []string{shared.addr}, ns), src, WithSubscribe(false))
	if err := r.WaitLive(context.Background()); err != nil {
		t.Fatal(err)
	}
	get := getter(t, r)
	get(u + "reader:nosub")
	get(u + "reader:nosub")
	if s := r.Stats(); s.CacheHits != 0 || s.GateCalls != 2 || r.CachedAbsent(u+"reader:nosub") {
		t.Errorf("stats %+v: want 2 gate calls and no cache", s)
	}
}

func TestReaderWarmingAddsWithTheNextAnswer(t *testing.T) {
	u := uniq()
	ns := "warming"
	waitReady(t, shared.addr, ns)
	raw := rawStub(t, shared.addr)
	// The gate is warm; the next BatchMayExist answer is made to look like a warming gate's (every key
	// MAY_EXIST, warming), as the interceptor of a real warming gate's reply would see it.
	var warmNext atomic.Bool
	warming := grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply interface{},
		cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if batch, ok := reply.(*existencepb.BatchMayExistResponse); ok && err == nil && warmNext.CompareAndSwap(true, false) {
			batch.Warming = true
			for i := range batch.MayExistBitmap {
				batch.MayExistBitmap[i] = 0xff
			}
		}
		return err
	})
	src := newMemorySource()
	r := newReader(t, newClient(t, []string{shared.addr}, ns, WithDialOptions(warming)), src)
	waitLive(t, r)
	get := getter(t, r)

	src.set(u+"warming:legacy", "Edsger") // a row the gate does not know
	if reply := rawAnswer(t, raw, ns, u+"warming:legacy"); reply.Answer != existencepb.Answer_ANSWER_ABSENT {
		t.Fatalf("the gate answers %v", reply.Answer)
	}
	warmNext.Store(true)
	if value, found := get(u + "warming:legacy"); !found || value != "Edsger" {
		t.Fatalf("read while the gate warms: %q %v", value, found)
	}
	if reply := rawAnswer(t, raw, ns, u+"warming:legacy"); reply.Answer != existencepb.Answer_ANSWER_ABSENT {
		t.Errorf("added while the gate was warming (it refuses writes then): %v", reply.Answer)
	}
	get(u + "warming:other") // a warm answer
	if reply := rawAnswer(t, raw, ns, u+"warming:legacy"); reply.Answer != existencepb.Answer_ANSWER_MAY_EXIST {
		t.Errorf("not added with the next answer: %v", reply.Answer)
	}
}

func TestReaderFailsOpenWithTheGateDown(t *testing.T) {
	u := uniq()
	src := newMemorySource()
	src.set(u+"failopen:1", "Ada")
	r := newReader(t, newClient(t, []string{deadAddress(t)}, "failopen"), src)
	get := getter(t, r)
	for i := 0; i < 3; i++ {
		started := time.Now()
		if value, found := get(u + "failopen:1"); !found || value != "Ada" {
			t.Errorf("a row read with the gate down: %q %v", value, found)
		}
		if elapsed := time.Since(started); elapsed > 2*DefaultDeadline {
			t.Errorf("a read with the gate down took %v", elapsed)
		}
	}
	if _, found := get(u + "failopen:missing"); found {
		t.Error("a row the source lacks was found")
	}
	if s := r.Stats(); s.FailOpens != 4 || s.SourceReads != 4 || s.AbsencesRecorded != 0 || r.CachedAbsent(u+"failopen:missing") {
		t.Errorf("stats %+v: want 4 fail-opens and source reads, nothing recorded or cached", s)
	}
	// A caller that gives up gets its ctx's error, not a source read.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := r.Get(ctx, u+"failopen:1"); err == nil {
		t.Error("a cancelled Get succeeded")
	}
}

func TestReaderResumesAfterADroppedStream(t *testing.T) {
	u := uniq()
	ns := "resume"
	waitReady(t, shared.addr, ns)
	p := startProxy(t, shared.addr)
	src := newMemorySource()
	writer := newClient(t, []string{shared.addr}, ns, WithCoalesceWindow(0))
	r := newReader(t, newClient(t, []string{p.addr()}, ns), src, WithCacheTTL(time.Minute))
	waitLive(t, r)
	get := getter(t, r)

	// An event applied first, so the reader resumes after its seq (not "from now on").
	mustAdd(t, writer, u+"resume:first")
	eventually(t, "the first invalidation arrives", func() bool { return r.Stats().Invalidations >= 1 })
	get(u + "resume:gap")
	get(u + "resume:stay")
	if !r.CachedAbsent(u+"resume:gap") || !r.CachedAbsent(u+"resume:stay") {
		t.Fatal("absences not cached")
	}
	before := r.Stats()

	p.cut(true) // the connection drops, and reconnecting fails for now
	mustAdd(t, writer, u+"resume:gap")
	src.set(u+"resume:gap", "Barbara")
	if !r.CachedAbsent(u + "resume:gap") {
		t.Fatal("the Add reached a reader that is cut off")
	}
	p.resume()
	eventually(t, "the Add made while disconnected reaches the reader", func() bool { return !r.CachedAbsent(u + "resume:gap") })
	after := r.Stats()
	if after.Resubscribes <= before.Resubscribes {
		t.Errorf("no resubscription counted: %+v", after)
	}
	if !r.CachedAbsent(u+"resume:stay") || after.Invalidations != before.Invalidations+1 {
		t.Errorf("resumed with a RESYNC instead of after_seq (stay cached %v, invalidations %d -> %d)",
			r.CachedAbsent(u+"resume:stay"), before.Invalidations, after.Invalidations)
	}
	if value, found := get(u + "resume:gap"); !found || value != "Barbara" {
		t.Errorf("the new row: %q %v", value, found)
	}
}

func TestReaderResyncClearsTheCache(t *testing.T) {
	u := uniq()
	server := resyncServer(t)
	ns := "resync"
	writer := newClient(t, []string{server.addr}, ns, WithCoalesceWindow(0), WithToken(resyncToken))
	eventually(t, "the gate is ready", func() bool {
		a, err := writer.MayExist(context.Background(), "ready?")
		return err == nil && !a.Warming
	})
	p := startProxy(t, server.addr)
	src := newMemorySource()
	r := newReader(t, newClient(t, []string{p.addr()}, ns, WithToken(resyncToken)), src, WithCacheTTL(time.Minute))
	waitLive(t, r)
	get := getter(t, r)
	mustAdd(t, writer, u+"resync:first")
	eventually(t, "the first invalidation arrives", func() bool { return r.Stats().Invalidations >= 1 })
	get(u + "resync:absent")
	if !r.CachedAbsent(u + "resync:absent") {
		t.Fatal("absence not cached")
	}
	before := r.Stats()

	p.cut(true)
	// More Adds than the gate's 4 KiB replay buffer keeps: the reader cannot resume exactly.
	for i := 0; i < 10; i++ {
		keys := make([]string, 20)
		for k := range keys {
			keys[k] = fmt.Sprintf(u+"resync:filler:%d:%d:%s", i, k, strings.Repeat("x", 32))
		}
		mustAdd(t, writer, keys...)
	}
	p.resume()
	eventually(t, "RESYNC drops every cached absence", func() bool { return !r.CachedAbsent(u + "resync:absent") })
	after := r.Stats()
	if after.Resubscribes <= before.Resubscribes || after.Invalidations != before.Invalidations+1 {
		t.Errorf("stats %+v -> %+v: want a resubscription and one RESYNC", before, after)
	}
	// The stream goes on after the RESYNC.
	get(u + "resync:later")
	mustAdd(t, writer, u+"resync:later")
	eventually(t, "ADDED after the RESYNC", func() bool { return !r.CachedAbsent(u + "resync:later") })
}
