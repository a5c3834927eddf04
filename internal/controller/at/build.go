package at

import (
	"context"

	"github.com/netop-dev/netop/internal/component"
)

// Build is the At controller, if cfg enables it and c's cluster serves
// Ats (nil otherwise).
func Build(ctx context.Context, c *component.Context, cfg Config) (*Controller, error) {
	if !cfg.Enabled {
		return nil, nil
	}
	return NewWhereServed(ctx, c.Client, c.Kube, c.Netop.Cnat().V1alpha1().Ats(), c.Pods.Core().V1().Pods(), c.Recorder, c.Metrics,
		Options{Workers: c.Settings.Workers, Image: cfg.Image})
}
