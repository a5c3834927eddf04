// Package operator wires netop's controllers to a cluster: client
// configuration, informers, the backend, Events and metrics. Both binaries,
// netop (any cluster) and netop-standalone (embedded control plane), run it,
// so the operator behaves the same in either.
package operator

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/netop-dev/netop/config"
	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/controller/at"
	"github.com/netop-dev/netop/internal/controller/deploynet"
	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/internal/webhook"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
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

// Options are the operator's settings, each a command-line flag.
type Options struct {
	// Role is set by the command, not by a flag.
	Role Role
	// NodeName is the agent's node; AgentPod its pod, if it runs in one.
	NodeName string
	AgentPod string

	// QPS and Burst limit the operator's API requests. client-go's defaults
	// (5 and 10) would make 2,000 status writes take 400 s.
	QPS   float32
	Burst int
	// KubeAPIContentType is the encoding of requests for built-in
	// resources (kubeclient.Protobuf or JSON); Networks are always JSON.
	KubeAPIContentType string

	Workers int
	Resync  time.Duration
	// Namespace limits the operator to one namespace; "" means all.
	Namespace string

	Backend string
	// Netns is the network namespace the linux backend works in; "" is
	// the host's.
	Netns string
	// NeutronEndpoint is a noauth Neutron URL (development and tests);
	// empty authenticates with Keystone from OS_* or clouds.yaml.
	NeutronEndpoint string
	// NeutronProject owns the networks netop makes in Neutron.
	NeutronProject string
	// NeutronCloud names the clouds.yaml entry (default $OS_CLOUD).
	NeutronCloud string

	// ClusterID is recorded on every backend network so that netops of
	// several clusters can share a network namespace or a Neutron project;
	// empty means the UID of the kube-system namespace.
	ClusterID string

	// MetricsAddr serves /metrics, /healthz and /readyz; "0" turns it off.
	MetricsAddr string
	// Profiling adds Go's /debug/pprof handlers to the metrics address.
	Profiling bool

	// OperatorNamespace holds the operator's own objects: the default
	// envoy-initializer template, the webhook certificate Secret.
	OperatorNamespace string
	// WebhookAddr is where the admission webhooks listen; "0" turns them
	// off.
	WebhookAddr string
	// WebhookLocal registers the webhooks by the listener's 127.0.0.1 URL
	// (standalone) instead of by WebhookService.
	WebhookLocal bool
	// WebhookService is the Service in OperatorNamespace in front of the
	// webhook server (in a cluster).
	WebhookService string
	// ConversionService is the Service in OperatorNamespace in front of
	// the conversion webhook: the same server, reachable before the
	// replica is ready (publishNotReadyAddresses), which admission must
	// not be.
	ConversionService string
	// WebhookCertDir keeps the webhook CA and certificate in files;
	// empty keeps them in a Secret in OperatorNamespace.
	WebhookCertDir string
	// WebhookMaxInflight caps the admission reviews served at once;
	// beyond it the server answers 429 with Retry-After. 0: no limit.
	WebhookMaxInflight int
	// WebhookMaxInflightBytes caps the bytes of admission review bodies
	// being read and decoded at once (429 beyond it). 0: no limit.
	WebhookMaxInflightBytes resource.QuantityValue
	// InitializeWorkloads runs the workload initializer: the Envoy
	// template merged into annotated Deployments.
	InitializeWorkloads bool
	// DeploymentNetworks gives annotated Deployments a Network of their
	// own, with cidrs of DeploymentNetworkPrefixLength from
	// DeploymentNetworkPool unless they name one.
	DeploymentNetworks            bool
	DeploymentNetworkPool         string
	DeploymentNetworkPrefixLength int
	// RunAts runs the At controller: Ats' commands in pods at their
	// scheduled time, with the image AtImage.
	RunAts  bool
	AtImage string
	// AllowPrivilegedTemplates lets the envoy-initializer template of any
	// namespace make privileged containers, add capabilities, use host
	// ports and hostPath volumes (the template policy of envoy.Finder);
	// without it only the operator namespace's template may, and the
	// namespaces its annotation lists.
	AllowPrivilegedTemplates bool
	// AllowReservedPrefixes lets Networks use special-purpose prefixes
	// (link-local, "this network", 240.0.0.0/4, 6to4, ...; see
	// internal/netspec) in admission and in the controller alike.
	// Loopback and multicast, and the prefixes that contain them, stay
	// refused: the CRD refuses them too.
	AllowReservedPrefixes bool
	// CNIKubeconfig and CNIDataDir are the paths, on the nodes, of the CNI
	// plugin's credentials and records, as written into the
	// NetworkAttachmentDefinitions netop keeps where Multus runs.
	CNIKubeconfig string
	CNIDataDir    string
	// InstallCNI makes the agent install the CNI plugin on its host: the
	// binary into CNIBinDir and, at CNIKubeconfig, credentials of the
	// service account CNIServiceAccount (in OperatorNamespace) renewed
	// every CNITokenLifetime.
	InstallCNI        bool
	CNIBinDir         string
	CNIServiceAccount string
	CNITokenLifetime  time.Duration

	// LeaderElect makes replicas elect one leader (a Lease in
	// OperatorNamespace) that runs the controllers; every replica serves
	// the webhooks and keeps its caches warm.
	LeaderElect bool
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's
	// leader election timings.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	// overlay is an agent's node on the underlay, found by New.
	overlay *linux.Overlay
}

// NewOptions returns the defaults for an operator in a cluster.
func NewOptions() *Options {
	return &Options{
		Role:     RoleAll,
		NodeName: os.Getenv("NODE_NAME"),
		AgentPod: os.Getenv("POD_NAME"),
		QPS:      100,
		Burst:    200,

		KubeAPIContentType: kubeclient.Protobuf,
		Workers:            4,
		Resync:             5 * time.Minute,
		Backend:            string(samplecrd.BackendLinux),
		MetricsAddr:        ":8080",

		OperatorNamespace: operatorNamespace(),
		WebhookAddr:       ":9443",
		WebhookService:    "netop-webhook",
		ConversionService: "netop-conversion",

		WebhookMaxInflight:      webhook.DefaultMaxInFlight,
		WebhookMaxInflightBytes: resource.QuantityValue{Quantity: *resource.NewQuantity(webhook.DefaultMaxBodyBytesInFlight, resource.BinarySI)},

		InitializeWorkloads: true,
		RunAts:              true,

		DeploymentNetworks:            true,
		DeploymentNetworkPool:         "172.30.0.0/16",
		DeploymentNetworkPrefixLength: 24,

		AtImage: at.DefaultImage,

		// Where the manifests mount the hosts' directories.
		CNIKubeconfig:     filepath.Join(config.DefaultCNIConfigDir, "netop.kubeconfig"),
		CNIDataDir:        "/var/lib/cni/netop",
		CNIBinDir:         config.DefaultCNIBinDir,
		CNIServiceAccount: "netop-cni",
		CNITokenLifetime:  24 * time.Hour,

		LeaseDuration: 15 * time.Second,
		RenewDeadline: 10 * time.Second,
		RetryPeriod:   2 * time.Second,
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

// flagGroup is the flags of one part of netop, and the roles that run
// that part: a command shows only the flags of what it runs.
type flagGroup struct {
	roles []Role
	add   func(o *Options, fs *pflag.FlagSet)
}

var (
	everyRole       = []Role{RoleAll, RoleController, RoleAgent}
	clusterWide     = []Role{RoleAll, RoleController}
	buildingBridges = []Role{RoleAll, RoleAgent}
)

// flagGroups declares which role takes which flags.
var flagGroups = []flagGroup{
	{everyRole, (*Options).addClientFlags},
	{everyRole, (*Options).addMetricsFlags},
	{buildingBridges, (*Options).addBridgeFlags},
	{clusterWide, (*Options).addBackendFlags},
	{clusterWide, (*Options).addWebhookFlags},
	{clusterWide, (*Options).addLeaderFlags},
	{clusterWide, (*Options).addSidecarFlags},
	{clusterWide, (*Options).addDeploymentNetworkFlags},
	{clusterWide, (*Options).addAtFlags},
	{clusterWide, (*Options).addNADFlags},
	{[]Role{RoleAgent}, (*Options).addAgentFlags},
}

// AddFlags registers on fs the flags of what role runs.
func (o *Options) AddFlags(fs *pflag.FlagSet, role Role) {
	for _, g := range flagGroups {
		if slices.Contains(g.roles, role) {
			g.add(o, fs)
		}
	}
}

// addClientFlags registers the flags every role shares: the API client,
// the work queues, and what netop manages and as which cluster.
func (o *Options) addClientFlags(fs *pflag.FlagSet) {
	fs.Float32Var(&o.QPS, "kube-api-qps", o.QPS, "Queries per second the operator may send to the API server.")
	fs.IntVar(&o.Burst, "kube-api-burst", o.Burst, "Burst of queries the operator may send to the API server above --kube-api-qps.")
	fs.StringVar(&o.KubeAPIContentType, "kube-api-content-type", o.KubeAPIContentType, "Encoding of the requests for built-in resources (pods, deployments, configmaps, events, leases, nodes): application/vnd.kubernetes.protobuf or application/json. Networks and other custom resources are always JSON.")
	fs.IntVar(&o.Workers, "workers", o.Workers, "Networks reconciled at once.")
	fs.DurationVar(&o.Resync, "resync", o.Resync, "How often the informers resync and the backend is compared with the Networks (orphans swept, missing networks recreated).")
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "Only manage Networks in this namespace (default: all namespaces).")
	fs.StringVar(&o.ClusterID, "cluster-id", o.ClusterID, "Identity of this cluster, recorded on every backend network: netops of several clusters sharing a network namespace or a Neutron project touch only their own cluster's networks. Default: the UID of the kube-system namespace.")
	fs.StringVar(&o.OperatorNamespace, "operator-namespace", o.OperatorNamespace, "Namespace of the operator's own objects: the default envoy-initializer template and the webhook certificate Secret. Defaults to $POD_NAMESPACE.")
	fs.BoolVar(&o.AllowReservedPrefixes, "allow-reserved-prefixes", o.AllowReservedPrefixes, "Let Networks use special-purpose prefixes (IANA special-purpose registries: link-local 169.254.0.0/16 and fe80::/10, 0.0.0.0/8, 240.0.0.0/4, 6to4, NAT64, ...). Loopback and multicast, and prefixes that contain them such as a /0, stay refused.")
	fs.StringVar(&o.CNIKubeconfig, "cni-kubeconfig", o.CNIKubeconfig, "Path, on the nodes, of the credentials of netop's CNI plugin, written into the NetworkAttachmentDefinitions netop keeps where Multus is installed.")
}

// addMetricsFlags registers the flags of the metrics and health server.
func (o *Options) addMetricsFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.MetricsAddr, "metrics-addr", o.MetricsAddr, "Address serving /metrics, /healthz and /readyz; \"0\" turns it off.")
	fs.BoolVar(&o.Profiling, "profiling", o.Profiling, "Serve Go's profiles at /debug/pprof/ on --metrics-addr (CPU, heap, goroutines), as Kubernetes components do with --profiling.")
}

// addBridgeFlags registers where the linux backend builds bridges: in
// netop run and in the agents.
func (o *Options) addBridgeFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Netns, "netns", o.Netns, "Named network namespace (as in `ip netns`) the linux backend works in, created if missing; \"\" is the host's namespace.")
}

// addBackendFlags registers which backend provides the Networks: the
// controller chooses; agents always build bridges.
func (o *Options) addBackendFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Backend, "backend", o.Backend, "The backend that provides networks: linux (a bridge per Network) or neutron (an OpenStack Neutron network and subnet).")
	fs.StringVar(&o.NeutronEndpoint, "neutron-endpoint", o.NeutronEndpoint, "URL of a Neutron API without authentication (noauth), for development and tests. Empty: Keystone from the OS_* variables or clouds.yaml.")
	fs.StringVar(&o.NeutronProject, "neutron-project", o.NeutronProject, "Neutron project ID that owns netop's networks; required with --neutron-endpoint.")
	fs.StringVar(&o.NeutronCloud, "neutron-cloud", o.NeutronCloud, "clouds.yaml entry to authenticate with (default $OS_CLOUD).")
}

// addWebhookFlags registers the flags of the webhook server: admission
// and conversion.
func (o *Options) addWebhookFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.WebhookAddr, "webhook-addr", o.WebhookAddr, "Address the admission webhooks (HTTPS) listen on; \"0\" turns them off.")
	fs.StringVar(&o.WebhookService, "webhook-service", o.WebhookService, "Service in --operator-namespace that routes to the webhook server.")
	fs.StringVar(&o.ConversionService, "conversion-service", o.ConversionService, "Service in --operator-namespace that routes to the webhook server's conversion webhook, not-ready replicas included.")
	fs.BoolVar(&o.WebhookLocal, "webhook-local", o.WebhookLocal, "Register the webhooks by the listener's https://127.0.0.1 URL instead of --webhook-service, for a netop running beside its API server.")
	fs.StringVar(&o.WebhookCertDir, "webhook-cert-dir", o.WebhookCertDir, "Keep the webhook CA and certificate in this directory instead of a Secret.")
	fs.IntVar(&o.WebhookMaxInflight, "webhook-max-inflight", o.WebhookMaxInflight, "Admission reviews the webhook server serves at once, and conversion reviews apart from them; more are answered 429 Too Many Requests with Retry-After (the API server retries within the webhook's timeout, then applies its failurePolicy). 0: no limit.")
	fs.Var(&o.WebhookMaxInflightBytes, "webhook-max-inflight-bytes", "Bytes of review bodies (admission and conversion together) the webhook server reads and decodes at once (each review counts its Content-Length, at most 4Mi); more are answered 429 Too Many Requests with Retry-After. A quantity such as 64Mi; 0: no limit.")
}

// addLeaderFlags registers the flags of leader election among controller
// replicas.
func (o *Options) addLeaderFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "Elect one leader among the replicas (a Lease named netop in --operator-namespace) to run the controllers; every replica serves the admission webhooks. Off, this process runs the controllers at once: run one replica only.")
	fs.DurationVar(&o.LeaseDuration, "leader-elect-lease-duration", o.LeaseDuration, "How long a leader's Lease holds without renewal before another replica may take over.")
	fs.DurationVar(&o.RenewDeadline, "leader-elect-renew-deadline", o.RenewDeadline, "How long the leader keeps trying to renew before it gives up leading.")
	fs.DurationVar(&o.RetryPeriod, "leader-elect-retry-period", o.RetryPeriod, "How often replicas try to acquire or renew the Lease.")
}

// addSidecarFlags registers the flags of Envoy sidecar injection and the
// workload initializer.
func (o *Options) addSidecarFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.InitializeWorkloads, "initialize-workloads", o.InitializeWorkloads, "Merge the Envoy template into Deployments annotated initializer.kubernetes.io/envoy: \"true\".")
	fs.BoolVar(&o.AllowPrivilegedTemplates, "allow-privileged-templates", o.AllowPrivilegedTemplates, "Let the envoy-initializer template of every namespace make privileged containers, add capabilities, and use host ports, hostPath volumes and the other fields Pod Security's baseline refuses. Without it only the template in --operator-namespace may, and the templates of the namespaces its annotation initializer.kubernetes.io/envoy-privileged-namespaces lists (\"*\": all).")
}

// addDeploymentNetworkFlags registers the flags of a Network per Deployment.
func (o *Options) addDeploymentNetworkFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.DeploymentNetworks, "deployment-networks", o.DeploymentNetworks, "Give each Deployment annotated samplecrd.k8s.io/network: auto (or samplecrd.k8s.io/network-cidr: CIDR) a Network of its name, owned by it, that its pods join.")
	fs.StringVar(&o.DeploymentNetworkPool, "deployment-network-pool", o.DeploymentNetworkPool, "The range the cidrs of Deployments' Networks (samplecrd.k8s.io/network: auto) are taken from, skipping every cidr another Network has.")
	fs.IntVar(&o.DeploymentNetworkPrefixLength, "deployment-network-prefix-length", o.DeploymentNetworkPrefixLength, "The prefix length of the cidrs taken from --deployment-network-pool.")
}

// addAtFlags registers the flags of the At controller.
func (o *Options) addAtFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.RunAts, "ats", o.RunAts, "Run the At controller: each At (cnat.programming-kubernetes.info/v1alpha1) runs its command in a pod at its scheduled time.")
	fs.StringVar(&o.AtImage, "at-image", o.AtImage, "Image of the pods that run Ats' commands; it must have sh.")
}

// addNADFlags registers the flags of the NetworkAttachmentDefinitions
// kept for Multus.
func (o *Options) addNADFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.CNIDataDir, "cni-data-dir", o.CNIDataDir, "Path, on the nodes, where netop's CNI plugin records attachments, written into the NetworkAttachmentDefinitions.")
}

// addAgentFlags registers the flags of the node agent: its node and the
// CNI plugin it installs.
func (o *Options) addAgentFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "The node this agent runs on, as its Node object is named. Defaults to $NODE_NAME (the downward API's spec.nodeName).")
	fs.BoolVar(&o.InstallCNI, "install-cni", o.InstallCNI, "Install netop's CNI plugin on the host: this binary as netop-cni in --cni-bin-dir, and at --cni-kubeconfig the plugin's kubeconfig with tokens of --cni-service-account, renewed before they expire.")
	fs.StringVar(&o.CNIBinDir, "cni-bin-dir", o.CNIBinDir, "The host's CNI plugin directory, where --install-cni puts netop-cni.")
	fs.StringVar(&o.CNIServiceAccount, "cni-service-account", o.CNIServiceAccount, "Service account in --operator-namespace whose tokens the CNI plugin reads pods with (--install-cni).")
	fs.DurationVar(&o.CNITokenLifetime, "cni-token-lifetime", o.CNITokenLifetime, "How long each of the CNI plugin's tokens is valid (--install-cni); renewed at 80% of it.")
}

// Validate checks the options.
func (o *Options) Validate() error {
	switch {
	case o.Role != RoleAll && o.Role != RoleController && o.Role != RoleAgent:
		return fmt.Errorf("unknown role %q", o.Role)
	case o.Role == RoleAgent && o.NodeName == "":
		return fmt.Errorf("--node-name (or $NODE_NAME) is required: the agent reports on its node")
	case o.Role == RoleAgent && o.Backend != string(samplecrd.BackendLinux):
		return fmt.Errorf("--backend %q: the agent builds linux bridges; Neutron networks are the controller's", o.Backend)
	case o.InstallCNI && (o.CNIBinDir == "" || o.CNIKubeconfig == "" || o.CNIServiceAccount == ""):
		return fmt.Errorf("--install-cni needs --cni-bin-dir, --cni-kubeconfig and --cni-service-account")
	case o.InstallCNI && o.CNITokenLifetime < 10*time.Minute:
		return fmt.Errorf("--cni-token-lifetime %v: the API server issues tokens for at least 10m", o.CNITokenLifetime)
	case o.QPS <= 0:
		return fmt.Errorf("--kube-api-qps must be positive, got %v", o.QPS)
	case o.Burst < 1:
		return fmt.Errorf("--kube-api-burst must be at least 1, got %d", o.Burst)
	case kubeclient.ValidContentType(o.KubeAPIContentType) != nil:
		return fmt.Errorf("--kube-api-content-type: %w", kubeclient.ValidContentType(o.KubeAPIContentType))
	case o.DeploymentNetworks && deploymentPoolError(o) != nil:
		return fmt.Errorf("--deployment-network-pool, --deployment-network-prefix-length: %w", deploymentPoolError(o))
	case o.RunAts && o.AtImage == "":
		return fmt.Errorf("--at-image must name an image with sh, or turn Ats off with --ats=false")
	case o.Workers < 1:
		return fmt.Errorf("--workers must be at least 1, got %d", o.Workers)
	case o.Resync <= 0:
		return fmt.Errorf("--resync must be positive, got %v", o.Resync)
	case o.LeaderElect && (o.LeaseDuration <= o.RenewDeadline || o.RenewDeadline <= o.RetryPeriod || o.RetryPeriod <= 0):
		return fmt.Errorf("--leader-elect-lease-duration (%v) must exceed --leader-elect-renew-deadline (%v), which must exceed --leader-elect-retry-period (%v) > 0",
			o.LeaseDuration, o.RenewDeadline, o.RetryPeriod)
	case o.WebhookMaxInflight < 0:
		return fmt.Errorf("--webhook-max-inflight must be 0 (no limit) or positive, got %d", o.WebhookMaxInflight)
	case o.WebhookMaxInflightBytes.Sign() < 0:
		return fmt.Errorf("--webhook-max-inflight-bytes must be 0 (no limit) or positive, got %s", o.WebhookMaxInflightBytes.String())
	case o.Role != RoleAgent && o.webhooksEnabled() && o.Namespace != "":
		return fmt.Errorf("--namespace %q: the admission webhooks check Networks of all namespaces; use --webhook-addr=0 with --namespace", o.Namespace)
	case o.Role != RoleAgent && o.InitializeWorkloads && o.Namespace != "":
		return fmt.Errorf("--namespace %q: the workload initializer serves all namespaces; use --initialize-workloads=false with --namespace", o.Namespace)
	case o.ClusterID != "" && backend.ValidCluster(o.ClusterID) != nil:
		return fmt.Errorf("--cluster-id: %w", backend.ValidCluster(o.ClusterID))
	case o.Backend != string(samplecrd.BackendLinux) && o.Backend != string(samplecrd.BackendNeutron):
		return fmt.Errorf("--backend %q is not supported; supported: linux, neutron", o.Backend)
	case o.Backend == string(samplecrd.BackendNeutron) && o.NeutronEndpoint != "" && o.NeutronProject == "":
		return fmt.Errorf("--neutron-project is required with --neutron-endpoint: Neutron without Keystone needs the project that owns the networks")
	}
	return nil
}

func deploymentPoolError(o *Options) error {
	_, err := deploynet.NewPool(o.DeploymentNetworkPool, o.DeploymentNetworkPrefixLength)
	return err
}

func (o *Options) webhooksEnabled() bool { return o.WebhookAddr != "" && o.WebhookAddr != "0" }

// ClientConfigFlags say where the cluster is, the way kubectl users expect:
// --kubeconfig, then $KUBECONFIG and ~/.kube/config, then the in-cluster
// service account.
type ClientConfigFlags struct {
	Kubeconfig string
	Master     string
}

// AddFlags registers the flags on fs.
func (c *ClientConfigFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "Path to a kubeconfig. Defaults to $KUBECONFIG, then ~/.kube/config, then the in-cluster configuration.")
	fs.StringVar(&c.Master, "master", "", "The address of the API server. Overrides the server in the kubeconfig.")
}

// RESTConfig loads the client configuration.
func (c *ClientConfigFlags) RESTConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = c.Kubeconfig
	overrides := &clientcmd.ConfigOverrides{}
	overrides.ClusterInfo.Server = c.Master
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading client configuration: %w", err)
	}
	return cfg, nil
}

func (o *Options) metricsEnabled() bool { return o.MetricsAddr != "" && o.MetricsAddr != "0" }
