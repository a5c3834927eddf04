package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Request and response bodies are counted by encoding, a response as it
// is read (a watch's stream is never read whole).
func TestCountRequestsBytes(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/v1/namespaces/a/events":
			w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf;stream=watch")
			_, _ = w.Write(make([]byte, 300))
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(make([]byte, 70))
		}
	}))
	defer srv.Close()
	m := New()
	client := &http.Client{Transport: m.CountRequests(http.DefaultTransport)}
	do := func(method, path, contentType, body string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", contentType)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	do(http.MethodPost, "/api/v1/namespaces/a/events", "application/vnd.kubernetes.protobuf", strings.Repeat("p", 40))
	do(http.MethodPatch, "/apis/samplecrd.k8s.io/v1/namespaces/a/networks/n/status", "application/merge-patch+json", strings.Repeat("j", 25))
	do(http.MethodPatch, "/apis/samplecrd.k8s.io/v1/namespaces/a/networks/n", "application/apply-patch+yaml", strings.Repeat("j", 5))
	do(http.MethodGet, "/version", "", "")

	// A watch is counted as it is read, not when it ends.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/v1/namespaces/a/events", nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.APIBytes.WithLabelValues("received", "protobuf")); got != 400 {
		t.Errorf("after 100 bytes of a second stream: %v received, want 400", got)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()

	for _, tc := range []struct {
		direction, encoding string
		want                float64
	}{
		{"sent", "protobuf", 40}, {"sent", "json", 30}, {"received", "protobuf", 600}, {"received", "json", 210}, {"received", "other", 0},
	} {
		if got := testutil.ToFloat64(m.APIBytes.WithLabelValues(tc.direction, tc.encoding)); got != tc.want {
			t.Errorf("%s %s bytes = %v, want %v", tc.direction, tc.encoding, got, tc.want)
		}
	}
}
