package hotplug

import (
	"errors"

	"github.com/spf13/pflag"
)

// Config is hot-plug's part of netop's flags, where nodes' bridges are
// built (the agent, `netop run`).
type Config struct {
	// CRISocket is the container runtime's CRI socket on the node; ""
	// turns hot-plug off (the pod's Networks are then fixed when its
	// sandbox starts).
	CRISocket string
	// Node is the node whose pods are attached; the agent's is its own
	// --node-name.
	Node string
	// CNIConfig names the network configuration an interface hot-plug
	// adds is recorded under when the pod's sandbox has no record yet.
	CNIConfig string
}

// AddFlags registers hot-plug's flags on fs.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.CRISocket, "cri-socket", c.CRISocket, "The container runtime's CRI socket on this node (containerd's: /run/containerd/containerd.sock). Set, running pods are attached to the Networks added to their k8s.v1.cni.cncf.io/networks annotation, and detached from those removed (hot-plug); empty, a pod's Networks are fixed when it starts.")
}

// Validate checks the flags; node is the node's name, if the role has one.
func (c *Config) Validate(node string) error {
	if c.CRISocket != "" && node == "" {
		return errors.New("--cri-socket: hot-plug needs the node's name (--node-name)")
	}
	return nil
}
