// Package agent is netop's node agent, the `netop agent` role: on every
// node of a cluster, the Network controller building the bridges of the
// Networks the node's pods use (Demand) and reporting them (in the node's
// NetworkNode, package networknode), each Network's overlay peers (Peers),
// the CNI plugin installed on the host with credentials of its own, and
// the watch that tells when the node left the cluster.
package agent

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// WaitNodeRemoved returns true once the Node named node is deleted from
// the cluster, and false when ctx is done first. It watches that Node
// alone.
func WaitNodeRemoved(ctx context.Context, kube kubernetes.Interface, node string) (bool, error) {
	selector := fields.OneTermEqualSelector("metadata.name", node).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return kube.CoreV1().Nodes().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return kube.CoreV1().Nodes().Watch(ctx, o)
		},
	}
	seen := false
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Node{}, func(store cache.Store) (bool, error) {
		// A Node that was never there is not removed: the agent waits.
		seen = len(store.List()) > 0
		return false, nil
	}, func(e watch.Event) (bool, error) {
		switch e.Type {
		case watch.Added:
			seen = true
		case watch.Deleted:
			return seen, nil
		}
		return false, nil
	})
	switch {
	case err == nil:
		return true, nil
	case ctx.Err() != nil:
		return false, nil
	default:
		return false, fmt.Errorf("watching Node %s: %w", node, err)
	}
}
