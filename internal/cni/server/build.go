package server

import "github.com/netop-dev/netop/internal/component"

// Build is the node side of the CNI plugin, serving ADD from c's pod
// cache on c's CNI socket, made in the network namespace netns ("" is the
// process's own); nil where no socket is set.
func Build(c *component.Context, netns string) (*Server, error) {
	if c.Settings.CNISocket == "" {
		return nil, nil
	}
	return New(c.Kube, c.Pods.Core().V1().Pods(), Options{Socket: c.Settings.CNISocket, Netns: netns, Namespace: c.Settings.Namespace, Metrics: c.Metrics})
}
