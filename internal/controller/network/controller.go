// Package network is the Network controller: the custom controller of the
// classic tutorial with its "FIX ME: call Neutron" done for real. It turns
// each Network into a backend network, keeps it in line with the spec,
// repairs drift, and removes it, through a finalizer, when the Network is
// deleted, also when that happened while netop was down.
package network

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/metrics"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	samplecrdinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/samplecrd/v1"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v1"
)

// Name is the controller's name in logs, metrics and Events.
const Name = "network"

// uidIndex indexes Networks by UID, the key that backends record.
const uidIndex = "uid"

// Options tune the controller.
type Options struct {
	// Workers is the number of keys reconciled at once.
	Workers int
	// Resync is how often the backend is listed to sweep orphans and find
	// Networks whose backend network went missing.
	Resync time.Duration
	// MinBackoff and MaxBackoff bound the per-Network retry delay after a
	// failure.
	MinBackoff, MaxBackoff time.Duration
}

// Controller reconciles Networks with a backend.
type Controller struct {
	client   versioned.Interface
	lister   samplecrdlisters.NetworkLister
	indexer  cache.Indexer
	synced   cache.DoneChecker
	queue    workqueue.TypedRateLimitingInterface[string]
	backend  backend.Backend
	recorder record.EventRecorder
	metrics  *metrics.Metrics
	opts     Options
	// written holds, by UID, the status last written (writtenStatus).
	written sync.Map
}

// New makes a controller on the given informer. Call it before the informer
// factory is started: it registers an index and event handlers.
func New(ctx context.Context, client versioned.Interface, informer samplecrdinformers.NetworkInformer,
	be backend.Backend, recorder record.EventRecorder, m *metrics.Metrics, opts Options) (*Controller, error) {
	if opts.Workers < 1 {
		return nil, fmt.Errorf("workers must be at least 1, got %d", opts.Workers)
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = 30 * time.Second
	}
	if err := informer.Informer().AddIndexers(cache.Indexers{uidIndex: func(obj any) ([]string, error) {
		n, ok := obj.(*samplecrdv1.Network)
		if !ok {
			return nil, nil
		}
		return []string{string(n.UID)}, nil
	}}); err != nil {
		return nil, fmt.Errorf("adding UID index: %w", err)
	}
	c := &Controller{
		client:  client,
		lister:  informer.Lister(),
		indexer: informer.Informer().GetIndexer(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			// Per-item exponential backoff, capped, so that a broken backend
			// is retried steadily but never in a hot loop.
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](opts.MinBackoff, opts.MaxBackoff),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: Name, MetricsProvider: m.WorkqueueProvider()},
		),
		backend:  be,
		recorder: recorder,
		metrics:  m,
		opts:     opts,
	}
	logger := klog.FromContext(ctx)
	registration, err := informer.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			// At start every Network arrives as an Add. Those that were
			// converged are checked in bulk by the first resync, with one
			// backend list, instead of one backend round trip each.
			if n, ok := obj.(*samplecrdv1.Network); ok && converged(n) {
				return
			}
			c.enqueue(obj)
		},
		UpdateFunc: func(oldObj, newObj any) {
			if needsReconcile(oldObj.(*samplecrdv1.Network), newObj.(*samplecrdv1.Network)) {
				c.enqueue(newObj)
			}
		},
		DeleteFunc: func(obj any) {
			n, ok := obj.(*samplecrdv1.Network)
			if tomb, isTomb := obj.(cache.DeletedFinalStateUnknown); isTomb {
				n, ok = tomb.Obj.(*samplecrdv1.Network)
			}
			if ok {
				c.written.Delete(n.UID)
			}
			c.enqueue(obj)
		},
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding event handler: %w", err)
	}
	c.synced = registration.HasSyncedChecker()
	return c, nil
}

// HasSyncedChecker is done once the informer has synced and the controller
// has been handed every Network of the initial list.
func (c *Controller) HasSyncedChecker() cache.DoneChecker { return c.synced }

// needsReconcile filters update events. A resync re-delivers unchanged
// objects (same resourceVersion): the backend is checked by the
// controller's own resync instead, at the cost of one list. And the
// controller's own status writes come back as updates that change neither
// spec (generation), deletion nor finalizers: reconciling them again would
// cost a backend round trip per Network for nothing. A status changed by
// someone else is still noticed by the resync, which compares it with the
// backend.
func needsReconcile(old, cur *samplecrdv1.Network) bool {
	if old.ResourceVersion == cur.ResourceVersion {
		return false
	}
	return old.Generation != cur.Generation ||
		!old.DeletionTimestamp.Equal(cur.DeletionTimestamp) ||
		!slices.Equal(old.Finalizers, cur.Finalizers) ||
		cur.Status.ObservedGeneration != cur.Generation
}

// converged reports whether n's status says its backend network matched its
// current spec.
func converged(n *samplecrdv1.Network) bool {
	return n.DeletionTimestamp == nil && n.Status.Backend != nil &&
		n.Status.ObservedGeneration == n.Generation &&
		slices.Contains(n.Finalizers, samplecrdv1.Finalizer) &&
		meta.IsStatusConditionTrue(n.Status.Conditions, samplecrdv1.ConditionReady)
}

func (c *Controller) enqueue(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		runtime.HandleError(err)
		return
	}
	c.queue.Add(key)
}

// Run waits for the cache, then runs the workers, the drift watch and the
// resync loop until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	defer runtime.HandleCrashWithContext(ctx)
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx).WithValues("controller", Name)
	ctx = klog.NewContext(ctx, logger)

	if !cache.WaitFor(ctx, "informer cache sync", c.synced) {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return errors.New("informer cache did not sync")
	}
	logger.Info("Starting workers", "workers", c.opts.Workers, "backend", c.backend.Type(), "resync", c.opts.Resync)

	var wg wait.Group
	for range c.opts.Workers {
		wg.StartWithContext(ctx, func(ctx context.Context) {
			for c.processNextItem(ctx) {
			}
		})
	}
	if w, ok := c.backend.(backend.DriftWatcher); ok {
		wg.StartWithContext(ctx, func(ctx context.Context) { c.watchDrift(ctx, w) })
	}
	wg.StartWithContext(ctx, func(ctx context.Context) {
		// The first pass runs at once: it cleans up what was orphaned
		// while netop was down.
		wait.UntilWithContext(ctx, c.resync, c.opts.Resync)
	})
	<-ctx.Done()
	logger.Info("Shutting down workers")
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

func (c *Controller) processNextItem(ctx context.Context) bool {
	key, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(key)

	start := time.Now()
	err := c.sync(ctx, key)
	c.metrics.ReconcileDuration.WithLabelValues(Name).Observe(time.Since(start).Seconds())
	switch {
	case err == nil:
		c.metrics.ReconcileTotal.WithLabelValues(Name, "success").Inc()
		c.queue.Forget(key)
	case apierrors.IsConflict(err):
		// Our cache was behind; the watch brings the newer object, and
		// the retry works on it.
		c.metrics.ReconcileTotal.WithLabelValues(Name, "conflict").Inc()
		klog.FromContext(ctx).V(2).Info("Conflict, retrying", "network", key)
		c.queue.AddRateLimited(key)
	default:
		c.metrics.ReconcileTotal.WithLabelValues(Name, "error").Inc()
		klog.FromContext(ctx).Error(err, "Reconcile failed, retrying", "network", key, "retries", c.queue.NumRequeues(key))
		c.queue.AddRateLimited(key)
	}
	return true
}

// watchDrift enqueues the Network of every backend network changed behind
// netop's back, restarting the watch when it breaks.
func (c *Controller) watchDrift(ctx context.Context, w backend.DriftWatcher) {
	logger := klog.FromContext(ctx)
	backoff := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Cap: 10 * time.Second, Steps: 1 << 30}
	for ctx.Err() == nil {
		err := w.WatchDrift(ctx, func(owner backend.Owner) {
			if key, ok := c.keyForUID(owner.UID); ok {
				c.queue.Add(key)
			}
		})
		if ctx.Err() != nil {
			return
		}
		logger.Error(err, "Backend drift watch ended, restarting it")
		// Events may have been lost while the watch was down.
		c.enqueueAll()
		select {
		case <-ctx.Done():
		case <-time.After(backoff.Step()):
		}
	}
}

func (c *Controller) keyForUID(uid any) (string, bool) {
	objs, err := c.indexer.ByIndex(uidIndex, fmt.Sprint(uid))
	if err != nil || len(objs) == 0 {
		return "", false
	}
	key, err := cache.MetaNamespaceKeyFunc(objs[0])
	return key, err == nil
}

func (c *Controller) enqueueAll() {
	for _, key := range c.indexer.ListKeys() {
		c.queue.Add(key)
	}
}

// eventf records an Event on the Network.
func (c *Controller) eventf(n *samplecrdv1.Network, eventType, reason, format string, args ...any) {
	c.recorder.Eventf(n, eventType, reason, format, args...)
}
