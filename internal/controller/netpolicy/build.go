package netpolicy

import (
	"context"

	"github.com/netop-dev/netop/internal/component"
)

// Build is a MultiNetworkPolicy controller, if c's cluster serves them
// (nil otherwise): one that enforces them on a node, or reports on them.
func Build(ctx context.Context, c *component.Context, o Options) (*Controller, error) {
	return NewWhereServed(ctx, c.Kube.Discovery(), c.Netop.K8sCniCncfIo().V1beta1().MultiNetworkPolicies(), c.Pods.Core().V1().Pods(),
		c.Builtin.Core().V1().Namespaces(), c.Networks(), c.Recorder, c.Metrics, o)
}
