package existencegate

import (
	"testing"
	"time"
)

// Where lookups read the CPU's ticks, an end converted to ticks is reached no later than the monotonic
// clock reaches the end itself (a later one would let a mirror answer past its sub-lease), and not much
// earlier either (the sub-lease would be wasted): within the allowances, about 0.1 % of what remained.
func TestTicksReachAnEndNoLaterThanTheMonotonicClock(t *testing.T) {
	clock := newMonotonicClock()
	ticks := newTickClock(clock)
	if ticks == nil {
		t.Skip("the monotonic clock is not the time-stamp counter here: lookups read the monotonic clock")
	}
	time.Sleep(20 * time.Millisecond) // something to calibrate over
	for _, remaining := range []time.Duration{time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond} {
		end := clock.now() + uint64(remaining)
		until := ticks.until(end)
		if until == 0 {
			t.Fatalf("an end %v ahead converted to no ticks", remaining)
		}
		allowance := uint64(unfencedSlack + anchorSpread + remaining/100)
		// Readings of the ticks between two of the clock close together (one around a preemption says
		// nothing), until the clock is surely past the end.
		for {
			before := clock.now()
			count := cpuTicks()
			after := clock.now()
			if after-before > uint64(anchorSpread) {
				continue
			}
			if before > end {
				if count < until {
					t.Fatalf("the clock passed an end %v ahead before the ticks did", remaining)
				}
				break
			}
			if after+allowance < end && count >= until {
				t.Fatalf("the ticks passed an end %v ahead %v early", remaining, time.Duration(end-after))
			}
		}
	}
	if ticks.until(clock.now()) != 0 {
		t.Fatal("an end already past converted to ticks")
	}
}
