// Package httpserver runs an http.Server for as long as a context lives,
// the one way netop's servers (metrics, admission) start and stop.
package httpserver

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// ShutdownGrace is how long requests in flight may take to finish once
// the context is done.
const ShutdownGrace = 5 * time.Second

// Run calls serve (srv.Serve or srv.ServeTLS on a listener) until ctx is
// done, then shuts srv down gracefully. It returns only after the shutdown
// ended: Serve itself returns as soon as the shutdown begins, while
// requests are still in flight.
func Run(ctx context.Context, srv *http.Server, serve func() error) error {
	shutdown := make(chan struct{})
	go func() {
		defer close(shutdown)
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownGrace)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-shutdown
	return nil
}
