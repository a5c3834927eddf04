package workload

import (
	"context"

	"github.com/netop-dev/netop/internal/component"
)

// Build is the workload controller of c's cluster, if cfg enables it (nil
// otherwise).
func Build(ctx context.Context, c *component.Context, cfg Config) (*Controller, error) {
	if !cfg.Enabled {
		return nil, nil
	}
	return New(ctx, Kinds(c.Kube, c.Builtin), c.Builtin.Core().V1().Namespaces(), c.Templates.Core().V1().ConfigMaps(), c.Recorder, c.Metrics,
		Options{OperatorNamespace: c.Settings.OperatorNamespace, Workers: c.Settings.Workers, AllowPrivilegedTemplates: cfg.AllowPrivilegedTemplates})
}
