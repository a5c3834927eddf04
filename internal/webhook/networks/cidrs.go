package networks

import (
	"net/netip"
	"sync"

	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/overlap"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// CIDRs indexes the cidr of every Network not being deleted, kept current
// by an informer's handlers, so that the overlap check of one request costs
// the same beside ten Networks or ten thousand. Listing the cache and
// parsing every cidr on each request made creating N Networks cost O(N²).
type CIDRs struct {
	mu      sync.RWMutex
	index   *overlap.Index
	handler cache.ResourceEventHandlerRegistration
}

// NewCIDRs returns an empty index; Watch fills it from an informer.
func NewCIDRs() *CIDRs { return &CIDRs{index: overlap.NewIndex()} }

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
	c.index.Set(overlap.Entry{Namespace: n.Namespace, Name: n.Name, UID: n.UID, Created: n.CreationTimestamp.Time, Prefixes: prefixes})
}

// Delete forgets n.
func (c *CIDRs) Delete(n *samplecrdv2.Network) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.index.Remove(n.UID)
}

// Overlapping returns a Network other than namespace/name whose cidr
// overlaps p.
func (c *CIDRs) Overlapping(p netip.Prefix, namespace, name string) (overlap.Entry, bool) {
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
