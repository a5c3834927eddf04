package network

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/overlap"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// resync lists the backend once and diffs it against the cache in memory:
// backend networks that no Network claims are deleted (the garbage
// collector the tutorials mention), and Networks whose backend network is
// missing or differs from the spec are reconciled. When nothing changed it
// costs one backend list and no API request.
func (c *Controller) resync(ctx context.Context) {
	logger := klog.FromContext(ctx)
	owned, err := c.backend.ListOwned(ctx)
	if err != nil {
		logger.Error(err, "Listing backend networks failed; orphans are swept at the next resync")
		return
	}
	observed := make(map[types.UID]backend.Observed, len(owned))
	for _, o := range owned {
		if o.Cluster != "" && o.Cluster != c.cluster {
			continue // another cluster's: never ours to sweep or repair
		}
		if name, claimed := c.nameForUID(o.UID); claimed {
			observed[o.UID] = o
			// The backend is the truth about what exists: a network that
			// a crash left unrecorded still keeps overlapping Networks
			// from building until its own sync decided about it.
			if len(o.Families) > 0 && !c.arbiter.Present(o.UID) {
				c.arbiter.MayBePresent(overlap.Entry{Namespace: name.Namespace, Name: name.Name, UID: o.UID, Prefixes: o.Prefixes()})
			}
			continue
		}
		if o.Cluster != c.cluster {
			// Recorded before clusters were: it may be another cluster's,
			// which that cluster adopts; only a Network's UID claims it.
			logger.V(4).Info("Leaving a backend network without a cluster record alone", "owner", klog.KRef(o.Namespace, o.Name), "uid", o.UID)
			continue
		}
		if !c.outcome.orphaned(ctx, o.Owner) {
			continue
		}
		logger.Info("Deleting orphaned backend network", "owner", klog.KRef(o.Namespace, o.Name), "uid", o.UID)
		if err := c.backend.Delete(ctx, o.Owner, &o.Status); err != nil {
			logger.Error(err, "Deleting orphaned backend network failed", "uid", o.UID)
			continue
		}
		c.metrics.BackendChanges.WithLabelValues(string(c.backend.Type()), metrics.ChangeSwept).Inc()
	}
	c.outcome.retain(func(uid types.UID) bool { _, ok := c.nameForUID(uid); return ok })
	for _, obj := range c.indexer.List() {
		n, ok := obj.(*samplecrdv2.Network)
		if !ok || n.DeletionTimestamp != nil || c.inSync(n, observed) && c.addressesInSync(ctx, n) && c.outcome.readinessInSync(n) {
			continue
		}
		logger.V(2).Info("Backend network differs from the Network; reconciling", "network", klog.KObj(n), "observed", observed[n.UID], "status", n.Status.Backend)
		c.Enqueue(n)
	}
}

// inSync reports whether the backend network of n is what its spec and
// status say. An invalid spec is in sync: nothing can be done until it
// changes.
func (c *Controller) inSync(n *samplecrdv2.Network, observed map[types.UID]backend.Observed) bool {
	families, errs := c.specs.Resolve(n)
	if len(errs) > 0 {
		return true
	}
	o, ok := observed[n.UID]
	if _, loses := c.arbiter.Loses(entryOf(n, families.Prefixes()...)); loses {
		// It must have no backend network, and its status must say why.
		return !ok && !c.arbiter.Present(n.UID) && n.Status.Backend == nil
	}
	// A record without the cluster is adopted by the sync rewriting it.
	built := ok && o.Cluster == c.cluster && o.Provides(backendNetwork(o.Owner, families, n.Spec))
	return c.outcome.inSync(n, o, built)
}

// liveNetworkExists asks the API server whether the owner still exists, for
// a backend network the cache does not know: the cache may lag behind a
// create, or this netop may watch one namespace only, and deleting a live
// Network's network would be worse than keeping an orphan until the next
// resync. The recorded name may have been shortened to fit, so a miss by
// name is confirmed by looking for the UID.
func (c *Controller) liveNetworkExists(ctx context.Context, o backend.Owner) bool {
	if o.Namespace != "" && o.Name != "" {
		n, err := c.client.SamplecrdV2().Networks(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
		switch {
		case err == nil && n.UID == o.UID:
			return true
		case err != nil && !apierrors.IsNotFound(err):
			return true // unsure: keep it
		}
	}
	list, err := c.client.SamplecrdV2().Networks(o.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return true
	}
	for _, n := range list.Items {
		if n.UID == o.UID {
			return true
		}
	}
	return false
}
