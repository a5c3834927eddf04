// Command netop-standalone runs a whole single-node Kubernetes (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler in process; a
// private containerd and a kubelet as child processes) and the netop
// operator, so that a newcomer can kubectl apply a Network and kubectl run
// a pod within seconds, offline.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/backends"
	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/cni/cniapi"
	"github.com/netop-dev/netop/internal/cni/plugin"
	"github.com/netop-dev/netop/internal/controller/hotplug"
	"github.com/netop-dev/netop/internal/install"
	"github.com/netop-dev/netop/internal/logging"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/standalone/controlplane"
	"github.com/netop-dev/netop/internal/standalone/node"
	"github.com/netop-dev/netop/internal/standalone/services"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

func main() {
	// The node's runtime runs this binary as netop's CNI plugin, by the
	// plugin's name.
	if filepath.Base(os.Args[0]) == cniapi.Type {
		plugin.Main()
		return
	}
	runNodeComponent(os.Args[1:])
	if err := newCommand().Execute(); err != nil {
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	var (
		dataDir  string
		port     int
		nodeOpts nodeOptions
	)
	logOpts := logging.NewOptions()
	opts := operator.NewOptions()
	// Standalone is for a developer's machine: bridges go into their own
	// network namespace, so that 192.168.0.0/16 never shadows the host's
	// routes, and metrics listen on loopback only.
	opts.Backend.Netns = "netop"
	opts.Metrics.Addr = "127.0.0.1:8080"
	opts.Webhooks.Addr = "127.0.0.1:9443"
	opts.Webhooks.Local = true
	cmd := &cobra.Command{
		Use:          "netop-standalone [--data-dir DIR]",
		Short:        "Run an embedded Kubernetes control plane with the netop operator",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// The embedded Kubernetes components log through klog's
			// process-wide logger into DATA_DIR/logs; the operator's own
			// logs go to stderr.
			logger, err := logOpts.Logger(os.Stderr)
			if err != nil {
				return err
			}
			ctx = klog.NewContext(ctx, logger)
			err = run(ctx, cmd, dataDir, port, nodeOpts, opts)
			if err != nil && ctx.Err() != nil {
				// Ctrl-C while starting: whatever step it cut short
				// fails with the cancelled context, but stopping is
				// what was asked for, and everything started was stopped.
				logger.Info("Stopped while starting", "step", err.Error())
				return nil
			}
			return err
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", ".netop", "Directory for the control plane's state, certificates, kubeconfig and logs. Reused on restart.")
	cmd.Flags().IntVar(&port, "apiserver-port", 0, "Port of the API server on 127.0.0.1 when the data directory has none recorded yet (0: any free port).")
	hostname, _ := os.Hostname()
	cmd.Flags().BoolVar(&nodeOpts.enabled, "node", true, "Run a node (containerd, a kubelet and kube-proxy) so that pods run. Where it cannot run, the standalone says what is missing and runs without one.")
	cmd.Flags().StringVar(&nodeOpts.name, "node-name", strings.ToLower(hostname), "Name of the node.")
	cmd.Flags().IntVar(&nodeOpts.count, "nodes", 1, "Number of nodes. Each is a machine of its own as far as networking goes: a network namespace (--netns; with more than one, NETNS-1 to -N, named NODE-NAME-1 to -N) with containerd, a kubelet and kube-proxy, on an underlay bridge in this host's namespace. More than one: netop runs as a controller and an agent per node, so that Networks span nodes over their VXLAN overlay.")
	cmd.Flags().StringVar(&nodeOpts.underlay, "underlay-cidr", "10.254.0.0/24", "The underlay's IPv4 prefix: the host gets its first address (where the cluster's DNS and the kubernetes Service's endpoint are served), the nodes the next ones. Each node's pods get a /24 of "+node.PodCIDR+", routed to it. Two standalones on one host need different --netns and --underlay-cidr.")
	cmd.Flags().StringSliceVar(&nodeOpts.archives, "image-archive", nil, "Image tarballs (such as `make image` writes to bin/netop-image.tar) the node serves as if pulled from their registries; repeatable. Tarballs in DIR/images are served too.")
	cmd.Flags().BoolVar(&nodeOpts.operator, "operator", true, "Run netop's operator in this process. Off, the cluster is bare, to install netop as on any cluster: netop manifests --image REF | kubectl apply -f -.")
	logOpts.AddFlags(cmd.Flags())
	opts.AddFlags(cmd.Flags(), operator.RoleAll)
	// The agents of --nodes above 1.
	opts.Agent.AddDemandFlags(cmd.Flags())
	return cmd
}

type nodeOptions struct {
	enabled  bool
	name     string
	archives []string
	// count nodes; more than one each get a network namespace of their
	// own on an underlay of the given prefix.
	count    int
	underlay string
	// operator runs netop's operator in this process; off, netop is
	// installed like on any cluster (netop manifests).
	operator bool
}

func run(ctx context.Context, cmd *cobra.Command, dataDir string, port int, nodeOpts nodeOptions, opts *operator.Options) error {
	logger := klog.FromContext(ctx)
	started := time.Now()
	if nodeOpts.enabled {
		if err := node.Check(); err != nil {
			logger.Info("Running without a node: pods will be stored but not run", "reason", err.Error())
			nodeOpts.enabled = false
		}
	}
	if nodeOpts.enabled && nodeOpts.name == "" {
		return errors.New("--node-name: the host has no name; give one")
	}
	if nodeOpts.count < 1 {
		return fmt.Errorf("--nodes %d: at least 1", nodeOpts.count)
	}
	multi := nodeOpts.enabled && nodeOpts.count > 1
	if multi && nodeOpts.operator {
		// A controller here, an agent per node (in this process too).
		opts.Role = operator.RoleController
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	// The backend first: missing privileges should stop us before the
	// control plane starts, not after.
	be, closeBackend, err := standaloneBackend(ctx, opts, nodeOpts.operator && !multi)
	if err != nil {
		return err
	}
	defer closeBackend()
	cp, err := startControlPlane(ctx, dataDir, port, nodeOpts, opts)
	if err != nil {
		return err
	}
	defer func() {
		logger.Info("Stopping the control plane")
		cp.Stop()
	}()
	logger.Info("Control plane ready", "server", cp.URL, "logs", cp.DataDir+"/logs", "after", time.Since(started).Round(time.Millisecond))
	// No CNI plugin asks a standalone without a node: its socket is
	// served only for a node (another netop sharing the namespace may
	// serve its own).
	nodeCNISocket := opts.CNISocket
	opts.CNISocket = ""
	var agents []*operator.Options
	if nodeOpts.enabled {
		nodes, stopNodes, err := startNodes(ctx, cp, nodeOpts, opts.Backend.Netns, started)
		switch {
		case err != nil && multi:
			return err
		case err != nil:
			logger.Error(err, "Running without a node: pods will be stored but not run")
		default:
			defer stopNodes()
			agents = serveNodes(nodes, multi, nodeOpts.operator, opts, nodeCNISocket)
		}
	}
	printKubeconfig := func() error {
		if _, err := fmt.Fprintf(cmd.OutOrStdout(), "export KUBECONFIG=%s\n", cp.KubeconfigPath); err != nil {
			return fmt.Errorf("printing the kubeconfig line: %w", err)
		}
		return nil
	}
	if !nodeOpts.operator {
		if err := printKubeconfig(); err != nil {
			return err
		}
		logger.Info("Running without netop's operator: install it with netop manifests")
		<-ctx.Done()
		return nil
	}
	return runOperators(ctx, cp, opts, be, agents, printKubeconfig)
}

// standaloneBackend is the backend of a standalone whose one operator
// builds the bridges (own), released by the function returned; otherwise
// none, and only the nodes' namespace is made.
func standaloneBackend(ctx context.Context, opts *operator.Options, own bool) (backend.Backend, func(), error) {
	if own {
		return backends.New(ctx, opts.Backend, nil)
	}
	if opts.Backend.Netns != "" {
		// The node's pod bridge lives there, made by the backend otherwise.
		if err := linux.EnsureNetns(opts.Backend.Netns); err != nil {
			return nil, nil, err
		}
	}
	return nil, func() {}, nil
}

// startControlPlane starts the control plane and installs netop's CRDs,
// namespace and policies in it.
func startControlPlane(ctx context.Context, dataDir string, port int, nodeOpts nodeOptions, opts *operator.Options) (*controlplane.ControlPlane, error) {
	cpConfig := controlplane.Config{DataDir: dataDir, APIServerPort: port}
	if nodeOpts.enabled {
		cpConfig.NodeNames = nodeOpts.names()
	}
	cp, err := controlplane.Start(ctx, cpConfig)
	if err != nil {
		return nil, err
	}
	err = install.CRDs(ctx, cp.AdminConfig())
	if err == nil {
		err = install.Namespace(ctx, cp.AdminConfig(), opts.OperatorNamespace)
	}
	if err == nil {
		err = install.Policies(ctx, cp.AdminConfig())
	}
	if err != nil {
		cp.Stop()
		return nil, err
	}
	if opts.Webhooks.CertDir == "" {
		opts.Webhooks.CertDir = filepath.Join(cp.DataDir, "webhook")
	}
	return cp, nil
}

// serveNodes has the nodes' CNI plugins served: by the one operator, or,
// with several nodes, by an agent per node, whose options it returns.
func serveNodes(nodes []*standaloneNode, multi, withOperator bool, opts *operator.Options, cniSocket string) []*operator.Options {
	if !multi {
		nodes[0].serveNode(opts, cniSocket)
		return nil
	}
	if !withOperator {
		return nil
	}
	var agents []*operator.Options
	for _, n := range nodes {
		o := *opts
		o.Role, o.Agent.NodeName, o.Backend.Netns = operator.RoleAgent, n.name, n.netns
		n.serveNode(&o, cniSocket)
		o.Metrics.Addr, o.Webhooks.Addr, o.Leader.Elect = "0", "0", false
		agents = append(agents, &o)
	}
	return agents
}

// runOperators runs the operator, prints the kubeconfig line once the
// cluster is usable, then runs the nodes' agents, until ctx is done.
func runOperators(ctx context.Context, cp *controlplane.ControlPlane, opts *operator.Options, be backend.Backend, agents []*operator.Options, printKubeconfig func() error) error {
	logger := klog.FromContext(ctx)
	op, err := operator.New(ctx, cp.AdminConfig(), opts, be)
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return op.Run(gctx) })
	// The line says the cluster is usable: v1 Networks (the tutorial's)
	// need the conversion webhook, which this start registers anew.
	select {
	case <-op.ConversionRegistered():
	case <-gctx.Done():
		return g.Wait()
	}
	if err := waitServesV1(gctx, cp.AdminConfig()); err != nil {
		logger.Error(err, "v1 Networks are not served yet")
	}
	// And admission is in force: a script that applies a Network the
	// moment the line is printed gets it checked.
	select {
	case <-op.AdmissionInForce():
	case <-gctx.Done():
		return g.Wait()
	}
	if err := printKubeconfig(); err != nil {
		return errors.Join(err, g.Wait())
	}
	for _, o := range agents {
		agent, err := operator.New(klog.NewContext(gctx, logger.WithValues("agent", o.Agent.NodeName)), cp.AdminConfig(), o, nil)
		if err != nil {
			return errors.Join(err, g.Wait())
		}
		g.Go(func() error { return agent.Run(klog.NewContext(gctx, logger.WithValues("agent", o.Agent.NodeName))) })
	}
	return g.Wait()
}

// waitServesV1 waits until the API server reads Networks in v1, through the
// conversion webhook the operator just registered: it takes up the CRD's
// new webhook address a moment after the change, and a restart's stored
// Networks would meanwhile fail to convert at the old one.
func waitServesV1(ctx context.Context, cfg *rest.Config) error {
	client, err := versioned.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := client.SamplecrdV1().Networks("").List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
}

// names are the nodes' names: --node-name, or with several nodes
// --node-name-1 to -N.
func (o nodeOptions) names() []string {
	if o.count <= 1 {
		return []string{o.name}
	}
	names := make([]string, o.count)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", o.name, i+1)
	}
	return names
}

// standaloneNode is one of the standalone's nodes.
type standaloneNode struct {
	name, netns string
	// dataDir is the node's (node.Config.DataDir).
	dataDir string
	node    *node.Node
}

// serveNode makes o the node side of n: the CNI plugin's socket and
// records, and hot-plug of the node's running pods through its runtime.
func (n *standaloneNode) serveNode(o *operator.Options, cniSocket string) {
	o.HotPlug = hotplug.Config{CRISocket: node.ContainerdSocket(n.dataDir), Node: n.name, CNIConfig: node.PodNetwork}
	o.CNIDataDir = node.CNIDataDir(n.dataDir)
	o.CNISocket = cniSocket
}

// startNodes makes the underlay, serves the cluster's own Services on it,
// and starts the nodes on it, at once; it returns them with the function
// that stops them and removes the underlay. One node is the standalone's
// netns itself, where the operator's bridges are; several are netns-1 to
// -N, each with its agent.
func startNodes(ctx context.Context, cp *controlplane.ControlPlane, o nodeOptions, netnsPrefix string, started time.Time) ([]*standaloneNode, func(), error) {
	logger := klog.FromContext(ctx)
	prefix, err := netip.ParsePrefix(o.underlay)
	if err != nil {
		return nil, nil, fmt.Errorf("--underlay-cidr: %w", err)
	}
	if netnsPrefix == "" {
		netnsPrefix = "netop"
	}
	names := o.names()
	nodes := make([]*standaloneNode, len(names))
	netnss := make([]string, len(names))
	for i, name := range names {
		netnss[i] = netnsPrefix
		if len(names) > 1 {
			netnss[i] = fmt.Sprintf("%s-%d", netnsPrefix, i+1)
		}
		nodes[i] = &standaloneNode{name: name, netns: netnss[i]}
	}
	underlay, err := node.NewUnderlay(netnsPrefix, prefix, netnss)
	if err != nil {
		return nil, nil, err
	}
	apiServer := strings.TrimPrefix(cp.URL, "https://")
	svcs, err := services.Start(ctx, services.Config{Admin: cp.AdminConfig(), Kubeconfig: cp.KubeconfigPath, Host: underlay.Host, APIServer: apiServer, LogDir: filepath.Join(cp.DataDir, "logs")})
	if err != nil {
		underlay.Remove()
		return nil, nil, err
	}
	// One registry serves every node: the data directory's images and
	// --image-archive's.
	registry, err := node.StartRegistry(ctx, filepath.Join(cp.DataDir, "images"), o.archives)
	if err != nil {
		svcs.Stop()
		underlay.Remove()
		return nil, nil, err
	}
	stop := func() {
		logger.Info("Stopping the nodes")
		var wg sync.WaitGroup
		for _, n := range nodes {
			if n.node != nil {
				wg.Go(func() { n.node.Stop(context.WithoutCancel(ctx)) })
			}
		}
		wg.Wait()
		registry.Stop()
		svcs.Stop()
		// The nodes' namespaces stay, like the standalone's own: the next
		// start finds its bridges there.
		underlay.Remove()
	}
	var g errgroup.Group
	for i, n := range nodes {
		u := underlay.Nodes[i]
		cfg := node.Config{
			DataDir: filepath.Join(cp.DataDir, "nodes", n.name), Name: n.name, Kubeconfig: cp.NodeKubeconfigs[n.name],
			Netns: n.netns, Address: u.Address.AsSlice(), PodCIDR: u.PodCIDR.String(), APIServer: apiServer,
			KubeProxyKubeconfig: cp.KubeProxyKubeconfig, Registry: registry,
			ClusterDNS: services.DNSServiceIP, ClusterDomain: services.ClusterDomain,
		}
		if len(nodes) == 1 {
			cfg.DataDir = cp.DataDir
		}
		n.dataDir = cfg.DataDir
		g.Go(func() (err error) {
			n.node, err = startNode(ctx, cp, cfg, started)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		stop()
		return nil, nil, err
	}
	return nodes, stop, nil
}

// startNode runs containerd and the kubelet of cfg and waits for the Node
// to be Ready.
func startNode(ctx context.Context, cp *controlplane.ControlPlane, cfg node.Config, started time.Time) (*node.Node, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this program to run the kubelet: %w", err)
	}
	cfg.ClientCAFile, cfg.Executable = cp.CACertPath, self
	n, err := node.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		n.Stop(ctx)
		return nil, err
	}
	ready, err := n.WaitReady(ctx, kube, 2*time.Minute)
	if err != nil {
		n.Stop(context.WithoutCancel(ctx))
		return nil, err
	}
	klog.FromContext(ctx).Info("Node ready", "node", ready.Name, "containerRuntime", ready.Status.NodeInfo.ContainerRuntimeVersion,
		"kubelet", ready.Status.NodeInfo.KubeletVersion, "after", time.Since(started).Round(time.Millisecond))
	return n, nil
}
