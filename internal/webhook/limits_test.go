package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// review returns a valid AdmissionReview body of about size bytes.
func review(size int) []byte {
	const head = `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","object":{"pad":"`
	const tail = `"}}}`
	return []byte(head + strings.Repeat("a", max(0, size-len(head)-len(tail))) + tail)
}

// blocking is a handler that holds every review until release is closed,
// and records how many it held at once.
type blocking struct {
	entered         chan struct{}
	release         chan struct{}
	current, maxSee atomic.Int32
}

func newBlocking(n int) *blocking {
	return &blocking{entered: make(chan struct{}, n), release: make(chan struct{})}
}

func (b *blocking) Admit(context.Context, *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	cur := b.current.Add(1)
	for {
		seen := b.maxSee.Load()
		if cur <= seen || b.maxSee.CompareAndSwap(seen, cur) {
			break
		}
	}
	b.entered <- struct{}{}
	<-b.release
	b.current.Add(-1)
	return &admissionv1.AdmissionResponse{Allowed: true}
}

type result struct {
	code       int
	retryAfter string
	body       string
	err        error
}

func send(client *http.Client, url string, body io.Reader) result {
	resp, err := client.Post(url, "application/json", body)
	if err != nil {
		return result{err: err}
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return result{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b), err: err}
}

// flood releases n requests of body together against a server whose
// handler blocks; it returns once want handlers hold a review and the
// other n-want requests were answered, and then releases the handlers and
// returns the answers of those too.
func flood(t *testing.T, srv *httptest.Server, h *blocking, n, want int, body []byte) (rejected, served []result) {
	t.Helper()
	rejected, release := hold(t, srv, h, n, want, body)
	return rejected, release()
}

// hold is flood up to the point where want handlers hold a review and the
// other requests were answered; release lets the handlers go and returns
// their answers.
func hold(t *testing.T, srv *httptest.Server, h *blocking, n, want int, body []byte) (rejected []result, release func() []result) {
	t.Helper()
	start := make(chan struct{})
	results := make(chan result, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			results <- send(srv.Client(), srv.URL+"/review", bytes.NewReader(body))
		})
	}
	close(start)
	timeout := time.After(30 * time.Second) // a failure guard, not synchronisation
	for entered := 0; entered < want || len(rejected) < n-want; {
		select {
		case <-h.entered:
			entered++
		case r := <-results:
			rejected = append(rejected, r)
		case <-timeout:
			t.Fatalf("after 30s: %d handlers hold a review, %d of %d requests answered: %+v", entered, len(rejected), n-want, rejected)
		}
	}
	return rejected, func() []result {
		close(h.release)
		wg.Wait()
		close(results)
		var served []result
		for r := range results {
			served = append(served, r)
		}
		return served
	}
}

func checkRejected(t *testing.T, rejected []result, flag string) {
	t.Helper()
	for _, r := range rejected {
		if r.err != nil {
			t.Fatalf("a request beyond the limit got no answer: %v", r.err)
		}
		var status metav1.Status
		if r.code != http.StatusTooManyRequests || r.retryAfter != "1" {
			t.Fatalf("beyond the limit: got %d, Retry-After %q, %s; want 429 with Retry-After 1", r.code, r.retryAfter, r.body)
		}
		if err := json.Unmarshal([]byte(r.body), &status); err != nil || status.Reason != metav1.StatusReasonTooManyRequests ||
			status.Code != http.StatusTooManyRequests || !strings.Contains(status.Message, flag) {
			t.Fatalf("429 body is not a Status naming %s: %s (%v)", flag, r.body, err)
		}
	}
}

func checkServed(t *testing.T, served []result, want int) {
	t.Helper()
	if len(served) != want {
		t.Fatalf("%d requests served, want %d", len(served), want)
	}
	for _, r := range served {
		if r.err != nil || r.code != http.StatusOK || !strings.Contains(r.body, `"allowed":true`) {
			t.Fatalf("a request within the limit: %d %s %v", r.code, r.body, r.err)
		}
	}
}

// limitedServer serves h within limits over HTTP/1.1 or HTTP/2 (TLS), and
// counts the rejections by limit.
func limitedServer(t *testing.T, limits Limits, h Handler, http2 bool) (*httptest.Server, map[string]int) {
	t.Helper()
	var mu sync.Mutex
	counts := map[string]int{}
	limits.Rejected = func(limit string) {
		mu.Lock()
		defer mu.Unlock()
		counts[limit]++
	}
	s := NewServer(nil, limits)
	s.Handle(t.Context(), "/review", h)
	srv := httptest.NewUnstartedServer(s.mux)
	srv.EnableHTTP2 = http2
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, counts
}

// N requests released together against a cap of M: exactly M are
// handled, never more at once, and the others are answered 429 with
// Retry-After at once, while the M are still being handled; when those
// end, their slots are free again.
func TestLimitsInFlight(t *testing.T) {
	for _, http2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("http2=%v", http2), func(t *testing.T) {
			const n, limit = 24, 4
			h := newBlocking(n + 1)
			srv, counts := limitedServer(t, Limits{MaxInFlight: limit}, h, http2)
			// Bodies of nearly the largest size: a rejected client is still
			// sending when the 429 comes, and must get it all the same.
			rejected, served := flood(t, srv, h, n, limit, review(MaxRequestBytes-1024))
			checkRejected(t, rejected, "--webhook-max-inflight")
			checkServed(t, served, limit)
			if got := h.maxSee.Load(); got != limit {
				t.Errorf("%d reviews handled at once, want %d", got, limit)
			}
			if counts[LimitInFlight] != n-limit || counts[LimitBytes] != 0 {
				t.Errorf("rejections counted %v, want %d in_flight", counts, n-limit)
			}
			if r := send(srv.Client(), srv.URL+"/review", bytes.NewReader(review(100))); r.code != http.StatusOK {
				t.Errorf("after the flood: %d %s %v", r.code, r.body, r.err)
			}
		})
	}
}

// The bytes of bodies in flight are capped by their Content-Length, and a
// body of unknown length counts as the largest: a flood of 1 MiB reviews
// against 3 MiB lets 3 in. A declared body above MaxRequestBytes is a 413
// also when the budget is spent.
func TestLimitsBytes(t *testing.T) {
	const n, size = 10, 1 << 20
	h := newBlocking(n + 1)
	srv, counts := limitedServer(t, Limits{MaxBodyBytesInFlight: 3 * size}, h, true)
	rejected, release := hold(t, srv, h, n, 3, review(size))
	checkRejected(t, rejected, "--webhook-max-inflight-bytes")
	if counts[LimitBytes] != n-3 {
		t.Errorf("rejections counted %v, want %d bytes", counts, n-3)
	}
	tooLarge := send(srv.Client(), srv.URL+"/review", bytes.NewReader(review(MaxRequestBytes+1)))
	if tooLarge.code != http.StatusRequestEntityTooLarge || !strings.Contains(tooLarge.body, "larger than") {
		t.Errorf("an oversized review with the budget spent: %d %s %v, want 413", tooLarge.code, tooLarge.body, tooLarge.err)
	}
	checkServed(t, release(), 3)

	// A body of unknown length (chunked) reserves the most a review may
	// be, here the whole budget: while it is held, even a small review is
	// refused.
	h2 := newBlocking(2)
	srv2, _ := limitedServer(t, Limits{MaxBodyBytesInFlight: 3 * size}, h2, true)
	chunked := make(chan result, 1)
	go func() {
		chunked <- send(srv2.Client(), srv2.URL+"/review", io.MultiReader(bytes.NewReader(review(100))))
	}()
	select {
	case <-h2.entered:
	case r := <-chunked:
		t.Fatalf("a chunked review was answered before release: %d %s %v", r.code, r.body, r.err)
	}
	checkRejected(t, []result{send(srv2.Client(), srv2.URL+"/review", bytes.NewReader(review(100)))}, "--webhook-max-inflight-bytes")
	close(h2.release)
	checkServed(t, []result{<-chunked}, 1)
	checkServed(t, []result{send(srv2.Client(), srv2.URL+"/review", bytes.NewReader(review(100)))}, 1)
}

// Zero limits are no limits.
func TestLimitsZeroIsUnlimited(t *testing.T) {
	const n = 40
	h := newBlocking(n)
	srv, _ := limitedServer(t, Limits{}, h, false)
	_, served := flood(t, srv, h, n, n, review(64<<10))
	checkServed(t, served, n)
}

// The API server calls webhooks with client-go's REST client, which waits
// the Retry-After of a 429 and sends the review again: a review refused
// while the server is full is served once a slot is free, within the
// caller's timeout, and the caller never sees the 429.
func TestLimitsRetriedByTheAPIServersClient(t *testing.T) {
	h := newBlocking(2)
	refused := make(chan struct{})
	var once sync.Once
	s := NewServer(nil, Limits{MaxInFlight: 1, Rejected: func(string) { once.Do(func() { close(refused) }) }})
	s.Handle(t.Context(), "/review", h)
	srv := httptest.NewUnstartedServer(s.mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	first := make(chan result, 1)
	go func() { first <- send(srv.Client(), srv.URL+"/review", bytes.NewReader(review(100))) }()
	<-h.entered

	// As the API server's webhook client does (k8s.io/apiserver's
	// webhook.ClientManager): an unversioned REST client, POST, a timeout.
	cfg := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(runtime.NewScheme()).WithoutConversion()
	client, err := rest.UnversionedRESTClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	var body []byte
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		b, err := client.Post().AbsPath("/review").SetHeader("Content-Type", "application/json").Body(review(100)).Do(ctx).Raw()
		body = b
		second <- err
	}()
	<-refused
	close(h.release) // the first review ends; the retry finds a free slot
	if err := <-second; err != nil || !strings.Contains(string(body), `"allowed":true`) {
		t.Fatalf("the review refused with 429 was not served on retry: %v %s", err, body)
	}
	if r := <-first; r.code != http.StatusOK {
		t.Fatalf("first review: %d %s %v", r.code, r.body, r.err)
	}
}

// The conversion webhook's reviews have an in-flight count of their own:
// with every admission slot held, a ConversionReview is still served, and
// admission reviews beyond the cap are still refused.
func TestLimitsConversionApartFromAdmission(t *testing.T) {
	const limit = 2
	h := newBlocking(limit + 1)
	s := NewServer(nil, Limits{MaxInFlight: limit, MaxBodyBytesInFlight: DefaultMaxBodyBytesInFlight})
	s.Handle(t.Context(), "/review", h)
	s.HandleHTTP("/convert", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("{}")) }))
	srv := httptest.NewUnstartedServer(s.mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	rejected, release := hold(t, srv, h, limit+1, limit, review(100))
	checkRejected(t, rejected, "--webhook-max-inflight")
	for range limit + 1 {
		if r := send(srv.Client(), srv.URL+"/convert", bytes.NewReader([]byte("{}"))); r.code != http.StatusOK {
			t.Errorf("a conversion with every admission slot held: %d %s %v", r.code, r.body, r.err)
		}
	}
	checkServed(t, release(), limit)
}
