package networks

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/overlap"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// CIDRs indexes the cidr of every Network not being deleted, kept current
// by an informer's handlers, so that the overlap check of one request costs
// the same beside ten Networks or ten thousand. Listing the cache and
// parsing every cidr on each request made creating N Networks cost O(N²).
//
// The informer delivers a Network a moment after its write returned, later
// on a busy machine, so the index alone misses a Network created just
// before: two overlapping Networks of one kubectl apply would both pass.
// CIDRs therefore also keeps the Networks this server admitted that the
// informer has not delivered yet (Admitted), and reads back from the API
// server (Live) those of them a request overlaps: a Network whose create
// returned is found there, one still being created or refused after
// admission is not. A request then costs the index's lookup and a scan of
// the few Networks admitted in the informer's lag; a read only when one of
// them overlaps it. Networks admitted by another replica are seen once the
// informer delivers them.
type CIDRs struct {
	mu    sync.RWMutex
	index *overlap.Index
	// admitted are Networks admitted here and not delivered yet, by UID.
	admitted map[types.UID]admittedNetwork
	handler  cache.ResourceEventHandlerRegistration
	// Live reads a Network from the API server, not a cache (a quorum
	// read). Nil: admitted Networks are not tracked.
	Live func(ctx context.Context, namespace, name string) (*samplecrdv2.Network, error)
}

// admittedNetwork is a Network admitted at a generation, at a time.
type admittedNetwork struct {
	overlap.Entry
	generation int64
	at         time.Time
}

// admittedFor is how long an admitted Network that the informer did not
// deliver is kept: longer than any create takes from admission to its
// write, after which the informer has it, or it was never written.
const admittedFor = 2 * time.Minute

// NewCIDRs returns an empty index; Watch fills it from an informer.
func NewCIDRs() *CIDRs {
	return &CIDRs{index: overlap.NewIndex(), admitted: map[types.UID]admittedNetwork{}}
}

// Watch keeps c current with informer's Networks.
func (c *CIDRs) Watch(informer cache.SharedIndexInformer) error {
	reg, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.set(obj) },
		UpdateFunc: func(_, obj any) { c.set(obj) },
		DeleteFunc: func(obj any) {
			if gone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = gone.Obj
			}
			if n, ok := obj.(*samplecrdv2.Network); ok {
				c.Delete(n)
			}
		},
	})
	c.handler = reg
	return err
}

// HasSyncedChecker is done once the informer's initial list is in the
// index; call it after Watch.
func (c *CIDRs) HasSyncedChecker() cache.DoneChecker { return c.handler.HasSyncedChecker() }

func (c *CIDRs) set(obj any) {
	if n, ok := obj.(*samplecrdv2.Network); ok {
		c.Set(n)
	}
}

// Set records n's cidrs, or forgets n while it is being deleted. The cidrs
// are parsed, not resolved: a Network that today's rules refuse (a
// reserved range, a /32) may have been built before they did, and still
// holds them.
func (c *CIDRs) Set(n *samplecrdv2.Network) {
	prefixes := netspec.ParsePrefixes(n.Spec.CIDRs...)
	if len(prefixes) == 0 || n.DeletionTimestamp != nil {
		c.Delete(n)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.index.Set(entryOf(n, prefixes))
	if a, ok := c.admitted[n.UID]; ok && n.Generation >= a.generation {
		delete(c.admitted, n.UID)
	}
}

func entryOf(n *samplecrdv2.Network, prefixes []netip.Prefix) overlap.Entry {
	return overlap.Entry{Namespace: n.Namespace, Name: n.Name, UID: n.UID, Created: n.CreationTimestamp.Time, Prefixes: prefixes}
}

// Delete forgets n.
func (c *CIDRs) Delete(n *samplecrdv2.Network) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.index.Remove(n.UID)
	delete(c.admitted, n.UID)
}

// Admitted records that n was admitted, to be found by Overlapping until
// the informer delivers it (that generation or a later one). The API
// server sets n's UID and generation before the validating webhooks see
// it.
func (c *CIDRs) Admitted(n *samplecrdv2.Network) {
	prefixes := netspec.ParsePrefixes(n.Spec.CIDRs...)
	if c.Live == nil || n.UID == "" || len(prefixes) == 0 {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for uid, a := range c.admitted {
		if now.Sub(a.at) > admittedFor {
			delete(c.admitted, uid)
		}
	}
	c.admitted[n.UID] = admittedNetwork{Entry: entryOf(n, prefixes), generation: n.Generation, at: now}
}

// Overlapping returns a Network other than namespace/name whose cidr
// overlaps p: from the index, else one admitted here that the API server
// has, with a cidr that overlaps p. It fails only when that read fails.
func (c *CIDRs) Overlapping(ctx context.Context, p netip.Prefix, namespace, name string) (overlap.Entry, bool, error) {
	if e, ok := c.indexed(p, namespace, name); ok {
		return e, true, nil
	}
	for _, a := range c.admittedOverlapping(p, namespace, name) {
		live, err := c.Live(ctx, a.Namespace, a.Name)
		switch {
		case apierrors.IsNotFound(err):
			continue // still being created, or never written
		case err != nil:
			return overlap.Entry{}, false, fmt.Errorf("reading Network %s/%s, admitted a moment ago: %w", a.Namespace, a.Name, err)
		}
		if e := entryOf(live, netspec.ParsePrefixes(live.Spec.CIDRs...)); live.DeletionTimestamp == nil && slices.ContainsFunc(e.Prefixes, p.Overlaps) {
			return e, true, nil
		}
	}
	return overlap.Entry{}, false, nil
}

// indexed returns an indexed Network other than namespace/name whose cidr
// overlaps p.
func (c *CIDRs) indexed(p netip.Prefix, namespace, name string) (overlap.Entry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var found overlap.Entry
	var ok bool
	c.index.Overlapping([]netip.Prefix{p}, "", func(e overlap.Entry) bool {
		if e.Namespace == namespace && e.Name == name {
			return true
		}
		found, ok = e, true
		return false
	})
	return found, ok
}

// admittedOverlapping are the Networks admitted here, not delivered yet,
// other than namespace/name, whose cidr overlaps p.
func (c *CIDRs) admittedOverlapping(p netip.Prefix, namespace, name string) []overlap.Entry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var found []overlap.Entry
	for _, a := range c.admitted {
		if (a.Namespace != namespace || a.Name != name) && slices.ContainsFunc(a.Prefixes, p.Overlaps) {
			found = append(found, a.Entry)
		}
	}
	return found
}
