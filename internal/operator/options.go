package operator

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/spf13/pflag"

	"github.com/netop-dev/netop/internal/admission"
	"github.com/netop-dev/netop/internal/agent"
	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/backends"
	"github.com/netop-dev/netop/internal/cni/cniapi"
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
	// Workers is the number of objects each controller works on at once;
	// Resync how often informers resync and backends are compared.
	Workers int
	Resync  time.Duration
	// Namespace limits the operator to one namespace; "" means all.
	Namespace string
	// ClusterID is recorded on every backend network so that netops of
	// several clusters can share a network namespace or a Neutron project;
	// empty means the UID of the kube-system namespace.
	ClusterID string
	// OperatorNamespace holds the operator's own objects: the default
	// envoy-initializer template, the webhook certificate Secret, the
	// leader's Lease.
	OperatorNamespace string
	// AllowReservedPrefixes lets Networks use special-purpose prefixes
	// (see internal/netspec) in admission and in the controller alike.
	AllowReservedPrefixes bool
	// CNIDataDir is the path, on the nodes, of the CNI plugin's records:
	// what the NetworkAttachmentDefinitions name, and where hot-plug
	// records what it attaches.
	CNIDataDir string
	// CNISocket is the unix socket, on the nodes, the CNI plugin asks to
	// attach pods: where the node side serves it, and what the
	// NetworkAttachmentDefinitions kept for Multus name.
	CNISocket string

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
		Role:              RoleAll,
		Client:            kubeclient.NewOptions(),
		Workers:           4,
		Resync:            5 * time.Minute,
		OperatorNamespace: operatorNamespace(),
		Metrics:           metrics.Options{Addr: ":8080"},
		Backend:           backends.NewOptions(),
		Leader:            leader.NewOptions(),

		Agent:              agent.NewOptions(),
		Webhooks:           admission.NewOptions(),
		Workloads:          workload.NewConfig(),
		DeploymentNetworks: deploynet.NewConfig(),
		Ats:                at.NewConfig(),
		CNIDataDir:         "/var/lib/cni/netop",
		CNISocket:          cniapi.DefaultSocket,
	}
}

// operatorNamespace is the namespace the pod runs in (from the downward
// API), or netop-system.
func operatorNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return "netop-system"
}

// sharedFlags are the flags of the shared context, by the roles that take
// them; each component declares its own in the list of components.
var sharedFlags = []struct {
	roles []Role
	add   func(o *Options, fs *pflag.FlagSet)
}{
	{everyRole, (*Options).addSharedFlags},
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

// addSharedFlags registers the flags every role shares: the work
// queues, and what netop manages and as which cluster.
func (o *Options) addSharedFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.Workers, "workers", o.Workers, "Networks reconciled at once.")
	fs.DurationVar(&o.Resync, "resync", o.Resync, "How often the informers resync and the backend is compared with the Networks (orphans swept, missing networks recreated).")
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "Only manage Networks in this namespace (default: all namespaces).")
	fs.StringVar(&o.ClusterID, "cluster-id", o.ClusterID, "Identity of this cluster, recorded on every backend network: netops of several clusters sharing a network namespace or a Neutron project touch only their own cluster's networks. Default: the UID of the kube-system namespace.")
	fs.StringVar(&o.OperatorNamespace, "operator-namespace", o.OperatorNamespace, "Namespace of the operator's own objects: the default envoy-initializer template and the webhook certificate Secret. Defaults to $POD_NAMESPACE.")
	fs.BoolVar(&o.AllowReservedPrefixes, "allow-reserved-prefixes", o.AllowReservedPrefixes, "Let Networks use special-purpose prefixes (IANA special-purpose registries: link-local 169.254.0.0/16 and fe80::/10, 0.0.0.0/8, 240.0.0.0/4, 6to4, NAT64, ...). Loopback and multicast, and prefixes that contain them such as a /0, stay refused.")
	fs.StringVar(&o.CNIDataDir, "cni-data-dir", o.CNIDataDir, "Path, on the nodes, where netop's CNI plugin records attachments: written into the NetworkAttachmentDefinitions, and where hot-plug records what it attaches.")
	fs.StringVar(&o.CNISocket, "cni-socket", o.CNISocket, "Unix socket, on the nodes, that netop's CNI plugin asks to attach pods: a path, or @name for an abstract socket of the bridges' network namespace. Served where bridges are built (empty: not served), and written into the NetworkAttachmentDefinitions.")
}

// Validate checks the shared options, and those of the components the
// role runs.
func (o *Options) Validate() error {
	var err error
	switch {
	case !slices.Contains(everyRole, o.Role):
		err = fmt.Errorf("unknown role %q", o.Role)
	case o.Workers < 1:
		err = fmt.Errorf("--workers must be at least 1, got %d", o.Workers)
	case o.Resync <= 0:
		err = fmt.Errorf("--resync must be positive, got %v", o.Resync)
	case o.ClusterID != "" && backend.ValidCluster(o.ClusterID) != nil:
		err = fmt.Errorf("--cluster-id: %w", backend.ValidCluster(o.ClusterID))
	default:
		err = errors.Join(o.Client.Validate(), o.Backend.Validate(), o.Leader.Validate())
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
