package httpserver

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// A request in flight when the context ends is answered, and Run returns
// only after it was.
func TestRunWaitsForRequestsInFlight(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	var answered atomic.Bool
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(started)
		<-release
		_, _ = w.Write([]byte("ok"))
		answered.Store(true)
	})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, srv, func() error { return srv.Serve(l) }) }()
	go func() { _, _ = http.Get("http://" + l.Addr().String()) }()
	<-started
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) with a request in flight", err)
	case <-time.After(100 * time.Millisecond): // how long Run must hold out, not synchronisation
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !answered.Load() {
		t.Error("Run returned before the request was answered")
	}
}

// A listener that fails is an error.
func TestRunReportsServeErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Close()
	srv := &http.Server{ReadHeaderTimeout: time.Second}
	if err := Run(context.Background(), srv, func() error { return srv.Serve(l) }); err == nil {
		t.Error("Serve on a closed listener: no error")
	}
}
