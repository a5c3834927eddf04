package operator

import (
	"context"

	"github.com/netop-dev/netop/internal/controller/hotplug"
)

// nodeName is the node this role runs for: the agent's, or hot-plug's
// where everything runs in one process.
func (o *Options) nodeName() string {
	if o.Role == RoleAgent {
		return o.Agent.NodeName
	}
	return o.HotPlug.Node
}

// newHotPlug is the node's side of hot-plug, where a CRI socket is given.
func newHotPlug(ctx context.Context, s *shared) (runnable, error) {
	h, err := hotplug.OnNode(ctx, s.opts.HotPlug, hotplug.NodeDeps{Kube: s.kube, Pods: s.pods.Core().V1().Pods(), Recorder: s.recorder,
		Metrics: s.metrics, Node: s.opts.nodeName(), Netns: s.opts.Backend.Netns, DataDir: s.opts.CNIDataDir, Workers: s.opts.Workers})
	if h == nil || err != nil {
		return nil, err
	}
	return h, nil
}
