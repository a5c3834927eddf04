// Package network is the Network controller: the custom controller of the
// classic tutorial with its "FIX ME: call Neutron" done for real. It turns
// each Network into a backend network, keeps it in line with the spec,
// repairs drift, and removes it, through a finalizer, when the Network is
// deleted, also when that happened while netop was down.
package network

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/controller/runner"
	"github.com/netop-dev/netop/internal/metrics"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	samplecrdinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/samplecrd/v1"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v1"
)

// Name is the controller's name in logs, metrics and Events.
const Name = "network"

// Reasons of the Normal Events on a Network. Warnings use the condition
// reasons of the API (samplecrdv1.ReasonInvalid, ReasonBackendError).
const (
	ReasonCreated = "Created"
	ReasonUpdated = "Updated"
	ReasonDeleted = "Deleted"
)

// uidIndex indexes Networks by UID, the key that backends record.
const uidIndex = "uid"

// Options tune the controller.
type Options struct {
	// Workers is the number of Networks reconciled at once.
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
	*runner.Controller
	client   versioned.Interface
	lister   samplecrdlisters.NetworkLister
	indexer  cache.Indexer
	synced   cache.DoneChecker
	backend  backend.Backend
	recorder record.EventRecorder
	metrics  *metrics.Metrics
	// written holds, by UID, the status last written (writtenStatus).
	written sync.Map
}

// New makes a controller on the given informer. Call it before the informer
// factory is started: it registers an index and event handlers.
func New(ctx context.Context, client versioned.Interface, informer samplecrdinformers.NetworkInformer,
	be backend.Backend, recorder record.EventRecorder, m *metrics.Metrics, opts Options) (*Controller, error) {
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
		client:   client,
		lister:   informer.Lister(),
		indexer:  informer.Informer().GetIndexer(),
		backend:  be,
		recorder: recorder,
		metrics:  m,
	}
	var err error
	c.Controller, err = runner.New(runner.Options{
		Name: Name, Workers: opts.Workers, MinBackoff: opts.MinBackoff, MaxBackoff: opts.MaxBackoff, Metrics: m,
	}, c.sync)
	if err != nil {
		return nil, err
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
			c.Enqueue(obj)
		},
		UpdateFunc: func(oldObj, newObj any) {
			if needsReconcile(oldObj.(*samplecrdv1.Network), newObj.(*samplecrdv1.Network)) {
				c.Enqueue(newObj)
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
			c.Enqueue(obj)
		},
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding event handler: %w", err)
	}
	c.synced = registration.HasSyncedChecker()
	c.WaitFor(c.synced)
	if w, ok := be.(backend.DriftWatcher); ok {
		c.Go(func(ctx context.Context) { c.watchDrift(ctx, w) })
	}
	// The first pass runs as soon as the caches synced: it cleans up what
	// was orphaned while netop was down.
	c.Every("resync", opts.Resync, c.resync)
	logger.V(1).Info("Network controller configured", "workers", opts.Workers, "backend", be.Type(), "resync", opts.Resync)
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

// watchDrift enqueues the Network of every backend network changed behind
// netop's back, restarting the watch when it breaks.
func (c *Controller) watchDrift(ctx context.Context, w backend.DriftWatcher) {
	logger := klog.FromContext(ctx)
	backoff := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Cap: 10 * time.Second, Steps: 1 << 30}
	for ctx.Err() == nil {
		err := w.WatchDrift(ctx, func(owner backend.Owner) {
			if name, ok := c.nameForUID(owner.UID); ok {
				c.Add(name)
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

func (c *Controller) nameForUID(uid any) (cache.ObjectName, bool) {
	objs, err := c.indexer.ByIndex(uidIndex, fmt.Sprint(uid))
	if err != nil || len(objs) == 0 {
		return cache.ObjectName{}, false
	}
	name, err := cache.ObjectToName(objs[0])
	return name, err == nil
}

func (c *Controller) enqueueAll() {
	for _, obj := range c.indexer.List() {
		c.Enqueue(obj)
	}
}

// eventf records an Event on the Network.
func (c *Controller) eventf(n *samplecrdv1.Network, eventType, reason, format string, args ...any) {
	c.recorder.Eventf(n, eventType, reason, format, args...)
}
