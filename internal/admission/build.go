package admission

import (
	"context"

	"github.com/netop-dev/netop/internal/component"
)

// Build is the webhook server of c's cluster. allowPrivilegedTemplates
// and deploymentNetworks are the workload and Deployment-network features'
// settings, whose webhooks it serves.
func Build(ctx context.Context, c *component.Context, o Options, allowPrivilegedTemplates, deploymentNetworks bool) (*Server, error) {
	return New(ctx, o, Deps{Config: c.Config, Kube: c.Kube, Networks: c.Netop.Samplecrd().V2().Networks().Informer(),
		Templates: c.Templates.Core().V1().ConfigMaps().Lister(), Addresses: c.Addresses, Pins: c.Addresses,
		Namespaces: c.Builtin.Core().V1().Namespaces().Lister(), Recorder: c.Recorder, Metrics: c.Metrics,
		Synced: c.Synced, OperatorNamespace: c.Settings.OperatorNamespace, AllowReservedPrefixes: c.Settings.AllowReservedPrefixes,
		AllowPrivilegedTemplates: allowPrivilegedTemplates, DeploymentNetworks: deploymentNetworks})
}
