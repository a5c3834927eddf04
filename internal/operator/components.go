package operator

import (
	"context"
	"fmt"
	"slices"

	"github.com/spf13/pflag"
	coreinformers "k8s.io/client-go/informers/core/v1"

	"github.com/netop-dev/netop/internal/admission"
	"github.com/netop-dev/netop/internal/agent"
	cniserver "github.com/netop-dev/netop/internal/cni/server"
	"github.com/netop-dev/netop/internal/controller/at"
	"github.com/netop-dev/netop/internal/controller/deploynet"
	"github.com/netop-dev/netop/internal/controller/nad"
	"github.com/netop-dev/netop/internal/controller/netpolicy"
	"github.com/netop-dev/netop/internal/controller/network"
	"github.com/netop-dev/netop/internal/controller/podnet"
	"github.com/netop-dev/netop/internal/controller/workload"
	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/networknode"
)

// component is a part of netop that roles run: a controller, the
// webhooks, the node agent.
type component struct {
	name  string
	roles []Role
	// leaderOnly components write: where replicas elect a leader, only
	// the leader runs them.
	leaderOnly bool
	// flags registers the component's flags, validate checks them.
	flags    func(o *Options, fs *pflag.FlagSet)
	validate func(o *Options) error
	// build makes the component from the shared context; nil, nil when it
	// does not run (turned off, or not served by this cluster).
	build func(ctx context.Context, s *shared) (runnable, error)
}

// runnable is a built component. It may also tell when it has seen its
// caches whole (HasSyncedChecker() cache.DoneChecker: startup waits for
// it) and why it is not ready (Ready() error: /readyz says so).
type runnable interface {
	Run(ctx context.Context) error
}

type builtComponent struct {
	name       string
	leaderOnly bool
	runnable   runnable
}

// components are netop's parts, built in this order: the address
// allocation before the Network controller and admission, which read it.
var components = []component{{
	name: "address allocation", roles: clusterWide, leaderOnly: true,
	// Allocation waits on the API server (one PATCH per pod), not on the
	// CPU: more workers than the controllers that work (BENCHMARKS.md).
	build: func(ctx context.Context, s *shared) (runnable, error) {
		c, err := podnet.New(ctx, s.kube, s.pods.Core().V1().Pods(), s.netop.Samplecrd().V2().Networks(), s.builtin.Core().V1().Namespaces(), s.recorder, s.metrics,
			podnet.Options{Workers: 4 * s.opts.Workers, Resolver: netspec.Resolver{AllowReserved: s.opts.AllowReservedPrefixes}})
		if err != nil {
			return nil, err
		}
		s.addresses = c.Allocator()
		return c, nil
	},
}, {
	name: "network controller", roles: clusterWide, leaderOnly: true,
	build: newNetworkController,
}, {
	name: "node agent", roles: agentOnly,
	flags:    func(o *Options, fs *pflag.FlagSet) { o.Agent.AddFlags(fs) },
	validate: func(o *Options) error { return o.Agent.Validate() },
	// Before the policy enforcement, which reads the Networks it holds.
	build: func(ctx context.Context, s *shared) (runnable, error) {
		a, err := agent.New(ctx, s.opts.Agent, agent.Deps{Config: s.config, Kube: s.kube, Client: s.client,
			Networks: s.netop.Samplecrd().V2().Networks(), Namespace: s.opts.Namespace, Reports: s.netop.Netop().V1alpha1().NetworkNodes(), Pods: s.pods.Core().V1().Pods(), Backend: s.backend, Overlay: s.overlay, Recorder: s.recorder, Metrics: s.metrics,
			Network: s.networkOptions()})
		if err != nil {
			return nil, err
		}
		s.nodeNetworks = a.Networks()
		return a, nil
	},
}, {
	name: "hot-plug", roles: buildingBridges,
	flags:    func(o *Options, fs *pflag.FlagSet) { o.HotPlug.AddFlags(fs) },
	validate: func(o *Options) error { return o.HotPlug.Validate(o.nodeName()) },
	build:    newHotPlug,
}, {
	// The node side of the CNI plugin: ADD, from the pod cache.
	name: "CNI server", roles: buildingBridges,
	build: func(_ context.Context, s *shared) (runnable, error) {
		if s.opts.CNISocket == "" {
			return nil, nil
		}
		return cniserver.New(s.kube, s.pods.Core().V1().Pods(), cniserver.Options{Socket: s.opts.CNISocket, Netns: s.opts.Backend.Netns, Namespace: s.opts.Namespace, Metrics: s.metrics})
	},
}, {
	name: "network policy enforcement", roles: buildingBridges,
	build: func(ctx context.Context, s *shared) (runnable, error) {
		if s.firewall == nil {
			return nil, nil
		}
		return newPolicyController(ctx, s, netpolicy.Options{Firewall: s.firewall, Resync: s.opts.Resync})
	},
}, {
	name: "network policy report", roles: clusterWide, leaderOnly: true,
	build: func(ctx context.Context, s *shared) (runnable, error) {
		return newPolicyController(ctx, s, netpolicy.Options{Report: true})
	},
}, {
	name: "admission webhooks", roles: clusterWide,
	flags:    func(o *Options, fs *pflag.FlagSet) { o.Webhooks.AddFlags(fs) },
	validate: func(o *Options) error { return o.Webhooks.Validate(o.Namespace) },
	build: func(ctx context.Context, s *shared) (runnable, error) {
		if !s.opts.Webhooks.Enabled() {
			return admission.Remover{Kube: s.kube}, nil
		}
		return admission.New(ctx, s.opts.Webhooks, s.admissionDeps())
	},
}, {
	name: "workload controller", roles: clusterWide, leaderOnly: true,
	flags:    func(o *Options, fs *pflag.FlagSet) { o.Workloads.AddFlags(fs) },
	validate: func(o *Options) error { return o.Workloads.Validate(o.Namespace) },
	build: func(ctx context.Context, s *shared) (runnable, error) {
		if !s.opts.Workloads.Enabled {
			return nil, nil
		}
		return workload.New(ctx, workload.Kinds(s.kube, s.builtin), s.builtin.Core().V1().Namespaces(),
			s.templates.Core().V1().ConfigMaps(), s.recorder, s.metrics, workload.Options{OperatorNamespace: s.opts.OperatorNamespace,
				Workers: s.opts.Workers, AllowPrivilegedTemplates: s.opts.Workloads.AllowPrivilegedTemplates})
	},
}, {
	name: "NetworkAttachmentDefinition controller", roles: clusterWide, leaderOnly: true,
	build: func(ctx context.Context, s *shared) (runnable, error) {
		c, nads, err := nad.NewWhereInstalled(ctx, s.config, s.kube, s.opts.Resync, s.opts.Namespace, s.netop.Samplecrd().V2().Networks(),
			s.recorder, s.metrics, nad.Options{Workers: s.opts.Workers, Socket: s.opts.CNISocket, DataDir: s.opts.CNIDataDir})
		if c == nil || err != nil {
			return nil, err
		}
		s.startWithOthers(nads)
		return c, nil
	},
}, {
	name: "At controller", roles: clusterWide, leaderOnly: true,
	flags:    func(o *Options, fs *pflag.FlagSet) { o.Ats.AddFlags(fs) },
	validate: func(o *Options) error { return o.Ats.Validate() },
	build: func(ctx context.Context, s *shared) (runnable, error) {
		if !s.opts.Ats.Enabled {
			return nil, nil
		}
		c, err := at.NewWhereServed(ctx, s.client, s.kube, s.netop.Cnat().V1alpha1().Ats(), s.pods.Core().V1().Pods(), s.recorder, s.metrics,
			at.Options{Workers: s.opts.Workers, Image: s.opts.Ats.Image})
		if c == nil || err != nil {
			return nil, err
		}
		return c, nil
	},
}, {
	name: "Deployment network controller", roles: clusterWide, leaderOnly: true,
	flags:    func(o *Options, fs *pflag.FlagSet) { o.DeploymentNetworks.AddFlags(fs) },
	validate: func(o *Options) error { return o.DeploymentNetworks.Validate() },
	build: func(ctx context.Context, s *shared) (runnable, error) {
		c := s.opts.DeploymentNetworks
		if !c.Enabled {
			return nil, nil
		}
		pool, err := deploynet.NewPool(c.Pool, c.PrefixLength)
		if err != nil {
			return nil, err
		}
		return deploynet.New(ctx, s.client, s.kube, s.builtin.Apps().V1().Deployments(), s.netop.Samplecrd().V2().Networks(),
			s.recorder, s.metrics, deploynet.Options{Workers: s.opts.Workers, Pool: pool})
	},
}}

// build makes the components of the shared context's role, in order.
func build(ctx context.Context, s *shared) ([]builtComponent, error) {
	var built []builtComponent
	for _, c := range components {
		if !slices.Contains(c.roles, s.opts.Role) {
			continue
		}
		r, err := c.build(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		if r != nil {
			built = append(built, builtComponent{name: c.name, leaderOnly: c.leaderOnly, runnable: r})
		}
	}
	return built, nil
}

// networkOptions tunes a Network controller of any role.
func (s *shared) networkOptions() network.Options {
	return network.Options{Cluster: s.cluster, Workers: s.opts.Workers, Resync: s.opts.Resync, AllowReservedPrefixes: s.opts.AllowReservedPrefixes}
}

// newNetworkController is the Network controller that writes the
// Networks: alone it builds them, in a cluster with agents it waits for
// the nodes' reports.
func newNetworkController(ctx context.Context, s *shared) (runnable, error) {
	opts := s.networkOptions()
	opts.Addresses = s.addresses
	opts.Outcome = network.Standalone()
	if s.fleet {
		// The agents' pods are seen where the pod cache covers their
		// namespace.
		var agentPods coreinformers.PodInformer
		if s.opts.Namespace == "" || s.opts.Namespace == s.opts.OperatorNamespace {
			agentPods = s.pods.Core().V1().Pods()
		}
		nodes, err := networknode.NewNodeReports(s.netop.Netop().V1alpha1().NetworkNodes(), agentPods, s.opts.OperatorNamespace)
		if err != nil {
			return nil, err
		}
		opts.Outcome = network.Cluster(nodes)
	}
	c, err := network.New(ctx, s.client, s.networks(), s.backend, s.recorder, s.metrics, opts)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// newPolicyController is a MultiNetworkPolicy controller, if the cluster
// serves them: one that enforces them on a node, or reports on them.
func newPolicyController(ctx context.Context, s *shared, o netpolicy.Options) (runnable, error) {
	c, err := netpolicy.NewWhereServed(ctx, s.kube.Discovery(), s.netop.K8sCniCncfIo().V1beta1().MultiNetworkPolicies(), s.pods.Core().V1().Pods(),
		s.builtin.Core().V1().Namespaces(), s.networks(), s.recorder, s.metrics, o)
	if c == nil || err != nil {
		return nil, err
	}
	return c, nil
}

// admissionDeps is what the webhooks read of the shared context.
func (s *shared) admissionDeps() admission.Deps {
	return admission.Deps{Config: s.config, Kube: s.kube, Networks: s.netop.Samplecrd().V2().Networks().Informer(),
		Templates: s.templates.Core().V1().ConfigMaps().Lister(), Addresses: s.addresses, Pins: s.addresses,
		Namespaces: s.builtin.Core().V1().Namespaces().Lister(), Recorder: s.recorder, Metrics: s.metrics,
		Synced: s.synced, OperatorNamespace: s.opts.OperatorNamespace, AllowReservedPrefixes: s.opts.AllowReservedPrefixes,
		AllowPrivilegedTemplates: s.opts.Workloads.AllowPrivilegedTemplates, DeploymentNetworks: s.opts.DeploymentNetworks.Enabled}
}
