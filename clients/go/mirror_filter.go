package existencegate

import (
	"math"
	"sync/atomic"
	"unsafe"
)

// The gate's filter, as a mirror applies the gate's stream to it: the blocked Bloom layer
// (crates/core/src/filter/bloom.rs) and the time-windowed, growable filter made of them
// (crates/core/src/filter/windowed.rs). A mirror must set exactly the bits the gate sets — the same block,
// the same probes, a new window and a new layer at the same moment — or a freshly downloaded copy and one
// kept up by Adds would differ, and the latter answer ABSENT where the gate does not. So every rule here is
// the gate's, including when a layer counts as full and how the next layer is sized; what a mirror never
// does (rebuilds, snapshots, stats) is left out.
//
// One writer (the mirror's keeper) and any number of lookups: the words are read and written atomically
// (plain moves on amd64 and arm64), and rotation, growth and expiry publish a new immutable window list
// through an atomic pointer, so a lookup sees either list whole.

const (
	blockBits     = 512
	wordsPerBlock = blockBits / 64
	// remix mixes the probe word between probes (2^32 / golden ratio, odd).
	remix uint32 = 0x9E3779B9
	// maxProbes is the most probes a layer uses.
	maxProbes = 24
	// maxLayerBytes is the largest layer: the block index ((hash >> 32) * blocks) >> 32 is exact in 64
	// bits only while blocks < 2^32.
	maxLayerBytes = uint64(math.MaxUint32) * (blockBits / 8)
)

// geometry is a layer's shape: blocks of 512 bits, probes per key, and the keys it is sized for.
type geometry struct {
	blocks   uint64
	probes   uint32
	capacity uint64
}

func (g geometry) bytes() uint64 { return g.blocks * blockBits / 8 }

// geometryFor is the smallest layer holding capacity keys at a false-positive rate of at most target
// (Geometry::for_target): a mirror sizes the layers a window grows by itself, so it must find the gate's
// numbers.
func geometryFor(capacity uint64, target float64) geometry {
	if capacity < 1 {
		capacity = 1
	}
	bitsPerKey, probes := bitsPerKeyFor(target)
	bitsNeeded := math.Ceil(float64(capacity) * bitsPerKey)
	blocks := uint64(math.Ceil(bitsNeeded / blockBits))
	if blocks < 1 {
		blocks = 1
	}
	return geometry{blocks: blocks, probes: probes, capacity: capacity}
}

// blockedFalsePositiveRate is the false-positive rate of a 512-bit-blocked filter (the Poisson sum of
// bloom.rs), computed in the gate's order of operations: the bisection below compares it with a target,
// and a last-bit difference could size a layer differently.
func blockedFalsePositiveRate(bitsPerKey float64, probes uint32) float64 {
	const block = float64(blockBits)
	lambda := block / bitsPerKey
	keyMissesBit := powi(1.0-1.0/block, probes)
	last := uint32(lambda + 12.0*math.Sqrt(lambda) + 20.0)
	poisson := math.Exp(-lambda)
	allKeysMissBit := 1.0
	rate := 0.0
	for keysInBlock := uint32(0); keysInBlock <= last; keysInBlock++ {
		// The explicit conversion keeps the compiler from fusing the multiply into the add (Go may; the
		// gate's Rust does not), which would round differently.
		rate += float64(poisson * powi(1.0-allKeysMissBit, probes))
		poisson *= lambda / float64(keysInBlock+1)
		allKeysMissBit *= keyMissesBit
	}
	return rate
}

// powi is f64::powi as the gate computes it (LLVM's powi: square-and-multiply from the low bit).
func powi(base float64, exponent uint32) float64 {
	result := 1.0
	for {
		if exponent&1 != 0 {
			result *= base
		}
		exponent >>= 1
		if exponent == 0 {
			return result
		}
		base *= base
	}
}

// bestProbes is the probe count near c·ln 2 with the lowest rate at bitsPerKey (the first of equals).
func bestProbes(bitsPerKey float64) (float64, uint32) {
	classic := uint32(math.Round(bitsPerKey * math.Ln2))
	most := classic + 3
	if most > maxProbes {
		most = maxProbes
	}
	least := uint32(1)
	if classic > 4 {
		least = classic - 3
	}
	if least > most {
		least = most
	}
	bestRate, best := math.Inf(1), least
	for k := least; k <= most; k++ {
		if rate := blockedFalsePositiveRate(bitsPerKey, k); rate < bestRate {
			bestRate, best = rate, k
		}
	}
	return bestRate, best
}

// bitsPerKeyFor bisects for the fewest bits per key that meet target, as the gate does.
func bitsPerKeyFor(target float64) (float64, uint32) {
	low, high := 0.5, 128.0
	for i := 0; i < 40; i++ {
		mid := (low + high) / 2
		if rate, _ := bestProbes(mid); rate <= target {
			high = mid
		} else {
			low = mid
		}
	}
	_, probes := bestProbes(high)
	return high, probes
}

// bloomLayer is one blocked Bloom filter: a key's probes all fall in one 64-byte block.
type bloomLayer struct {
	geometry
	// words holds blocks × 8 words, the first on a cache line: one block, one line, one miss.
	words    []uint64
	inserted atomic.Uint64
}

// newBloomLayer is an empty layer of shape g.
func newBloomLayer(g geometry) *bloomLayer {
	n := g.blocks * wordsPerBlock
	backing := make([]uint64, n+wordsPerBlock)
	skip := (64 - uintptr(unsafe.Pointer(&backing[0]))%64) % 64 / 8
	return &bloomLayer{geometry: g, words: backing[skip : skip+uintptr(n) : skip+uintptr(n)]}
}

// block is the offset of hash's block in words (fastrange of the upper 32 bits).
func (l *bloomLayer) block(hash uint64) uint64 {
	return ((hash >> 32) * l.blocks) >> 32 * wordsPerBlock
}

// contains stops at the first unset bit: most absent keys need one or two probes.
func (l *bloomLayer) contains(hash uint64) bool {
	block := l.words[l.block(hash):]
	block = block[:wordsPerBlock:wordsPerBlock]
	state := uint32(hash)
	for p := uint32(0); p < l.probes; p++ {
		position := state >> (32 - 9)
		state *= remix
		if atomic.LoadUint64(&block[position>>6])&(1<<(position&63)) == 0 {
			return false
		}
	}
	return true
}

// insert sets hash's bits and says whether any was new; only then does the key count as inserted, as on
// the gate (a re-added key must not fill a layer).
func (l *bloomLayer) insert(hash uint64) bool {
	var masks [wordsPerBlock]uint64
	state := uint32(hash)
	for p := uint32(0); p < l.probes; p++ {
		position := state >> (32 - 9)
		state *= remix
		masks[position>>6] |= 1 << (position & 63)
	}
	block := l.words[l.block(hash):]
	block = block[:wordsPerBlock:wordsPerBlock]
	var missing uint64
	for i, mask := range masks {
		missing |= mask &^ atomic.LoadUint64(&block[i])
	}
	if missing == 0 {
		return false
	}
	for i, mask := range masks {
		if mask != 0 {
			atomic.StoreUint64(&block[i], atomic.LoadUint64(&block[i])|mask)
		}
	}
	l.inserted.Store(l.inserted.Load() + 1)
	return true
}

func (l *bloomLayer) isFull() bool { return l.inserted.Load() >= l.capacity }

// filterSpec is the namespace's sizing, as the mirror header carries it.
type filterSpec struct {
	expectedKeys      uint64
	falsePositiveRate float64
	retentionMs       uint64 // 0: forever, a single window that never rotates
	windows           uint32
	maxBytes          uint64
}

func (s filterSpec) liveWindows() uint32 {
	if s.retentionMs == 0 {
		return 1
	}
	return s.windows
}

// spanMs is the milliseconds per window (0: never rotates), rounded up so that W − 1 spans cover the
// retention.
func (s filterSpec) spanMs() uint64 {
	if s.retentionMs == 0 {
		return 0
	}
	w := uint64(s.windows - 1)
	span := (s.retentionMs + w - 1) / w
	if span < 1 {
		span = 1
	}
	return span
}

// baseGeometry is a window's first layer: the keys one span receives, at the rate split over the windows.
func (s filterSpec) baseGeometry() geometry {
	windows := s.liveWindows()
	keys := s.expectedKeys
	if s.retentionMs != 0 {
		w := uint64(windows - 1)
		keys = (s.expectedKeys + w - 1) / w
	}
	return geometryFor(keys, s.falsePositiveRate/float64(windows))
}

// filterWindow is the layers holding the keys added during one span, oldest first.
type filterWindow struct {
	id     uint64
	layers []*bloomLayer
	// saturated: its newest layer is full and the memory cap refused another (until an expiry frees
	// memory); the gate marks it so, and stops asking to grow it, at the same insert.
	saturated bool
}

// windowedFilter is the namespace's filter: windows oldest first, published whole.
type windowedFilter struct {
	spec    filterSpec
	base    geometry
	windows atomic.Pointer[[]filterWindow]
}

func newWindowedFilter(spec filterSpec, windows []filterWindow) *windowedFilter {
	f := &windowedFilter{spec: spec, base: spec.baseGeometry()}
	f.windows.Store(&windows)
	return f
}

func (f *windowedFilter) windowID(atMs uint64) uint64 {
	if span := f.spec.spanMs(); span != 0 {
		return atMs / span
	}
	return 0
}

func (f *windowedFilter) oldestLiveID(nowMs uint64) uint64 {
	id, older := f.windowID(nowMs), uint64(f.spec.liveWindows()-1)
	if id < older {
		return 0
	}
	return id - older
}

// contains says whether hash may have been added within its retention, as of nowMs.
func (f *windowedFilter) contains(hash uint64, nowMs uint64) bool {
	oldest := f.oldestLiveID(nowMs)
	windows := *f.windows.Load()
	for i := len(windows) - 1; i >= 0 && windows[i].id >= oldest; i-- {
		for _, layer := range windows[i].layers {
			if layer.contains(hash) {
				return true
			}
		}
	}
	return false
}

// containsMany sets present[i] to contains(hashes[i], nowMs) for each i, a group of keys at a time: the
// blocks a group's keys fall in are loaded first, with no branch between the loads, so that their cache
// misses overlap (Go has no prefetch instruction; a load whose value is kept does as well), then probed.
// Probed one by one, each key's early exit is a branch the CPU guesses half the time wrong, and the miss
// after it waits. It returns the loaded words folded, for the caller to keep.
func (f *windowedFilter) containsMany(hashes []uint64, nowMs uint64, present []bool) uint64 {
	const group = 8
	oldest := f.oldestLiveID(nowMs)
	windows := *f.windows.Load()
	first := len(windows)
	for first > 0 && windows[first-1].id >= oldest {
		first--
	}
	live := windows[first:]
	var touched uint64
	for start := 0; start < len(hashes); start += group {
		end := start + group
		if end > len(hashes) {
			end = len(hashes)
		}
		keys := hashes[start:end]
		for w := range live {
			for _, layer := range live[w].layers {
				for _, hash := range keys {
					touched ^= atomic.LoadUint64(&layer.words[layer.block(hash)])
				}
			}
		}
		for i, hash := range keys {
			present[start+i] = liveContain(live, hash)
		}
	}
	return touched
}

// liveContain reports whether any layer of windows contains hash. (contains keeps its own loop, newest
// window first, stopping at the first dead one: built on this one, single lookups at 10M keys took 167–192
// ns against 128 ns side by side.)
func liveContain(windows []filterWindow, hash uint64) bool {
	for w := range windows {
		for _, layer := range windows[w].layers {
			if layer.contains(hash) {
				return true
			}
		}
	}
	return false
}

// insertMany adds hashes as of atMs (one Add): into the newest window, made first if atMs is past it (a
// time before it lands in the newest window too, as on the gate: a key then lives longer, never shorter).
func (f *windowedFilter) insertMany(hashes []uint64, atMs uint64) {
	windows := *f.windows.Load()
	if len(windows) == 0 || windows[len(windows)-1].id < f.windowID(atMs) {
		windows = f.rotate(atMs)
	}
	for _, hash := range hashes {
		newest := &windows[len(windows)-1]
		if newest.olderLayersContain(hash) {
			continue
		}
		layer := newest.layers[len(newest.layers)-1]
		if layer.insert(hash) && !newest.saturated && layer.isFull() {
			windows = f.grow(len(windows) - 1)
		}
	}
}

func (w *filterWindow) olderLayersContain(hash uint64) bool {
	for _, layer := range w.layers[:len(w.layers)-1] {
		if layer.contains(hash) {
			return true
		}
	}
	return false
}

// rotate appends the window of atMs; it drops nothing (only expire does, at the gate's time).
func (f *windowedFilter) rotate(atMs uint64) []filterWindow {
	current := *f.windows.Load()
	next := append(current[:len(current):len(current)],
		filterWindow{id: f.windowID(atMs), layers: []*bloomLayer{newBloomLayer(f.base)}})
	return f.publish(next)
}

// grow adds a layer of twice the capacity at half the rate to window i, or marks it saturated when the
// cap (of all windows' bytes, dead ones not yet expired included) does not allow it.
func (f *windowedFilter) grow(i int) []filterWindow {
	current := *f.windows.Load()
	next := append([]filterWindow(nil), current...)
	window := &next[i]
	growth := uint32(len(window.layers))
	shift := growth
	if shift > 32 {
		shift = 32
	}
	halving := growth
	if halving > 30 {
		halving = 30
	}
	g := geometryFor(f.base.capacity<<shift,
		f.spec.falsePositiveRate/float64(f.spec.liveWindows())/float64(uint32(1)<<halving))
	if bytesOf(current)+g.bytes() > f.spec.maxBytes {
		window.saturated = true
	} else {
		window.layers = append(window.layers[:len(window.layers):len(window.layers)], newBloomLayer(g))
	}
	return f.publish(next)
}

// expire drops the windows no longer live at nowMs, freeing their memory; the rest may grow again.
func (f *windowedFilter) expire(nowMs uint64) {
	current := *f.windows.Load()
	oldest := f.oldestLiveID(nowMs)
	dead := 0
	for dead < len(current) && current[dead].id < oldest {
		dead++
	}
	if dead == 0 {
		return
	}
	next := make([]filterWindow, 0, len(current)-dead)
	for _, w := range current[dead:] {
		next = append(next, filterWindow{id: w.id, layers: w.layers})
	}
	f.publish(next)
}

func (f *windowedFilter) publish(next []filterWindow) []filterWindow {
	f.windows.Store(&next)
	return next
}

// bytes is the bytes of every layer held, windows past retention included until expire drops them.
func (f *windowedFilter) bytes() uint64 { return bytesOf(*f.windows.Load()) }

func bytesOf(windows []filterWindow) uint64 {
	var total uint64
	for _, w := range windows {
		for _, layer := range w.layers {
			total += layer.bytes()
		}
	}
	return total
}
