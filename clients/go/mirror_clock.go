package existencegate

import (
	"math/bits"
	"time"
)

// monotonicClock is this process's monotonic clock in nanoseconds since the mirror was made: the Go
// runtime's (CLOCK_MONOTONIC, read through the vDSO, to the nanosecond), so a reading is never early and
// the sub-lease needs no margin of its own for it. The wall clock must not be used: a step back would let
// the mirror hold past its end.
type monotonicClock struct{ zero time.Time }

func newMonotonicClock() monotonicClock { return monotonicClock{zero: time.Now()} }

// now is never 0, which stands for "no end".
func (c monotonicClock) now() uint64 { return uint64(time.Since(c.zero)) + 1 }

// tickClock answers "is it before this end?" by the CPU's time-stamp counter, where the monotonic clock is
// that counter (ticksAreTheClock). Why: reading the monotonic clock through the vDSO fences the CPU
// (rdtscp/lfence) so that a loop of lookups takes their cache misses one after another — 181–191 ns per
// lookup at 10M keys against 71–82 ns for the probe alone (benches/results/mirror-go.md) — while a bare
// RDTSC costs a few nanoseconds and no fence.
//
// Safe because every end is converted to ticks never later than it falls: an end on the monotonic clock is
// counted from an anchor (a tick count read between two clock readings at most anchorSpread apart) at a
// rate of ticks per nanosecond that is a lower bound — measured against the clock since the mirror was
// made, with the anchors' spreads counted against it, then lowered by slewAllowance for the adjustment NTP
// may make to the monotonic clock's rate — and earlier by unfencedSlack, which covers an unfenced RDTSC
// executing before the instructions ahead of it.
type tickClock struct {
	clock monotonicClock
	// The calibration's start: the ticks read when the clock read at least zeroNs.
	zeroTicks, zeroNs uint64
}

const (
	// anchorSpread bounds how far apart the two clock readings around an anchor's tick count may be.
	anchorSpread = 2 * time.Microsecond
	// unfencedSlack is taken off every end converted to ticks: how much earlier than its place in the
	// program an unfenced RDTSC may run (the loads it overtakes, a few hundred nanoseconds at worst).
	unfencedSlack = 10 * time.Microsecond
	// slewAllowance is the share the ticks' rate is lowered by: NTP slews the monotonic clock by at most
	// 500 ppm either way, so its rate now and during the calibration differ by at most 1,000 ppm.
	slewAllowance = 1000
)

// newTickClock is a tick clock for clock, or nil where ticks are not the monotonic clock (or no anchor
// could be read): lookups then read clock.
func newTickClock(clock monotonicClock) *tickClock {
	if !ticksAreTheClock() {
		return nil
	}
	low, ticks, _, ok := anchor(clock)
	if !ok {
		return nil
	}
	return &tickClock{clock: clock, zeroTicks: ticks, zeroNs: low}
}

// anchor reads the ticks between two readings of clock: their count at a moment within [low, high].
func anchor(clock monotonicClock) (low, ticks, high uint64, ok bool) {
	for attempt := 0; attempt < 16; attempt++ {
		low = clock.now()
		ticks = cpuTicks()
		high = clock.now()
		if high-low <= uint64(anchorSpread) {
			return low, ticks, high, true
		}
	}
	return 0, 0, 0, false
}

// until is end (on clock) in ticks, never later than end; 0 when end is past or no anchor could be read.
func (c *tickClock) until(end uint64) uint64 {
	if end == 0 {
		return 0
	}
	_, ticks, high, ok := anchor(c.clock)
	if !ok || ticks <= c.zeroTicks || end <= high+uint64(unfencedSlack) {
		return 0
	}
	// The ticks' time lies within [low, high]; the calibration's start, after zeroNs: so at most high −
	// zeroNs passed between the two tick counts, and the rate is at least their difference over that.
	ticksSince, nsSince := ticks-c.zeroTicks, high-c.zeroNs
	remaining := end - high - uint64(unfencedSlack)
	hi, lo := bits.Mul64(remaining, ticksSince)
	if hi >= nsSince {
		return 0
	}
	count, _ := bits.Div64(hi, lo, nsSince)
	return ticks + count - count/slewAllowance
}
