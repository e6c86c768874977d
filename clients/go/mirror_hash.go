package existencegate

import "math/bits"

// filterHasher is the gate's fast keyed hash of a key (crates/core/src/hashing.rs, FilterHasher): foldhash
// 0.2.0's fast variant, FixedState::with_seed(seed).hash_one(key). A mirror's copy answers for the gate's
// bits only if every key lands on the bits the gate set for it, so this must give the gate's value for
// every seed and key length (clients/testdata/filter-hash.txt, checked by a test); the lengths foldhash
// treats apart (up to 16 bytes, up to 128, up to 256, longer) each take their own path below.
type filterHasher struct {
	// The per-hasher seed: the gate's seed xor-ed with foldhash's ARBITRARY3, as FixedState::with_seed does.
	seed uint64
}

// foldhash's fixed shared seeds (SharedSeed::global_fixed: ARBITRARY6 to ARBITRARY11).
var foldSeeds = [6]uint64{
	0xc0ac29b7c97c50dd, 0x3f84d5b5b5470917, 0x9216d5d98979fb1b,
	0xd1310ba698dfb5ac, 0x2ffd72dbd01adfb7, 0xb8e1afed6a267e96,
}

const foldArbitrary3 = 0x082efa98ec4e6c89

func newFilterHasher(seed uint64) filterHasher { return filterHasher{seed: seed ^ foldArbitrary3} }

// hash is hash_one(&[u8]): the slice's Hash writes its length (write_usize, which goes to the sponge),
// then its bytes (write, which folds them into the accumulator); finish folds the sponge in.
func (h filterHasher) hash(key string) uint64 {
	n := len(key)
	accumulator := bits.RotateLeft64(h.seed, -(n & 63))
	if n <= 16 {
		accumulator = hashShort(key, accumulator)
	} else {
		accumulator = hashLong(key, accumulator)
	}
	return foldedMultiply(uint64(n)^accumulator, foldSeeds[0])
}

// foldedMultiply is the 128-bit product's halves xor-ed.
func foldedMultiply(x, y uint64) uint64 {
	hi, lo := bits.Mul64(x, y)
	return hi ^ lo
}

func load64(s string, i int) uint64 {
	_ = s[i+7]
	return uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
		uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
}

func load32(s string, i int) uint64 {
	_ = s[i+3]
	return uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24
}

func hashShort(s string, accumulator uint64) uint64 {
	n := len(s)
	s0, s1 := accumulator, foldSeeds[1]
	switch {
	case n >= 8:
		s0 ^= load64(s, 0)
		s1 ^= load64(s, n-8)
	case n >= 4:
		s0 ^= load32(s, 0)
		s1 ^= load32(s, n-4)
	case n > 0:
		s0 ^= uint64(s[0])
		s1 ^= uint64(s[n-1])<<8 | uint64(s[n/2])
	}
	return foldedMultiply(s0, s1)
}

func hashLong(v string, accumulator uint64) uint64 {
	s0 := accumulator
	s1 := s0 + foldSeeds[1]
	if len(v) > 128 {
		s2, s3 := s0+foldSeeds[2], s0+foldSeeds[3]
		if len(v) > 256 {
			s4, s5 := s0+foldSeeds[4], s0+foldSeeds[5]
			for {
				s0 = foldedMultiply(load64(v, 0)^s0, load64(v, 48)^foldSeeds[0])
				s1 = foldedMultiply(load64(v, 8)^s1, load64(v, 56)^foldSeeds[0])
				s2 = foldedMultiply(load64(v, 16)^s2, load64(v, 64)^foldSeeds[0])
				s3 = foldedMultiply(load64(v, 24)^s3, load64(v, 72)^foldSeeds[0])
				s4 = foldedMultiply(load64(v, 32)^s4, load64(v, 80)^foldSeeds[0])
				s5 = foldedMultiply(load64(v, 40)^s5, load64(v, 88)^foldSeeds[0])
				v = v[96:]
				if len(v) <= 256 {
					break
				}
			}
			s0 ^= s4
			s1 ^= s5
		}
		for {
			s0 = foldedMultiply(load64(v, 0)^s0, load64(v, 32)^foldSeeds[0])
			s1 = foldedMultiply(load64(v, 8)^s1, load64(v, 40)^foldSeeds[0])
			s2 = foldedMultiply(load64(v, 16)^s2, load64(v, 48)^foldSeeds[0])
			s3 = foldedMultiply(load64(v, 24)^s3, load64(v, 56)^foldSeeds[0])
			v = v[64:]
			if len(v) <= 128 {
				break
			}
		}
		s0 ^= s2
		s1 ^= s3
	}
	n := len(v)
	s0 = foldedMultiply(load64(v, 0)^s0, load64(v, n-16)^foldSeeds[0])
	s1 = foldedMultiply(load64(v, 8)^s1, load64(v, n-8)^foldSeeds[0])
	if n >= 32 {
		s0 = foldedMultiply(load64(v, 16)^s0, load64(v, n-32)^foldSeeds[0])
		s1 = foldedMultiply(load64(v, 24)^s1, load64(v, n-24)^foldSeeds[0])
		if n >= 64 {
			s0 = foldedMultiply(load64(v, 32)^s0, load64(v, n-48)^foldSeeds[0])
			s1 = foldedMultiply(load64(v, 40)^s1, load64(v, n-40)^foldSeeds[0])
			if n >= 96 {
				s0 = foldedMultiply(load64(v, 48)^s0, load64(v, n-64)^foldSeeds[0])
				s1 = foldedMultiply(load64(v, 56)^s1, load64(v, n-56)^foldSeeds[0])
			}
		}
	}
	return s0 ^ s1
}
