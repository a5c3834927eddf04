package runner

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/metrics"
)

var resource = schema.GroupResource{Group: "samplecrd.k8s.io", Resource: "networks"}

func TestOutcome(t *testing.T) {
	for err, want := range map[error]string{
		nil:                metrics.ResultSuccess,
		errors.New("boom"): metrics.ResultError,
		apierrors.NewConflict(resource, "n", errors.New("modified")): metrics.ResultConflict,
		apierrors.NewNotFound(resource, "n"):                         metrics.ResultNotFound,
		// Wrapped, as syncs wrap them with context.
		errors.Join(errors.New("patching"), apierrors.NewNotFound(resource, "n")): metrics.ResultNotFound,
	} {
		if got := Outcome(err); got != want {
			t.Errorf("Outcome(%v) = %s, want %s", err, got, want)
		}
	}
}

// The runner waits for its caches, retries errors and conflicts with
// backoff until they succeed, never retries NotFound, runs the periodic
// and background functions, and stops cleanly.
func TestRun(t *testing.T) {
	var (
		mu       sync.Mutex
		attempts = map[string]int{}
		early    int // syncs before the caches synced
		done     = make(chan struct{})
		synced   = make(chan struct{})
	)
	failures := map[string]error{
		"error":    errors.New("injected"),
		"conflict": apierrors.NewConflict(resource, "conflict", errors.New("modified")),
		"gone":     apierrors.NewNotFound(resource, "gone"),
	}
	m := metrics.New()
	c, err := New(Options{Name: "test", Workers: 2, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, Metrics: m},
		func(ctx context.Context, name cache.ObjectName) error {
			mu.Lock()
			defer mu.Unlock()
			select {
			case <-synced:
			default:
				early++
			}
			attempts[name.Name]++
			if attempts[name.Name] <= 2 {
				return failures[name.Name]
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	c.WaitFor(doneChecker(synced))
	periodic := make(chan struct{}, 10)
	c.Every("tick", time.Hour, func(context.Context) { periodic <- struct{}{} })
	background := make(chan struct{})
	c.Go(func(ctx context.Context) { <-ctx.Done(); close(background) })
	for _, n := range []string{"ok", "error", "conflict", "gone"} {
		c.Add(cache.NewObjectName("ns", n))
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { defer close(done); _ = c.Run(ctx) }()
	close(synced)

	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		got := map[string]int{"ok": attempts["ok"], "error": attempts["error"], "conflict": attempts["conflict"], "gone": attempts["gone"]}
		early := early
		mu.Unlock()
		if got["ok"] == 1 && got["error"] == 3 && got["conflict"] == 3 && got["gone"] == 1 && c.Len() == 0 {
			if early > 0 {
				t.Errorf("%d syncs before the caches synced", early)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("attempts %v, want ok 1, error 3, conflict 3 (two failures, then success), gone 1 (not retried)", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case <-periodic:
	case <-time.After(10 * time.Second):
		t.Fatal("the periodic function did not run at start")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the stop")
	}
	select {
	case <-background:
	default:
		t.Error("Run returned before its background function")
	}
}

// A stop before the caches sync is a clean stop.
func TestStopBeforeSync(t *testing.T) {
	c, err := New(Options{Name: "test", Workers: 1, Metrics: metrics.New()}, func(context.Context, cache.ObjectName) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	c.WaitFor(doneChecker(make(chan struct{})))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Run(ctx); err != nil {
		t.Errorf("Run after a stop before sync: %v", err)
	}
}

func TestOptions(t *testing.T) {
	sync := func(context.Context, cache.ObjectName) error { return nil }
	for name, o := range map[string]Options{
		"no name":    {Workers: 1, Metrics: metrics.New()},
		"no workers": {Name: "x", Metrics: metrics.New()},
		"no metrics": {Name: "x", Workers: 1},
	} {
		if _, err := New(o, sync); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

type doneChecker chan struct{}

func (d doneChecker) Name() string          { return "test" }
func (d doneChecker) Done() <-chan struct{} { return d }
