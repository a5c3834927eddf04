package network

import (
	"context"

	coreinformers "k8s.io/client-go/informers/core/v1"

	"github.com/netop-dev/netop/internal/component"
	"github.com/netop-dev/netop/internal/networknode"
)

// OptionsFrom tunes a Network controller of any role by c's settings.
func OptionsFrom(c *component.Context) Options {
	return Options{Cluster: c.Cluster, Workers: c.Settings.Workers, Resync: c.Settings.Resync, AllowReservedPrefixes: c.Settings.AllowReservedPrefixes}
}

// Build is the Network controller that writes the Networks: alone it
// builds them, in a cluster with agents (c.Fleet) it waits for the nodes'
// reports.
func Build(ctx context.Context, c *component.Context) (*Controller, error) {
	opts := OptionsFrom(c)
	opts.Addresses = c.Addresses
	opts.Outcome = Standalone()
	if c.Fleet {
		// The agents' pods are seen where the pod cache covers their
		// namespace.
		var agentPods coreinformers.PodInformer
		if s := c.Settings; s.Namespace == "" || s.Namespace == s.OperatorNamespace {
			agentPods = c.Pods.Core().V1().Pods()
		}
		nodes, err := networknode.NewNodeReports(c.Netop.Netop().V1alpha1().NetworkNodes(), agentPods, c.Settings.OperatorNamespace)
		if err != nil {
			return nil, err
		}
		opts.Outcome = Cluster(nodes)
	}
	return New(ctx, c.Client, c.Networks(), c.Backend, c.Recorder, c.Metrics, opts)
}
