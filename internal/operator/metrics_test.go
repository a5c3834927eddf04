package operator

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/netop-dev/netop/internal/agent"
	"github.com/netop-dev/netop/internal/metrics"
)

// The metrics address serves readiness from the synced flag, and Go's
// profiles only when --profiling asks for them.
func TestMetricsHandler(t *testing.T) {
	get := func(h http.Handler, path string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	for _, profiling := range []bool{false, true} {
		op := &Operator{opts: &Options{Profiling: profiling}, metrics: metrics.New()}
		h := op.metricsHandler()
		if code := get(h, "/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("profiling=%v: /readyz before sync = %d, want 503", profiling, code)
		}
		op.synced.Store(true)
		for path, want := range map[string]int{"/readyz": 200, "/healthz": 200, "/metrics": 200} {
			if code := get(h, path); code != want {
				t.Errorf("profiling=%v: %s = %d, want %d", profiling, path, code, want)
			}
		}
		want := http.StatusNotFound
		if profiling {
			want = http.StatusOK
		}
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/cmdline"} {
			if code := get(h, path); code != want {
				t.Errorf("profiling=%v: %s = %d, want %d", profiling, path, code, want)
			}
		}
	}
}

// An agent that installs the CNI plugin is ready only once it is in place:
// before, pods on its node cannot be attached.
func TestReadyzWaitsForCNIInstall(t *testing.T) {
	op := &Operator{opts: &Options{}, metrics: metrics.New(), cni: &agent.CNIInstall{}}
	op.synced.Store(true)
	rec := httptest.NewRecorder()
	op.metricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "CNI plugin") {
		t.Errorf("/readyz before the install: %d %q, want 503 naming the CNI plugin", rec.Code, rec.Body.String())
	}
}
