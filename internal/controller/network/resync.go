package network

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
)

// resync lists the backend once and compares it with the cache: backend
// networks that no Network claims are deleted (the garbage collector the
// tutorials mention), and Networks whose backend network is missing are
// reconciled. When nothing changed it costs one backend list and no API
// request.
func (c *Controller) resync(ctx context.Context) {
	logger := klog.FromContext(ctx)
	owned, err := c.backend.ListOwned(ctx)
	if err != nil {
		logger.Error(err, "Listing backend networks failed; orphans are swept at the next resync")
		return
	}
	present := make(map[types.UID]bool, len(owned))
	for _, o := range owned {
		present[o.UID] = true
		if _, claimed := c.keyForUID(o.UID); claimed {
			continue
		}
		if c.liveNetworkExists(ctx, o) {
			continue
		}
		logger.Info("Deleting orphaned backend network", "owner", klog.KRef(o.Namespace, o.Name), "uid", o.UID)
		if err := c.backend.Delete(ctx, o, nil); err != nil {
			logger.Error(err, "Deleting orphaned backend network failed", "uid", o.UID)
		}
	}
	for _, obj := range c.indexer.List() {
		n, ok := obj.(interface{ GetUID() types.UID })
		if !ok || present[n.GetUID()] {
			continue
		}
		if key, ok := c.keyForUID(n.GetUID()); ok {
			c.queue.Add(key)
		}
	}
}

// liveNetworkExists asks the API server whether the owner still exists, for
// a backend network the cache does not know: the cache may lag behind a
// create, and deleting a live Network's network would be worse than keeping
// an orphan until the next resync.
func (c *Controller) liveNetworkExists(ctx context.Context, o backend.Owner) bool {
	if o.Namespace == "" || o.Name == "" {
		return false
	}
	n, err := c.client.SamplecrdV1().Networks(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false
	case err != nil:
		return true // unsure: keep it
	default:
		return n.UID == o.UID
	}
}
