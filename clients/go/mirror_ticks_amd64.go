//go:build linux

package existencegate

import (
	"os"
	"strings"
)

// cpuTicks is the CPU's time-stamp counter, read without a fence (RDTSC): a few nanoseconds, and the CPU
// goes on overlapping the loads around it.
func cpuTicks() uint64

// ticksAreTheClock reports whether the kernel's monotonic clock is the time-stamp counter itself (clock
// source "tsc"): the kernel then found it invariant and in step across CPUs, so ticks counted on one CPU
// and compared on another measure the monotonic clock's time.
func ticksAreTheClock() bool {
	source, err := os.ReadFile("/sys/devices/system/clocksource/clocksource0/current_clocksource")
	return err == nil && strings.TrimSpace(string(source)) == "tsc"
}
