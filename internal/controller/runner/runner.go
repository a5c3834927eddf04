// Package runner is the one queueing controller that every netop controller
// runs on, so that they all behave alike: a rate-limited typed queue of
// object names (sample-controller's cache.ObjectName queue), a wait for the
// caches the controller reads, N workers, periodic and background
// functions, and one policy for the outcome of a sync. A controller
// provides only its event handlers, its sync and its periodic work.
//
// The outcome policy:
//   - nil: done; the name's backoff is forgotten.
//   - a Conflict from the API server: our cache was behind, the watch
//     brings the newer object, and the name is retried with backoff.
//   - a NotFound from the API server for the synced object itself: it went
//     while we worked on it; its deletion is an event of its own, so
//     retrying cannot help. A NotFound for anything else (another object,
//     a resource the server does not serve) is an error like any other.
//   - any other error: retried with capped per-name exponential backoff.
package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/metrics"
)

// SyncFunc reconciles the object of one name. It returns an error only for
// what a retry can fix.
type SyncFunc func(ctx context.Context, name cache.ObjectName) error

// Periodic is a function run every Interval, the first time at once.
type Periodic struct {
	Name     string
	Interval time.Duration
	Func     func(ctx context.Context)
}

// Options configure a Controller.
type Options struct {
	// Name names the controller in logs, its queue and its metrics.
	Name string
	// Workers is the number of names synced at once.
	Workers int
	// MinBackoff and MaxBackoff bound a name's retry delay after a failure;
	// a MinBackoff of zero means 100 ms, a MaxBackoff below MinBackoff
	// means 30 s (or MinBackoff, if that is more).
	MinBackoff, MaxBackoff time.Duration
	// Metrics receives the queue and reconcile metrics.
	Metrics *metrics.Metrics
}

// Controller is a queue of object names and the workers that sync them.
type Controller struct {
	opts       Options
	sync       SyncFunc
	queue      workqueue.TypedRateLimitingInterface[cache.ObjectName]
	synced     []cache.DoneChecker
	periodic   []Periodic
	background []func(ctx context.Context)
}

// New makes a controller that syncs names with sync.
func New(opts Options, sync SyncFunc) (*Controller, error) {
	if opts.Name == "" {
		return nil, errors.New("a controller needs a name")
	}
	if opts.Workers < 1 {
		return nil, fmt.Errorf("controller %s: workers must be at least 1, got %d", opts.Name, opts.Workers)
	}
	if opts.Metrics == nil {
		return nil, fmt.Errorf("controller %s: no metrics", opts.Name)
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(30*time.Second, opts.MinBackoff)
	}
	return &Controller{
		opts: opts,
		sync: sync,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			// Per-name exponential backoff, capped, so that a broken
			// dependency is retried steadily but never in a hot loop.
			workqueue.NewTypedItemExponentialFailureRateLimiter[cache.ObjectName](opts.MinBackoff, opts.MaxBackoff),
			workqueue.TypedRateLimitingQueueConfig[cache.ObjectName]{Name: opts.Name, MetricsProvider: opts.Metrics.WorkqueueProvider()},
		),
	}, nil
}

// Name is the controller's name.
func (c *Controller) Name() string { return c.opts.Name }

// WaitFor adds checkers that must be done before the workers start: the
// informers' and the event handlers' sync.
func (c *Controller) WaitFor(checkers ...cache.DoneChecker) { c.synced = append(c.synced, checkers...) }

// Every runs f every interval while the controller runs; the first run is
// right after the caches synced.
func (c *Controller) Every(name string, interval time.Duration, f func(ctx context.Context)) {
	c.periodic = append(c.periodic, Periodic{Name: name, Interval: interval, Func: f})
}

// Go runs f beside the workers until the controller stops; f must return
// when its context is done.
func (c *Controller) Go(f func(ctx context.Context)) { c.background = append(c.background, f) }

// Enqueue adds the name of obj, which may be a tombstone of a deleted
// object. It is meant for event handlers.
func (c *Controller) Enqueue(obj any) {
	name, err := cache.DeletionHandlingObjectToName(obj)
	if err != nil {
		utilruntime.HandleError(fmt.Errorf("controller %s: %w", c.opts.Name, err))
		return
	}
	c.queue.Add(name)
}

// ControllerOf is the name of the controller of obj (which may be a
// tombstone of a deleted object) if that controller is of kind gvk: the
// object to enqueue when something it owns changes.
func ControllerOf(obj any, gvk schema.GroupVersionKind) (cache.ObjectName, bool) {
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	owned, err := meta.Accessor(obj)
	if err != nil {
		return cache.ObjectName{}, false
	}
	for _, ref := range owned.GetOwnerReferences() {
		if ref.Controller != nil && *ref.Controller && ref.Kind == gvk.Kind && ref.APIVersion == gvk.GroupVersion().String() {
			return cache.ObjectName{Namespace: owned.GetNamespace(), Name: ref.Name}, true
		}
	}
	return cache.ObjectName{}, false
}

// EnqueueController returns an event handler that adds the name of the
// object's controller of kind gvk, if it has one.
func (c *Controller) EnqueueController(gvk schema.GroupVersionKind) func(obj any) {
	return func(obj any) {
		if name, ok := ControllerOf(obj, gvk); ok {
			c.queue.Add(name)
		}
	}
}

// Add adds a name.
func (c *Controller) Add(name cache.ObjectName) { c.queue.Add(name) }

// AddAfter adds a name once delay has passed; adding it again meanwhile
// adds it once, so that a burst of changes costs one sync.
func (c *Controller) AddAfter(name cache.ObjectName, delay time.Duration) {
	c.queue.AddAfter(name, delay)
}

// Len is the number of names waiting, for tests and benchmarks.
func (c *Controller) Len() int { return c.queue.Len() }

// Run waits for the caches, then runs the workers, the periodic and the
// background functions until ctx is done, and returns when they all have.
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx).WithValues("controller", c.opts.Name)
	ctx = klog.NewContext(ctx, logger)

	// Progress of the wait at V(2): one line per informer at V(0) is noise.
	if !cache.WaitFor(klog.NewContext(ctx, logger.V(2)), "caches of controller "+c.opts.Name, c.synced...) {
		return nil // WaitFor gives up only when ctx is done: stopped while starting
	}
	logger.Info("Starting workers", "workers", c.opts.Workers)

	var wg wait.Group
	for range c.opts.Workers {
		wg.StartWithContext(ctx, func(ctx context.Context) {
			for c.processNextItem(ctx) {
			}
		})
	}
	for _, p := range c.periodic {
		wg.StartWithContext(ctx, func(ctx context.Context) {
			wait.UntilWithContext(klog.NewContext(ctx, logger.WithValues("periodic", p.Name)), p.Func, p.Interval)
		})
	}
	for _, f := range c.background {
		wg.StartWithContext(ctx, f)
	}
	<-ctx.Done()
	logger.Info("Shutting down workers")
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

func (c *Controller) processNextItem(ctx context.Context) bool {
	name, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(name)

	start := time.Now()
	err := c.sync(ctx, name)
	c.opts.Metrics.ReconcileDuration.WithLabelValues(c.opts.Name).Observe(time.Since(start).Seconds())
	result := Outcome(err, name)
	c.opts.Metrics.ReconcileTotal.WithLabelValues(c.opts.Name, result).Inc()
	if result == metrics.ResultSuccess {
		c.queue.Forget(name)
		return true
	}
	// Built only here: a successful sync, the common case, logs nothing.
	logger := klog.FromContext(ctx).WithValues("object", klog.KRef(name.Namespace, name.Name))
	switch result {
	case metrics.ResultNotFound:
		logger.V(2).Info("Object gone while syncing, not retried", "err", err)
		c.queue.Forget(name)
	case metrics.ResultConflict:
		logger.V(2).Info("Conflict, retrying", "err", err)
		c.queue.AddRateLimited(name)
	default:
		logger.Error(err, "Sync failed, retrying", "retries", c.queue.NumRequeues(name))
		c.queue.AddRateLimited(name)
	}
	return true
}

// Outcome classifies the error of the sync of name as the runner treats
// it, with the metric label it counts it under.
func Outcome(err error, name cache.ObjectName) string {
	switch {
	case err == nil:
		return metrics.ResultSuccess
	case apierrors.IsConflict(err):
		return metrics.ResultConflict
	case gone(err, name):
		return metrics.ResultNotFound
	default:
		return metrics.ResultError
	}
}

// gone reports whether err is the API server's NotFound for the object
// name itself.
func gone(err error, name cache.ObjectName) bool {
	var status apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &status) {
		return false
	}
	details := status.Status().Details
	return details != nil && details.Name == name.Name
}
