package operator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"reflect"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	kubeinformers "k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/agent"
	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/agents"
	"github.com/netop-dev/netop/internal/backend/linux"
	neutronbackend "github.com/netop-dev/netop/internal/backend/neutron"
	"github.com/netop-dev/netop/internal/controller/at"
	"github.com/netop-dev/netop/internal/controller/deploynet"
	"github.com/netop-dev/netop/internal/controller/nad"
	"github.com/netop-dev/netop/internal/controller/network"
	"github.com/netop-dev/netop/internal/controller/podnet"
	"github.com/netop-dev/netop/internal/controller/workload"
	"github.com/netop-dev/netop/internal/eventsink"
	"github.com/netop-dev/netop/internal/httpserver"
	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/networknode"
	"github.com/netop-dev/netop/internal/version"
	cnatv1alpha1 "github.com/netop-dev/netop/pkg/apis/cnat/v1alpha1"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdinstall "github.com/netop-dev/netop/pkg/apis/samplecrd/install"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

// scheme knows the built-in types and ours: for Event references and for
// decoding admitted objects.
var scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	// Network's hub and every served version, with their conversions:
	// the conversion webhook converts through them.
	samplecrdinstall.Install(scheme)
	utilruntime.Must(cnatv1alpha1.AddToScheme(scheme))
}

// Both ends of a NetworkNode are what the Network controller records in
// and reads from in a cluster with agents.
var (
	_ network.Reporter      = (*networknode.Report)(nil)
	_ network.NodeReadiness = (*networknode.NodeReports)(nil)
	_ network.AddressUsage  = (*podnet.Controller)(nil)
)

// Operator is netop configured for one cluster, ready to run.
type Operator struct {
	opts        *Options
	factory     informers.SharedInformerFactory
	controller  *network.Controller
	metrics     *metrics.Metrics
	broadcaster record.EventBroadcaster
	// events writes the broadcaster's Events, several at once.
	events      *eventsink.Sink
	kubeFactory kubeinformers.SharedInformerFactory
	templates   kubeinformers.SharedInformerFactory
	// pods is the pod cache of the address allocation, trimmed to what
	// it reads.
	pods   kubeinformers.SharedInformerFactory
	podnet *podnet.Controller
	// report is the agent's report on its node, nodes its peers' Nodes
	// (agent role only).
	report *networknode.Report
	nodes  kubeinformers.SharedInformerFactory
	// cni installs the CNI plugin on the agent's host (--install-cni).
	cni *agent.CNIInstall
	// cluster is the cluster identity recorded on backend networks.
	cluster string
	// nads is the NetworkAttachmentDefinitions' cache, where Multus is.
	nads      dynamicinformer.DynamicSharedInformerFactory
	nadKeep   *nad.Controller
	admission *admission
	workloads *workload.Controller
	ats       *at.Controller
	// deploymentNetworks gives annotated Deployments their Networks.
	deploymentNetworks *deploynet.Controller
	backend            backend.Backend
	close              func()
	synced             atomic.Bool
	// leader is the identity of the replica that leads, as last seen.
	leader atomic.Value
	kube   kubernetes.Interface
	// started is when Run began, for the startup metrics.
	started time.Time

	// removeWebhooks runs instead of admission when webhooks are off.
	removeWebhooks func(context.Context) error
}

// New configures an operator for the cluster of cfg. be is the backend to
// use; nil makes the one the options name. Nothing runs until Run.
func New(ctx context.Context, cfg *rest.Config, o *Options, be backend.Backend) (*Operator, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	op := &Operator{opts: o, metrics: metrics.New(), close: func() {}}

	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = o.QPS, o.Burst
	cfg.UserAgent = "netop/" + version.String()
	cfg.Wrap(op.metrics.CountRequests)
	kube, err := kubeclient.New(cfg, o.KubeAPIContentType)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	op.kube = kube
	client, err := versioned.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("netop client: %w", err)
	}

	cluster, err := clusterID(ctx, kube, o.ClusterID)
	if err != nil {
		return nil, err
	}
	op.cluster = cluster
	if o.Role == RoleAgent {
		if o.overlay, err = agentOverlay(ctx, kube, o.NodeName); err != nil {
			return nil, err
		}
	}
	if be == nil {
		if o.Role == RoleController && o.Backend == string(samplecrd.BackendLinux) {
			be = agents.Backend{}
		} else if be, op.close, err = NewBackend(ctx, o); err != nil {
			return nil, err
		}
	}
	op.backend = backend.Instrument(be, func(operation string, d time.Duration, err error) {
		op.metrics.ObserveBackend(string(be.Type()), operation, d, err)
	})

	op.factory = informers.NewSharedInformerFactoryWithOptions(client, o.Resync,
		informers.WithNamespace(o.Namespace),
		informers.WithTransform(dropManagedFields))
	op.broadcaster = record.NewBroadcaster(record.WithContext(ctx))
	recorder := op.broadcaster.NewRecorder(scheme, corev1.EventSource{Component: "netop"})
	// Events get a client, and so a rate limiter, of their own: they are
	// best effort, and must not slow the status writes down.
	eventsConfig := kubeclient.Config(cfg, o.KubeAPIContentType)
	// Bounds a stop's last writes (eventsink's flush) and a hung request.
	eventsConfig.Timeout = 10 * time.Second
	eventClient, err := kubernetes.NewForConfig(eventsConfig)
	if err != nil {
		return nil, fmt.Errorf("event client: %w", err)
	}
	op.events = eventsink.Start(ctx, &typedcorev1.EventSinkImpl{Interface: eventClient.CoreV1().Events("")}, eventsink.Options{
		Written: op.metrics.EventsWritten.Inc,
		Dropped: func(reason string) { op.metrics.EventsDropped.WithLabelValues(reason).Inc() },
	})
	op.broadcaster.StartRecordingToSink(op.events)

	fail := func(err error) (*Operator, error) {
		op.broadcaster.Shutdown()
		op.events.Stop()
		op.close()
		return nil, err
	}
	if o.Role == RoleAgent {
		if err := op.newAgent(ctx, cfg, client, cluster, recorder); err != nil {
			return fail(err)
		}
		return op, nil
	}
	op.pods = kubeinformers.NewSharedInformerFactoryWithOptions(kube, o.Resync,
		kubeinformers.WithNamespace(o.Namespace), kubeinformers.WithTransform(trimPod))
	// Allocation waits on the API server (one PATCH per pod), not on the
	// CPU: more workers than the controllers that work (BENCHMARKS.md).
	op.podnet, err = podnet.New(ctx, kube, op.pods.Core().V1().Pods(), op.factory.Samplecrd().V2().Networks(), recorder, op.metrics,
		podnet.Options{Workers: 4 * o.Workers, Resolver: netspec.Resolver{AllowReserved: o.AllowReservedPrefixes}})
	if err != nil {
		return fail(err)
	}

	outcome := network.Standalone()
	if _, fleet := be.(agents.Backend); fleet {
		// The agents' pods are seen where the pod cache covers their
		// namespace.
		var agentPods coreinformers.PodInformer
		if o.Namespace == "" || o.Namespace == o.OperatorNamespace {
			agentPods = op.pods.Core().V1().Pods()
		}
		nodes, err := networknode.NewNodeReports(op.factory.Netop().V1alpha1().NetworkNodes(), agentPods, o.OperatorNamespace)
		if err != nil {
			return fail(err)
		}
		outcome = network.Cluster(nodes)
	}
	op.controller, err = network.New(ctx, client, op.factory.Samplecrd().V2().Networks(), op.backend, recorder, op.metrics,
		network.Options{Cluster: cluster, Workers: o.Workers, Resync: o.Resync, AllowReservedPrefixes: o.AllowReservedPrefixes,
			Addresses: op.podnet, Outcome: outcome})
	if err != nil {
		return fail(err)
	}
	// Address usage is read from the pods: not before they are listed.
	op.controller.WaitFor(op.pods.Core().V1().Pods().Informer().HasSyncedChecker())

	if op.nadKeep, err = op.newNADController(ctx, cfg, kube, recorder); err != nil {
		return fail(err)
	}

	if o.RunAts {
		if op.ats, err = op.newAtController(ctx, client, kube, recorder); err != nil {
			return fail(err)
		}
	}

	// Cluster-wide unless --namespace (which the workload initializer
	// refuses): the Deployment networks follow it.
	op.kubeFactory = kubeinformers.NewSharedInformerFactoryWithOptions(kube, o.Resync,
		kubeinformers.WithNamespace(o.Namespace), kubeinformers.WithTransform(dropManagedFields))
	if o.DeploymentNetworks {
		pool, err := deploynet.NewPool(o.DeploymentNetworkPool, o.DeploymentNetworkPrefixLength)
		if err != nil {
			return fail(err)
		}
		op.deploymentNetworks, err = deploynet.New(ctx, client, kube, op.kubeFactory.Apps().V1().Deployments(), op.factory.Samplecrd().V2().Networks(),
			recorder, op.metrics, deploynet.Options{Workers: o.Workers, Pool: pool})
		if err != nil {
			return fail(err)
		}
	}
	op.templates = templateInformers(kube, o.Resync)
	if o.InitializeWorkloads {
		op.workloads, err = workload.New(ctx, workload.Kinds(kube, op.kubeFactory), op.kubeFactory.Core().V1().Namespaces(),
			op.templates.Core().V1().ConfigMaps(), recorder, op.metrics,
			workload.Options{OperatorNamespace: o.OperatorNamespace, Workers: o.Workers, AllowPrivilegedTemplates: o.AllowPrivilegedTemplates})
		if err != nil {
			return fail(err)
		}
	}
	if o.webhooksEnabled() {
		op.admission, err = newAdmission(ctx, o, cfg, kube, op.templates, op.factory.Samplecrd().V2().Networks().Informer(), op.podnet, recorder, op.metrics)
		if err != nil {
			return fail(err)
		}
	} else {
		op.removeWebhooks = func(ctx context.Context) error { return removeWebhooks(ctx, kube) }
	}
	return op, nil
}

// newAgent configures the node agent: the Network controller building the
// node's bridges and reporting them in the node's NetworkNode. It writes
// no Network, serves no webhook and needs no leader: each node has one.
func (op *Operator) newAgent(ctx context.Context, cfg *rest.Config, client versioned.Interface, cluster string, recorder record.EventRecorder) error {
	o := op.opts
	if o.InstallCNI {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("--install-cni: find this binary: %w", err)
		}
		ca := cfg.CAData
		if len(ca) == 0 && cfg.CAFile != "" {
			if ca, err = os.ReadFile(cfg.CAFile); err != nil {
				return fmt.Errorf("--install-cni: the API server's CA: %w", err)
			}
		}
		op.cni = &agent.CNIInstall{Executable: exe, BinDir: o.CNIBinDir, Kubeconfig: o.CNIKubeconfig, Server: cfg.Host, CAData: ca,
			Namespace: o.OperatorNamespace, ServiceAccount: o.CNIServiceAccount, TokenLifetime: o.CNITokenLifetime, Kube: op.kube}
	}
	op.report = networknode.NewReport(client, op.kube, o.NodeName, o.AgentPod, reportDelay)
	if err := op.report.Load(ctx); err != nil {
		return err
	}
	var err error
	op.controller, err = network.New(ctx, client, op.factory.Samplecrd().V2().Networks(), op.backend, recorder, op.metrics,
		network.Options{Cluster: cluster, Workers: o.Workers, Resync: o.Resync, AllowReservedPrefixes: o.AllowReservedPrefixes,
			Outcome: network.Agent(op.report, o.overlay != nil)})
	if err != nil || o.overlay == nil {
		return err
	}
	// The peers are the other Nodes' InternalIPs; when they change, every
	// Network's flooding entries follow.
	op.nodes = kubeinformers.NewSharedInformerFactoryWithOptions(op.kube, o.Resync, kubeinformers.WithTransform(trimNode))
	nodes := op.nodes.Core().V1().Nodes()
	update := func(any) {
		list, err := nodes.Lister().List(labels.Everything())
		if err != nil {
			return
		}
		var peers []netip.Addr
		for _, node := range list {
			if ip, err := netip.ParseAddr(nodeInternalIP(node)); err == nil && node.Name != o.NodeName {
				peers = append(peers, ip)
			}
		}
		if o.overlay.SetPeers(peers) {
			klog.FromContext(ctx).Info("Overlay peers changed", "peers", len(peers))
			op.controller.EnqueueAll()
		}
	}
	_, err = nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, cur any) { update(cur) },
		DeleteFunc: update,
	})
	op.controller.WaitFor(nodes.Informer().HasSyncedChecker())
	return err
}

// agentOverlay is the overlay of an agent's node: its InternalIP, as its
// kubelet reports it, is where the VXLAN packets of every Network leave
// from. A node without one runs no overlay.
func agentOverlay(ctx context.Context, kube kubernetes.Interface, nodeName string) (*linux.Overlay, error) {
	node, err := kube.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the agent's Node %s: %w", nodeName, err)
	}
	local, err := netip.ParseAddr(nodeInternalIP(node))
	if err != nil {
		klog.FromContext(ctx).Info("The node has no InternalIP: its bridges join no other node's", "node", nodeName)
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
		return dropManagedFields(obj)
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.Name, UID: node.UID, ResourceVersion: node.ResourceVersion},
		Status: corev1.NodeStatus{Addresses: node.Status.Addresses}}, nil
}

// errNodeRemoved ends an agent whose Node was deleted.
var errNodeRemoved = errors.New("the node was removed from the cluster")

// removeNodeNetworks removes this cluster's backend networks from the
// node of an agent whose Node was deleted: the node left the cluster, and
// nothing would ever sweep them. Other clusters' networks stay.
func (op *Operator) removeNodeNetworks(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	owned, err := op.backend.ListOwned(ctx)
	if err != nil {
		return fmt.Errorf("node removed: listing its networks: %w", err)
	}
	var errs []error
	removed := 0
	for _, o := range owned {
		if o.Cluster != op.cluster {
			continue
		}
		if err := op.backend.Delete(ctx, o.Owner, &o.Status); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	logger.Info("Node removed from the cluster: removed its networks", "node", op.opts.NodeName, "removed", removed)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("node removed: removing its networks: %w", err)
	}
	return nil
}

// reportDelay coalesces an agent's report writes: a burst of Networks
// costs one write.
const reportDelay = time.Second

// newAtController runs Ats where the API server serves them; nil
// elsewhere: a netop upgraded before its CRDs were applied still runs, and
// Ats wait for a restart.
func (op *Operator) newAtController(ctx context.Context, client versioned.Interface, kube kubernetes.Interface, recorder record.EventRecorder) (*at.Controller, error) {
	served, err := kubeclient.Serves(kube.Discovery(), cnatv1alpha1.SchemeGroupVersion.WithResource("ats"))
	if err != nil {
		return nil, err
	}
	if !served {
		klog.FromContext(ctx).Info("Not running Ats: the API server does not serve them; apply netop's CRDs and restart", "resource", "ats."+cnatv1alpha1.GroupName)
		return nil, nil
	}
	return at.New(ctx, client, kube, op.factory.Cnat().V1alpha1().Ats(), op.pods.Core().V1().Pods(), recorder, op.metrics,
		at.Options{Workers: op.opts.Workers, Image: op.opts.AtImage})
}

// newNADController keeps a NetworkAttachmentDefinition per Network where
// the cluster serves them (Multus is installed); nil elsewhere.
func (op *Operator) newNADController(ctx context.Context, cfg *rest.Config, kube kubernetes.Interface, recorder record.EventRecorder) (*nad.Controller, error) {
	installed, err := nad.Installed(kube.Discovery())
	if err != nil || !installed {
		klog.FromContext(ctx).V(1).Info("Not keeping NetworkAttachmentDefinitions", "installed", installed, "err", err)
		return nil, nil //nolint:nilerr // discovery failing only means Multus support is off
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	// All of them, not only netop's: one a user made under a Network's
	// name must be seen to be left alone.
	op.nads = dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, op.opts.Resync, op.opts.Namespace, nil)
	return nad.New(ctx, dyn, op.factory.Samplecrd().V2().Networks(), op.nads.ForResource(nad.Resource), recorder, op.metrics,
		nad.Options{Workers: op.opts.Workers, Kubeconfig: op.opts.CNIKubeconfig, DataDir: op.opts.CNIDataDir})
}

// clusterID returns the cluster identity: the flag's, or the UID of the
// kube-system namespace, which every cluster has, which never changes, and
// which differs between clusters. The API server makes the namespace right
// after it starts, so a fresh one gets a few seconds.
func clusterID(ctx context.Context, kube kubernetes.Interface, flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	var uid string
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		ns, err := kube.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
		switch {
		case err == nil:
			uid = string(ns.UID)
			return true, nil
		case apierrors.IsNotFound(err):
			lastErr = err
			return false, nil
		default:
			return false, err
		}
	})
	if err != nil {
		return "", fmt.Errorf("cluster identity: reading the UID of namespace %s (or set --cluster-id): %w", metav1.NamespaceSystem, errors.Join(err, lastErr))
	}
	klog.FromContext(ctx).V(1).Info("Cluster identity", "cluster", uid)
	return uid, nil
}

// NewBackend makes the backend the options name, and the function that
// releases it.
func NewBackend(ctx context.Context, o *Options) (backend.Backend, func(), error) {
	if o.Backend == string(samplecrd.BackendNeutron) {
		nb, err := neutronbackend.New(ctx, neutronbackend.Config{Endpoint: o.NeutronEndpoint, ProjectID: o.NeutronProject, Cloud: o.NeutronCloud})
		if err != nil {
			return nil, nil, err
		}
		return nb, func() {}, nil
	}
	lb, err := linux.New(ctx, linux.Config{Netns: o.Netns, Overlay: o.overlay})
	if err != nil {
		return nil, nil, err
	}
	return lb, lb.Close, nil
}

// dropManagedFields trims what the controller never reads from cached
// objects: managedFields are often most of an object's size.
func dropManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// trimPod keeps of a pod what the address allocation reads (identity,
// annotations, phase), its Ready condition, which says whether a node
// agent's pod works, and its controller reference, finalizers and
// deletion, which say which At it runs and whether it goes: a cluster's
// pods are most of its objects, and their specs and statuses most of
// their size.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return dropManagedFields(obj)
	}
	trimmed := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
			Annotations: pod.Annotations, Finalizers: pod.Finalizers, DeletionTimestamp: pod.DeletionTimestamp},
		Status: corev1.PodStatus{Phase: pod.Status.Phase},
	}
	if ref := metav1.GetControllerOf(pod); ref != nil {
		trimmed.OwnerReferences = []metav1.OwnerReference{*ref}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			trimmed.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return trimmed, nil
}

// Metrics returns the operator's metrics.
func (op *Operator) Metrics() *metrics.Metrics { return op.metrics }

// Run runs the operator until ctx is done, then releases everything. The
// components run in one errgroup: the first to fail stops the others, and
// its error is returned.
func (op *Operator) Run(ctx context.Context) error {
	defer op.close()
	defer op.events.Stop() // after the broadcaster's shutdown: defers run last first
	defer op.broadcaster.Shutdown()
	op.started = time.Now()
	logger := klog.FromContext(ctx)
	logger.Info("Starting netop", "version", version.String(), "backend", op.backend.Type(), "namespace", op.opts.Namespace)

	parent := ctx
	all, ctx := newComponents(ctx)
	run := all.run
	factories := []interface {
		Start(<-chan struct{})
		Shutdown()
	}{op.factory}
	if op.opts.Role != RoleAgent {
		factories = append(factories, op.kubeFactory, op.templates, op.pods)
	}
	if op.nodes != nil {
		factories = append(factories, op.nodes)
	}
	if op.nads != nil {
		factories = append(factories, op.nads)
	}
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	synced := make(chan struct{})
	run("startup", func(ctx context.Context) error { return op.waitSynced(ctx, synced) })
	if op.opts.metricsEnabled() {
		run("metrics server", op.serveMetrics)
	}
	switch {
	case op.report != nil:
		// An agent: no webhooks, no leader, its own node's report.
		run("node report", op.report.Run)
		if op.cni != nil {
			run("CNI plugin install", op.cni.Run)
		}
		run("network controller", op.controller.Run)
		run("node removal watch", func(ctx context.Context) error {
			removed, err := agent.WaitNodeRemoved(ctx, op.kube, op.opts.NodeName)
			if removed {
				return errNodeRemoved
			}
			return err
		})
		err := all.wait()
		for _, f := range factories {
			f.Shutdown()
		}
		if errors.Is(err, errNodeRemoved) {
			err = op.removeNodeNetworks(parent)
		}
		logger.Info("Stopped netop agent")
		return err
	case op.admission != nil:
		run("admission webhooks", func(ctx context.Context) error { return op.admission.run(ctx, synced) })
	default:
		run("admission webhooks removal", op.removeWebhooks)
	}
	// The writers: on one replica at a time when replicas elect a leader.
	controllers := func(ctx context.Context) error {
		writers, _ := newComponents(ctx)
		run := writers.run
		if op.workloads != nil {
			run("workload controller", op.workloads.Run)
		}
		run("network controller", op.controller.Run)
		run("address allocation", op.podnet.Run)
		if op.nadKeep != nil {
			run("NetworkAttachmentDefinition controller", op.nadKeep.Run)
		}
		if op.ats != nil {
			run("At controller", op.ats.Run)
		}
		if op.deploymentNetworks != nil {
			run("Deployment network controller", op.deploymentNetworks.Run)
		}
		return writers.wait()
	}
	if op.opts.LeaderElect {
		run("leader election", func(ctx context.Context) error { return op.lead(ctx, controllers) })
	} else {
		op.metrics.Leader.Set(1)
		run("controllers", controllers)
	}

	err := all.wait()
	for _, f := range factories {
		f.Shutdown()
	}
	logger.Info("Stopped netop")
	return err
}

// components run in one errgroup: the first to fail stops the others, and
// its error, named, is the group's.
type components struct {
	g   *errgroup.Group
	ctx context.Context
}

// newComponents returns the group and the context its components run in.
func newComponents(ctx context.Context) (*components, context.Context) {
	g, ctx := errgroup.WithContext(ctx)
	return &components{g: g, ctx: ctx}, ctx
}

func (c *components) run(name string, f func(context.Context) error) {
	c.g.Go(func() error {
		if err := f(c.ctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

func (c *components) wait() error { return c.g.Wait() }

// ConversionRegistered is closed once this operator's conversion webhook
// is registered on the Network CRD: from then on v1 clients are served. An
// operator without webhooks registers none, and its channel is closed.
func (op *Operator) ConversionRegistered() <-chan struct{} {
	if op.admission == nil {
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	return op.admission.conversionRegistered
}

// waitSynced records the startup phases, makes /readyz ready and closes
// synced once every cache is synced and the Network controller has been
// handed the whole initial list.
func (op *Operator) waitSynced(ctx context.Context, synced chan<- struct{}) error {
	if !cache.WaitFor(ctx, "", op.factory.Samplecrd().V2().Networks().Informer().HasSyncedChecker()) {
		return nil // stopped
	}
	op.metrics.Startup.WithLabelValues(metrics.PhaseNetworksListed).Set(time.Since(op.started).Seconds())
	waits := []map[reflect.Type]bool{op.factory.WaitForCacheSync(ctx.Done())}
	if op.opts.Role != RoleAgent {
		waits = append(waits, op.kubeFactory.WaitForCacheSync(ctx.Done()), op.templates.WaitForCacheSync(ctx.Done()), op.pods.WaitForCacheSync(ctx.Done()))
	}
	for _, informers := range waits {
		for _, ok := range informers {
			if !ok {
				return nil // stopped
			}
		}
	}
	if !cache.WaitFor(ctx, "", op.controller.HasSyncedChecker()) {
		return nil
	}
	if op.admission != nil && !cache.WaitForCacheSync(ctx.Done(), op.admission.cidrs.HasSynced) {
		return nil
	}
	op.metrics.Startup.WithLabelValues(metrics.PhaseCachesSynced).Set(time.Since(op.started).Seconds())
	op.synced.Store(true)
	klog.FromContext(ctx).Info("Caches synced", "after", time.Since(op.started))
	close(synced)
	return nil
}

// serveMetrics serves the metrics handler until ctx is done.
func (op *Operator) serveMetrics(ctx context.Context) error {
	l, err := net.Listen("tcp", op.opts.MetricsAddr)
	if err != nil {
		return fmt.Errorf("--metrics-addr: %w", err)
	}
	srv := &http.Server{Handler: op.metricsHandler(), ReadHeaderTimeout: 5 * time.Second}
	klog.FromContext(ctx).Info("Serving metrics", "address", l.Addr().String())
	return httpserver.Run(ctx, srv, func() error { return srv.Serve(l) })
}

// metricsHandler serves /metrics, /healthz, /readyz (ready once the caches
// are synced, the webhook server serves and, for an agent with
// --install-cni, the CNI plugin is in place) and, with --profiling, /debug/pprof/.
func (op *Operator) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", op.metrics.Handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !op.synced.Load() {
			http.Error(w, "informer caches not synced", http.StatusServiceUnavailable)
			return
		}
		if op.admission != nil && !op.admission.serving.Load() {
			http.Error(w, "the webhook server is not serving yet", http.StatusServiceUnavailable)
			return
		}
		if op.cni != nil && !op.cni.Installed() {
			http.Error(w, "the CNI plugin is not installed yet", http.StatusServiceUnavailable)
			return
		}
		// Every replica is ready (each serves the webhooks); the body says
		// which one leads.
		msg := "ok"
		if leader, _ := op.leader.Load().(string); op.opts.LeaderElect && leader != "" {
			msg += "\nleader: " + leader
		}
		_, _ = w.Write([]byte(msg))
	})
	if op.opts.Profiling {
		// pprof.Index serves the named profiles (heap, allocs, goroutine)
		// under the same prefix.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// Run configures an operator from the options and runs it until ctx is done.
func Run(ctx context.Context, cfg *rest.Config, o *Options) error {
	op, err := New(ctx, cfg, o, nil)
	if err != nil {
		return err
	}
	return op.Run(ctx)
}
