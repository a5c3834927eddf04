package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Config describes the node.
type Config struct {
	// DataDir is the standalone's data directory: the node keeps its state
	// under DataDir/node and its logs in DataDir/logs.
	DataDir string
	// Name is the Node's name.
	Name string
	// Kubeconfig authenticates the kubelet as system:node:Name.
	Kubeconfig string
	// ClientCAFile is the cluster's CA: the kubelet accepts clients (the
	// API server, for logs and exec) with certificates it signed.
	ClientCAFile string
	// Executable runs the kubelet with the subcommand "kubelet" and
	// kube-proxy with "kube-proxy", and is netop's CNI plugin when called
	// by its name.
	Executable string
	// Registry serves the node's images.
	Registry *Registry

	// Netns is the node's own network namespace, its host: containerd,
	// the kubelet and kube-proxy run there (see hostns.go), and so do the
	// pods' bridge and netop's. Address is the node's InternalIP there,
	// PodCIDR its pods' network, APIServer the API server's loopback
	// address (127.0.0.1:PORT), forwarded into the namespace.
	Netns     string
	Address   net.IP
	PodCIDR   string
	APIServer string

	// KubeProxyKubeconfig authenticates kube-proxy as system:kube-proxy.
	KubeProxyKubeconfig string
	// ClusterDNS is the kube-dns Service's address, ClusterDomain the
	// cluster's DNS domain: the kubelet hands both to pods.
	ClusterDNS    string
	ClusterDomain string
}

// Prerequisites are the host programs the node needs, and the Debian
// packages that have them.
var prerequisites = []struct{ what, pkg string }{
	{"containerd", "containerd"},
	{"runc", "runc"},
	{"/usr/lib/cni/bridge", "containernetworking-plugins"},
	{"/bin/busybox", "busybox-static"},
	{"nft", "nftables"}, // kube-proxy's nftables mode
}

// InstallCommand installs what the node needs on Debian and Ubuntu.
const InstallCommand = "apt-get install -y containerd runc containernetworking-plugins busybox-static nftables"

// Check says what keeps a node from running here, with how to install
// it, or returns nil.
func Check() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (the kubelet and containerd manage cgroups, mounts and network namespaces): run as root")
	}
	var pkgs []string
	for _, p := range prerequisites {
		if _, err := exec.LookPath(p.what); err != nil {
			missing = append(missing, fmt.Sprintf("%s (Debian package %s)", p.what, p.pkg))
			pkgs = append(pkgs, p.pkg)
		}
	}
	if busybox, err := os.ReadFile("/bin/busybox"); err == nil && isDynamic(busybox) {
		missing = append(missing, "a static /bin/busybox, to build the busybox and pause images (Debian package busybox-static)")
		pkgs = append(pkgs, "busybox-static")
	}
	if _, err := os.Stat("/sys/fs/cgroup"); err != nil {
		missing = append(missing, "cgroups mounted at /sys/fs/cgroup")
	}
	if len(missing) == 0 {
		return nil
	}
	msg := "no node: missing " + strings.Join(missing, "; ")
	if len(pkgs) > 0 {
		msg += "; install with: apt-get install -y " + strings.Join(pkgs, " ")
	}
	return errors.New(msg)
}

// Node is a running containerd and kubelet.
type Node struct {
	cfg        Config
	dir        string
	containerd *process
	kubelet    *process
	kubeProxy  *process
	cgroups    *cgroupRoot
	forwarder  *Forwarder
	socket     string
	started    time.Time
}

// Start runs the node's parts and returns once the kubelet runs; WaitReady
// waits for the Node to be Ready. Stop must be called to release it.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	logger := klog.FromContext(ctx)
	n := &Node{cfg: cfg, dir: filepath.Join(cfg.DataDir, "node"), started: time.Now()}
	defer func() {
		if err != nil {
			n.Stop(context.WithoutCancel(ctx))
		}
	}()
	for _, sub := range []string{"", "containerd", "kubelet", "cni/net.d", "cni/bin", "cni/ipam"} {
		if err := os.MkdirAll(filepath.Join(n.dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("node directory: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Join(cfg.DataDir, "logs"), 0o700); err != nil {
		return nil, fmt.Errorf("node directory: %w", err)
	}
	n.socket = socketPath(n.dir)
	// One cgroup per data directory: two standalones on one host never
	// share one.
	sum := sha256.Sum256([]byte(n.dir))
	if n.cgroups, err = makeCgroupRoot("/netop-" + cfg.Name + "-" + hex.EncodeToString(sum[:4])); err != nil {
		return nil, err
	}
	if err := netnsReady(cfg.Netns); err != nil {
		return nil, err
	}
	if err := n.startForwarding(ctx); err != nil {
		return nil, err
	}
	if err := writeCNI(n.dir, cfg); err != nil {
		return nil, err
	}
	if n.containerd, err = n.startContainerd(ctx); err != nil {
		return nil, err
	}
	if n.kubelet, err = n.startKubelet(ctx); err != nil {
		return nil, err
	}
	if n.kubeProxy, err = n.startKubeProxy(ctx); err != nil {
		return nil, err
	}
	logger.V(1).Info("Node started", "node", cfg.Name, "containerd", n.socket)
	return n, nil
}

// WaitReady waits until the Node is Ready and returns it.
func (n *Node) WaitReady(ctx context.Context, kube kubernetes.Interface, timeout time.Duration) (*corev1.Node, error) {
	var node *corev1.Node
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := n.kubelet.exited(); err != nil {
			return false, fmt.Errorf("kubelet stopped (see %s): %w", n.kubelet.log, err)
		}
		if err := n.containerd.exited(); err != nil {
			return false, fmt.Errorf("containerd stopped (see %s): %w", n.containerd.log, err)
		}
		if err := n.kubeProxy.exited(); err != nil {
			return false, fmt.Errorf("kube-proxy stopped (see %s): %w", n.kubeProxy.log, err)
		}
		got, err := kube.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, c := range got.Status.Conditions {
			if c.Type == corev1.NodeReady {
				last = fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
				// A Node from an earlier start still says Ready: only this
				// kubelet's word counts (heartbeats have second precision).
				if c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(n.started.Truncate(time.Second)) {
					node = got
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("node %s not Ready (last: %s; logs in %s): %w", n.cfg.Name, last, filepath.Join(n.cfg.DataDir, "logs"), err)
	}
	return node, nil
}

// Stop stops the kubelet, every pod's sandbox and containers, and
// containerd, and removes what they mounted: nothing the node started
// outlives the standalone. Pods stay bound to the node, so that the next
// start brings them back. It is safe to call more than once.
func (n *Node) Stop(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if n.kubeProxy != nil {
		n.kubeProxy.stop(3 * time.Second)
		n.kubeProxy = nil
	}
	if n.kubelet != nil {
		// The kubelet shuts its loops down on SIGTERM but its process
		// does not exit (v1.37): a short grace, then SIGKILL, which it
		// is built to survive (its checkpoints are written as it goes).
		n.kubelet.stop(3 * time.Second)
		n.kubelet = nil
	}
	if n.containerd != nil {
		if err := stopSandboxes(ctx, n.socket); err != nil {
			logger.Error(err, "Stopping the pods' sandboxes")
		}
		n.containerd.stop(20 * time.Second)
		n.containerd = nil
	}
	if err := unmountUnder(n.dir); err != nil {
		logger.Error(err, "Unmounting what the node left")
	}
	if err := removeNodeTables(n.cfg.Netns); err != nil {
		logger.Error(err, "Removing the node's nftables tables")
	}
	if n.forwarder != nil {
		n.forwarder.Stop()
		n.forwarder = nil
	}
	if n.cgroups != nil {
		n.cgroups.remove()
		n.cgroups = nil
	}
}
