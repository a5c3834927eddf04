// Package backends makes the backend netop's flags name: the linux
// backend (a bridge per Network, in the host's or a named network
// namespace) or Neutron.
package backends

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/linux"
	neutronbackend "github.com/netop-dev/netop/internal/backend/neutron"
)

// Options are the backend's flags.
type Options struct {
	// Type is the backend that provides Networks: linux or neutron.
	Type string
	// Netns is the network namespace the linux backend works in; "" is
	// the host's.
	Netns string
	// NeutronEndpoint is a noauth Neutron URL (development and tests);
	// empty authenticates with Keystone from OS_* or clouds.yaml.
	NeutronEndpoint string
	// NeutronProject owns the networks netop makes in Neutron;
	// NeutronCloud names the clouds.yaml entry (default $OS_CLOUD).
	NeutronProject, NeutronCloud string
}

// NewOptions returns the defaults: linux bridges in the host's namespace.
func NewOptions() Options { return Options{Type: string(backend.TypeLinux)} }

// AddFlags registers which backend provides the Networks.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Type, "backend", o.Type, "The backend that provides networks: linux (a bridge per Network) or neutron (an OpenStack Neutron network and subnet).")
	fs.StringVar(&o.NeutronEndpoint, "neutron-endpoint", o.NeutronEndpoint, "URL of a Neutron API without authentication (noauth), for development and tests. Empty: Keystone from the OS_* variables or clouds.yaml.")
	fs.StringVar(&o.NeutronProject, "neutron-project", o.NeutronProject, "Neutron project ID that owns netop's networks; required with --neutron-endpoint.")
	fs.StringVar(&o.NeutronCloud, "neutron-cloud", o.NeutronCloud, "clouds.yaml entry to authenticate with (default $OS_CLOUD).")
}

// AddBridgeFlags registers where the linux backend builds bridges.
func (o *Options) AddBridgeFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Netns, "netns", o.Netns, "Named network namespace (as in `ip netns`) the linux backend works in, created if missing; \"\" is the host's namespace.")
}

// Validate checks the options.
func (o *Options) Validate() error {
	switch {
	case o.Type != string(backend.TypeLinux) && o.Type != string(backend.TypeNeutron):
		return fmt.Errorf("--backend %q is not supported; supported: linux, neutron", o.Type)
	case o.Type == string(backend.TypeNeutron) && o.NeutronEndpoint != "" && o.NeutronProject == "":
		return fmt.Errorf("--neutron-project is required with --neutron-endpoint: Neutron without Keystone needs the project that owns the networks")
	}
	return nil
}

// New makes the backend the options name, and the function that releases
// it. A linux backend joins other nodes' bridges over overlay, if any.
func New(ctx context.Context, o Options, overlay *linux.Overlay) (backend.Backend, func(), error) {
	if o.Type == string(backend.TypeNeutron) {
		nb, err := neutronbackend.New(ctx, neutronbackend.Config{Endpoint: o.NeutronEndpoint, ProjectID: o.NeutronProject, Cloud: o.NeutronCloud})
		if err != nil {
			return nil, func() {}, err
		}
		return nb, func() {}, nil
	}
	lb, err := linux.New(ctx, linux.Config{Netns: o.Netns, Overlay: overlay})
	if err != nil {
		return nil, func() {}, err
	}
	return lb, lb.Close, nil
}
