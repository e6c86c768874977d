// The Go side of the load-balancer tests (tests/suite/balancer.rs): a steady load through the library, with
// its default settings, against the addresses given — HAProxy's front, or the replicas themselves, balanced by
// the library — while the test restarts, kills, pauses or cuts off replicas. load.sh builds and runs it.
//
//	load DIR ADDRESS[,ADDRESS...]
//
// Four callers, each in a loop: Add of a new key, MayExist of it (ABSENT there is a false ABSENT), MayExist
// of a key nobody adds. DIR/started appears once every caller has had 20 Adds acknowledged (a steady load:
// a channel's first calls may miss the default deadline while it connects); the callers stop once DIR/stop
// appears; then DIR/report holds "calls=N failed=N false_absent=N", then a line per failed call
// or false ABSENT: "UNIX_MS what".
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	existencegate "github.com/existence-gate/existence-gate/clients/go"
)

const (
	callers = 4
	// warm is how many Adds each caller has acknowledged before the load counts as started.
	warm = 20
)

type seen struct {
	calls, failed, falseAbsent atomic.Int64
	mu                         sync.Mutex
	lines                      []string
}

func (s *seen) note(what string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, fmt.Sprintf("%d %s", time.Now().UnixMilli(), fmt.Sprintf(what, args...)))
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: load DIR ADDRESS[,ADDRESS...]")
		os.Exit(2)
	}
	dir, addresses := os.Args[1], strings.Split(os.Args[2], ",")
	client, err := existencegate.NewGateClient(addresses, "users")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer client.Close()
	stopped := func() bool {
		_, err := os.Stat(filepath.Join(dir, "stop"))
		return err == nil
	}
	var s seen
	var started sync.WaitGroup
	var done sync.WaitGroup
	started.Add(callers)
	for c := 0; c < callers; c++ {
		done.Add(1)
		go func(c int) {
			defer done.Done()
			acked := 0
			for i := 0; !stopped(); i++ {
				key := fmt.Sprintf("go-%d-%d", c, i)
				s.calls.Add(1)
				if _, err := client.Add(context.Background(), []string{key}); err != nil {
					s.failed.Add(1)
					s.note("Add %s: %v", key, err)
					continue
				}
				acked++
				if acked == warm {
					started.Done()
				}
				for _, k := range []string{key, "go-none-" + key} {
					s.calls.Add(1)
					answer, err := client.MayExist(context.Background(), k)
					switch {
					case err != nil:
						s.failed.Add(1)
						s.note("MayExist %s: %v", k, err)
					case k == key && !answer.MayExist:
						s.falseAbsent.Add(1)
						s.note("false ABSENT for %s, acknowledged", k)
					}
				}
			}
			if acked < warm {
				started.Done()
			}
		}(c)
	}
	started.Wait()
	if err := os.WriteFile(filepath.Join(dir, "started"), nil, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	done.Wait()
	report := fmt.Sprintf("calls=%d failed=%d false_absent=%d\n", s.calls.Load(), s.failed.Load(), s.falseAbsent.Load())
	for _, line := range s.lines {
		report += line + "\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "report"), []byte(report), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
