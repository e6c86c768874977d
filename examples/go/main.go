// Command example is a small service's read path over existence-gate, using the Go client library
// (clients/go: GateClient and GatedReader), with an in-memory map standing in for the database. It runs a
// short self-check against the server (each step prints ok/FAIL) and exits 0 when every step passed:
//
//	example -addr 127.0.0.1:50051 -namespace default
//
// Use a namespace nobody else writes to: the checks expect to be the only writer of the keys they use.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	existencegate "github.com/existence-gate/existence-gate/clients/go"
	"github.com/existence-gate/existence-gate/clients/go/existencepb"
	"google.golang.org/grpc"
)

// database is the source of truth: rows by key; a deleted row is kept as a marker (a soft delete).
type database struct {
	mu      sync.Mutex
	rows    map[string]string
	deleted map[string]bool
	reads   map[string]int
	delay   time.Duration // how long each read takes
}

func newDatabase() *database {
	return &database{rows: map[string]string{}, deleted: map[string]bool{}, reads: map[string]int{}}
}

// load is the reader's source.
func (db *database) load(_ context.Context, key string) (string, existencegate.SourceStatus, error) {
	db.mu.Lock()
	delay := db.delay
	db.mu.Unlock()
	time.Sleep(delay)
	db.mu.Lock()
	defer db.mu.Unlock()
	db.reads[key]++
	if db.deleted[key] {
		return "", existencegate.Deleted, nil
	}
	if value, ok := db.rows[key]; ok {
		return value, existencegate.Found, nil
	}
	return "", existencegate.Missing, nil
}

func (db *database) insert(key, value string) {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.rows[key] = value
	delete(db.deleted, key)
}

func (db *database) remove(key string) {
	db.mu.Lock()
	defer db.mu.Unlock()
	delete(db.rows, key)
	db.deleted[key] = true
}

func (db *database) readsOf(key string) int {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.reads[key]
}

func (db *database) totalReads() int {
	db.mu.Lock()
	defer db.mu.Unlock()
	total := 0
	for _, n := range db.reads {
		total += n
	}
	return total
}

func (db *database) setDelay(d time.Duration) {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.delay = d
}

// writer is the write path: Add the key to the gate before the insert becomes visible in the source.
type writer struct {
	reader *existencegate.GatedReader[string]
	db     *database
}

func (w *writer) create(ctx context.Context, key, value string) error {
	if _, err := w.reader.Add(ctx, []string{key}); err != nil {
		return err // a writer that cannot Add must not insert
	}
	w.db.insert(key, value)
	return nil
}

// createFailed: the Add succeeded but the insert then failed, so the gate holds a key the source lacks.
func (w *writer) createFailed(ctx context.Context, key string) error {
	_, err := w.reader.Add(ctx, []string{key})
	return err
}

var passed, failed int

func check(name string, ok bool, detail ...interface{}) {
	if ok {
		passed++
		fmt.Printf("ok   %s\n", name)
	} else {
		failed++
		fmt.Printf("FAIL %s %s\n", name, fmt.Sprint(detail...))
	}
}

func eventually(condition func() bool) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if condition() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return condition()
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// warmNext makes the next BatchMayExist answer look like a warming gate's (every key MAY_EXIST, warming):
// this server is warm, so the check feeds the reader such an answer through a client interceptor.
var warmNext atomic.Bool

func warmingInterceptor(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if batch, ok := reply.(*existencepb.BatchMayExistResponse); ok && err == nil && warmNext.CompareAndSwap(true, false) {
		batch.Warming = true
		for i := range batch.MayExistBitmap {
			batch.MayExistBitmap[i] = 0xff
		}
	}
	return err
}

func selfCheck(addr, namespace string) {
	ctx := context.Background()
	db := newDatabase()
	client, err := existencegate.NewGateClient([]string{addr}, namespace,
		existencegate.WithDialOptions(grpc.WithUnaryInterceptor(warmingInterceptor)))
	must(err)
	defer client.Close()
	reader := existencegate.NewGatedReader(client, db.load)
	defer reader.Close()
	w := &writer{reader: reader, db: db}

	// The gate's own answers (with their basis), asked directly to check what the reader did.
	conn, err := grpc.Dial(addr, grpc.WithInsecure())
	must(err)
	defer conn.Close()
	gate := existencepb.NewExistenceGateClient(conn)
	gateAnswer := func(key string) (existencepb.Answer, existencepb.Basis) {
		reply, err := gate.MayExist(ctx, &existencepb.MayExistRequest{Namespace: namespace, Key: []byte(key)})
		must(err)
		return reply.Answer, reply.Basis
	}
	// latestSeq is the namespace's latest seq, which every answer carries (never 0: seqs start at 1).
	latestSeq := func() uint64 {
		reply, err := gate.MayExist(ctx, &existencepb.MayExistRequest{Namespace: namespace, Key: []byte("user:0")})
		must(err)
		return reply.ObservedSeq
	}
	get := func(key string) (string, bool) {
		value, found, err := reader.Get(ctx, key)
		must(err)
		return value, found
	}
	absent := func(key string) bool { _, found := get(key); return !found }

	liveCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	check("the invalidation subscription goes live", reader.WaitLive(liveCtx) == nil)
	cancel()

	must(w.create(ctx, "user:1", "Ada"))
	value, found := get("user:1")
	check("an added row is read from the source", found && value == "Ada", value)
	check("... with one source read", db.totalReads() == 1, db.totalReads())

	check("a key never added does not exist", absent("user:404"))
	check("... and the gate spared the source", db.totalReads() == 1, db.totalReads())
	check("... and the absence is cached locally", reader.CachedAbsent("user:404"))
	calls := reader.Stats().GateCalls
	check("a second read of it is a local hit", absent("user:404") && reader.Stats().GateCalls == calls)

	must(w.createFailed(ctx, "user:2"))
	check("a key the gate knows but the source lacks does not exist", absent("user:2"))
	check("... the source was read once", db.readsOf("user:2") == 1, db.readsOf("user:2"))
	check("... and the absence RECORDED at the gate", reader.Stats().AbsencesRecorded == 1)
	answer, basis := gateAnswer("user:2")
	check("... so the gate now answers it", answer == existencepb.Answer_ANSWER_ABSENT && basis == existencepb.Basis_BASIS_TOMBSTONE, answer, basis)
	absent("user:2")
	check("... and the next read is a local hit", db.readsOf("user:2") == 1, db.readsOf("user:2"))

	must(w.create(ctx, "user:3", "Grace"))
	db.setDelay(300 * time.Millisecond)
	results := make([]string, 8)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			results[i], _ = get("user:3")
		}(i)
	}
	wg.Wait()
	db.setDelay(0)
	want := []string{"Grace", "Grace", "Grace", "Grace", "Grace", "Grace", "Grace", "Grace"}
	check("8 concurrent reads of one key all get the row", reflect.DeepEqual(results, want), results)
	check("... through a single source read", db.readsOf("user:3") == 1, db.readsOf("user:3"))

	check("user:404 is cached absent", reader.CachedAbsent("user:404"))
	must(w.create(ctx, "user:404", "Linus"))
	check("ADDED drops the cached absence", eventually(func() bool { return !reader.CachedAbsent("user:404") }))
	value, _ = get("user:404")
	check("... and the new row is read", value == "Linus", value)

	check("user:405 does not exist yet", absent("user:405") && reader.CachedAbsent("user:405"))
	resubscribes := reader.Stats().Resubscribes
	reader.Resubscribe()                       // as if the connection dropped
	must(w.create(ctx, "user:405", "Barbara")) // lands while the reader is reconnecting
	check("an Add made while reconnecting reaches the reader (resumed by after_seq)",
		eventually(func() bool { return !reader.CachedAbsent("user:405") }))
	check("... over a new subscription", eventually(func() bool { return reader.Stats().Resubscribes > resubscribes }))
	value, _ = get("user:405")
	check("... and the new row is read", value == "Barbara", value)

	db.remove("user:1")
	check("a deleted row does not exist", absent("user:1"))
	answer, basis = gateAnswer("user:1")
	check("... its absence RECORDED as DELETED", answer == existencepb.Answer_ANSWER_ABSENT && basis == existencepb.Basis_BASIS_TOMBSTONE, answer, basis)
	check("... and cached locally", reader.CachedAbsent("user:1"))

	// While the gate loads its state it answers MAY_EXIST + WARMING for every key and refuses writes; a row
	// found then is added with the first answer that is not WARMING.
	db.insert("user:legacy", "Edsger")
	answer, _ = gateAnswer("user:legacy")
	check("a row the gate does not know is ABSENT there", answer == existencepb.Answer_ANSWER_ABSENT, answer)
	warmNext.Store(true)
	value, found = get("user:legacy")
	check("read while the gate warms: found", found && value == "Edsger", value)
	answer, _ = gateAnswer("user:legacy")
	check("... and not added yet", answer == existencepb.Answer_ANSWER_ABSENT, answer)
	get("user:406") // this answer is not WARMING
	answer, _ = gateAnswer("user:legacy")
	check("... added with the next answer", answer == existencepb.Answer_ANSWER_MAY_EXIST, answer)

	// RESYNC (events were missed, e.g. a long disconnection) clears every cached absence.
	// user:1's absence is cached as DELETED (10 minutes here); user:2's MISSING one may have expired by now
	// (1 s in the interop configuration).
	check("some absences are cached", reader.CachedAbsent("user:1"))
	// A RESYNC carries the namespace's latest seq.
	reader.ApplyInvalidation(&existencepb.Invalidation{Namespace: namespace, Seq: latestSeq(),
		Cause: existencepb.InvalidationCause_INVALIDATION_CAUSE_RESYNC})
	check("RESYNC drops them all", !reader.CachedAbsent("user:2") && !reader.CachedAbsent("user:1"))

	s := reader.Stats()
	fmt.Printf("reader stats: lookups=%d gate_calls=%d batched_keys=%d retries=%d cache_hits=%d fail_opens=%d source_reads=%d absences_recorded=%d invalidations=%d resubscribes=%d\n",
		s.Lookups, s.GateCalls, s.BatchedKeys, s.Retries, s.CacheHits, s.FailOpens, s.SourceReads,
		s.AbsencesRecorded, s.Invalidations, s.Resubscribes)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "the gate's gRPC address")
	namespace := flag.String("namespace", "default", "a namespace only this check writes to")
	flag.Parse()

	func() {
		defer func() {
			if r := recover(); r != nil {
				check("self-check ran to the end", false, r)
			}
		}()
		selfCheck(*addr, *namespace)
	}()
	fmt.Printf("example: %d passed, %d failed\n", passed, failed)
	if failed > 0 || passed == 0 {
		os.Exit(1)
	}
}
