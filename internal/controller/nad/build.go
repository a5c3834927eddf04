package nad

import (
	"context"

	"github.com/netop-dev/netop/internal/component"
)

// Build is the NetworkAttachmentDefinition controller, where c's cluster
// has their CRD (nil otherwise); its informer starts with c's.
func Build(ctx context.Context, c *component.Context) (*Controller, error) {
	s := c.Settings
	ctrl, nads, err := NewWhereInstalled(ctx, c.Config, c.Kube, s.Resync, s.Namespace, c.Netop.Samplecrd().V2().Networks(),
		c.Recorder, c.Metrics, Options{Workers: s.Workers, Socket: s.CNISocket, DataDir: s.CNIDataDir})
	if ctrl == nil || err != nil {
		return nil, err
	}
	c.StartWithOthers(nads)
	return ctrl, nil
}
