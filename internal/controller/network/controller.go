// Package network is the Network controller: the custom controller of the
// classic tutorial with its "FIX ME: call Neutron" done for real. It turns
// each Network into a backend network, keeps it in line with the spec,
// repairs drift, and removes it, through a finalizer, when the Network is
// deleted, also when that happened while netop was down.
package network

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/controller/runner"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/networkcache"
	"github.com/netop-dev/netop/internal/overlap"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v2"
)

// Name is the controller's name in logs, metrics and Events.
const Name = "network"

// Reasons of the Normal Events on a Network. Warnings use the condition
// reasons of the API (samplecrd.ReasonInvalid, ReasonBackendError).
const (
	ReasonCreated = "Created"
	ReasonUpdated = "Updated"
	ReasonDeleted = "Deleted"
)

// uidIndex indexes Networks by UID, the key that backends record.
const uidIndex = "uid"

// Options tune the controller.
type Options struct {
	// Cluster is recorded on every backend network, and only backend
	// networks recorded with it (or with none) are this controller's.
	Cluster string
	// Workers is the number of Networks reconciled at once.
	Workers int
	// Resync is how often the backend is listed to sweep orphans and find
	// Networks whose backend network went missing.
	Resync time.Duration
	// MinBackoff and MaxBackoff bound the per-Network retry delay after a
	// failure.
	MinBackoff, MaxBackoff time.Duration
	// AllowReservedPrefixes lets Networks use special-purpose prefixes
	// (netspec.Resolver.AllowReserved), as --allow-reserved-prefixes does
	// for the admission webhook.
	AllowReservedPrefixes bool
	// Addresses, if set, says how pods use Networks' addresses: the
	// counts go into status, and a Network whose addresses pods hold is
	// not deleted until they are gone.
	Addresses AddressUsage
	// Outcome is the controller's part in the role it runs in:
	// Standalone (if nil), Cluster or Agent.
	Outcome Outcome
}

// AddressUsage is how pods use Networks' addresses: the allocation
// controller's allocator, the one that hands them out.
type AddressUsage interface {
	// Usage counts the addresses pods hold, those left, and those the
	// Network reserves, as status shows them.
	Usage(n *samplecrdv2.Network) (*samplecrdv2.NetworkAddresses, error)
	// Retire stops allocations in a Network being deleted and counts the
	// pods that still hold addresses in it, naming up to limit of them.
	Retire(n *samplecrdv2.Network, limit int) (netselect.Holders, error)
	// Outsiders counts the pods holding addresses of n although their
	// namespaces may no longer join it, naming up to limit of them.
	Outsiders(n *samplecrdv2.Network, limit int) (netselect.Holders, error)
	// OnUsageChanged registers f, told of each Network whose addresses
	// pods took or freed, or whose pods' namespaces changed: New registers the controller's UsageChanged,
	// which it cannot be handed before the controller exists.
	OnUsageChanged(f func(network cache.ObjectName))
	// Synced are done once the caches the other methods read are filled.
	// The controller syncs no Network before: a new leader would write
	// the addresses of pods it has not seen as free, and the pods of a
	// namespace it has not seen as outsiders.
	Synced() []cache.DoneChecker
}

// usageDelay coalesces the status writes of address usage: a burst of
// pods costs one write per Network.
const usageDelay = time.Second

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
	// specs say what each version of a spec means, under
	// --allow-reserved-prefixes.
	specs *networkcache.Specs
	// cluster is Options.Cluster.
	cluster string
	// arbiter decides which of overlapping Networks is built.
	arbiter *overlap.Arbiter
	// addresses is Options.Addresses.
	addresses AddressUsage
	// outcome is Options.Outcome, bound to this controller.
	outcome Outcome
}

// UsageChanged tells the controller that pods took or freed addresses of
// a Network; its status follows within about usageDelay.
func (c *Controller) UsageChanged(name cache.ObjectName) { c.AddAfter(name, usageDelay) }

// New makes a controller on the given Networks (the shared informer's, or
// an agent's own). Call it before they are started: it registers an index
// and event handlers.
func New(ctx context.Context, client versioned.Interface, networks networkcache.Source,
	be backend.Backend, recorder record.EventRecorder, m *metrics.Metrics, opts Options) (*Controller, error) {
	if err := networks.AddIndexers(cache.Indexers{uidIndex: func(obj any) ([]string, error) {
		n, ok := obj.(*samplecrdv2.Network)
		if !ok {
			return nil, nil
		}
		return []string{string(n.UID)}, nil
	}}); err != nil {
		return nil, fmt.Errorf("adding UID index: %w", err)
	}
	c := &Controller{
		client:   client,
		lister:   samplecrdlisters.NewNetworkLister(networks.GetIndexer()),
		indexer:  networks.GetIndexer(),
		backend:  be,
		recorder: recorder,
		metrics:  m,
		specs:    networkcache.NewSpecs(netspec.Resolver{AllowReserved: opts.AllowReservedPrefixes}),
		arbiter:  overlap.NewArbiter(),
		cluster:  opts.Cluster,

		addresses: opts.Addresses,
	}
	var err error
	c.Controller, err = runner.New(runner.Options{
		Name: Name, Workers: opts.Workers, MinBackoff: opts.MinBackoff, MaxBackoff: opts.MaxBackoff, Metrics: m,
	}, c.sync)
	if err != nil {
		return nil, err
	}
	outcome := opts.Outcome
	if outcome == nil {
		outcome = Standalone()
	}
	c.outcome = outcome.bind(c)
	if c.addresses != nil {
		c.addresses.OnUsageChanged(c.UsageChanged)
		c.WaitFor(c.addresses.Synced()...)
	}
	logger := klog.FromContext(ctx)
	registration, err := networks.AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			n, ok := obj.(*samplecrdv2.Network)
			if !ok {
				return
			}
			c.record(n)
			// At start every Network arrives as an Add. Those that were
			// converged are checked in bulk by the first resync, with one
			// backend list, instead of one backend round trip each.
			if c.converged(n) {
				return
			}
			c.Enqueue(obj)
		},
		UpdateFunc: func(oldObj, newObj any) {
			old, cur := oldObj.(*samplecrdv2.Network), newObj.(*samplecrdv2.Network)
			// A node that does not need the Network has nothing to change,
			// nor does the Network contend there: its need changing
			// enqueues it, and the resync sweeps what a crash left.
			if needsReconcile(old, cur) && c.outcome.wanted(cur) {
				c.contend(cur)
				c.Enqueue(newObj)
			}
		},
		DeleteFunc: func(obj any) {
			n, ok := obj.(*samplecrdv2.Network)
			if tomb, isTomb := obj.(cache.DeletedFinalStateUnknown); isTomb {
				n, ok = tomb.Obj.(*samplecrdv2.Network)
			}
			if ok {
				c.outcome.deleted(n)
				c.specs.Forget(n.UID)
				// Its finalizer removed its backend network, or someone
				// removed the finalizer: either way nothing waits for it.
				c.enqueueEntries(c.arbiter.Withdraw(n.UID))
				c.enqueueEntries(c.arbiter.Release(n.UID))
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
func needsReconcile(old, cur *samplecrdv2.Network) bool {
	if old.ResourceVersion == cur.ResourceVersion {
		return false
	}
	return old.Generation != cur.Generation || old.Status.VNI != cur.Status.VNI ||
		!old.DeletionTimestamp.Equal(cur.DeletionTimestamp) ||
		!slices.Equal(old.Finalizers, cur.Finalizers) ||
		cur.Status.ObservedGeneration != cur.Generation
}

// converged reports whether n, not being deleted, is recorded as having
// its backend network match its current spec.
func (c *Controller) converged(n *samplecrdv2.Network) bool {
	return n.DeletionTimestamp == nil && c.outcome.converged(n)
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

// record tells the arbiter about a Network seen for the first time (at
// start, after a relist, or created): whether it wants a backend network,
// and that what its status says was built may still be there, so that no
// overlapping Network builds until this one's sync has decided about it.
func (c *Controller) record(n *samplecrdv2.Network) {
	c.outcome.seen(n)
	if !c.outcome.wanted(n) {
		// Built nowhere here: it contends with nothing here. Its sync
		// contends once the node needs it.
		return
	}
	c.contend(n)
	if e, ok := c.builtEntry(n); ok {
		c.arbiter.MayBePresent(e)
	}
}

// contend records n with the arbiter as wanting a backend network, or not
// (invalid or being deleted), and enqueues the Networks whose verdict that
// may change.
func (c *Controller) contend(n *samplecrdv2.Network) {
	if e, ok := c.contenderEntry(n); ok {
		c.enqueueEntries(c.arbiter.Contend(e))
		return
	}
	c.enqueueEntries(c.arbiter.Withdraw(n.UID))
}

// contenderEntry is n as a contender for a backend network: valid and not
// being deleted.
func (c *Controller) contenderEntry(n *samplecrdv2.Network) (overlap.Entry, bool) {
	if n.DeletionTimestamp != nil {
		return overlap.Entry{}, false
	}
	families, errs := c.specs.Resolve(n)
	if len(errs) > 0 {
		return overlap.Entry{}, false
	}
	return entryOf(n, families.Prefixes()...), true
}

// builtEntry is n with the prefixes its backend network may have, as its
// status and spec say, unless the status says it has none.
func (c *Controller) builtEntry(n *samplecrdv2.Network) (overlap.Entry, bool) {
	if n.Status.Backend == nil {
		return overlap.Entry{}, false
	}
	e := entryOf(n)
	e.Prefixes = netspec.ParsePrefixes(n.Status.CIDRs...)
	if families, errs := c.specs.Resolve(n); len(errs) == 0 {
		for _, p := range families.Prefixes() {
			if !slices.Contains(e.Prefixes, p) {
				e.Prefixes = append(e.Prefixes, p)
			}
		}
	}
	return e, len(e.Prefixes) > 0
}

func entryOf(n *samplecrdv2.Network, prefixes ...netip.Prefix) overlap.Entry {
	return overlap.Entry{Namespace: n.Namespace, Name: n.Name, UID: n.UID, Created: n.CreationTimestamp.Time, Prefixes: prefixes}
}

func (c *Controller) enqueueEntries(entries []overlap.Entry) {
	for _, e := range entries {
		c.Add(cache.ObjectName{Namespace: e.Namespace, Name: e.Name})
	}
}

// EnqueueUID enqueues the Network of uid after the delay, if the cache
// has it: what it depends on on this node changed (its demand, its peers).
func (c *Controller) EnqueueUID(uid types.UID, after time.Duration) {
	if name, ok := c.nameForUID(uid); ok {
		c.AddAfter(name, after)
	}
}

func (c *Controller) enqueueAll() {
	for _, obj := range c.indexer.List() {
		c.Enqueue(obj)
	}
}
