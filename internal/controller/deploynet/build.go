package deploynet

import (
	"context"

	"github.com/netop-dev/netop/internal/component"
)

// Build is the Deployment network controller, if cfg enables it (nil
// otherwise).
func Build(ctx context.Context, c *component.Context, cfg Config) (*Controller, error) {
	if !cfg.Enabled {
		return nil, nil
	}
	pool, err := NewPool(cfg.Pool, cfg.PrefixLength)
	if err != nil {
		return nil, err
	}
	return New(ctx, c.Client, c.Kube, c.Builtin.Apps().V1().Deployments(), c.Netop.Samplecrd().V2().Networks(),
		c.Recorder, c.Metrics, Options{Workers: c.Settings.Workers, Pool: pool})
}
