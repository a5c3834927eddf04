package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/metrics"
)

var resource = schema.GroupResource{Group: "samplecrd.k8s.io", Resource: "networks"}

func TestOutcome(t *testing.T) {
	name := cache.NewObjectName("ns", "n")
	for err, want := range map[error]string{
		nil:                metrics.ResultSuccess,
		errors.New("boom"): metrics.ResultError,
		apierrors.NewConflict(resource, "n", errors.New("modified")): metrics.ResultConflict,
		apierrors.NewNotFound(resource, "n"):                         metrics.ResultNotFound,
		// Wrapped, as syncs wrap them with context.
		fmt.Errorf("patching: %w", apierrors.NewNotFound(resource, "n")): metrics.ResultNotFound,
		// Another object, or a resource the server does not serve, is not
		// the synced object being gone.
		apierrors.NewNotFound(resource, "other"):                       metrics.ResultError,
		apierrors.NewNotFound(schema.GroupResource{Resource: "x"}, ""): metrics.ResultError,
	} {
		if got := Outcome(err, name); got != want {
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
		"lost":     apierrors.NewNotFound(resource, "another"),
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
	for _, n := range []string{"ok", "error", "conflict", "gone", "lost"} {
		c.Add(cache.NewObjectName("ns", n))
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { defer close(done); _ = c.Run(ctx) }()
	close(synced)

	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		got := map[string]int{"ok": attempts["ok"], "error": attempts["error"], "conflict": attempts["conflict"], "gone": attempts["gone"], "lost": attempts["lost"]}
		early := early
		mu.Unlock()
		if got["ok"] == 1 && got["error"] == 3 && got["conflict"] == 3 && got["gone"] >= 1 && got["lost"] == 3 && c.Len() == 0 {
			if early > 0 {
				t.Errorf("%d syncs before the caches synced", early)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("attempts %v, want ok 1, error, conflict and lost 3 (two failures, then success), gone 1 (not retried)", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Counted by outcome: a retried "gone" would have counted as an error
	// at its first attempt already.
	for result, want := range map[string]float64{
		metrics.ResultSuccess: 4, metrics.ResultError: 4, metrics.ResultConflict: 2, metrics.ResultNotFound: 1,
	} {
		if got := testutil.ToFloat64(m.ReconcileTotal.WithLabelValues("test", result)); got != want {
			t.Errorf("reconcile_total{result=%s} = %v, want %v", result, got, want)
		}
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

// The controller of an object, or of a deleted one's tombstone, of the
// asked kind only.
func TestControllerOf(t *testing.T) {
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: "ns", UID: "u"}}
	gvk := corev1.SchemeGroupVersion.WithKind("ConfigMap")
	owned := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Secret", Name: "other"}, *metav1.NewControllerRef(owner, gvk)}}}
	for _, obj := range []any{owned, cache.DeletedFinalStateUnknown{Key: "ns/p", Obj: owned}} {
		if name, ok := ControllerOf(obj, gvk); !ok || name != (cache.ObjectName{Namespace: "ns", Name: "owner"}) {
			t.Errorf("ControllerOf(%T) = %v, %v", obj, name, ok)
		}
	}
	if _, ok := ControllerOf(owned, corev1.SchemeGroupVersion.WithKind("Secret")); ok {
		t.Error("a reference that is not the controller counted")
	}
	if _, ok := ControllerOf("not an object", gvk); ok {
		t.Error("a string has a controller")
	}
}
