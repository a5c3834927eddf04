package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubeinformers "k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/config"
	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/controller/network"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/networkcache"
	"github.com/netop-dev/netop/internal/networknode"
	"github.com/netop-dev/netop/internal/rungroup"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	netopinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/netop/v1alpha1"
	samplecrdinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/samplecrd/v2"
)

// Options are the agent's flags: its node and the CNI plugin it installs.
type Options struct {
	// NodeName is the agent's node; Pod its pod, if it runs in one.
	NodeName string
	Pod      string
	// InstallCNI makes the agent install the CNI plugin on its host: the
	// binary into CNIBinDir.
	InstallCNI bool
	CNIBinDir  string
	// OnDemand builds on the node only the Networks its pods use, each
	// kept ReleaseDelay after its last pod here left; off, every Network.
	OnDemand     bool
	ReleaseDelay time.Duration
}

// DefaultReleaseDelay is how long a node keeps a Network after its last
// pod there left: longer than a Deployment's rolling update takes to
// replace a pod on the same node, so that churn does not remove and make
// the bridge again (BENCHMARKS.md).
const DefaultReleaseDelay = 30 * time.Second

// NewOptions returns the defaults, where the manifests mount the host's
// directories and the downward API names the node and the pod.
func NewOptions() Options {
	return Options{
		NodeName:     os.Getenv("NODE_NAME"),
		Pod:          os.Getenv("POD_NAME"),
		CNIBinDir:    config.DefaultCNIBinDir,
		OnDemand:     true,
		ReleaseDelay: DefaultReleaseDelay,
	}
}

// AddFlags registers the agent's flags on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "The node this agent runs on, as its Node object is named. Defaults to $NODE_NAME (the downward API's spec.nodeName).")
	fs.BoolVar(&o.InstallCNI, "install-cni", o.InstallCNI, "Install netop's CNI plugin on the host as netop-cni in --cni-bin-dir: the netop-cni binary beside this one (the image's), or else this binary, which runs as the plugin under that name.")
	fs.StringVar(&o.CNIBinDir, "cni-bin-dir", o.CNIBinDir, "The host's CNI plugin directory, where --install-cni puts netop-cni.")
	o.AddDemandFlags(fs)
}

// AddDemandFlags registers the flags of which Networks the node builds;
// the standalone registers them for its nodes' agents.
func (o *Options) AddDemandFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.OnDemand, "networks-on-demand", o.OnDemand, "Build a Network on a node only while a pod there has an interface on it; false builds every Network on every node.")
	fs.DurationVar(&o.ReleaseDelay, "network-release-delay", o.ReleaseDelay, "With --networks-on-demand, how long a node keeps a Network's bridge after the last pod there on it left.")
}

// Validate checks the options.
func (o *Options) Validate() error {
	switch {
	case o.NodeName == "":
		return errors.New("--node-name (or $NODE_NAME) is required: the agent reports on its node")
	case o.InstallCNI && o.CNIBinDir == "":
		return errors.New("--install-cni needs --cni-bin-dir")
	case o.ReleaseDelay < 0:
		return fmt.Errorf("--network-release-delay %v: must not be negative", o.ReleaseDelay)
	}
	return nil
}

// Deps is what the agent is built from: the operator's shared clients,
// the Network, NetworkNode and pod informers and the node's backend, with
// its overlay.
type Deps struct {
	Config *rest.Config
	Kube   kubernetes.Interface
	Client versioned.Interface
	// Networks is every Network's informer, which only an agent building
	// every Network starts (its Informer); Namespace, if set, is the only
	// one whose Networks the agent builds.
	Networks  samplecrdinformers.NetworkInformer
	Namespace string
	Reports   netopinformers.NetworkNodeInformer
	Pods      coreinformers.PodInformer
	Backend   backend.Backend
	// Overlay is the node on the underlay (Overlay), nil without one.
	Overlay  *linux.Overlay
	Recorder record.EventRecorder
	Metrics  *metrics.Metrics
	// Network tunes the agent's Network controller; its outcome is the
	// agent's.
	Network network.Options
}

// Agent is one node's part of netop: the Network controller building the
// node's bridges and reporting them in the node's NetworkNode, the
// overlay's peers, the CNI plugin on the host, and the watch that tells
// when the node left the cluster. It writes no Network, serves no webhook
// and needs no leader: each node has one.
type Agent struct {
	node       string
	kube       kubernetes.Interface
	backend    backend.Backend
	cluster    string
	report     *networknode.Report
	controller *network.Controller
	// networks are the Networks the agent reads: byName, where the node
	// builds only those its pods use, else every Network.
	networks networkcache.Source
	byName   *networkcache.ByName
	// nodes are the peers' Nodes, for the overlay; nil without one.
	nodes kubeinformers.SharedInformerFactory
	// cni installs the CNI plugin on the host (--install-cni).
	cni *CNIInstall
}

// reportDelay coalesces the report's writes: a burst of Networks costs
// one write.
const reportDelay = time.Second

// New configures the agent of node o.NodeName.
func New(ctx context.Context, o Options, d Deps) (*Agent, error) {
	a := &Agent{node: o.NodeName, kube: d.Kube, backend: d.Backend, cluster: d.Network.Cluster}
	if o.InstallCNI {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("--install-cni: find this binary: %w", err)
		}
		a.cni = &CNIInstall{Executable: PluginExecutable(exe), BinDir: o.CNIBinDir}
	}
	a.report = networknode.NewReport(d.Client, d.Kube, o.NodeName, o.Pod, reportDelay)
	a.report.OnDemand(o.OnDemand)
	if err := a.report.Load(ctx); err != nil {
		return nil, err
	}
	// wants is nil where the node builds every Network (not a nil
	// *Demand, which the outcome would ask).
	var wants network.Demand
	var demand *Demand
	if o.OnDemand {
		// The node's cache holds only the Networks its pods are on.
		var err error
		a.byName = networkcache.NewByName(d.Client, d.Namespace, d.Network.Resync)
		if demand, err = NewDemand(d.Pods, o.NodeName, o.ReleaseDelay, a.byName); err != nil {
			return nil, err
		}
		a.byName.SetInitial(demand.HasSyncedChecker())
		a.networks, wants = a.byName, demand
	} else {
		a.networks = d.Networks.Informer()
	}
	opts := d.Network
	opts.Outcome = network.Agent(a.report, d.Overlay != nil, wants)
	var err error
	if a.controller, err = network.New(ctx, d.Client, a.networks, d.Backend, d.Recorder, d.Metrics, opts); err != nil {
		return nil, err
	}
	if demand != nil {
		demand.OnChange(a.controller.AddAfter)
	}
	if d.Overlay != nil {
		if err := a.followPeers(d.Overlay, d.Reports, wants, d.Network.Resync); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// followPeers has each Network's VXLAN device flood to the other nodes
// that realise it, at their Nodes' InternalIPs: when those change, the
// Networks this node realises are synced again.
func (a *Agent) followPeers(overlay *linux.Overlay, reports netopinformers.NetworkNodeInformer, wants network.Demand, resync time.Duration) error {
	a.nodes = kubeinformers.NewSharedInformerFactoryWithOptions(a.kube, resync, kubeinformers.WithTransform(trimNode))
	nodes := a.nodes.Core().V1().Nodes()
	peers, err := NewPeers(nodes, reports, a.node)
	if err != nil {
		return err
	}
	peers.OnChange(func(uids []types.UID) {
		for _, uid := range uids {
			if wants == nil || wants.Wants(uid) {
				a.controller.EnqueueUID(uid, 0)
			}
		}
	})
	overlay.Follow(peers)
	a.controller.WaitFor(peers.Synced()...)
	return nil
}

// Overlay is the overlay of node: its InternalIP, as its kubelet reports
// it, is where the VXLAN packets of every Network leave from. A node
// without one runs no overlay (nil).
func Overlay(ctx context.Context, kube kubernetes.Interface, node string) (*linux.Overlay, error) {
	n, err := kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the agent's Node %s: %w", node, err)
	}
	local, err := netip.ParseAddr(nodeInternalIP(n))
	if err != nil {
		klog.FromContext(ctx).Info("The node has no InternalIP: its bridges join no other node's", "node", node)
		return nil, nil //nolint:nilerr // no overlay is a working configuration
	}
	return &linux.Overlay{Local: local}, nil
}

// nodeInternalIP is the node's InternalIP, as kubelets report it, or "".
func nodeInternalIP(node *corev1.Node) string {
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

// trimNode keeps of a Node its name and addresses: the agent's peers.
func trimNode(obj any) (any, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.Name, UID: node.UID, ResourceVersion: node.ResourceVersion},
		Status: corev1.NodeStatus{Addresses: node.Status.Addresses}}, nil
}

// Networks are the Networks the agent reads, for the node's other parts:
// on demand, only those the node's pods use.
func (a *Agent) Networks() networkcache.Source { return a.networks }

// HasSyncedChecker is done once the Network controller has every Network.
func (a *Agent) HasSyncedChecker() cache.DoneChecker { return a.controller.HasSyncedChecker() }

// Ready says why the agent is not ready, or nil: with --install-cni, pods
// on the node cannot be attached before the plugin is in place.
func (a *Agent) Ready() error {
	if a.cni != nil && !a.cni.Installed() {
		return errors.New("the CNI plugin is not installed yet")
	}
	return nil
}

// errNodeRemoved stops the agent's parts when its Node was deleted.
var errNodeRemoved = errors.New("the node was removed from the cluster")

// Run runs the agent until ctx is done. When its Node is deleted, it
// removes the node's networks and then idles until ctx is done: its pod,
// bound to a Node that no longer exists, is the pod garbage collector's to
// delete, and an agent that exited would only be restarted by the kubelet,
// again and again, until then.
func (a *Agent) Run(ctx context.Context) error {
	parent := ctx
	g, ctx := rungroup.New(ctx)
	run := g.Run
	if a.nodes != nil {
		a.nodes.Start(ctx.Done())
		defer a.nodes.Shutdown()
	}
	if a.byName != nil {
		run("networks of the node", a.byName.Run)
	}
	run("node report", a.report.Run)
	if a.cni != nil {
		run("CNI plugin install", a.cni.Run)
	}
	run("network controller", a.controller.Run)
	run("node removal watch", func(ctx context.Context) error {
		removed, err := WaitNodeRemoved(ctx, a.kube, a.node)
		if removed {
			return errNodeRemoved
		}
		return err
	})
	err := g.Wait()
	if !errors.Is(err, errNodeRemoved) {
		return err
	}
	if err := a.removeNodeNetworks(parent); err != nil {
		return err
	}
	klog.FromContext(parent).Info("Idle until this agent is stopped: its node left the cluster", "node", a.node)
	<-parent.Done()
	return nil
}

// removeNodeNetworks removes this cluster's backend networks from the
// node whose Node was deleted: the node left the cluster, and nothing
// would ever sweep them. Other clusters' networks stay.
func (a *Agent) removeNodeNetworks(ctx context.Context) error {
	owned, err := a.backend.ListOwned(ctx)
	if err != nil {
		return fmt.Errorf("node removed: listing its networks: %w", err)
	}
	var errs []error
	removed := 0
	for _, o := range owned {
		if o.Cluster != a.cluster {
			continue
		}
		if err := a.backend.Delete(ctx, o.Owner, &o.Status); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	klog.FromContext(ctx).Info("Node removed from the cluster: removed its networks", "node", a.node, "removed", removed)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("node removed: removing its networks: %w", err)
	}
	return nil
}
