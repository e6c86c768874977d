package existencegate

import (
	"math/rand"
	"testing"
)

// containsMany answers as contains does, key for key, whatever the batch's length (its groups of eight
// included): over windows that rotated, grew layers and partly expired as of the lookup's time.
func TestContainsManyAnswersAsContainsDoes(t *testing.T) {
	spec := filterSpec{expectedKeys: 1000, falsePositiveRate: 0.01, retentionMs: 3000, windows: 4, maxBytes: 1 << 30}
	f := newWindowedFilter(spec, nil)
	random := rand.New(rand.NewSource(7))
	inserted := make([]uint64, 0, 6000)
	for atMs := uint64(0); atMs < 6000; atMs += 500 {
		batch := make([]uint64, 500)
		for i := range batch {
			batch[i] = random.Uint64()
		}
		f.insertMany(batch, atMs)
		inserted = append(inserted, batch...)
	}
	layers := 0
	for _, w := range *f.windows.Load() {
		layers += len(w.layers)
	}
	if windows := len(*f.windows.Load()); layers <= windows || windows < 4 {
		t.Fatalf("%d windows, %d layers: the check needs several windows and a grown one", windows, layers)
	}
	for _, nowMs := range []uint64{5999, 7500, 9000} {
		for round := 0; round < 200; round++ {
			hashes := make([]uint64, 1+random.Intn(25))
			for i := range hashes {
				if random.Intn(2) == 0 {
					hashes[i] = inserted[random.Intn(len(inserted))]
				} else {
					hashes[i] = random.Uint64()
				}
			}
			present := make([]bool, len(hashes))
			f.containsMany(hashes, nowMs, present)
			for i, hash := range hashes {
				if present[i] != f.contains(hash, nowMs) {
					t.Fatalf("at %d ms, key %d of %d: containsMany says %v, contains %v",
						nowMs, i, len(hashes), present[i], !present[i])
				}
			}
		}
	}
}
