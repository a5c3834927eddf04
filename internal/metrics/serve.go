package metrics

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/httpserver"
	"github.com/spf13/pflag"
)

// Serve serves on addr until ctx is done: metrics at /metrics, /healthz,
// /readyz (ready while ready returns no error; its message follows "ok")
// and, with profiling, Go's profiles at /debug/pprof/.
func Serve(ctx context.Context, addr string, metrics http.Handler, ready func() (string, error), profiling bool) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--metrics-addr: %w", err)
	}
	srv := &http.Server{Handler: Mux(metrics, ready, profiling), ReadHeaderTimeout: 5 * time.Second}
	klog.FromContext(ctx).Info("Serving metrics", "address", l.Addr().String())
	return httpserver.Run(ctx, srv, func() error { return srv.Serve(l) })
}

// Mux is what Serve serves.
func Mux(metrics http.Handler, ready func() (string, error), profiling bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		msg, err := ready()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if msg != "" {
			msg = "\n" + msg
		}
		_, _ = w.Write([]byte("ok" + msg))
	})
	if profiling {
		// pprof.Index serves the named profiles (heap, allocs, goroutine)
		// under the same prefix.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// Options are the metrics server's flags.
type Options struct {
	// Addr serves /metrics, /healthz and /readyz; "0" turns it off.
	Addr string
	// Profiling adds Go's /debug/pprof handlers.
	Profiling bool
}

// AddFlags registers the flags of the metrics and health server.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Addr, "metrics-addr", o.Addr, "Address serving /metrics, /healthz and /readyz; \"0\" turns it off.")
	fs.BoolVar(&o.Profiling, "profiling", o.Profiling, "Serve Go's profiles at /debug/pprof/ on --metrics-addr (CPU, heap, goroutines), as Kubernetes components do with --profiling.")
}

// Enabled reports whether the server is on.
func (o *Options) Enabled() bool { return o.Addr != "" && o.Addr != "0" }
