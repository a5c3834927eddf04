package operator

import (
	"errors"
	"fmt"
	"slices"

	"github.com/spf13/pflag"

	"github.com/netop-dev/netop/internal/admission"
	"github.com/netop-dev/netop/internal/agent"
	"github.com/netop-dev/netop/internal/backend/backends"
	"github.com/netop-dev/netop/internal/component"
	"github.com/netop-dev/netop/internal/controller/at"
	"github.com/netop-dev/netop/internal/controller/deploynet"
	"github.com/netop-dev/netop/internal/controller/hotplug"
	"github.com/netop-dev/netop/internal/controller/workload"
	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/internal/leader"
	"github.com/netop-dev/netop/internal/metrics"
)

// Role is what part of netop a process runs.
type Role string

const (
	// RoleAll runs everything in one process: the controllers, the
	// webhooks, and the backend networks (the standalone, `netop run`).
	RoleAll Role = "all"
	// RoleController runs what is cluster-wide: the Networks' status and
	// finalizers, admission, address allocation, the workload
	// initializer, Neutron. With the linux backend the bridges are the
	// agents' (`netop controller`).
	RoleController Role = "controller"
	// RoleAgent runs one node's part: its bridges, their drift repair and
	// sweeping, and the node's report (`netop agent`).
	RoleAgent Role = "agent"
)

var (
	everyRole       = []Role{RoleAll, RoleController, RoleAgent}
	clusterWide     = []Role{RoleAll, RoleController}
	buildingBridges = []Role{RoleAll, RoleAgent}
	agentOnly       = []Role{RoleAgent}
)

// Options are the operator's settings, each a command-line flag: the
// shared context's here, each part's in its own package.
type Options struct {
	// Role is set by the command, not by a flag.
	Role Role

	Client kubeclient.Options
	// The settings every component may read (component.Context).
	component.Settings

	Metrics metrics.Options
	Backend backends.Options
	Leader  leader.Options

	// Each component's own.
	Agent              agent.Options
	Webhooks           admission.Options
	Workloads          workload.Config
	DeploymentNetworks deploynet.Config
	Ats                at.Config
	HotPlug            hotplug.Config
}

// NewOptions returns the defaults for an operator in a cluster.
func NewOptions() *Options {
	return &Options{
		Role:     RoleAll,
		Client:   kubeclient.NewOptions(),
		Settings: component.NewSettings(),
		Metrics:  metrics.Options{Addr: ":8080"},
		Backend:  backends.NewOptions(),
		Leader:   leader.NewOptions(),

		Agent:              agent.NewOptions(),
		Webhooks:           admission.NewOptions(),
		Workloads:          workload.NewConfig(),
		DeploymentNetworks: deploynet.NewConfig(),
		Ats:                at.NewConfig(),
	}
}

// sharedFlags are the flags of the shared context, by the roles that take
// them; each component declares its own in the list of components.
var sharedFlags = []struct {
	roles []Role
	add   func(o *Options, fs *pflag.FlagSet)
}{
	{everyRole, func(o *Options, fs *pflag.FlagSet) { o.Settings.AddFlags(fs) }},
	{everyRole, func(o *Options, fs *pflag.FlagSet) { o.Client.AddFlags(fs) }},
	{everyRole, func(o *Options, fs *pflag.FlagSet) { o.Metrics.AddFlags(fs) }},
	{buildingBridges, func(o *Options, fs *pflag.FlagSet) { o.Backend.AddBridgeFlags(fs) }},
	{clusterWide, func(o *Options, fs *pflag.FlagSet) { o.Backend.AddFlags(fs) }},
	{clusterWide, func(o *Options, fs *pflag.FlagSet) { o.Leader.AddFlags(fs) }},
}

// AddFlags registers on fs the flags of what role runs.
func (o *Options) AddFlags(fs *pflag.FlagSet, role Role) {
	for _, g := range sharedFlags {
		if slices.Contains(g.roles, role) {
			g.add(o, fs)
		}
	}
	for _, c := range components {
		if c.flags != nil && slices.Contains(c.roles, role) {
			c.flags(o, fs)
		}
	}
}

// Validate checks the shared options, and those of the components the
// role runs.
func (o *Options) Validate() error {
	var err error
	switch {
	case !slices.Contains(everyRole, o.Role):
		err = fmt.Errorf("unknown role %q", o.Role)
	default:
		err = errors.Join(o.Settings.Validate(), o.Client.Validate(), o.Backend.Validate(), o.Leader.Validate())
	}
	if err != nil {
		return err
	}
	for _, c := range components {
		if c.validate != nil && slices.Contains(c.roles, o.Role) {
			if err := c.validate(o); err != nil {
				return err
			}
		}
	}
	return nil
}

// nodeName is the node this role runs for: the agent's, or hot-plug's
// where everything runs in one process.
func (o *Options) nodeName() string {
	if o.Role == RoleAgent {
		return o.Agent.NodeName
	}
	return o.HotPlug.Node
}
