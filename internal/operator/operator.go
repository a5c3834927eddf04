package operator

import (
	"context"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/version"
)

// Run runs the operator against the cluster of cfg until ctx is done.
func Run(ctx context.Context, cfg *rest.Config, o *Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = o.QPS, o.Burst
	cfg.UserAgent = "netop/" + version.String()
	logger := klog.FromContext(ctx)
	logger.Info("Starting netop", "version", version.String(), "server", cfg.Host)
	<-ctx.Done()
	logger.Info("Stopping netop")
	return nil
}
