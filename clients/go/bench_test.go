package existencegate

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// cpuSeconds is this process's user + system CPU time so far.
func cpuSeconds(b *testing.B) float64 {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		b.Fatal(err)
	}
	seconds := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return seconds(usage.Utime) + seconds(usage.Stime)
}

// BenchmarkCoalescedLookups64 is the client's side of coalescing: 64 goroutines, each with one MayExist in
// flight, against the shared gate (a separate process); it reports this process's CPU per lookup beside the
// lookups per second, as `cargo bench --bench load -- callers` does for the Rust client. Run with
// `go test -run '^$' -bench Coalesced -benchtime 200000x` (see README "Client libraries").
func BenchmarkCoalescedLookups64(b *testing.B) {
	const callers = 64
	c, err := NewGateClient([]string{shared.addr}, "coalesce")
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	keys := make([]string, 1<<12)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench-%d", i)
	}
	var next atomic.Int64
	var failed atomic.Int64
	run := func(n int64) {
		next.Store(0)
		var wg sync.WaitGroup
		for g := 0; g < callers; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1)
					if i > n {
						return
					}
					if _, err := c.MayExist(context.Background(), keys[i%int64(len(keys))]); err != nil {
						failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
	}
	run(10_000) // connections and batches warm
	before := c.Stats()
	b.ResetTimer()
	cpu := cpuSeconds(b)
	started := time.Now()
	run(int64(b.N))
	elapsed := time.Since(started)
	used := cpuSeconds(b) - cpu
	b.StopTimer()
	if failed.Load() > 0 {
		b.Fatalf("%d lookups failed", failed.Load())
	}
	after := c.Stats()
	b.ReportMetric(used/float64(b.N)*1e6, "client-cpu-µs/lookup")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "lookups/s")
	b.ReportMetric(float64(after.BatchedKeys-before.BatchedKeys)/float64(after.GateCalls-before.GateCalls), "keys/rpc")
}
