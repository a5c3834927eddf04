package operator

import (
	"context"
	"fmt"

	"github.com/vishvananda/netns"

	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/controller/hotplug"
	"github.com/netop-dev/netop/internal/cri"
)

// nodeName is the node this role runs for: the agent's, or hot-plug's
// where everything runs in one process.
func (o *Options) nodeName() string {
	if o.Role == RoleAgent {
		return o.Agent.NodeName
	}
	return o.HotPlug.Node
}

// newHotPlug is the node's side of hot-plug, where a CRI socket is given:
// it attaches in the namespace of the node's bridges, through the
// runtime's socket.
func newHotPlug(ctx context.Context, s *shared) (runnable, error) {
	c := s.opts.HotPlug
	if c.CRISocket == "" {
		return nil, nil
	}
	// The bridges' namespace: this process's own, without opening it (as
	// the linux backend does), or the one --netns names.
	ns := netns.None()
	if name := s.opts.Backend.Netns; name != "" {
		var err error
		if ns, err = netns.GetFromName(name); err != nil {
			return nil, fmt.Errorf("the bridges' network namespace %q: %w", name, err)
		}
		defer func() { _ = ns.Close() }()
	}
	attacher, err := cni.NewAttacher(ns)
	if err != nil {
		return nil, err
	}
	runtime, err := cri.Dial(c.CRISocket)
	if err != nil {
		attacher.Close()
		return nil, err
	}
	h, err := hotplug.New(ctx, s.kube, s.pods.Core().V1().Pods(), s.recorder, s.metrics, hotplug.Options{
		Node: s.opts.nodeName(), Runtime: runtime, Attacher: attacher, Store: cni.Store{Dir: s.opts.CNIDataDir},
		Config: c.CNIConfig, Workers: s.opts.Workers,
	})
	if err != nil {
		attacher.Close()
		_ = runtime.Close()
		return nil, err
	}
	return closing{h, func() { attacher.Close(); _ = runtime.Close() }}, nil
}

// closing is a component that releases what it holds once it stopped.
type closing struct {
	*hotplug.Controller
	release func()
}

func (c closing) Run(ctx context.Context) error {
	defer c.release()
	return c.Controller.Run(ctx)
}
