// Command example is a small service's read path over existence-gate, with an in-memory map standing in
// for the database. It runs a short self-check against the server (each step prints ok/FAIL) and exits 0
// when every step passed:
//
//	example -addr 127.0.0.1:50051 -namespace default
//
// Use a namespace nobody else writes to: the checks expect to be the only writer of the keys they use.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"reflect"
	"sync"
	"time"

	existencev1 "example.com/existence-gate/gen/existence/v1"
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

func (db *database) load(_ context.Context, key string) (string, SourceStatus, error) {
	db.mu.Lock()
	delay := db.delay
	db.mu.Unlock()
	time.Sleep(delay)
	db.mu.Lock()
	defer db.mu.Unlock()
	db.reads[key]++
	if db.deleted[key] {
		return "", Deleted, nil
	}
	if value, ok := db.rows[key]; ok {
		return value, Found, nil
	}
	return "", Missing, nil
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
	gate      existencev1.ExistenceGateClient
	namespace string
	db        *database
}

func (w *writer) create(ctx context.Context, key, value string) error {
	if _, err := w.gate.Add(ctx, &existencev1.AddRequest{Namespace: w.namespace, Keys: [][]byte{[]byte(key)}}); err != nil {
		return err
	}
	w.db.insert(key, value)
	return nil
}

// createFailed: the Add succeeded but the insert then failed, so the gate holds a key the source lacks.
func (w *writer) createFailed(ctx context.Context, key string) error {
	_, err := w.gate.Add(ctx, &existencev1.AddRequest{Namespace: w.namespace, Keys: [][]byte{[]byte(key)}})
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

func selfCheck(conn *grpc.ClientConn, namespace string) {
	ctx := context.Background()
	db := newDatabase()
	gate := existencev1.NewExistenceGateClient(conn)
	w := &writer{gate: gate, namespace: namespace, db: db}
	reader := NewGatedReader(conn, namespace, db.load, Options{})
	gateAnswer := func(key string) (existencev1.Answer, existencev1.Basis) {
		reply, err := gate.MayExist(ctx, &existencev1.MayExistRequest{Namespace: namespace, Key: []byte(key)})
		must(err)
		return reply.Answer, reply.Basis
	}
	// latestSeq is the namespace's latest seq, which every answer carries (never 0: seqs start at 1).
	latestSeq := func() uint64 {
		reply, err := gate.MayExist(ctx, &existencev1.MayExistRequest{Namespace: namespace, Key: []byte("user:0")})
		must(err)
		return reply.ObservedSeq
	}
	get := func(key string) (string, bool) {
		value, found, err := reader.Get(ctx, key)
		must(err)
		return value, found
	}
	absent := func(key string) bool { _, found := get(key); return !found }

	check("the invalidation subscription goes live", reader.Start(10*time.Second))
	defer reader.Close()

	must(w.create(ctx, "user:1", "Ada"))
	value, found := get("user:1")
	check("an added row is read from the source", found && value == "Ada", value)
	check("... with one source read", db.totalReads() == 1, db.totalReads())

	check("a key never added does not exist", absent("user:404"))
	check("... and the gate spared the source", db.totalReads() == 1, db.totalReads())
	check("... and the absence is cached locally", reader.IsCachedAbsent("user:404"))
	calls := reader.Stats.GateCalls.Load()
	check("a second read of it is a local hit", absent("user:404") && reader.Stats.GateCalls.Load() == calls)

	must(w.createFailed(ctx, "user:2"))
	check("a key the gate knows but the source lacks does not exist", absent("user:2"))
	check("... the source was read once", db.readsOf("user:2") == 1, db.readsOf("user:2"))
	check("... and the absence RECORDED at the gate", reader.Stats.AbsencesRecorded.Load() == 1)
	answer, basis := gateAnswer("user:2")
	check("... so the gate now answers it", answer == existencev1.Answer_ANSWER_ABSENT && basis == existencev1.Basis_BASIS_TOMBSTONE, answer, basis)
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

	check("user:404 is cached absent", reader.IsCachedAbsent("user:404"))
	must(w.create(ctx, "user:404", "Linus"))
	check("ADDED drops the cached absence", eventually(func() bool { return !reader.IsCachedAbsent("user:404") }))
	value, _ = get("user:404")
	check("... and the new row is read", value == "Linus", value)

	check("user:405 does not exist yet", absent("user:405") && reader.IsCachedAbsent("user:405"))
	subscriptions := reader.Stats.Subscriptions.Load()
	reader.Resubscribe()                       // as if the connection dropped
	must(w.create(ctx, "user:405", "Barbara")) // lands while the reader is reconnecting
	check("an Add made while reconnecting reaches the reader (resumed by after_seq)",
		eventually(func() bool { return !reader.IsCachedAbsent("user:405") }))
	check("... over a new subscription", eventually(func() bool { return reader.Stats.Subscriptions.Load() > subscriptions }))
	value, _ = get("user:405")
	check("... and the new row is read", value == "Barbara", value)

	db.remove("user:1")
	check("a deleted row does not exist", absent("user:1"))
	answer, basis = gateAnswer("user:1")
	check("... its absence RECORDED as DELETED", answer == existencev1.Answer_ANSWER_ABSENT && basis == existencev1.Basis_BASIS_TOMBSTONE, answer, basis)
	check("... and cached locally", reader.IsCachedAbsent("user:1"))

	// While the gate loads its state it answers MAY_EXIST + WARMING for every key and refuses writes; a row
	// found then is added with the first answer that is not WARMING. (This server is warm: the check feeds
	// the reader such an answer.)
	db.insert("user:legacy", "Edsger")
	answer, _ = gateAnswer("user:legacy")
	check("a row the gate does not know is ABSENT there", answer == existencev1.Answer_ANSWER_ABSENT, answer)
	// Such an answer carries the seq loaded so far; here, the latest.
	warming := &existencev1.MayExistResponse{Answer: existencev1.Answer_ANSWER_MAY_EXIST, Basis: existencev1.Basis_BASIS_WARMING,
		ObservedSeq: latestSeq()}
	value, found, err := reader.loadAndReport(ctx, "user:legacy", warming, 0, false)
	check("read while the gate warms: found", err == nil && found && value == "Edsger", value, err)
	answer, _ = gateAnswer("user:legacy")
	check("... and not added yet", answer == existencev1.Answer_ANSWER_ABSENT && reader.Stats.Adds.Load() == 0, answer)
	get("user:406") // the gate is ready: this answer is not WARMING
	answer, _ = gateAnswer("user:legacy")
	check("... added with the next answer", answer == existencev1.Answer_ANSWER_MAY_EXIST && reader.Stats.Adds.Load() == 1, answer)

	// RESYNC (events were missed, e.g. a long disconnection) clears every cached absence.
	check("some absences are cached", reader.IsCachedAbsent("user:2"))
	// A RESYNC carries the namespace's latest seq.
	reader.ApplyInvalidation(&existencev1.Invalidation{Namespace: namespace, Seq: latestSeq(),
		Cause: existencev1.InvalidationCause_INVALIDATION_CAUSE_RESYNC})
	check("RESYNC drops them all", !reader.IsCachedAbsent("user:2") && !reader.IsCachedAbsent("user:1"))

	s := &reader.Stats
	fmt.Printf("reader stats: local_hits=%d gate_calls=%d gate_absent=%d source_reads=%d absences_recorded=%d adds=%d invalidations=%d resyncs=%d subscriptions=%d\n",
		s.LocalHits.Load(), s.GateCalls.Load(), s.GateAbsent.Load(), s.SourceReads.Load(), s.AbsencesRecorded.Load(),
		s.Adds.Load(), s.Invalidations.Load(), s.Resyncs.Load(), s.Subscriptions.Load())
}

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "the gate's gRPC address")
	namespace := flag.String("namespace", "default", "a namespace only this check writes to")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("existence-gate reader: ")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	conn, err := grpc.DialContext(ctx, *addr, grpc.WithInsecure(), grpc.WithBlock())
	cancel()
	if err != nil {
		check("connects to "+*addr, false, err)
	} else {
		func() {
			defer func() {
				if r := recover(); r != nil {
					check("self-check ran to the end", false, r)
				}
			}()
			selfCheck(conn, *namespace)
		}()
		conn.Close()
	}
	fmt.Printf("example: %d passed, %d failed\n", passed, failed)
	if failed > 0 || passed == 0 {
		os.Exit(1)
	}
}
