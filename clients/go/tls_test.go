package existencegate

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// testPKI is a throwaway CA with a server certificate for localhost and a client certificate, made with
// the standard library (no openssl).
type testPKI struct {
	dir        string // ca.pem, server.pem, server.key
	roots      *x509.CertPool
	clientCert tls.Certificate
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	serial := int64(0)
	issue := func(template *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		serial++
		template.SerialNumber = big.NewInt(serial)
		template.NotBefore = time.Now().Add(-time.Hour)
		template.NotAfter = time.Now().Add(24 * time.Hour)
		template.BasicConstraintsValid = true
		if parent == nil {
			parent, parentKey = template, key
		}
		der, err := x509.CreateCertificate(rand.Reader, template, parent, &key.PublicKey, parentKey)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	}
	ca, caKey, caPEM, _ := issue(&x509.Certificate{Subject: pkix.Name{CommonName: "existence-gate test CA"}, IsCA: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}, nil, nil)
	_, _, serverPEM, serverKey := issue(&x509.Certificate{Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca, caKey)
	_, _, clientPEM, clientKey := issue(&x509.Certificate{Subject: pkix.Name{CommonName: "go-client-test"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, ca, caKey)
	for name, data := range map[string][]byte{"ca.pem": caPEM, "server.pem": serverPEM, "server.key": serverKey} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pki := &testPKI{dir: dir, roots: x509.NewCertPool()}
	pki.roots.AddCert(ca)
	var err error
	if pki.clientCert, err = tls.X509KeyPair(clientPEM, clientKey); err != nil {
		t.Fatal(err)
	}
	return pki
}

// TestTLS runs the client against a gate that serves gRPC over TLS and requires client certificates.
func TestTLS(t *testing.T) {
	pki := newTestPKI(t)
	server, err := startGate(namespaceConfig("tls"),
		"--tls-cert", filepath.Join(pki.dir, "server.pem"), "--tls-key", filepath.Join(pki.dir, "server.key"),
		"--tls-client-ca", filepath.Join(pki.dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(server.stop)
	addrs := []string{server.addr} // 127.0.0.1:PORT; the certificate names localhost, hence ServerName
	mutual := &tls.Config{RootCAs: pki.roots, ServerName: "localhost", Certificates: []tls.Certificate{pki.clientCert}}
	ctx := context.Background()

	// Mutual TLS, coalesced (the default).
	client := newClient(t, addrs, "tls", WithTransportCredentials(credentials.NewTLS(mutual)), WithDeadline(5*time.Second))
	p := uniq()
	var added, never []string
	for i := 0; i < 32; i++ {
		added = append(added, fmt.Sprintf("%sadded-%d", p, i))
		never = append(never, fmt.Sprintf("%snever-%d", p, i))
	}
	eventually(t, "Add over mutual TLS", func() bool {
		_, err := client.Add(ctx, added)
		return err == nil
	})
	eventually(t, "the gate is ready", func() bool {
		a, err := client.MayExist(ctx, added[0])
		return err == nil && !a.Warming
	})

	// The same credentials given as a plain dial option (grpc.WithTransportCredentials), uncoalesced: the
	// reference answers.
	unary := newClient(t, addrs, "tls", WithCoalesceWindow(0), WithDeadline(5*time.Second),
		WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(mutual.Clone()))))
	keys := append(append([]string{}, added...), never...)
	want := map[string]bool{}
	absent := 0
	for _, key := range keys {
		a, err := unary.MayExist(ctx, key)
		if err != nil {
			t.Fatalf("unary MayExist(%q) over mutual TLS: %v", key, err)
		}
		want[key] = a.MayExist
		if !a.MayExist {
			absent++
		}
	}
	if absent == 0 {
		t.Fatal("no never-added key was answered absent")
	}

	before := client.Stats()
	var wg sync.WaitGroup
	errs := make(chan string, len(keys))
	for _, key := range keys {
		wg.Add(1)
		go func(key string) {
			defer wg.Done()
			a, err := client.MayExist(ctx, key)
			switch {
			case err != nil:
				errs <- fmt.Sprintf("MayExist(%q): %v", key, err)
			case a.MayExist != want[key]:
				errs <- fmt.Sprintf("MayExist(%q) = %v, unary %v", key, a.MayExist, want[key])
			}
		}(key)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	for _, key := range added {
		if !want[key] {
			t.Errorf("added key %q answered absent", key)
		}
	}
	after := client.Stats()
	if got := after.BatchedKeys - before.BatchedKeys; got != uint64(len(keys)) {
		t.Errorf("batched keys %d, want %d (every lookup coalesced)", got, len(keys))
	}
	if u := unary.Stats(); u.BatchedKeys != 0 {
		t.Errorf("the uncoalesced client batched %d keys", u.BatchedKeys)
	}

	// The reader's invalidation subscription runs over the same credentials.
	reader := NewGatedReader(client, func(ctx context.Context, key string) (string, SourceStatus, error) {
		return "", Missing, nil
	})
	defer reader.Close()
	waitCtx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	if err := reader.WaitLive(waitCtx); err != nil {
		t.Errorf("subscription over mutual TLS: %v", err)
	}

	// Refused: no client certificate, plaintext, and a server name the certificate does not have.
	refused := map[string][]Option{
		"no client certificate": {WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pki.roots, ServerName: "localhost"}))},
		"plaintext":             nil,
		"no ServerName (127.0.0.1 is not in the certificate)": {WithTransportCredentials(credentials.NewTLS(
			&tls.Config{RootCAs: pki.roots, Certificates: []tls.Certificate{pki.clientCert}}))},
	}
	for name, opts := range refused {
		c := newClient(t, addrs, "tls", append(opts, WithDeadline(2*time.Second))...)
		if _, err := c.Add(ctx, []string{p + "refused"}); err == nil {
			t.Errorf("%s: Add succeeded", name)
		} else {
			t.Logf("%s: refused: %v", name, err)
		}
		if _, err := c.MayExist(ctx, added[0]); err == nil {
			t.Errorf("%s: MayExist succeeded", name)
		}
	}
}
