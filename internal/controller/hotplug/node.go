package hotplug

import (
	"context"
	"fmt"

	"github.com/vishvananda/netns"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/cri"
	"github.com/netop-dev/netop/internal/metrics"
)

// NodeDeps is what hot-plug on a node is built from besides its Config.
type NodeDeps struct {
	Kube     kubernetes.Interface
	Pods     coreinformers.PodInformer
	Recorder record.EventRecorder
	Metrics  *metrics.Metrics
	// Node is the node whose pods are attached.
	Node string
	// Netns names the namespace of the node's bridges; "" is the
	// process's own.
	Netns string
	// DataDir holds the CNI plugin's records on the node.
	DataDir string
	Workers int
}

// OnNode is the node's side of hot-plug, where c gives a CRI socket (nil
// otherwise): it attaches in the namespace of the node's bridges, through
// the runtime's socket, and releases both once it stopped.
func OnNode(ctx context.Context, c Config, d NodeDeps) (*NodeController, error) {
	if c.CRISocket == "" {
		return nil, nil
	}
	// The bridges' namespace: this process's own, without opening it (as
	// the linux backend does), or the one named.
	ns := netns.None()
	if d.Netns != "" {
		var err error
		if ns, err = netns.GetFromName(d.Netns); err != nil {
			return nil, fmt.Errorf("the bridges' network namespace %q: %w", d.Netns, err)
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
	h, err := New(ctx, d.Kube, d.Pods, d.Recorder, d.Metrics, Options{
		Node: d.Node, Runtime: runtime, Attacher: attacher, Store: cni.Store{Dir: d.DataDir},
		Config: c.CNIConfig, Workers: d.Workers,
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
