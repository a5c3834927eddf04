package metrics

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The metrics address serves readiness from ready, and Go's profiles only
// when profiling asks for them.
func TestMux(t *testing.T) {
	get := func(h http.Handler, path string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	for _, profiling := range []bool{false, true} {
		notReady := errors.New("informer caches not synced")
		h := Mux(New().Handler(), func() (string, error) { return "", notReady }, profiling)
		if code := get(h, "/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("profiling=%v: /readyz before sync = %d, want 503", profiling, code)
		}
		notReady = nil
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
