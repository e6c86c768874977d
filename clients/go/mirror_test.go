package existencegate

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/existence-gate/existence-gate/clients/go/existencepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Mirrors against real gates: a copy that is the gate's filter bit for bit, that never answers ABSENT for
// an acknowledged key — while Adds race lookups, while its link is silent, while its gate is frozen or
// killed — that follows a rebuild, and refusals that say what was wrong.

// mirrorSublease is mirroredConfig's sub-lease.
const mirrorSublease = 300 * time.Millisecond

// mirroredConfig: users, a plain namespace; growing, one that grows layers (expected_keys is small);
// rotating, one whose windows are a second long and hold 20 keys before they grow.
const mirroredConfig = `
[mirrors]
max_per_namespace = 4
sublease = "300ms"

[namespaces.users]
expected_keys = 100000

[namespaces.growing]
expected_keys = 1000
max_filter_bytes = 1048576

[namespaces.rotating]
expected_keys = 60
retention = "3s"
windows = 4
max_filter_bytes = 67108864
`

func mirroredGate(t *testing.T, extra string) *gateServer {
	t.Helper()
	gate, err := startGate(mirroredConfig + extra)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gate.stop)
	return gate
}

func newMirror(t *testing.T, c *GateClient, options MirrorOptions) *Mirror {
	t.Helper()
	m, err := c.Mirror(options)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func waitHolding(t *testing.T, m *Mirror) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := m.WaitReady(ctx); err != nil {
		t.Fatalf("the mirror never held a sub-lease: %v", err)
	}
}

func numbered(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return keys
}

// localAbsences is which of keys the mirror answers ABSENT locally, read under one sub-lease that held
// throughout (a lapse on a loaded machine makes it read again), one key at a time and all at once: the
// two must agree.
func localAbsences(t *testing.T, m *Mirror, keys []string) []bool {
	t.Helper()
	for {
		waitHolding(t, m)
		until, attaches := m.holdsUntil.Load(), m.client.Stats().MirrorAttaches
		answers := make([]bool, len(keys))
		for i, key := range keys {
			answers[i] = m.AbsentLocally(key)
		}
		many := m.AbsentLocallyMany(keys)
		if m.clock.now() < until && m.client.Stats().MirrorAttaches == attaches {
			for i := range keys {
				if many[i] != answers[i] {
					t.Fatalf("%q: AbsentLocally says %v, AbsentLocallyMany %v", keys[i], answers[i], many[i])
				}
			}
			return answers
		}
	}
}

// For keys added before and after the mirror attached and 20,000 never added, in a plain namespace and
// one whose layers grew, the mirror answers ABSENT for exactly the keys the gate does (its false
// positives included), and MayExist answers such a key locally, marked and counted.
func TestMirrorAnswersAbsentExactlyWhereTheGateDoes(t *testing.T) {
	gate := mirroredGate(t, "")
	for _, namespace := range []string{"users", "growing"} {
		c := newClient(t, []string{gate.addr}, namespace, WithDeadline(patience))
		ctx := context.Background()
		if _, err := c.Add(ctx, numbered("before", 3000)); err != nil {
			t.Fatal(err)
		}
		m := newMirror(t, c, MirrorOptions{})
		waitHolding(t, m)
		if _, err := c.Add(ctx, numbered("after", 3000)); err != nil {
			t.Fatal(err)
		}
		probes := append(append(numbered("before", 3000), numbered("after", 3000)...), numbered("never", 20000)...)
		local := localAbsences(t, m, probes)
		gateAnswers, err := c.MayExistMany(ctx, probes)
		if err != nil {
			t.Fatal(err)
		}
		absent := 0
		for i, key := range probes {
			if local[i] == gateAnswers[i].MayExist {
				t.Fatalf("%s: %q is absent locally: %v, may exist at the gate: %v", namespace, key, local[i], gateAnswers[i].MayExist)
			}
			if local[i] {
				absent++
			}
		}
		if absent < 19000 {
			t.Fatalf("%s: only %d of the 20,000 keys never added were absent", namespace, absent)
		}
		if layers := len((*m.copy.Load().filter.windows.Load())[0].layers); namespace == "growing" && layers < 3 {
			t.Fatalf("growing: %d layers, the test meant to cover grown layers", layers)
		}
		assertAnsweredLocally(t, m, probes[6000])
	}
}

// assertAnsweredLocally checks that MayExist answers key (absent locally) with no call, as ABSENT, marked
// Local and counted; tried again only when the sub-lease lapsed in between.
func assertAnsweredLocally(t *testing.T, m *Mirror, key string) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for time.Now().Before(deadline) {
		waitHolding(t, m)
		before := m.client.Stats()
		answer, err := m.MayExist(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if answer.Local {
			after := m.client.Stats()
			if answer.MayExist || answer.ObservedSeq == 0 {
				t.Fatalf("a local answer for %q: %+v", key, answer)
			}
			if after.MirrorAnswers != before.MirrorAnswers+1 || after.GateCalls != before.GateCalls {
				t.Fatalf("a local answer counted as %+v, before %+v", after, before)
			}
			return
		}
	}
	t.Fatalf("%q was never answered locally", key)
}

// liveLayer is what a layer of a live window holds: the gate's shape, its count of keys, its words.
type liveLayer struct {
	geometry
	inserted uint64
	words    []uint64
}

// liveWindows is the copy's windows live at nowMs, each with its layers.
func liveWindows(m *Mirror, nowMs uint64) map[uint64][]liveLayer {
	filter := m.copy.Load().filter
	live := map[uint64][]liveLayer{}
	for _, w := range *filter.windows.Load() {
		if w.id < filter.oldestLiveID(nowMs) {
			continue
		}
		for _, l := range w.layers {
			words := make([]uint64, len(l.words))
			for i := range words {
				words[i] = atomic.LoadUint64(&l.words[i])
			}
			live[w.id] = append(live[w.id], liveLayer{geometry: l.geometry, inserted: l.inserted.Load(), words: words})
		}
	}
	return live
}

// A mirror attached to an empty namespace and kept up by Adds that open new windows (a second each) and
// grow layers (20 keys a window, 80 added to each) ends bit-identical to a mirror that downloads the
// gate's filter at the same seq: the same live windows, layer shapes, key counts and words. Every window
// and every grown layer of the first was made by this library, so the hash, the insert, the rotation and
// the growth are the gate's.
func TestMirrorKeptUpByAddsIsTheGatesFilterBitForBit(t *testing.T) {
	gate := mirroredGate(t, "")
	c := newClient(t, []string{gate.addr}, "rotating", WithDeadline(patience))
	kept := newMirror(t, c, MirrorOptions{})
	waitHolding(t, kept)
	if windows := len(*kept.copy.Load().filter.windows.Load()); windows != 0 {
		t.Fatalf("the namespace had %d windows before any Add", windows)
	}
	span := kept.copy.Load().filter.spec.spanMs()
	var seq uint64
	for round := 0; round < 5; round++ {
		for add := 0; add < 8; add++ {
			var err error
			if seq, err = c.Add(context.Background(), numbered(fmt.Sprintf("r%d-a%d", round, add), 10)); err != nil {
				t.Fatal(err)
			}
		}
		newest := (*kept.copy.Load().filter.windows.Load())
		lastWindow := newest[len(newest)-1].id
		eventually(t, "the gate's clock reaches the next window", func() bool {
			return kept.nowMs.Load()/span > lastWindow
		})
	}
	fresh := newMirror(t, c, MirrorOptions{})
	waitHolding(t, fresh)
	eventually(t, "both mirrors applied the last Add", func() bool {
		return kept.applied.Load() == seq && fresh.applied.Load() == seq
	})
	nowMs := fresh.nowMs.Load()
	keptLive, freshLive := liveWindows(kept, nowMs), liveWindows(fresh, nowMs)
	grown := 0
	for id, layers := range freshLive {
		if len(layers) >= 3 {
			grown++
		}
		if len(keptLive[id]) != len(layers) {
			t.Fatalf("window %d: %d layers kept up, %d downloaded", id, len(keptLive[id]), len(layers))
		}
		for i, layer := range layers {
			mine := keptLive[id][i]
			if mine.geometry != layer.geometry || mine.inserted != layer.inserted {
				t.Fatalf("window %d layer %d: kept up %+v with %d keys, downloaded %+v with %d", id, i,
					mine.geometry, mine.inserted, layer.geometry, layer.inserted)
			}
			for w := range layer.words {
				if mine.words[w] != layer.words[w] {
					t.Fatalf("window %d layer %d word %d: kept up %#x, downloaded %#x", id, i, w, mine.words[w], layer.words[w])
				}
			}
		}
	}
	if len(keptLive) != len(freshLive) || len(freshLive) < 2 || grown < 2 {
		t.Fatalf("live windows: %d kept up, %d downloaded, %d with grown layers (the test meant at least 2 of each)",
			len(keptLive), len(freshLive), grown)
	}
}

// Adds acknowledged one after another while another goroutine looks up every key acknowledged so far:
// none is ever ABSENT in the mirror after its Add returned (the gate waited for the mirror's
// acknowledgement), and keys never added were answered locally meanwhile, so the check was not empty.
func TestNoAcknowledgedKeyIsAbsentInAMirrorWhileAddsRaceLookups(t *testing.T) {
	gate := mirroredGate(t, "")
	c := newClient(t, []string{gate.addr}, "users", WithDeadline(patience))
	m := newMirror(t, c, MirrorOptions{})
	waitHolding(t, m)
	added := numbered("raced", 1500)
	var acknowledged atomic.Int64
	done := make(chan struct{})
	type outcome struct {
		wrong []string
		local int
	}
	result := make(chan outcome)
	go func() {
		var o outcome
		for i := 0; ; i++ {
			select {
			case <-done:
				result <- o
				return
			default:
			}
			through := int(acknowledged.Load())
			from := through - 64
			if from < 0 {
				from = 0
			}
			for _, key := range added[from:through] {
				if m.AbsentLocally(key) {
					o.wrong = append(o.wrong, key)
				}
			}
			if m.AbsentLocally(fmt.Sprintf("never-%d", i)) {
				o.local++
			}
		}
	}()
	for i, key := range added {
		if _, err := c.Add(context.Background(), []string{key}); err != nil {
			t.Fatal(err)
		}
		if m.AbsentLocally(key) {
			t.Fatalf("%q is ABSENT in the mirror after its Add was acknowledged", key)
		}
		acknowledged.Store(int64(i + 1))
	}
	close(done)
	o := <-result
	if len(o.wrong) > 0 {
		t.Fatalf("acknowledged keys ABSENT in the mirror: %v", o.wrong)
	}
	if o.local == 0 {
		t.Fatal("the mirror never answered locally: the check proved nothing")
	}
	assertAnsweredLocally(t, m, "never-asked")
}

// waitAbsentLocally waits until the mirror answers key ABSENT locally.
func waitAbsentLocally(t *testing.T, m *Mirror, key string) {
	t.Helper()
	eventually(t, fmt.Sprintf("%q is answered ABSENT locally", key), func() bool { return m.AbsentLocally(key) })
}

// A gate frozen (SIGSTOP) under its mirror grants nothing more: the mirror stops answering locally before
// its sub-lease ends — at most a sub-lease after the freeze, on its monotonic clock, since the last grant
// answered an ask sent before it — and once the gate runs again (SIGCONT) it holds and answers locally
// again.
func TestAMirrorOfAFrozenGateStopsAnsweringWithinItsSublease(t *testing.T) {
	gate := mirroredGate(t, "")
	c := newClient(t, []string{gate.addr}, "users")
	m := newMirror(t, c, MirrorOptions{})
	waitHolding(t, m)
	waitAbsentLocally(t, m, "never")
	if err := gate.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gate.cmd.Process.Signal(syscall.SIGCONT) })
	frozen := m.clock.now()
	lastLocal := map[string]uint64{"AbsentLocally": 0, "AbsentLocallyMany": 0}
	never := []string{"never"}
	for now := m.clock.now(); now < frozen+uint64(3*mirrorSublease); now = m.clock.now() {
		if m.AbsentLocally("never") {
			lastLocal["AbsentLocally"] = now
		}
		if m.AbsentLocallyMany(never)[0] {
			lastLocal["AbsentLocallyMany"] = now
		}
	}
	for lookup, last := range lastLocal {
		if last == 0 {
			t.Fatalf("%s never answered locally once the gate was frozen: the check proved nothing", lookup)
		}
		if last >= frozen+uint64(mirrorSublease) {
			t.Fatalf("%s answered locally %v after its gate froze, past its sub-lease (%v)",
				lookup, time.Duration(last-frozen), mirrorSublease)
		}
	}
	if err := gate.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitHolding(t, m)
	waitAbsentLocally(t, m, "never")
}

// A gate killed under its mirror ends the stream: the mirror drops its sub-lease at once (before the
// sub-lease would have run out), and attaches to the gate that takes the address over, answering locally
// from the new gate's filter, never ABSENT for a key that gate acknowledged.
func TestAMirrorOfAKilledGateDropsItsSubleaseAndAttachesToItsSuccessor(t *testing.T) {
	first := mirroredGate(t, "")
	via := startProxy(t, first.addr)
	c := newClient(t, []string{via.addr()}, "users", WithDeadline(patience))
	m := newMirror(t, c, MirrorOptions{})
	waitHolding(t, m)
	// The end as it stands before the kill (read after, the mirror may have dropped it already).
	until, killed := m.holdsUntil.Load(), m.clock.now()
	if until <= killed {
		t.Fatal("the mirror held no sub-lease when its gate was killed")
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the mirror drops its sub-lease", func() bool { return !m.HoldsSublease() })
	if dropped := m.clock.now(); dropped >= until {
		t.Fatalf("the sub-lease ran out (%v after the kill, its end %v after) rather than being dropped when the stream ended",
			time.Duration(dropped-killed), time.Duration(until-killed))
	}
	second := mirroredGate(t, "")
	via.retarget(second.addr)
	eventually(t, "the new gate acknowledges an Add", func() bool {
		_, err := c.Add(context.Background(), []string{"after-restart"})
		return err == nil
	})
	waitHolding(t, m)
	waitAbsentLocally(t, m, "never")
	if m.AbsentLocally("after-restart") {
		t.Fatal("the mirror answered ABSENT for a key its new gate acknowledged")
	}
	if attaches := c.Stats().MirrorAttaches; attaches < 2 {
		t.Fatalf("%d attaches", attaches)
	}
}

// A client of two gates: its mirror attaches to the first; when that one is killed, the mirror marks it
// down and attaches to the second, answering locally from its filter, never ABSENT for a key it holds.
func TestAMirrorWhoseGateDiesAttachesToTheNextAddress(t *testing.T) {
	first, second := mirroredGate(t, ""), mirroredGate(t, "")
	onSecond := newClient(t, []string{second.addr}, "users", WithDeadline(patience))
	if _, err := onSecond.Add(context.Background(), []string{"only-on-the-second"}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, []string{first.addr, second.addr}, "users", WithDeadline(patience))
	m := newMirror(t, c, MirrorOptions{})
	waitHolding(t, m)
	waitAbsentLocally(t, m, "only-on-the-second") // the first gate's copy
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the mirror attaches to the second gate", func() bool {
		return c.Stats().MirrorAttaches >= 2 && m.HoldsSublease()
	})
	waitAbsentLocally(t, m, "never")
	if m.AbsentLocally("only-on-the-second") {
		t.Fatal("the mirror answered ABSENT for a key the second gate holds: it is not following it")
	}
}

// A mirror whose link goes silent keeps no sub-lease past the gate's: an Add through another link waits
// for that sub-lease to run out at the gate, and when it returns the mirror no longer holds. Once the link
// passes again the gate's answers to the asks it held back come before the Add (it reads asks first), so
// the mirror is granted a sub-lease from the Add's seq before it has the Add: it must not hold until it
// applied it. Watched throughout, the key is never ABSENT locally.
func TestASilentMirrorNeverAnswersAbsentForAnAddAcknowledgedMeanwhile(t *testing.T) {
	gate := mirroredGate(t, "")
	via := startProxy(t, gate.addr)
	direct := newClient(t, []string{gate.addr}, "users", WithDeadline(patience))
	c := newClient(t, []string{via.addr()}, "users")
	m := newMirror(t, c, MirrorOptions{})
	const key = "added-while-silent"
	for attempt := 0; attempt < 5; attempt++ {
		waitHolding(t, m)
		waitAbsentLocally(t, m, "never")
		via.setSilent(true)
		seq, err := direct.Add(context.Background(), []string{fmt.Sprintf("%s-%d", key, attempt)})
		if err != nil {
			t.Fatal(err)
		}
		if m.HoldsSublease() {
			t.Fatal("the gate acknowledged an Add the silent mirror never saw while the mirror still held a sub-lease")
		}
		watching := make(chan int)
		go func() {
			wrong := 0
			for m.applied.Load() < seq || !m.HoldsSublease() {
				if m.AbsentLocally(fmt.Sprintf("%s-%d", key, attempt)) {
					wrong++
				}
			}
			watching <- wrong
		}()
		time.Sleep(mirrorSublease / 2) // asks pile up in the silent link
		via.setSilent(false)
		if wrong := <-watching; wrong > 0 {
			t.Fatalf("the key added while the link was silent was ABSENT locally %d times", wrong)
		}
		if m.AbsentLocally(fmt.Sprintf("%s-%d", key, attempt)) {
			t.Fatal("the key added while the link was silent is ABSENT locally")
		}
	}
}

// A rebuild swaps in a filter whose keys no Add announced: the gate sends RESYNC, and the mirror
// downloads the new filter and answers from it (a key only the old filter held is ABSENT again, the
// rebuilt ones are not).
func TestAMirrorFollowsARebuild(t *testing.T) {
	gate := mirroredGate(t, "")
	c := newClient(t, []string{gate.addr}, "users", WithDeadline(patience))
	if _, err := c.Add(context.Background(), []string{"only-before"}); err != nil {
		t.Fatal(err)
	}
	m := newMirror(t, c, MirrorOptions{})
	waitHolding(t, m)
	if m.AbsentLocally("only-before") {
		t.Fatal("an added key is ABSENT locally")
	}
	conn, err := grpc.Dial(gate.addr, grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	rebuild, err := existencepb.NewAdminClient(conn).Rebuild(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rebuild.Send(&existencepb.RebuildRequest{Namespace: "users", Keys: [][]byte{[]byte("rebuilt-1"), []byte("rebuilt-2")}, Commit: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := rebuild.CloseAndRecv(); err != nil {
		t.Fatalf("the rebuild failed: %v", err)
	}
	waitAbsentLocally(t, m, "only-before")
	if m.AbsentLocally("rebuilt-1") || m.AbsentLocally("rebuilt-2") {
		t.Fatal("a rebuilt key is ABSENT locally")
	}
	if stats := c.Stats(); stats.MirrorResyncs < 1 || stats.MirrorAttaches < 2 {
		t.Fatalf("after a rebuild: %+v", stats)
	}
}

// assertRefused waits for the mirror's refusal and checks its code and what it says; the mirror then
// answers nothing locally and MayExist asks the gate.
func assertRefused(t *testing.T, m *Mirror, code codes.Code, says string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	err := m.WaitReady(ctx)
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), says) {
		t.Fatalf("refused with %v, expected %v saying %q", err, code, says)
	}
	if m.AbsentLocally("never") || m.HoldsSublease() {
		t.Fatal("a refused mirror answers locally")
	}
	answer, err := m.MayExist(context.Background(), "never")
	if err != nil || answer.Local {
		t.Fatalf("a refused mirror's MayExist: %+v, %v (expected the gate's answer)", answer, err)
	}
}

// A filter larger than MaxFilterBytes is refused before any byte is sent; a copy that grows past it is
// dropped, and attaching again is refused by the gate.
func TestAMirrorRefusesAFilterLargerThanItsLimit(t *testing.T) {
	gate := mirroredGate(t, "")
	c := newClient(t, []string{gate.addr}, "growing", WithDeadline(patience))
	assertRefused(t, newMirror(t, c, MirrorOptions{MaxFilterBytes: 64}), codes.ResourceExhausted, "max_filter_bytes (64)")

	sized := newMirror(t, c, MirrorOptions{})
	waitHolding(t, sized)
	// The namespace's first window (made by the first Add) holds a layer of the base geometry.
	initial := sized.copy.Load().filter.base.bytes()
	sized.Close()
	capped := newMirror(t, c, MirrorOptions{MaxFilterBytes: initial})
	waitHolding(t, capped)
	// The Add waits for the dropped mirror's sub-lease to end at the gate, while the mirror, refused, tries
	// again: its own refusal is watched meanwhile.
	added := make(chan error, 1)
	go func() {
		_, err := c.Add(context.Background(), numbered("grow", 2000))
		added <- err
	}()
	eventually(t, "the grown copy is dropped", func() bool {
		return strings.Contains(status.Convert(capped.Err()).Message(), "grew to")
	})
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	if status.Code(capped.Err()) != codes.ResourceExhausted || capped.copy.Load() != nil {
		t.Fatalf("after growing past its limit: %v, copy kept: %v", capped.Err(), capped.copy.Load() != nil)
	}
	assertRefused(t, capped, codes.ResourceExhausted, fmt.Sprintf("max_filter_bytes (%d)", initial))
}

// A token without the mirror role is refused with PERMISSION_DENIED, which WaitReady returns; with the
// role the same mirror attaches.
func TestAMirrorWithoutTheMirrorRoleIsDenied(t *testing.T) {
	tokens := ""
	for name, roles := range map[string]string{"reader": `["read", "write"]`, "mirror": `["read", "mirror"]`} {
		tokens += fmt.Sprintf("[[tokens]]\nname = %q\nsha256 = \"%x\"\nroles = %s\nnamespaces = [\"users\"]\n\n",
			name, sha256.Sum256([]byte(name+"-secret")), roles)
	}
	gate := mirroredGate(t, tokens)
	reader := newClient(t, []string{gate.addr}, "users", WithToken("reader-secret"))
	assertRefused(t, newMirror(t, reader, MirrorOptions{}), codes.PermissionDenied, "mirror")
	mirror := newClient(t, []string{gate.addr}, "users", WithToken("mirror-secret"))
	m := newMirror(t, mirror, MirrorOptions{})
	waitHolding(t, m)
	waitAbsentLocally(t, m, "never")
}

// A client closed under its mirror ends the mirror too (its channel is gone, no attachment can succeed):
// its keeper stops trying, it answers nothing locally, and WaitReady says CANCELED instead of waiting.
func TestAMirrorOfAClosedClientStops(t *testing.T) {
	gate := mirroredGate(t, "")
	c, err := NewGateClient([]string{gate.addr}, "users")
	if err != nil {
		t.Fatal(err)
	}
	m := newMirror(t, c, MirrorOptions{})
	waitHolding(t, m)
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	eventually(t, "the mirror stops", func() bool { return status.Code(m.WaitReady(ctx)) == codes.Canceled })
	eventually(t, "its keeper ends", func() bool {
		select {
		case <-m.done:
			return true
		default:
			return false
		}
	})
	if m.AbsentLocally("never") || m.HoldsSublease() {
		t.Fatal("the mirror of a closed client answers locally")
	}
}
