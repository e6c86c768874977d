package existencegate

import (
	"math"
	"math/bits"
)

// The mirror's side of a sub-lease (crates/core/src/sublease.rs, rules 2 and 4): what lets a copy answer
// ABSENT without asking, and why it then never does so for a key whose Add the gate acknowledged.

// leaseTerms are the durations the gate sends in its header.
type leaseTerms struct {
	// length is the longest sub-lease the gate grants (ns on its clock).
	length uint64
	// driftPPM is ρ: how much faster this process's monotonic clock may run than the gate's.
	driftPPM uint64
	// margin is taken off every end: the gate's, for how coarsely clocks are read.
	margin uint64
}

// sublease is the newest grant as this mirror holds it.
type sublease struct {
	terms leaseTerms
	// end is the grant's end on the mirror's clock (0: none).
	end uint64
	// fromSeq is the seq the mirror must have applied before the grant holds: the gate's applied seq
	// when it granted, so a key acknowledged before the grant is in the copy whenever it holds.
	fromSeq uint64
}

// granted takes the gate's grant of length ns (from fromSeq) for the ask sent at asked on the mirror's
// clock. The end is asked + length × (1 − ρ) − margin: counted from when the mirror asked (the ask's
// travel counts against the mirror), shrunk so that a mirror clock up to ρ fast still reaches it before
// the gate reaches its own end — after which the gate acknowledges Adds without waiting for this mirror.
// Counted from the grant's arrival instead, or without the shrink, the mirror could answer ABSENT for an
// Add the gate acknowledged without it. A grant ending earlier than the one held (a late answer to an
// older ask) changes nothing.
func (s *sublease) granted(asked, length, fromSeq uint64) {
	drift := s.terms.driftPPM
	if drift > 1_000_000 {
		drift = 1_000_000
	}
	hi, lo := bits.Mul64(length, 1_000_000-drift)
	shrunk, _ := bits.Div64(hi, lo, 1_000_000)
	end := asked + shrunk
	if end < asked {
		end = math.MaxUint64
	}
	if end <= s.terms.margin {
		end = 0
	} else {
		end -= s.terms.margin
	}
	if end > s.end {
		s.end = end
		if fromSeq > s.fromSeq {
			s.fromSeq = fromSeq
		}
	}
}

// holdingUntil is the end until which the mirror holds, having applied through applied: 0 until it has
// applied the grant's fromSeq, since before that its copy may lack a key the gate acknowledged.
func (s *sublease) holdingUntil(applied uint64) uint64 {
	if applied >= s.fromSeq {
		return s.end
	}
	return 0
}

// observableSeq is the observed_seq a local answer may claim (crates/core/src/lease.rs): what the copy
// applied, no further than the grant's bound (a replica vouches for its copy of the log only that far),
// and never 0, which a RecordAbsent takes as "not observed".
func observableSeq(applied, bound uint64) uint64 {
	seq := applied
	if bound < seq {
		seq = bound
	}
	if seq < 1 {
		seq = 1
	}
	return seq
}
