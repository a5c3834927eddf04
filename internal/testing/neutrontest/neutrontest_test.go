package neutrontest

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

func get(t *testing.T, url string) (int, string, error) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	b, err := io.ReadAll(resp.Body)
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	return resp.StatusCode, string(b), err
}

// TestRestartKeepsPortAndDatabase checks what outage tests rely on.
func TestRestartKeepsPortAndDatabase(t *testing.T) {
	Require(t)
	ctx := context.Background()
	srv, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
	})
	if !strings.HasPrefix(srv.URL, "http://127.0.0.1:") || !strings.HasSuffix(srv.URL, "/") {
		t.Fatalf("URL = %q, want http://127.0.0.1:PORT/", srv.URL)
	}

	body := `{"network":{"name":"kept","project_id":"neutrontest"}}`
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"v2.0/networks", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create network: %s\n%s", resp.Status, srv.LogTail(20))
	}

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, _, err := get(t, srv.URL+"v2.0/networks"); err == nil {
		t.Fatal("neutron still answers after Stop")
	}

	oldURL := srv.URL
	start := time.Now()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted in %v", time.Since(start).Round(time.Millisecond))
	if srv.URL != oldURL {
		t.Fatalf("URL after Restart = %s, want %s", srv.URL, oldURL)
	}
	code, got, err := get(t, srv.URL+"v2.0/networks?name=kept")
	if err != nil || code != http.StatusOK {
		t.Fatalf("list networks after Restart: %d %v", code, err)
	}
	if !strings.Contains(got, `"kept"`) {
		t.Fatalf("network made before Restart is gone: %s", got)
	}
}

// TestParallelServers checks that two servers of one binary do not share
// a port or database.
func TestParallelServers(t *testing.T) {
	a := Shared(t)
	b, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	if a.URL == b.URL || a.Dir() == b.Dir() {
		t.Fatalf("servers share %s / %s", a.URL, a.Dir())
	}
	for _, s := range []*Server{a, b} {
		if code, _, err := get(t, s.URL+"v2.0/networks"); err != nil || code != http.StatusOK {
			t.Fatalf("%s: %d %v", s.URL, code, err)
		}
	}
}
