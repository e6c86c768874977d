package existencegate

import (
	"context"
	"encoding/binary"
	"errors"

	"io"
	"math"
	"math/bits"
	"time"

	"github.com/existence-gate/existence-gate/clients/go/existencepb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The goroutine that keeps a mirror's copy: attach, download, follow, and attach again when the stream
// ends.

const (
	mirrorFirstBackoff = 200 * time.Millisecond
	mirrorMaxBackoff   = 5 * time.Second
	// unansweredAsks is how many asks a gate that stopped granting may leave unanswered before the
	// oldest are forgotten.
	unansweredAsks = 16
)

// errResync ends a stream the gate ended with RESYNC: attach again at once, with a fresh download.
var errResync = errors.New("existencegate: the gate sent RESYNC")

// keep attaches, follows until the stream ends, and attaches again until the mirror is closed. When a
// stream ends the sub-lease is dropped before anything else: the gate may already count this mirror as
// gone, and acknowledge Adds it never sent it.
func (m *Mirror) keep(ctx context.Context) {
	defer close(m.done)
	backoff := mirrorFirstBackoff
	for {
		index := m.client.firstUp()
		err := m.follow(ctx, index)
		m.setHoldsUntil(0)
		m.copy.Store(nil)
		if ctx.Err() != nil {
			m.setState(mirrorState{err: closedError()})
			return
		}
		if status.Code(err) == codes.Unavailable {
			m.client.addrs[index].markDown(time.Now())
		}
		if errors.Is(err, errResync) || errors.Is(err, io.EOF) {
			backoff = mirrorFirstBackoff
		}
		m.setState(mirrorState{err: err})
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			m.setState(mirrorState{err: closedError()})
			return
		case <-m.client.closed:
			// Its channels are closed: no attachment can succeed again.
			m.setState(mirrorState{err: closedError()})
			return
		}
		if backoff *= 2; backoff > mirrorMaxBackoff {
			backoff = mirrorMaxBackoff
		}
	}
}

// follow attaches to the client's address index, downloads the copy and follows the stream until it ends.
func (m *Mirror) follow(ctx context.Context, index int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := m.client
	stream, err := existencepb.NewMirrorClient(c.addrs[index].conn).Attach(c.withToken(ctx))
	if err != nil {
		return err
	}
	open := &existencepb.MirrorOpen{Namespace: c.namespace, MaxFilterBytes: m.options.MaxFilterBytes}
	if err := stream.Send(&existencepb.MirrorRequest{Request: &existencepb.MirrorRequest_Open{Open: open}}); err != nil {
		return streamError(stream, err)
	}
	header, copy, err := download(stream, m.options.MaxFilterBytes)
	if err != nil {
		return err
	}
	m.copy.Store(copy)
	f := &following{
		mirror: m,
		stream: stream,
		lease: sublease{terms: leaseTerms{length: header.SubleaseNs, driftPPM: header.MaxClockDriftPpm,
			margin: header.MarginNs}},
		applied:  header.Seq,
		askEvery: quarter(header.SubleaseNs),
	}
	m.applied.Store(header.Seq)
	// The copy is the gate's filter as of the header's seq: acknowledged like an applied Add, since the
	// gate renews a sub-lease only once the previous grant's seq is acknowledged.
	if err := f.acknowledge(header.Seq); err != nil {
		return err
	}
	c.addrs[index].markUp()
	c.mirrorAttaches.Add(1)
	m.setState(mirrorState{attached: true})
	return f.run(ctx, receive(ctx, stream))
}

// streamError is the status a stream ended with when a Send failed (Send itself only says io.EOF).
func streamError(stream existencepb.Mirror_AttachClient, err error) error {
	if errors.Is(err, io.EOF) {
		if _, recvErr := stream.Recv(); recvErr != nil {
			return recvErr
		}
	}
	return err
}

func tooLarge(bytes, limit uint64) error {
	return status.Errorf(codes.ResourceExhausted,
		"existencegate: the mirror's filter grew to %d bytes, more than its MaxFilterBytes (%d)", bytes, limit)
}

// received is one message of the stream, or how it ended.
type received struct {
	update *existencepb.MirrorUpdate
	err    error
}

// receive reads the stream on a goroutine of its own, so that the follower can ask for sub-leases on
// time while no message comes (a gate that stopped answering must not hold the asks back).
func receive(ctx context.Context, stream existencepb.Mirror_AttachClient) <-chan received {
	updates := make(chan received, 64)
	go func() {
		for {
			update, err := stream.Recv()
			select {
			case updates <- received{update, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return updates
}

// following is one attachment's state: what it applied and its sub-lease.
type following struct {
	mirror  *Mirror
	stream  existencepb.Mirror_AttachClient
	lease   sublease
	applied uint64
	// asked holds the asks not yet answered, oldest first.
	asked  []ask
	nextID uint64
	// askEvery is a quarter of the latest grant's length (at first, of the longest the gate grants): a
	// replica grants no longer than its own read lease has left, often far less than its sublease.
	askEvery time.Duration
}

// ask is a LeaseAsk's id and when it was sent on the mirror's clock.
type ask struct {
	id, at uint64
}

func (f *following) run(ctx context.Context, updates <-chan received) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
			if err := f.ask(); err != nil {
				return err
			}
			timer.Reset(f.askEvery)
		case r := <-updates:
			if r.err != nil {
				return r.err
			}
			if err := f.handle(r.update); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (f *following) handle(update *existencepb.MirrorUpdate) error {
	switch u := update.Update.(type) {
	case *existencepb.MirrorUpdate_Added:
		return f.apply(u.Added)
	case *existencepb.MirrorUpdate_Grant:
		f.granted(u.Grant)
		return nil
	case *existencepb.MirrorUpdate_Resync:
		f.mirror.client.mirrorResyncs.Add(1)
		return errResync
	case *existencepb.MirrorUpdate_Header, *existencepb.MirrorUpdate_Words:
		return status.Error(codes.Internal, "existencegate: the gate sent a second filter on one mirror stream")
	}
	return nil
}

// ask sends a LeaseAsk, noting when: the sub-lease is counted from the moment it was asked for.
func (f *following) ask() error {
	f.nextID++
	at := f.mirror.clock.now()
	request := &existencepb.MirrorRequest{Request: &existencepb.MirrorRequest_Ask{Ask: &existencepb.LeaseAsk{Id: f.nextID}}}
	if err := f.stream.Send(request); err != nil {
		return streamError(f.stream, err)
	}
	if len(f.asked) >= unansweredAsks {
		f.asked = f.asked[1:]
	}
	f.asked = append(f.asked, ask{id: f.nextID, at: at})
	return nil
}

// apply inserts an Add's keys at its time, publishes, and acknowledges it. A copy grown past
// MaxFilterBytes ends the attachment (and is dropped).
func (f *following) apply(added *existencepb.MirroredAdd) error {
	m := f.mirror
	copy := m.copy.Load()
	hashes := make([]uint64, len(added.Keys))
	for i, key := range added.Keys {
		hashes[i] = copy.hasher.hash(string(key))
	}
	copy.filter.insertMany(hashes, added.AtMs)
	if bytes := copy.filter.bytes(); bytes > m.options.MaxFilterBytes {
		return tooLarge(bytes, m.options.MaxFilterBytes)
	}
	f.applied = added.Seq
	f.publish()
	return f.acknowledge(added.Seq)
}

func (f *following) acknowledge(seq uint64) error {
	applied := &existencepb.MirrorRequest{Request: &existencepb.MirrorRequest_Applied{Applied: &existencepb.MirrorApplied{Seq: seq}}}
	if err := f.stream.Send(applied); err != nil {
		return streamError(f.stream, err)
	}
	return nil
}

// granted takes a grant for one of the asks sent (older asks are forgotten: their grants would end
// earlier). A refusal (length 0) changes nothing: the sub-lease held runs out.
func (f *following) granted(grant *existencepb.LeaseGrant) {
	position := -1
	for i, a := range f.asked {
		if a.id == grant.Id {
			position = i
			break
		}
	}
	if position < 0 {
		return
	}
	asked := f.asked[position].at
	f.asked = f.asked[position+1:]
	if grant.LengthNs == 0 {
		return
	}
	m := f.mirror
	m.client.mirrorGrants.Add(1)
	f.askEvery = quarter(grant.LengthNs)
	m.nowMs.Store(grant.NowMs)
	// Before the sub-lease is published: a lookup that sees it holding sees this grant's bound.
	observable := grant.ObservableSeq
	if observable == 0 {
		observable = math.MaxUint64
	}
	m.observable.Store(observable)
	// Windows no longer live at the gate's time free their memory, as the gate's do.
	m.copy.Load().filter.expire(grant.NowMs)
	f.lease.granted(asked, grant.LengthNs, grant.FromSeq)
	f.publish()
	m.notify()
}

// publish makes the applied seq and the sub-lease visible to lookups, after the filter changes they
// cover.
func (f *following) publish() {
	m := f.mirror
	m.applied.Store(f.applied)
	m.setHoldsUntil(f.lease.holdingUntil(f.applied))
}

// quarter is how often a mirror asks to keep a sub-lease of length ns: a quarter of it, at least 1 ms.
func quarter(length uint64) time.Duration {
	every := time.Duration(length / 4)
	if every < time.Millisecond {
		every = time.Millisecond
	}
	return every
}

// download reads the header and the layers' words: the copy as of the header's seq.
//
// A filter the header announces over limit is refused before any of it is allocated: the gate refuses one
// itself, but the limit is this process's memory, so it does not rest on the gate alone.
func download(stream existencepb.Mirror_AttachClient, limit uint64) (*existencepb.MirrorHeader, *mirrorCopy, error) {
	first, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	header := first.GetHeader()
	if header == nil {
		return nil, nil, status.Error(codes.Internal, "existencegate: the gate's mirror stream did not begin with its header")
	}
	spec, err := specOf(header)
	if err != nil {
		return nil, nil, err
	}
	if announced := announcedBytes(header); announced > limit {
		return nil, nil, status.Errorf(codes.ResourceExhausted,
			"existencegate: the gate's filter takes %d bytes, more than this mirror's MaxFilterBytes (%d)", announced, limit)
	}
	words := &wordStream{stream: stream}
	windows := make([]filterWindow, 0, len(header.FilterWindows))
	for _, w := range header.FilterWindows {
		window := filterWindow{id: w.Id}
		for _, l := range w.Layers {
			layer, err := words.layer(l)
			if err != nil {
				return nil, nil, err
			}
			window.layers = append(window.layers, layer)
		}
		if len(window.layers) == 0 || window.layers[0].geometry != spec.baseGeometry() {
			return nil, nil, status.Errorf(codes.Internal, "existencegate: window %d's first layer is not the sizing's "+
				"(%+v): this library sizes layers unlike the gate", w.Id, spec.baseGeometry())
		}
		windows = append(windows, window)
	}
	return header, &mirrorCopy{filter: newWindowedFilter(spec, windows), hasher: newFilterHasher(header.HashSeed)}, nil
}

// announcedBytes is what the header's layers take, saturating rather than wrapping.
func announcedBytes(header *existencepb.MirrorHeader) uint64 {
	var total uint64
	for _, w := range header.FilterWindows {
		for _, l := range w.Layers {
			hi, bytes := bits.Mul64(l.Blocks, 64)
			if sum := total + bytes; hi == 0 && sum >= total {
				total = sum
			} else {
				total = math.MaxUint64
			}
		}
	}
	return total
}

// specOf is the sizing the header carries, refused when implausible.
func specOf(header *existencepb.MirrorHeader) (filterSpec, error) {
	spec := filterSpec{expectedKeys: header.ExpectedKeys, falsePositiveRate: header.FalsePositiveRate,
		retentionMs: header.RetentionMs, windows: header.Windows, maxBytes: header.MaxFilterBytes}
	if !(spec.falsePositiveRate > 0 && spec.falsePositiveRate < 1) || (spec.retentionMs != 0 && spec.windows < 2) {
		return spec, status.Errorf(codes.Internal, "existencegate: the gate's filter sizing is implausible (%+v)", spec)
	}
	return spec, nil
}

// wordStream hands out the layers' words as FilterWords messages bring them, in header order.
type wordStream struct {
	stream  existencepb.Mirror_AttachClient
	pending []byte
}

// layer reads the words of the layer l announces.
func (s *wordStream) layer(l *existencepb.FilterLayer) (*bloomLayer, error) {
	g := geometry{blocks: l.Blocks, probes: l.Probes, capacity: l.Capacity}
	if g.blocks == 0 || g.blocks > maxLayerBytes/64 || g.probes < 1 || g.probes > maxProbes || l.Inserted > g.blocks*blockBits {
		return nil, status.Errorf(codes.Internal, "existencegate: the gate announced a layer of %d blocks, %d probes, %d keys",
			l.Blocks, l.Probes, l.Inserted)
	}
	layer := newBloomLayer(g)
	for filled := 0; filled < len(layer.words); {
		if len(s.pending) < 8 {
			if err := s.next(); err != nil {
				return nil, err
			}
			continue
		}
		n := len(s.pending) / 8
		if rest := len(layer.words) - filled; n > rest {
			n = rest
		}
		for i := 0; i < n; i++ {
			layer.words[filled+i] = binary.LittleEndian.Uint64(s.pending[8*i:])
		}
		filled += n
		s.pending = s.pending[8*n:]
	}
	layer.inserted.Store(l.Inserted)
	return layer, nil
}

func (s *wordStream) next() error {
	update, err := s.stream.Recv()
	if err != nil {
		return err
	}
	chunk := update.GetWords()
	if chunk == nil {
		return status.Error(codes.Internal, "existencegate: the gate's filter ended before its words did")
	}
	if len(s.pending) == 0 {
		s.pending = chunk.Words
	} else {
		s.pending = append(s.pending, chunk.Words...)
	}
	return nil
}
