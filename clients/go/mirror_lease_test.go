package existencegate

import (
	"testing"
	"time"
)

// The mirror's side of the sub-lease rules (crates/core/src/sublease.rs), exactly: these orderings are
// rare against a real gate (a grant must overtake the Add it names), so each rule is also pinned here.

var testTerms = leaseTerms{length: uint64(300 * time.Millisecond), driftPPM: 10_000, margin: uint64(time.Millisecond)}

// Rule 2: the end is asked + length × (1 − ρ) − margin on the mirror's clock. The gate granted after the
// ask was sent, so its own end is at least asked + length on its clock; a mirror clock up to ρ fast reaches
// its end within length × (1 − ρ)(1 + ρ) < length of the ask, so before the gate's end: the gate never
// counts a sub-lease over that the mirror still holds. Without the shrink or the margin the end is later.
func TestASubleaseEndsAtTheAskPlusTheShrunkLengthLessTheMargin(t *testing.T) {
	lease := sublease{terms: testTerms}
	asked := uint64(5 * time.Second)
	lease.granted(asked, testTerms.length, 7)
	want := asked + uint64(297*time.Millisecond) - uint64(time.Millisecond)
	if got := lease.holdingUntil(7); got != want {
		t.Fatalf("held until %v after the ask, expected %v", time.Duration(got-asked), time.Duration(want-asked))
	}
	// On the gate's clock the mirror's end comes, at the fastest drift, before the grant's end.
	if mirrorEnd := float64(want-asked) * (1 + float64(testTerms.driftPPM)/1e6); mirrorEnd >= float64(testTerms.length) {
		t.Fatalf("a mirror clock %d ppm fast reaches its end %v after the ask, not before the gate's %v",
			testTerms.driftPPM, time.Duration(mirrorEnd), time.Duration(testTerms.length))
	}
}

// Rule 2: a grant holds only once the mirror has applied its from_seq — the gate may have acknowledged
// that Add while this mirror held nothing, and the grant may arrive before the Add does.
func TestASubleaseHoldsOnlyOnceItsFromSeqIsApplied(t *testing.T) {
	lease := sublease{terms: testTerms}
	lease.granted(1, testTerms.length, 42)
	if until := lease.holdingUntil(41); until != 0 {
		t.Fatalf("holds until %d having applied 41 of a grant from 42", until)
	}
	if until := lease.holdingUntil(42); until == 0 {
		t.Fatal("does not hold having applied the grant's from_seq")
	}
}

// A late answer to an older ask ends earlier: it neither shortens the sub-lease held nor changes the seq
// it waits for; a newer grant raises both.
func TestAnOlderGrantChangesNothing(t *testing.T) {
	lease := sublease{terms: testTerms}
	lease.granted(uint64(time.Second), testTerms.length, 10)
	end := lease.holdingUntil(10)
	lease.granted(uint64(time.Second)-1, testTerms.length, 12)
	if lease.holdingUntil(10) != end {
		t.Fatal("an older grant moved the sub-lease")
	}
	lease.granted(uint64(2*time.Second), testTerms.length, 12)
	if lease.holdingUntil(11) != 0 || lease.holdingUntil(12) <= end {
		t.Fatalf("a newer grant: until %d (applied 11), %d (applied 12), before %d",
			lease.holdingUntil(11), lease.holdingUntil(12), end)
	}
}

// observed_seq of a local answer: what the copy applied, no further than the grant's bound, never 0.
func TestALocalAnswerClaimsNoSeqPastItsBound(t *testing.T) {
	for _, c := range []struct{ applied, bound, want uint64 }{{9, 1<<64 - 1, 9}, {9, 5, 5}, {0, 1<<64 - 1, 1}} {
		if got := observableSeq(c.applied, c.bound); got != c.want {
			t.Errorf("observableSeq(%d, %d) = %d, expected %d", c.applied, c.bound, got, c.want)
		}
	}
}
