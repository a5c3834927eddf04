package hotplug

import (
	"context"
	"fmt"

	"github.com/vishvananda/netns"

	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/component"
	"github.com/netop-dev/netop/internal/cri"
)

// Build is the node's side of hot-plug, where cfg gives a CRI socket (nil
// otherwise): it attaches node's pods in the namespace of the node's
// bridges ("" is the process's own), through the runtime's socket,
// and releases both once it stopped.
func Build(ctx context.Context, c *component.Context, cfg Config, node, bridges string) (*NodeController, error) {
	if cfg.CRISocket == "" {
		return nil, nil
	}
	// The bridges' namespace: this process's own, without opening it (as
	// the linux backend does), or the one named.
	ns := netns.None()
	if bridges != "" {
		var err error
		if ns, err = netns.GetFromName(bridges); err != nil {
			return nil, fmt.Errorf("the bridges' network namespace %q: %w", bridges, err)
		}
		defer func() { _ = ns.Close() }()
	}
	attacher, err := cni.NewAttacher(ns)
	if err != nil {
		return nil, err
	}
	runtime, err := cri.Dial(cfg.CRISocket)
	if err != nil {
		attacher.Close()
		return nil, err
	}
	h, err := New(ctx, c.Kube, c.Pods.Core().V1().Pods(), c.Recorder, c.Metrics, Options{
		Node: node, Runtime: runtime, Attacher: attacher, Store: cni.Store{Dir: c.Settings.CNIDataDir},
		Config: cfg.CNIConfig, Workers: c.Settings.Workers,
	})
	if err != nil {
		attacher.Close()
		_ = runtime.Close()
		return nil, err
	}
	return &NodeController{Controller: h, release: func() { attacher.Close(); _ = runtime.Close() }}, nil
}

// NodeController is hot-plug on a node: the controller, and the runtime
// connection and netlink handles it releases once it stopped.
type NodeController struct {
	*Controller
	release func()
}

// Run runs the controller until ctx is done, then releases what it holds.
func (c *NodeController) Run(ctx context.Context) error {
	defer c.release()
	return c.Controller.Run(ctx)
}
