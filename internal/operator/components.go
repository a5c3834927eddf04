package operator

import (
	"context"
	"fmt"
	"slices"

	"github.com/spf13/pflag"

	"github.com/netop-dev/netop/internal/admission"
	"github.com/netop-dev/netop/internal/agent"
	cniserver "github.com/netop-dev/netop/internal/cni/server"
	"github.com/netop-dev/netop/internal/controller/at"
	"github.com/netop-dev/netop/internal/controller/deploynet"
	"github.com/netop-dev/netop/internal/controller/hotplug"
	"github.com/netop-dev/netop/internal/controller/nad"
	"github.com/netop-dev/netop/internal/controller/netpolicy"
	"github.com/netop-dev/netop/internal/controller/network"
	"github.com/netop-dev/netop/internal/controller/podnet"
	"github.com/netop-dev/netop/internal/controller/workload"
)

// part is a part of netop that roles run: a controller, the webhooks, the
// node agent. Each builds itself from the shared context (its package's
// Build); the list says which roles run it and with which of the options.
type part struct {
	name  string
	roles []Role
	// leaderOnly parts write: where replicas elect a leader, only the
	// leader runs them.
	leaderOnly bool
	// flags registers the part's flags, validate checks them.
	flags    func(o *Options, fs *pflag.FlagSet)
	validate func(o *Options) error
	// build makes the part; nil, nil when it does not run (turned off, or
	// not served by this cluster).
	build func(ctx context.Context, s *shared) (runnable, error)
}

// runnable is a built part. It may also tell when it has seen its caches
// whole (HasSyncedChecker() cache.DoneChecker: startup waits for it) and
// why it is not ready (Ready() error: /readyz says so).
type runnable interface {
	Run(ctx context.Context) error
}

// built is a runnable part, or none where its Build returned a nil one.
func built[T interface {
	comparable
	runnable
}](r T, err error) (runnable, error) {
	var none T
	if r == none || err != nil {
		return nil, err
	}
	return r, nil
}

type builtComponent struct {
	name       string
	leaderOnly bool
	runnable   runnable
}

// components are netop's parts, built in this order: each after those
// whose results it reads from the shared context (the allocator, an
// agent's Networks).
var components = []part{{
	name: "address allocation", roles: clusterWide, leaderOnly: true,
	build: func(ctx context.Context, s *shared) (runnable, error) { return built(podnet.Build(ctx, s.Context)) },
}, {
	name: "network controller", roles: clusterWide, leaderOnly: true,
	build: func(ctx context.Context, s *shared) (runnable, error) { return built(network.Build(ctx, s.Context)) },
}, {
	name: "node agent", roles: agentOnly,
	flags:    func(o *Options, fs *pflag.FlagSet) { o.Agent.AddFlags(fs) },
	validate: func(o *Options) error { return o.Agent.Validate() },
	// Before the policy enforcement, which reads the Networks it holds.
	build: func(ctx context.Context, s *shared) (runnable, error) {
		return built(agent.Build(ctx, s.Context, s.opts.Agent))
	},
}, {
	name: "hot-plug", roles: buildingBridges,
	flags:    func(o *Options, fs *pflag.FlagSet) { o.HotPlug.AddFlags(fs) },
	validate: func(o *Options) error { return o.HotPlug.Validate(o.nodeName()) },
	build: func(ctx context.Context, s *shared) (runnable, error) {
		return built(hotplug.Build(ctx, s.Context, s.opts.HotPlug, s.opts.nodeName(), s.opts.Backend.Netns))
	},
}, {
	// The node side of the CNI plugin: ADD, from the pod cache.
	name: "CNI server", roles: buildingBridges,
	build: func(_ context.Context, s *shared) (runnable, error) {
		return built(cniserver.Build(s.Context, s.opts.Backend.Netns))
	},
}, {
	name: "network policy enforcement", roles: buildingBridges,
	build: func(ctx context.Context, s *shared) (runnable, error) {
		if s.Firewall == nil {
			return nil, nil
		}
		return built(netpolicy.Build(ctx, s.Context, netpolicy.Options{Firewall: s.Firewall, Resync: s.Settings.Resync}))
	},
}, {
	name: "network policy report", roles: clusterWide, leaderOnly: true,
	build: func(ctx context.Context, s *shared) (runnable, error) {
		return built(netpolicy.Build(ctx, s.Context, netpolicy.Options{Report: true}))
	},
}, {
	name: "admission webhooks", roles: clusterWide,
	flags:    func(o *Options, fs *pflag.FlagSet) { o.Webhooks.AddFlags(fs) },
	validate: func(o *Options) error { return o.Webhooks.Validate(o.Namespace) },
	build: func(ctx context.Context, s *shared) (runnable, error) {
		if !s.opts.Webhooks.Enabled() {
			return admission.Remover{Kube: s.Kube}, nil
		}
		return built(admission.Build(ctx, s.Context, s.opts.Webhooks, s.opts.Workloads.AllowPrivilegedTemplates, s.opts.DeploymentNetworks.Enabled))
	},
}, {
	name: "workload controller", roles: clusterWide, leaderOnly: true,
	flags:    func(o *Options, fs *pflag.FlagSet) { o.Workloads.AddFlags(fs) },
	validate: func(o *Options) error { return o.Workloads.Validate(o.Namespace) },
	build: func(ctx context.Context, s *shared) (runnable, error) {
		return built(workload.Build(ctx, s.Context, s.opts.Workloads))
	},
}, {
	name: "NetworkAttachmentDefinition controller", roles: clusterWide, leaderOnly: true,
	build: func(ctx context.Context, s *shared) (runnable, error) { return built(nad.Build(ctx, s.Context)) },
}, {
	name: "At controller", roles: clusterWide, leaderOnly: true,
	flags:    func(o *Options, fs *pflag.FlagSet) { o.Ats.AddFlags(fs) },
	validate: func(o *Options) error { return o.Ats.Validate() },
	build: func(ctx context.Context, s *shared) (runnable, error) {
		return built(at.Build(ctx, s.Context, s.opts.Ats))
	},
}, {
	name: "Deployment network controller", roles: clusterWide, leaderOnly: true,
	flags:    func(o *Options, fs *pflag.FlagSet) { o.DeploymentNetworks.AddFlags(fs) },
	validate: func(o *Options) error { return o.DeploymentNetworks.Validate() },
	build: func(ctx context.Context, s *shared) (runnable, error) {
		return built(deploynet.Build(ctx, s.Context, s.opts.DeploymentNetworks))
	},
}}

// build makes the components of the shared context's role, in order.
func build(ctx context.Context, s *shared) ([]builtComponent, error) {
	var out []builtComponent
	for _, c := range components {
		if !slices.Contains(c.roles, s.opts.Role) {
			continue
		}
		r, err := c.build(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		if r != nil {
			out = append(out, builtComponent{name: c.name, leaderOnly: c.leaderOnly, runnable: r})
		}
	}
	return out, nil
}
