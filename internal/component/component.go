// Package component is the context every part of netop is built from: the
// clients, one informer factory per API group and cache shape, Events,
// metrics, the backend, and the settings every role shares. The operator
// (internal/operator) makes one per process and lists the components; each
// component's package builds itself from it (its Build function), so that
// its wiring stands beside it.
package component

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/cni/cniapi"
	"github.com/netop-dev/netop/internal/controller/podnet/allocator"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/networkcache"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

// Context is what every component is built from.
type Context struct {
	Settings Settings
	Config   *rest.Config
	Kube     kubernetes.Interface
	Client   versioned.Interface
	// The informer factories, one per API group and cache shape, each
	// with the transform that keeps its cache small: netop's resources,
	// the built-in ones, pods (kubeclient.TrimPod) and the
	// envoy-initializer ConfigMaps. A factory no component asks for starts
	// nothing.
	Netop     informers.SharedInformerFactory
	Builtin   kubeinformers.SharedInformerFactory
	Pods      kubeinformers.SharedInformerFactory
	Templates kubeinformers.SharedInformerFactory
	Recorder  record.EventRecorder
	Metrics   *metrics.Metrics
	Backend   backend.Backend
	// Cluster is the cluster identity recorded on backend networks.
	Cluster string
	// Fleet is set when the nodes' agents build the bridges
	// (agents.Backend): Networks are ready once ready on every node.
	Fleet bool
	// Overlay is an agent's node on the underlay; nil elsewhere, or on a
	// node without an InternalIP.
	Overlay *linux.Overlay
	// Firewall enforces network policies where the backend is a node's
	// bridges (linux); nil elsewhere.
	Firewall *linux.Firewall
	// Synced is closed once every cache is synced.
	Synced chan struct{}

	// What components built earlier publish for those built after them
	// (the operator's list is in that order).
	//
	// NodeNetworks are the Networks an agent reads (agent.Networks): on
	// demand, only those its node's pods use. nil in other roles.
	NodeNetworks networkcache.Source
	// Addresses is the address allocation's allocator, which the Network
	// controller and admission read.
	Addresses *allocator.Allocator

	more []Factory
}

// Factory is an informer factory: started with the others, shut down
// after the components stopped.
type Factory interface {
	Start(<-chan struct{})
	Shutdown()
}

// StartWithOthers has f started and shut down with the shared factories.
func (c *Context) StartWithOthers(f Factory) { c.more = append(c.more, f) }

// Factories are the informer factories to start, the shared ones first.
func (c *Context) Factories() []Factory {
	return append([]Factory{c.Netop, c.Builtin, c.Pods, c.Templates}, c.more...)
}

// Networks are the Networks the role's components read: an agent's own,
// else every Network's shared informer. Asking for the informer starts it:
// an agent on demand must not.
func (c *Context) Networks() networkcache.Source {
	if c.NodeNetworks != nil {
		return c.NodeNetworks
	}
	return c.Netop.Samplecrd().V2().Networks().Informer()
}

// Settings are what every role shares, each a command-line flag.
type Settings struct {
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
}

// NewSettings returns the defaults for an operator in a cluster.
func NewSettings() Settings {
	return Settings{
		Workers:           4,
		Resync:            5 * time.Minute,
		OperatorNamespace: operatorNamespace(),
		CNIDataDir:        "/var/lib/cni/netop",
		CNISocket:         cniapi.DefaultSocket,
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

// AddFlags registers the settings' flags on fs: the work queues, and what
// netop manages and as which cluster.
func (s *Settings) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&s.Workers, "workers", s.Workers, "Networks reconciled at once.")
	fs.DurationVar(&s.Resync, "resync", s.Resync, "How often the informers resync and the backend is compared with the Networks (orphans swept, missing networks recreated).")
	fs.StringVar(&s.Namespace, "namespace", s.Namespace, "Only manage Networks in this namespace (default: all namespaces).")
	fs.StringVar(&s.ClusterID, "cluster-id", s.ClusterID, "Identity of this cluster, recorded on every backend network: netops of several clusters sharing a network namespace or a Neutron project touch only their own cluster's networks. Default: the UID of the kube-system namespace.")
	fs.StringVar(&s.OperatorNamespace, "operator-namespace", s.OperatorNamespace, "Namespace of the operator's own objects: the default envoy-initializer template and the webhook certificate Secret. Defaults to $POD_NAMESPACE.")
	fs.BoolVar(&s.AllowReservedPrefixes, "allow-reserved-prefixes", s.AllowReservedPrefixes, "Let Networks use special-purpose prefixes (IANA special-purpose registries: link-local 169.254.0.0/16 and fe80::/10, 0.0.0.0/8, 240.0.0.0/4, 6to4, NAT64, ...). Loopback and multicast, and prefixes that contain them such as a /0, stay refused.")
	fs.StringVar(&s.CNIDataDir, "cni-data-dir", s.CNIDataDir, "Path, on the nodes, where netop's CNI plugin records attachments: written into the NetworkAttachmentDefinitions, and where hot-plug records what it attaches.")
	fs.StringVar(&s.CNISocket, "cni-socket", s.CNISocket, "Unix socket, on the nodes, that netop's CNI plugin asks to attach pods: a path, or @name for an abstract socket of the bridges' network namespace. Served where bridges are built (empty: not served), and written into the NetworkAttachmentDefinitions.")
}

// Validate checks the settings.
func (s *Settings) Validate() error {
	switch {
	case s.Workers < 1:
		return fmt.Errorf("--workers must be at least 1, got %d", s.Workers)
	case s.Resync <= 0:
		return fmt.Errorf("--resync must be positive, got %v", s.Resync)
	case s.ClusterID != "" && backend.ValidCluster(s.ClusterID) != nil:
		return fmt.Errorf("--cluster-id: %w", backend.ValidCluster(s.ClusterID))
	}
	return nil
}
