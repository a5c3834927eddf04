package agent

import (
	"context"

	"github.com/netop-dev/netop/internal/component"
	"github.com/netop-dev/netop/internal/controller/network"
)

// Build is the node agent of c's node. The Networks it holds go into
// c.NodeNetworks, for the policy enforcement, which reads them.
func Build(ctx context.Context, c *component.Context, o Options) (*Agent, error) {
	a, err := New(ctx, o, Deps{Config: c.Config, Kube: c.Kube, Client: c.Client, Networks: c.Netop.Samplecrd().V2().Networks(),
		Namespace: c.Settings.Namespace, Reports: c.Netop.Netop().V1alpha1().NetworkNodes(), Pods: c.Pods.Core().V1().Pods(),
		Backend: c.Backend, Overlay: c.Overlay, Recorder: c.Recorder, Metrics: c.Metrics, Network: network.OptionsFrom(c)})
	if err != nil {
		return nil, err
	}
	c.NodeNetworks = a.Networks()
	return a, nil
}
