package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/client/pkg/v3/tlsutil"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/component-base/configz"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	scheduleroptions "k8s.io/kubernetes/cmd/kube-scheduler/app/options"

	pkiutil "github.com/netop-dev/netop/internal/pki"
)

// ServiceCIDR is the Services' address range; KubernetesServiceIP, its
// first address, is the kubernetes Service's, which pods' in-cluster
// configuration uses.
const (
	ServiceCIDR         = "10.0.0.0/24"
	KubernetesServiceIP = "10.0.0.1"
)

// Config says where the control plane keeps its state.
type Config struct {
	// DataDir holds etcd's data, the PKI, the kubeconfig and the logs.
	DataDir string
	// APIServerPort is the port to serve on when the data directory has
	// none recorded yet; 0 picks a free one. A port recorded by an earlier
	// start always wins, so that existing kubeconfigs stay valid.
	APIServerPort int
	// NodeNames each get a kubelet identity (system:node:NAME) and a
	// kubeconfig: the first at NodeKubeconfigPath, the others at
	// DIR/nodes/NAME/kubeconfig (NodeKubeconfigs).
	NodeNames []string
}

// ControlPlane is a running etcd, kube-apiserver and kube-controller-manager.
type ControlPlane struct {
	// DataDir is the absolute path of the data directory.
	DataDir string
	// KubeconfigPath is DIR/kubeconfig, an administrator's kubeconfig.
	KubeconfigPath string
	// URL is the API server's address, https://127.0.0.1:PORT.
	URL string
	// NodeKubeconfigPath is DIR/node/kubeconfig, the first node's
	// kubelet's, when there is a node.
	NodeKubeconfigPath string
	// NodeKubeconfigs are the kubelets' kubeconfigs, by node name.
	NodeKubeconfigs map[string]string
	// KubeProxyKubeconfig is DIR/kube-proxy/kubeconfig, kube-proxy's on
	// every node.
	KubeProxyKubeconfig string
	// CACertPath is the cluster CA's certificate.
	CACertPath string

	adminConfig *rest.Config
	logFiles    []*os.File
	etcd        *embed.Etcd
	// etcdURL is etcd's client URL, https://127.0.0.1:PORT.
	etcdURL string

	// A component's done channel is closed when its Run returns; an
	// unexpected error is logged to the component's log. apiServerErr is
	// what the API server's Run returned, to be read once apiServerDone is
	// closed.
	stopControllerManager context.CancelFunc
	controllerManagerDone chan struct{}
	stopScheduler         context.CancelFunc
	schedulerDone         chan struct{}
	stopAPIServer         context.CancelFunc
	apiServerDone         chan struct{}
	apiServerErr          error
}

// ports is what DIR/ports.json records: where each component listens.
type ports struct {
	APIServer  int `json:"apiServer"`
	EtcdClient int `json:"etcdClient"`
	EtcdPeer   int `json:"etcdPeer"`
}

// instances numbers the control planes started in this process; the API
// server registers its informer under a process-wide name.
var instances atomic.Int32

// Start runs a control plane and returns when the API server is ready.
// Stop must be called to release it, also when ctx is cancelled.
func Start(ctx context.Context, cfg Config) (_ *ControlPlane, err error) {
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	for _, sub := range []string{"", "etcd", "logs", "pki", "controller-manager", "scheduler"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("creating data directory: %w", err)
		}
	}
	cp := &ControlPlane{DataDir: dir, KubeconfigPath: filepath.Join(dir, "kubeconfig")}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()

	if err := cp.redirectKlog(); err != nil {
		return nil, err
	}
	if err := cp.redirectEtcdClientLog(); err != nil {
		return nil, err
	}
	p, err := ensurePKI(filepath.Join(dir, "pki"), cfg.NodeNames...)
	if err != nil {
		return nil, err
	}
	cp.CACertPath = p.path(caCertFile)
	pp, err := ensurePorts(filepath.Join(dir, "ports.json"), cfg.APIServerPort)
	if err != nil {
		return nil, err
	}
	cp.URL = "https://127.0.0.1:" + strconv.Itoa(pp.APIServer)

	if err := cp.startEtcd(p, pp); err != nil {
		return nil, err
	}
	if err := cp.writeKubeconfig(cp.KubeconfigPath, p, adminUser); err != nil {
		return nil, err
	}
	cp.NodeKubeconfigs = map[string]string{}
	for i, name := range cfg.NodeNames {
		path := filepath.Join(dir, "nodes", name, "kubeconfig")
		if i == 0 {
			path = filepath.Join(dir, "node", "kubeconfig")
			cp.NodeKubeconfigPath = path
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		if err := cp.writeKubeconfig(path, p, NodeUser(name)); err != nil {
			return nil, err
		}
		cp.NodeKubeconfigs[name] = path
	}
	cp.KubeProxyKubeconfig = filepath.Join(dir, "kube-proxy", "kubeconfig")
	if err := os.MkdirAll(filepath.Dir(cp.KubeProxyKubeconfig), 0o700); err != nil {
		return nil, err
	}
	if err := cp.writeKubeconfig(cp.KubeProxyKubeconfig, p, kubeProxyUser); err != nil {
		return nil, err
	}
	kcmKubeconfig := filepath.Join(dir, "controller-manager", "kubeconfig")
	if err := cp.writeKubeconfig(kcmKubeconfig, p, controllerManagerUser); err != nil {
		return nil, err
	}
	cp.adminConfig, err = clientcmd.BuildConfigFromFlags("", cp.KubeconfigPath)
	if err != nil {
		return nil, fmt.Errorf("loading admin kubeconfig: %w", err)
	}

	if err := cp.startAPIServer(ctx, p, pp); err != nil {
		return nil, err
	}
	if err := cp.waitReady(ctx); err != nil {
		return nil, err
	}
	if err := cp.startControllerManager(ctx, p, kcmKubeconfig); err != nil {
		return nil, err
	}
	schedulerKubeconfig := filepath.Join(dir, "scheduler", "kubeconfig")
	if err := cp.writeKubeconfig(schedulerKubeconfig, p, schedulerUser); err != nil {
		return nil, err
	}
	if err := cp.startScheduler(ctx, schedulerKubeconfig); err != nil {
		return nil, err
	}
	return cp, nil
}

// AdminConfig returns a client configuration with full rights.
func (cp *ControlPlane) AdminConfig() *rest.Config { return rest.CopyConfig(cp.adminConfig) }

// Stored returns the values etcd holds under the keys that begin with
// prefix (the API server's, such as /registry/samplecrd.k8s.io/networks/),
// by key: what the API server stored, in the encoding and version it
// stored it in. It reads in-process, for tests of storage.
func (cp *ControlPlane) Stored(ctx context.Context, prefix string) (map[string][]byte, error) {
	if cp.etcd == nil {
		return nil, errors.New("etcd is not running")
	}
	c := v3client.New(cp.etcd.Server)
	defer func() { _ = c.Close() }()
	resp, err := c.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("reading etcd under %s: %w", prefix, err)
	}
	values := make(map[string][]byte, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		values[string(kv.Key)] = kv.Value
	}
	return values, nil
}

// Stop shuts the components down in reverse order of start and waits for
// them. It is safe to call more than once.
func (cp *ControlPlane) Stop() {
	if cp.stopScheduler != nil {
		cp.stopScheduler()
		<-cp.schedulerDone
		cp.stopScheduler = nil
	}
	if cp.stopControllerManager != nil {
		cp.stopControllerManager()
		<-cp.controllerManagerDone
		cp.stopControllerManager = nil
	}
	if cp.stopAPIServer != nil {
		cp.stopAPIServer()
		<-cp.apiServerDone
		cp.stopAPIServer = nil
	}
	if cp.etcd != nil {
		cp.etcd.Close()
		cp.etcd = nil
	}
	for _, f := range cp.logFiles {
		_ = f.Close()
	}
	cp.logFiles = nil
}

// logger returns a logger that writes to DIR/logs/NAME.log.
func (cp *ControlPlane) logger(name string) (klog.Logger, error) {
	f, err := os.OpenFile(filepath.Join(cp.DataDir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return klog.Logger{}, fmt.Errorf("opening log file: %w", err)
	}
	cp.logFiles = append(cp.logFiles, f)
	return textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(f))), nil
}

// redirectKlog sends klog's process-wide output to DIR/logs/klog.log: the
// Kubernetes components log there heavily, not always through the
// contextual loggers they are given.
func (cp *ControlPlane) redirectKlog() error {
	f, err := os.OpenFile(filepath.Join(cp.DataDir, "logs", "klog.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening log file: %w", err)
	}
	cp.logFiles = append(cp.logFiles, f)
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for name, value := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "one_output": "true", "stderrthreshold": "FATAL"} {
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("configuring klog: %w", err)
		}
	}
	klog.SetOutput(f)
	return nil
}

func ensurePorts(path string, apiServerPort int) (ports, error) {
	var pp ports
	if data, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(data, &pp); err != nil {
			return pp, fmt.Errorf("reading %s: %w", path, err)
		}
	}
	var err error
	if pp.APIServer == 0 {
		pp.APIServer = apiServerPort
		if pp.APIServer == 0 {
			if pp.APIServer, err = freePort(); err != nil {
				return pp, err
			}
		}
	}
	for _, port := range []*int{&pp.EtcdClient, &pp.EtcdPeer} {
		if *port == 0 {
			if *port, err = freePort(); err != nil {
				return pp, err
			}
		}
	}
	data, _ := json.MarshalIndent(pp, "", "  ")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return pp, fmt.Errorf("recording ports: %w", err)
	}
	for name, port := range map[string]int{"kube-apiserver": pp.APIServer, "etcd client": pp.EtcdClient, "etcd peer": pp.EtcdPeer} {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return pp, fmt.Errorf("%s port 127.0.0.1:%d recorded in %s is not free (is another control plane running on this data directory?): %w", name, port, path, err)
		}
		_ = l.Close()
	}
	return pp, nil
}

// freePort picks a free port below the kernel's ephemeral range: the
// ports are recorded for the next start, and one of that range (which
// bind to port 0 would give) can be taken meanwhile by any outgoing
// connection of the host, which get theirs from it.
func freePort() (int, error) {
	const lowest = 10000
	below := ephemeralStart()
	for range 100 {
		if below <= lowest {
			break
		}
		port := lowest + rand.IntN(below-lowest)
		if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
			_ = l.Close()
			return port, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralStart is the first port of the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), 32768 if it cannot be read.
func ephemeralStart() int {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	fields := strings.Fields(string(data))
	if len(fields) == 0 {
		return 32768
	}
	start, err := strconv.Atoi(fields[0])
	if err != nil {
		return 32768
	}
	return start
}

// startEtcd runs etcd on 127.0.0.1 with TLS on both of its listeners and
// client certificates required: a client needs a certificate of etcd's own
// CA (the API server has one), so that no other user of the host reads or
// writes the cluster's objects past RBAC. Peers (there are none; the
// listener exists all the same) are held to the same.
func (cp *ControlPlane) startEtcd(p *pki, pp ports) error {
	cfg := embed.NewConfig()
	cfg.Name = "netop"
	cfg.Dir = filepath.Join(cp.DataDir, "etcd")
	clientURL := etcdClientURL(pp)
	cp.etcdURL = clientURL.String()
	peerURL := url.URL{Scheme: "https", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(pp.EtcdPeer))}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	for _, info := range []*transport.TLSInfo{&cfg.ClientTLSInfo, &cfg.PeerTLSInfo} {
		info.CertFile = p.path(etcdServerCertFile)
		info.KeyFile = p.path(etcdServerKeyFile)
		info.TrustedCAFile = p.path(etcdCACertFile)
		info.ClientCertAuth = true
	}
	cfg.TlsMinVersion = string(tlsutil.TLSVersion12)
	cfg.CipherSuites = pkiutil.TLSCipherSuiteNames()
	cfg.Logger = "zap"
	cfg.LogOutputs = []string{filepath.Join(cp.DataDir, "logs", "etcd.log")}
	// Only a machine crash, not a process crash, loses unsynced writes, and
	// fsync on every write makes a development control plane slow.
	cfg.UnsafeNoFsync = true
	// A single member still waits out an election timeout before it leads
	// (fast-forwarding leaves the last tick): etcd's default, 1 s, was a
	// third of a cold start. It has no peer to wait for.
	cfg.TickMs, cfg.ElectionMs = 20, 200

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("starting etcd: %w", err)
	}
	cp.etcd = e
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return fmt.Errorf("etcd: %w", err)
	case <-time.After(60 * time.Second):
		return errors.New("etcd did not become ready within 60s")
	}
}

func (cp *ControlPlane) startAPIServer(ctx context.Context, p *pki, pp ports) error {
	s := apiserveroptions.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	args := []string{
		"--etcd-servers=" + cp.etcdURL,
		"--etcd-cafile=" + p.path(etcdCACertFile),
		"--etcd-certfile=" + p.path(etcdClientCertFile),
		"--etcd-keyfile=" + p.path(etcdClientKeyFile),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(pp.APIServer),
		"--cert-dir=" + p.dir,
		"--tls-cert-file=" + p.path(servingCertFile),
		"--tls-private-key-file=" + p.path(servingKeyFile),
		"--tls-min-version=VersionTLS12",
		"--tls-cipher-suites=" + strings.Join(pkiutil.TLSCipherSuiteNames(), ","),
		"--client-ca-file=" + p.path(caCertFile),
		"--token-auth-file=" + p.path(tokenFile),
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.path(saKeyFile),
		"--service-account-signing-key-file=" + p.path(saKeyFile),
		"--service-cluster-ip-range=" + ServiceCIDR,
		// The only address is loopback, which the endpoint reconciler refuses.
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--profiling=false",
		// Logs, exec and port-forward: the kubelet trusts the cluster CA,
		// and listens on the node's InternalIP (loopback), not on
		// whatever the host's name resolves to.
		"--kubelet-client-certificate=" + p.path(kubeletClientCertFile),
		"--kubelet-client-key=" + p.path(kubeletClientKeyFile),
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		// Webhooks behind a Service are called at its endpoints: no
		// kube-proxy makes its ClusterIP reachable.
		"--enable-aggregator-routing=true",
		// Stop in seconds with clients watching (kubectl get -w, a
		// user's controller): once the short requests are drained, the
		// HTTP server gives watches 2s instead of its 60s request timeout.
		"--shutdown-send-retry-after=true",
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("kube-apiserver flags: %w", err)
	}
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return fmt.Errorf("kube-apiserver feature gates: %w", err)
	}
	logger, err := cp.logger("kube-apiserver")
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), logger))
	completed, err := s.Complete(runCtx)
	if err != nil {
		cancel()
		return fmt.Errorf("kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) > 0 {
		cancel()
		return fmt.Errorf("kube-apiserver options: %v", errs)
	}
	completed.InformerName, err = cache.NewInformerName(fmt.Sprintf("kube-apiserver-%d", instances.Add(1)))
	if err != nil {
		cancel()
		return err
	}
	cp.stopAPIServer = cancel
	cp.apiServerDone = make(chan struct{})
	go func() {
		defer close(cp.apiServerDone)
		cp.apiServerErr = apiserverapp.Run(runCtx, completed)
		if cp.apiServerErr != nil {
			logger.Error(cp.apiServerErr, "kube-apiserver stopped")
		}
	}()
	return nil
}

// etcdClientURL is where etcd serves its clients: https://127.0.0.1:PORT.
func etcdClientURL(pp ports) url.URL {
	return url.URL{Scheme: "https", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(pp.EtcdClient))}
}

// waitReady polls /readyz until the API server answers ok, or it stops.
func (cp *ControlPlane) waitReady(ctx context.Context) error {
	client, err := kubernetes.NewForConfig(cp.adminConfig)
	if err != nil {
		return err
	}
	var lastErr error
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case <-cp.apiServerDone:
			return false, fmt.Errorf("kube-apiserver stopped before it was ready (see %s): %v",
				filepath.Join(cp.DataDir, "logs", "kube-apiserver.log"), cp.apiServerErr)
		default:
		}
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			lastErr = err
			return false, nil
		}
		return string(body) == "ok", nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-apiserver at %s to be ready (last error: %v): %w", cp.URL, lastErr, err)
	}
	return nil
}

func (cp *ControlPlane) startControllerManager(ctx context.Context, p *pki, kubeconfig string) error {
	s, err := kcmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		return fmt.Errorf("kube-controller-manager options: %w", err)
	}
	named := s.Flags(kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases())
	s.ParsedFlags = &named
	fs := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	for _, f := range named.FlagSets {
		fs.AddFlagSet(f)
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + p.path(saKeyFile),
		"--root-ca-file=" + p.path(caCertFile),
		"--cluster-name=netop",
		"--flex-volume-plugin-dir=" + filepath.Join(cp.DataDir, "controller-manager", "volume-plugins"),
		"--kube-api-qps=200",
		"--kube-api-burst=400",
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("kube-controller-manager flags: %w", err)
	}
	if err := s.ComponentGlobalsRegistry.Set(); err != nil {
		return fmt.Errorf("kube-controller-manager feature gates: %w", err)
	}
	logger, err := cp.logger("kube-controller-manager")
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), logger))
	c, err := s.Config(runCtx, kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases())
	if err != nil {
		cancel()
		return fmt.Errorf("kube-controller-manager config: %w", err)
	}
	// A controller manager stopped earlier in this process left its
	// configz entry behind, and Run refuses to register it twice.
	configz.Delete(kcmapp.ConfigzName)
	cp.stopControllerManager = cancel
	cp.controllerManagerDone = make(chan struct{})
	go func() {
		defer close(cp.controllerManagerDone)
		if err := kcmapp.Run(runCtx, c.Complete()); err != nil && runCtx.Err() == nil {
			logger.Error(err, "kube-controller-manager stopped")
		}
	}()
	return nil
}

// startScheduler runs kube-scheduler, so that pods without a nodeName get
// one, as on any cluster. It serves nothing (--secure-port=0): nobody
// scrapes it here.
func (cp *ControlPlane) startScheduler(ctx context.Context, kubeconfig string) error {
	opts := scheduleroptions.NewOptions()
	fs := pflag.NewFlagSet("kube-scheduler", pflag.ContinueOnError)
	for _, f := range opts.Flags.FlagSets {
		fs.AddFlagSet(f)
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("kube-scheduler flags: %w", err)
	}
	if err := opts.ComponentGlobalsRegistry.Set(); err != nil {
		return fmt.Errorf("kube-scheduler feature gates: %w", err)
	}
	var err error
	if opts.InformerName, err = cache.NewInformerName(fmt.Sprintf("kube-scheduler-%d", instances.Load())); err != nil {
		return err
	}
	logger, err := cp.logger("kube-scheduler")
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), logger))
	cc, sched, err := schedulerapp.Setup(runCtx, opts)
	if err != nil {
		cancel()
		return fmt.Errorf("kube-scheduler: %w", err)
	}
	// A scheduler stopped earlier in this process left its configz entry
	// behind, and Run refuses to register it twice.
	configz.Delete("componentconfig")
	cp.stopScheduler = cancel
	cp.schedulerDone = make(chan struct{})
	go func() {
		defer close(cp.schedulerDone)
		if err := schedulerapp.Run(runCtx, cc, sched); err != nil && runCtx.Err() == nil {
			logger.Error(err, "kube-scheduler stopped")
		}
	}()
	return nil
}

// writeKubeconfig writes a kubeconfig for user, authenticated by its token.
func (cp *ControlPlane) writeKubeconfig(path string, p *pki, user string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["netop"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: p.caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: p.tokens[user]}
	cfg.Contexts["netop"] = &clientcmdapi.Context{Cluster: "netop", AuthInfo: user, Namespace: "default"}
	cfg.CurrentContext = "netop"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig: %w", err)
	}
	return nil
}
