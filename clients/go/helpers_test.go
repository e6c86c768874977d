package existencegate

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/existence-gate/existence-gate/clients/go/existencepb"
	"google.golang.org/grpc"
)

// patience bounds every wait for a condition.
const patience = 30 * time.Second

// gateServer is a real existence-gate process serving on free loopback ports.
type gateServer struct {
	addr string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

// testNamespaces are configured on the shared server, one per test that writes.
var testNamespaces = []string{"coalesce", "unary", "cancel", "invalid", "failopen", "multi", "reader", "warming",
	"resume", "many", "batching", "closing"}

var shared *gateServer

// second is a server with a tiny replay buffer (so a subscriber that misses a few Adds gets a RESYNC) and
// a token, started by the first test that needs it.
var (
	second     *gateServer
	secondErr  error
	secondOnce sync.Once
)

const resyncToken = "go-client-test-token"

func resyncServer(t *testing.T) *gateServer {
	t.Helper()
	secondOnce.Do(func() {
		hash := sha256.Sum256([]byte(resyncToken))
		config := "[limits]\nreplay_buffer_bytes = 4096\n\n[[tokens]]\nname = \"tests\"\n" +
			fmt.Sprintf("sha256 = \"%x\"\n", hash) + "roles = [\"read\", \"write\"]\nnamespaces = [\"*\"]\n\n" +
			namespaceConfig("resync")
		second, secondErr = startGate(config)
	})
	if secondErr != nil {
		t.Fatal(secondErr)
	}
	return second
}

func namespaceConfig(name string) string {
	return fmt.Sprintf("[namespaces.%s]\nexpected_keys = 100000\nmissing_ttl = \"30s\"\ndeleted_ttl = \"10m\"\n"+
		"ttl_jitter = 0.0\nmax_ttl = \"1h\"\n\n", name)
}

var grpcAddrLine = regexp.MustCompile(`grpc_addr=([0-9.:]+)`)
var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

// startGate starts a server with config and extra serve arguments; it fails when it does not serve.
func startGate(config string, args ...string) (*gateServer, error) {
	bin := os.Getenv("EXISTENCE_GATE_BIN")
	if bin == "" {
		return nil, fmt.Errorf("EXISTENCE_GATE_BIN is not set (the existence-gate server binary)")
	}
	dir, err := os.MkdirTemp("", "existence-gate-go-test")
	if err != nil {
		return nil, err
	}
	configPath := filepath.Join(dir, "gate.toml")
	if err := os.WriteFile(configPath, []byte(config), 0o600); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve", "--in-memory", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--resp-listen", "127.0.0.1:0",
		"--config", configPath)
	cmd.Args = append(cmd.Args, args...)
	// Stopped at once on SIGTERM: these tests are about the client, not the drain delay a balancer needs.
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "EXISTENCE_GATE_DRAIN_DELAY=0s")
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// A test binary that is killed takes its servers with it; test.sh also stops every pid listed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if pids := os.Getenv("EXISTENCE_GATE_TEST_PIDS"); pids != "" {
		if f, err := os.OpenFile(pids, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			fmt.Fprintln(f, cmd.Process.Pid)
			f.Close()
		}
	}
	s := &gateServer{cmd: cmd, log: logFile, done: make(chan struct{})}
	go func() { cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(patience)
	for s.addr == "" {
		text, _ := os.ReadFile(logFile.Name())
		if m := grpcAddrLine.FindSubmatch(ansi.ReplaceAll(text, nil)); m != nil {
			s.addr = string(m[1])
			break
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("the server exited; its log:\n%s", text)
		default:
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("the server did not serve within %v; its log:\n%s", patience, text)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s, nil
}

// stop sends SIGTERM and waits for the process (SIGKILL after the patience).
func (s *gateServer) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(patience):
		s.cmd.Process.Kill()
		<-s.done
	}
	s.log.Close()
	os.RemoveAll(filepath.Dir(s.log.Name()))
}

func TestMain(m *testing.M) {
	var config strings.Builder
	for _, ns := range testNamespaces {
		config.WriteString(namespaceConfig(ns))
	}
	var err error
	shared, err = startGate(config.String())
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	code := m.Run()
	shared.stop()
	if second != nil {
		second.stop()
	}
	if benchGate != nil {
		benchGate.stop()
	}
	os.Exit(code)
}

// rawStub is a plain generated client of addr, to check what the gate answers without the library.
func rawStub(t *testing.T, addr string) existencepb.ExistenceGateClient {
	t.Helper()
	conn, err := grpc.Dial(addr, grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return existencepb.NewExistenceGateClient(conn)
}

func rawAnswer(t *testing.T, stub existencepb.ExistenceGateClient, namespace, key string) *existencepb.MayExistResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	reply, err := stub.MayExist(ctx, &existencepb.MayExistRequest{Namespace: namespace, Key: []byte(key)})
	if err != nil {
		t.Fatalf("MayExist(%q): %v", key, err)
	}
	return reply
}

func newClient(t *testing.T, addrs []string, namespace string, opts ...Option) *GateClient {
	t.Helper()
	c, err := NewGateClient(addrs, namespace, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitReady waits until the gate answers lookups of namespace without WARMING.
func waitReady(t *testing.T, addr, namespace string) {
	t.Helper()
	stub := rawStub(t, addr)
	eventually(t, "the gate is ready", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		reply, err := stub.MayExist(ctx, &existencepb.MayExistRequest{Namespace: namespace, Key: []byte("ready?")})
		return err == nil && reply.Basis != existencepb.Basis_BASIS_WARMING
	})
}

var uniqCount atomic.Uint64

// uniq is a key prefix of its own for each test run, so that a test can run again (go test -count=N)
// against the same server.
func uniq() string { return fmt.Sprintf("%d.%d/", os.Getpid(), uniqCount.Add(1)) }

// eventually polls condition until it holds, failing the test after the patience.
func eventually(t *testing.T, what string, condition func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !condition() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", patience, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// deadAddress is a loopback address nothing listens on.
// silentAddress is an address that accepts connections (so a client's connection is up) and never answers,
// as a stopped process's: closed when the test ends.
func silentAddress(t *testing.T) string {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	go func() {
		var held []net.Conn
		for {
			conn, err := silent.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, conn)
		}
	}()
	return silent.Addr().String()
}

func deadAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// proxy forwards TCP connections to a target that can change (a gate restarted elsewhere), as a network
// would and as it fails: cut drops every connection and can refuse new ones; silent stops bytes flowing both
// ways while every connection stays open (a partition TCP outlasts, or a stalled peer), so that nothing
// tells the client its gate is gone.
type proxy struct {
	ln net.Listener

	mu      sync.Mutex
	target  string
	refuse  bool
	silent  bool
	resumed *sync.Cond
	conns   map[net.Conn]struct{}
	accepts int
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.resumed = sync.NewCond(&p.mu)
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.setSilent(false); p.cut(true) })
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse, target := p.refuse, p.target
		p.mu.Unlock()
		if refuse {
			down.Close()
			continue
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		p.conns[down] = struct{}{}
		p.conns[up] = struct{}{}
		p.accepts++
		p.mu.Unlock()
		go p.pipe(up, down)
		go p.pipe(down, up)
	}
}

// pipe copies src to dst, holding each read back while the proxy is silent.
func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.silent {
				p.resumed.Wait()
			}
			p.mu.Unlock()
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// cut closes every forwarded connection; refuse says whether new ones are refused until resume.
func (p *proxy) cut(refuse bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = refuse
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
}

func (p *proxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = false
}

// retarget sends new connections to target.
func (p *proxy) retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// setSilent holds every byte (silent) or lets what was held flow on.
func (p *proxy) setSilent(silent bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.silent = silent
	p.resumed.Broadcast()
}

// memorySource is a stand-in database: rows, soft-deleted rows, reads counted per key, an optional delay.
type memorySource struct {
	mu      sync.Mutex
	rows    map[string]string
	deleted map[string]bool
	reads   map[string]int
	delay   time.Duration
}

func newMemorySource() *memorySource {
	return &memorySource{rows: map[string]string{}, deleted: map[string]bool{}, reads: map[string]int{}}
}

func (s *memorySource) load(_ context.Context, key string) (string, SourceStatus, error) {
	s.mu.Lock()
	delay := s.delay
	s.mu.Unlock()
	time.Sleep(delay)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads[key]++
	if s.deleted[key] {
		return "", Deleted, nil
	}
	if v, ok := s.rows[key]; ok {
		return v, Found, nil
	}
	return "", Missing, nil
}

func (s *memorySource) set(key, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rows[key] = value
	delete(s.deleted, key)
}

func (s *memorySource) remove(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.rows, key)
	s.deleted[key] = true
}

func (s *memorySource) readsOf(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads[key]
}

func (s *memorySource) setDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}
