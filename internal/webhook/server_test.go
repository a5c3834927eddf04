package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/netop-dev/netop/internal/pki"
)

var allow = HandlerFunc(func(context.Context, *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Allowed: true}
})

func post(t *testing.T, h http.Handler, method, contentType, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, "/x", strings.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// Malformed reviews get a 400-class answer with a message, never a crash.
func TestReviewHandlerRejectsMalformedReviews(t *testing.T) {
	h := ReviewHandler(context.Background(), allow)
	for _, tc := range []struct {
		name, method, contentType, body string
		code                            int
		message                         string
	}{
		{"not json", http.MethodPost, "application/json", "{", 400, "decoding admission review"},
		{"wrong kind", http.MethodPost, "application/json", `{"apiVersion":"v1","kind":"Pod"}`, 400, "expected an admission.k8s.io/v1 AdmissionReview"},
		{"no request", http.MethodPost, "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, 400, "no request"},
		{"no uid", http.MethodPost, "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}`, 400, "no request uid"},
		{"GET", http.MethodGet, "application/json", "", 405, "POSTed"},
		{"yaml", http.MethodPost, "application/yaml", "a: b", 415, "not application/json"},
		{"too large", http.MethodPost, "application/json", `{"x":"` + strings.Repeat("a", MaxRequestBytes) + `"}`, 413, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := post(t, h, tc.method, tc.contentType, tc.body)
			if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.message) {
				t.Fatalf("got %d %q, want %d with %q", rec.Code, rec.Body.String(), tc.code, tc.message)
			}
		})
	}

	rec := post(t, h, http.MethodPost, "application/json; charset=utf-8",
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1"}}`)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"uid":"u-1"`) || !strings.Contains(rec.Body.String(), `"allowed":true`) {
		t.Fatalf("valid review: %d %s", rec.Code, rec.Body.String())
	}
}

func FuzzDecodeReview(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"a":1}}}`))
	f.Add([]byte(`{"request":null}`))
	f.Add([]byte(`[]`))
	h := ReviewHandler(context.Background(), allow)
	f.Fuzz(func(t *testing.T, body []byte) {
		review, err := DecodeReview(body)
		if err == nil && (review.Request == nil || review.Request.UID == "") {
			t.Fatal("accepted a review without a request uid")
		}
		rec := post(t, h, http.MethodPost, "application/json", string(body))
		if (err == nil) != (rec.Code == 200) {
			t.Fatalf("DecodeReview error %v but handler answered %d", err, rec.Code)
		}
	})
}

type memStore struct{ b *Bundle }

func (m *memStore) Load(context.Context) (*Bundle, error) { return m.b, nil }
func (m *memStore) Save(_ context.Context, b *Bundle) error {
	c := *b
	m.b = &c
	return nil
}

// The stored CA and certificate are reused; a certificate that no longer
// covers the names, or is near expiry, is replaced under the same CA.
func TestCertManagerReusesAndRenews(t *testing.T) {
	store := &memStore{}
	serving := pki.ServingCert{CommonName: "w", IPs: []net.IP{net.ParseIP("127.0.0.1")}, Validity: time.Hour}
	m := NewCertManager(store, serving)
	if err := m.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	first := *store.b
	if err := NewCertManager(store, serving).Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(store.b.Cert, first.Cert) || !bytes.Equal(store.b.CACert, first.CACert) {
		t.Fatal("a current certificate was replaced")
	}
	if serving.Current(first.Cert, time.Now().Add(41*time.Minute)) {
		t.Fatal("a certificate with less than a third of its life left counts as current")
	}
	moved := serving
	moved.DNSNames = []string{"netop-webhook.netop-system.svc"}
	if err := NewCertManager(store, moved).Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(store.b.Cert, first.Cert) || !bytes.Equal(store.b.CACert, first.CACert) {
		t.Fatal("a certificate for other names was kept, or the CA changed")
	}
}

// The server speaks TLS 1.3, or TLS 1.2 with AEAD suites, only, with a
// certificate the CA bundle verifies.
func TestServerTLS(t *testing.T) {
	m := NewCertManager(&memStore{}, pki.ServingCert{CommonName: "w", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err := m.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- NewServer(m, DefaultLimits()).Run(ctx, l) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	}()

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(m.CABundle())
	if _, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS11}); err == nil {
		t.Fatal("a TLS 1.1 handshake succeeded")
	}
	conn, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("TLS 1.2+ handshake with the CA bundle: %v", err)
	}
	_ = conn.Close()

	// TLS 1.2 only with ECDHE and AEAD: a client offering nothing but a
	// CBC suite is refused, one offering an AEAD suite is served.
	for _, tc := range []struct {
		suite uint16
		ok    bool
	}{
		{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, false},
		{tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA, false},
		{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256, false},
		{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, true},
		{tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, true},
		{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, true},
	} {
		conn, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{
			RootCAs: pool, MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tc.suite},
		})
		if (err == nil) != tc.ok {
			t.Errorf("TLS 1.2 with only %s: error %v, want accepted=%v", tls.CipherSuiteName(tc.suite), err, tc.ok)
		}
		if err == nil {
			_ = conn.Close()
		}
	}
	conn, err = tls.Dial("tcp", l.Addr().String(), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatalf("TLS 1.3 handshake: %v", err)
	}
	_ = conn.Close()
}

// A CA made anew (its Secret deleted) is handed over for re-registration,
// so the API server can keep calling the webhooks.
func TestRenewLoopReportsANewCA(t *testing.T) {
	store := &memStore{}
	m := NewCertManager(store, pki.ServingCert{CommonName: "w", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err := m.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	old := m.CABundle()
	store.b = nil
	got := make(chan []byte, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go m.RenewLoop(ctx, 10*time.Millisecond, func(_ context.Context, ca []byte) error {
		select {
		case got <- ca:
		default:
		}
		return nil
	})
	select {
	case ca := <-got:
		if bytes.Equal(ca, old) || !bytes.Equal(ca, m.CABundle()) {
			t.Fatal("the reported CA is not the new one")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a new CA was never reported")
	}
}

// A gated handler holds a request until it opens, answers 503 if it stays
// shut for the whole wait, and passes everything once open.
func TestGate(t *testing.T) {
	served := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("served")) })
	ready := make(chan struct{})
	gate := Gate(ready, 50*time.Millisecond, served)
	if rec := post(t, gate, http.MethodPost, "application/json", "{}"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "not synced") {
		t.Errorf("shut: %d %q, want 503 saying the caches are not synced", rec.Code, rec.Body)
	}

	held := Gate(ready, time.Minute, served)
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- post(t, held, http.MethodPost, "application/json", "{}") }()
	select {
	case rec := <-done:
		t.Fatalf("answered %d %q before the gate opened", rec.Code, rec.Body)
	case <-time.After(20 * time.Millisecond):
	}
	close(ready)
	if rec := <-done; rec.Code != http.StatusOK || rec.Body.String() != "served" {
		t.Errorf("held, then opened: %d %q", rec.Code, rec.Body)
	}
	if rec := post(t, gate, http.MethodPost, "application/json", "{}"); rec.Code != http.StatusOK {
		t.Errorf("open: %d %q", rec.Code, rec.Body)
	}
}
