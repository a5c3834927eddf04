// Package networkcache is where controllers read Networks from: the shared
// informer of every Network, or, for a node's agent that builds only the
// Networks its pods use, a cache of those alone (ByName), each watched by
// its name. Every agent watching every Network made each Network's change
// cost every node a decode, so that an agent's CPU grew with the cluster's
// Networks, not with its own (docs/benchmarks/journal.md, the agents bench on demand).
package networkcache

import (
	"context"
	"errors"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	samplecrdinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/samplecrd/v2"
)

// Source is a cache of Networks and the events of its changes, as
// controllers use it; a cache.SharedIndexInformer is one.
type Source interface {
	// AddIndexers adds indexes to the cache; before it is filled.
	AddIndexers(indexers cache.Indexers) error
	// GetIndexer is the cache.
	GetIndexer() cache.Indexer
	// AddEventHandlerWithOptions registers handler, told of every change
	// once the cache has it; before the source runs.
	AddEventHandlerWithOptions(handler cache.ResourceEventHandler, options cache.HandlerOptions) (cache.ResourceEventHandlerRegistration, error)
	// HasSyncedChecker is done once the cache holds what it is to hold.
	HasSyncedChecker() cache.DoneChecker
}

var _ Source = cache.SharedIndexInformer(nil)
var _ Source = (*ByName)(nil)

// ByName caches the Networks it is told to Watch, each through a watch of
// its own on its name (a field selector on metadata.name), and tells its
// handlers of their changes as one informer would: one event at a time,
// the cache updated first. A Network it stops watching leaves the cache
// without an event: it was not deleted.
type ByName struct {
	client    versioned.Interface
	namespace string
	resync    time.Duration
	indexer   cache.Indexer
	// initial is done once every name to watch at start was given.
	initial cache.DoneChecker
	synced  doneChannel

	// dispatch makes the watches' events reach the handlers one at a
	// time, as one informer's do.
	dispatch sync.Mutex

	mu       sync.Mutex
	ctx      context.Context
	running  sync.WaitGroup
	watches  map[cache.ObjectName]*nameWatch
	handlers []cache.ResourceEventHandler
}

// nameWatch is the watch of one Network's name.
type nameWatch struct {
	informer cache.SharedIndexInformer
	// relayed is done once the initial list reached the cache.
	relayed cache.DoneChecker
	// ctx is done once the watch is stopped.
	ctx    context.Context
	cancel context.CancelFunc
}

// NewByName makes a cache of the Networks named to it, in namespace (all
// if ""), each resynced every resync. Call SetInitial before Run.
func NewByName(client versioned.Interface, namespace string, resync time.Duration) *ByName {
	return &ByName{
		client: client, namespace: namespace, resync: resync,
		indexer: cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		synced:  doneChannel{name: "the Networks of this node", ch: make(chan struct{})},
		watches: map[cache.ObjectName]*nameWatch{},
	}
}

// SetInitial tells the cache what is done once the names it must watch at
// start were all given: it counts as synced once their Networks are listed
// (without it, those given before Run).
func (b *ByName) SetInitial(initial cache.DoneChecker) { b.initial = initial }

// AddIndexers adds indexes to the cache.
func (b *ByName) AddIndexers(indexers cache.Indexers) error { return b.indexer.AddIndexers(indexers) }

// GetIndexer is the cache.
func (b *ByName) GetIndexer() cache.Indexer { return b.indexer }

// AddEventHandlerWithOptions registers handler; call it before Run.
func (b *ByName) AddEventHandlerWithOptions(handler cache.ResourceEventHandler, _ cache.HandlerOptions) (cache.ResourceEventHandlerRegistration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ctx != nil {
		return nil, errors.New("networkcache: handlers must be registered before the cache runs")
	}
	b.handlers = append(b.handlers, handler)
	return registration{b.synced}, nil
}

// HasSyncedChecker is done once the Networks of every name given before
// initial was done were listed and handed to the handlers.
func (b *ByName) HasSyncedChecker() cache.DoneChecker { return b.synced }

// Watch has the cache follow the Network of that name, if it does not
// already; one outside the namespace is ignored.
func (b *ByName) Watch(name cache.ObjectName) {
	if b.namespace != "" && name.Namespace != b.namespace {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.watches[name]; ok {
		return
	}
	w := &nameWatch{}
	b.watches[name] = w
	if b.ctx != nil {
		b.start(name, w)
	}
}

// Unwatch stops following the Network of that name and drops it from the
// cache, without telling the handlers. Events of its watch still on their
// way may reach them, but no longer the cache.
func (b *ByName) Unwatch(name cache.ObjectName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	w, ok := b.watches[name]
	if !ok {
		return
	}
	delete(b.watches, name)
	if w.cancel != nil {
		w.cancel()
	}
	if obj, exists, _ := b.indexer.GetByKey(name.String()); exists {
		_ = b.indexer.Delete(obj)
	}
}

// Watched counts the names the cache follows.
func (b *ByName) Watched() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.watches)
}

// Run follows the names given until ctx is done.
func (b *ByName) Run(ctx context.Context) error {
	b.mu.Lock()
	if b.ctx != nil {
		b.mu.Unlock()
		return errors.New("networkcache: Run called twice")
	}
	b.ctx = ctx
	for name, w := range b.watches {
		b.start(name, w)
	}
	b.mu.Unlock()
	defer b.running.Wait()
	if !b.waitInitial(ctx) {
		return nil
	}
	close(b.synced.ch)
	<-ctx.Done()
	return nil
}

// waitInitial waits until the names to watch at start were all given and
// each was listed (or stopped being watched), or ctx is done.
func (b *ByName) waitInitial(ctx context.Context) bool {
	if b.initial != nil {
		select {
		case <-b.initial.Done():
		case <-ctx.Done():
			return false
		}
	}
	b.mu.Lock()
	pending := make([]*nameWatch, 0, len(b.watches))
	for _, w := range b.watches {
		if w.relayed != nil { // else never started: the cache stopped
			pending = append(pending, w)
		}
	}
	b.mu.Unlock()
	for _, w := range pending {
		select {
		case <-w.relayed.Done():
		case <-w.ctx.Done():
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// start runs the watch of name, unless the cache stopped; b.mu is held.
func (b *ByName) start(name cache.ObjectName, w *nameWatch) {
	if b.ctx.Err() != nil {
		return
	}
	selector := fields.OneTermEqualSelector("metadata.name", name.Name).String()
	w.informer = samplecrdinformers.NewFilteredNetworkInformer(b.client, name.Namespace, b.resync, nil,
		func(o *metav1.ListOptions) { o.FieldSelector = selector })
	_ = w.informer.SetTransform(kubeclient.DropManagedFields)           // not started: cannot fail
	reg, _ := w.informer.AddEventHandler(relay{b: b, name: name, w: w}) // not started: cannot fail
	w.relayed = reg.HasSyncedChecker()
	w.ctx, w.cancel = context.WithCancel(klog.NewContext(b.ctx, klog.FromContext(b.ctx).WithValues("network", name)))
	b.running.Go(func() { w.informer.RunWithContext(w.ctx) })
}

// relay hands one watch's events to the cache and the handlers.
type relay struct {
	b    *ByName
	name cache.ObjectName
	w    *nameWatch
}

func (r relay) OnAdd(obj any, initial bool) {
	r.deliver(func(i cache.Indexer) error { return i.Add(obj) }, func(h cache.ResourceEventHandler) { h.OnAdd(obj, initial) })
}

func (r relay) OnUpdate(oldObj, newObj any) {
	r.deliver(func(i cache.Indexer) error { return i.Update(newObj) }, func(h cache.ResourceEventHandler) { h.OnUpdate(oldObj, newObj) })
}

func (r relay) OnDelete(obj any) {
	r.deliver(func(i cache.Indexer) error { return i.Delete(obj) }, func(h cache.ResourceEventHandler) { h.OnDelete(obj) })
}

// deliver applies an event of r's watch to the cache, if the name is
// still watched by it, then tells the handlers.
func (r relay) deliver(apply func(cache.Indexer) error, tell func(cache.ResourceEventHandler)) {
	b := r.b
	b.dispatch.Lock()
	defer b.dispatch.Unlock()
	b.mu.Lock()
	current := b.watches[r.name] == r.w
	if current {
		_ = apply(b.indexer) // errors only from index functions, as an informer's
	}
	handlers := b.handlers
	b.mu.Unlock()
	if !current {
		return
	}
	for _, h := range handlers {
		tell(h)
	}
}

// registration is a handler's: synced with the cache.
type registration struct{ synced doneChannel }

func (r registration) HasSynced() bool                     { return cache.IsDone(r.synced) }
func (r registration) HasSyncedChecker() cache.DoneChecker { return r.synced }

// doneChannel is a cache.DoneChecker closed once done.
type doneChannel struct {
	name string
	ch   chan struct{}
}

func (d doneChannel) Name() string          { return d.name }
func (d doneChannel) Done() <-chan struct{} { return d.ch }
