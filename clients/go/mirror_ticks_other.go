//go:build !(linux && amd64)

package existencegate

// Without a time-stamp counter known to drive the monotonic clock, lookups read the monotonic clock.

func cpuTicks() uint64 { return 0 }

func ticksAreTheClock() bool { return false }
