package existencegate

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// benchKeys is how many keys the mirror benchmarks' namespace holds.
const benchKeys = 10_000_000

// benchGate is a gate whose namespace "bench" holds benchKeys keys, made once for every benchmark that
// needs it.
var (
	benchGate     *gateServer
	benchGateErr  error
	benchGateOnce sync.Once
)

func loadedGate(b *testing.B) *gateServer {
	b.Helper()
	benchGateOnce.Do(func() {
		config := "[mirrors]\nmax_per_namespace = 64\nsublease = \"1s\"\n\n" +
			fmt.Sprintf("[namespaces.bench]\nexpected_keys = %d\n", benchKeys)
		if benchGate, benchGateErr = startGate(config); benchGateErr != nil {
			return
		}
		benchGateErr = addBenchKeys(benchGate.addr)
	})
	if benchGateErr != nil {
		b.Fatal(benchGateErr)
	}
	return benchGate
}

// addBenchKeys adds "key-0" to "key-<benchKeys-1>" in Adds of MaxBatchKeys keys.
func addBenchKeys(addr string) error {
	c, err := NewGateClient([]string{addr}, "bench", WithDeadline(time.Minute))
	if err != nil {
		return err
	}
	defer c.Close()
	started := time.Now()
	for first := 0; first < benchKeys; first += MaxBatchKeys {
		keys := make([]string, MaxBatchKeys)
		for i := range keys {
			keys[i] = fmt.Sprintf("key-%d", first+i)
		}
		if _, err := c.Add(context.Background(), keys); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "added %d keys in %v\n", benchKeys, time.Since(started).Round(time.Millisecond))
	return nil
}

// absentKeys are keys never added (about 1% of them pass the filter, as any key does).
func absentKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("absent-%d", i)
	}
	return keys
}

// BenchmarkMirror10M is a mirror of a namespace of 10M keys beside the same library's calls to the gate,
// on the same keys (never added): a local lookup, the sub-lease check included, single-threaded and on
// every core; the coalesced MayExist of 64 goroutines; and the time a mirror takes to attach (download
// the filter and hold its first sub-lease) with the memory it then holds. Run with bench.sh:
// BENCH=Mirror10M BENCH_TIME=3s.
func BenchmarkMirror10M(b *testing.B) {
	gate := loadedGate(b)
	c, err := NewGateClient([]string{gate.addr}, "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	keys := absentKeys(1 << 20)
	m, err := c.Mirror(MirrorOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	b.Run("AbsentLocally", func(b *testing.B) { benchLocal(b, m, keys, 1) })
	b.Run("AbsentLocallyAllCores", func(b *testing.B) { benchLocal(b, m, keys, runtime.GOMAXPROCS(0)) })
	b.Run("AbsentLocallyMany64", func(b *testing.B) { benchLocalMany(b, m, keys, 64) })
	b.Run("MirrorMayExistLocal", func(b *testing.B) { benchMirrorMayExist(b, m, locallyAbsent(m, keys)) })
	b.Run("GateMayExistCoalesced64", func(b *testing.B) { benchGateMayExist(b, c, gate, keys, 64) })
	b.Run("Attach", func(b *testing.B) { benchAttach(b, c) })
}

// benchLocal looks keys up in the mirror from goroutines goroutines, and reports the share answered
// locally (below 0.98 the sub-lease lapsed during the run, and the figure is not the lookup's).
func benchLocal(b *testing.B, m *Mirror, keys []string, goroutines int) {
	var local atomic.Int64
	var next atomic.Int64
	mask := int64(len(keys) - 1)
	var wg sync.WaitGroup
	b.ResetTimer()
	started := time.Now()
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			found := int64(0)
			for i := next.Add(1024) - 1024; i < int64(b.N); i = next.Add(1024) - 1024 {
				end := i + 1024
				if end > int64(b.N) {
					end = int64(b.N)
				}
				for ; i < end; i++ {
					if m.AbsentLocally(keys[i&mask]) {
						found++
					}
				}
			}
			local.Add(found)
		}()
	}
	wg.Wait()
	elapsed := time.Since(started)
	b.StopTimer()
	b.ReportMetric(float64(local.Load())/float64(b.N), "local-share")
	b.ReportMetric(float64(b.N)/elapsed.Seconds()/float64(goroutines), "lookups/s/goroutine")
}

// benchLocalMany looks keys up in the mirror batch at a time with AbsentLocallyMany; ns/op is per key.
func benchLocalMany(b *testing.B, m *Mirror, keys []string, batch int) {
	local := 0
	mask := len(keys) - 1
	b.ResetTimer()
	for i := 0; i < b.N; i += batch {
		start := i & mask
		for _, absent := range m.AbsentLocallyMany(keys[start : start+batch]) {
			if absent {
				local++
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(local)/float64((b.N+batch-1)/batch*batch), "local-share")
}

// locallyAbsent is the keys the mirror answers ABSENT for (the filter's false positives left out), a
// power of two of them.
func locallyAbsent(m *Mirror, keys []string) []string {
	absent := make([]string, 0, len(keys))
	for _, key := range keys {
		if m.AbsentLocally(key) {
			absent = append(absent, key)
		}
	}
	n := 1
	for n*2 <= len(absent) {
		n *= 2
	}
	return absent[:n]
}

// benchMirrorMayExist is Mirror.MayExist on one goroutine, for keys it answers locally: the local
// ABSENT through the library's lookup call (its Answer and counters included).
func benchMirrorMayExist(b *testing.B, m *Mirror, keys []string) {
	before := m.client.Stats()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := m.MayExist(context.Background(), keys[i&(len(keys)-1)]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	after := m.client.Stats()
	b.ReportMetric(float64(after.MirrorAnswers-before.MirrorAnswers)/float64(b.N), "local-share")
}

// benchGateMayExist is the library's call path: the client's coalesced MayExist from goroutines
// goroutines, with this process's CPU and the gate's per lookup.
func benchGateMayExist(b *testing.B, c *GateClient, gate *gateServer, keys []string, goroutines int) {
	var next atomic.Int64
	var failed atomic.Int64
	mask := int64(len(keys) - 1)
	var wg sync.WaitGroup
	b.ResetTimer()
	cpu, gateCPU := cpuSeconds(b), processCPUSeconds(b, gate.cmd.Process.Pid)
	started := time.Now()
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(b.N); i = next.Add(1) - 1 {
				if _, err := c.MayExist(context.Background(), keys[i&mask]); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(started)
	used, gateUsed := cpuSeconds(b)-cpu, processCPUSeconds(b, gate.cmd.Process.Pid)-gateCPU
	b.StopTimer()
	if failed.Load() > 0 {
		b.Fatalf("%d lookups failed", failed.Load())
	}
	b.ReportMetric(used/float64(b.N)*1e9, "client-cpu-ns/lookup")
	b.ReportMetric(gateUsed/float64(b.N)*1e9, "gate-cpu-ns/lookup")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "lookups/s")
}

// processCPUSeconds is another process's user + system CPU time so far (/proc/<pid>/stat, in clock ticks
// of 1/100 s).
func processCPUSeconds(b *testing.B, pid int) float64 {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command (which may hold spaces) start after its closing parenthesis.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	user, err1 := strconv.ParseUint(fields[11], 10, 64)
	system, err2 := strconv.ParseUint(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("unreadable /proc/%d/stat: %q", pid, stat)
	}
	return float64(user+system) / 100
}

// benchAttach makes a mirror and waits until it holds a sub-lease (the filter downloaded), reporting the
// filter's bytes and what the Go heap grew by.
func benchAttach(b *testing.B, c *GateClient) {
	var heap uint64
	var filterBytes uint64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		b.StartTimer()
		m, err := c.Mirror(MirrorOptions{})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = m.WaitReady(ctx)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap = after.HeapAlloc - before.HeapAlloc
		filterBytes = m.copy.Load().filter.bytes()
		m.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(filterBytes), "filter-bytes")
	b.ReportMetric(float64(heap), "heap-bytes")
}
