package existencegate

import (
	"net"
	"sync"
	"testing"
)

// link forwards TCP connections to a target that can change (a gate restarted elsewhere), and can go
// silent: bytes stop flowing both ways while every connection stays open, as on a partition TCP outlasts
// or a stalled peer, so that nothing tells the mirror its gate is gone.
type link struct {
	ln net.Listener

	mu      sync.Mutex
	target  string
	silent  bool
	resumed *sync.Cond
	conns   map[net.Conn]struct{}
}

func startLink(t *testing.T, target string) *link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &link{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	l.resumed = sync.NewCond(&l.mu)
	go l.serve()
	t.Cleanup(func() {
		ln.Close()
		l.setSilent(false)
		l.mu.Lock()
		for c := range l.conns {
			c.Close()
		}
		l.mu.Unlock()
	})
	return l
}

func (l *link) addr() string { return l.ln.Addr().String() }

// retarget sends new connections to target.
func (l *link) retarget(target string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.target = target
}

func (l *link) setSilent(silent bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.silent = silent
	l.resumed.Broadcast()
}

func (l *link) serve() {
	for {
		down, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		target := l.target
		l.mu.Unlock()
		up, err := net.Dial("tcp", target)
		if err != nil {
			down.Close()
			continue
		}
		l.mu.Lock()
		l.conns[down], l.conns[up] = struct{}{}, struct{}{}
		l.mu.Unlock()
		go l.pipe(up, down)
		go l.pipe(down, up)
	}
}

// pipe copies src to dst, holding each read back while the link is silent.
func (l *link) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			l.mu.Lock()
			for l.silent {
				l.resumed.Wait()
			}
			l.mu.Unlock()
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
