package podnet

import (
	"context"

	"github.com/netop-dev/netop/internal/component"
	"github.com/netop-dev/netop/internal/netspec"
)

// Build is the address allocation of c's cluster. Its allocator goes into
// c.Addresses, for the Network controller and admission, which read it.
func Build(ctx context.Context, c *component.Context) (*Controller, error) {
	// Allocation waits on the API server (one PATCH per pod), not on the
	// CPU: more workers than the controllers that work (BENCHMARKS.md).
	ctrl, err := New(ctx, c.Kube, c.Pods.Core().V1().Pods(), c.Netop.Samplecrd().V2().Networks(), c.Builtin.Core().V1().Namespaces(), c.Recorder, c.Metrics,
		Options{Workers: 4 * c.Settings.Workers, Resolver: netspec.Resolver{AllowReserved: c.Settings.AllowReservedPrefixes}})
	if err != nil {
		return nil, err
	}
	c.Addresses = ctrl.Allocator()
	return ctrl, nil
}
