package node

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"
)

// kubeletConfig is the KubeletConfiguration, as a map: the typed one
// would link the kubelet's API into every user of this package.
func (n *Node) kubeletConfig(ip net.IP, port int) map[string]any {
	cfg := map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"address":                  ip.String(),
		"port":                     port,
		"readOnlyPort":             0,
		"healthzPort":              0,
		"containerRuntimeEndpoint": "unix://" + n.socket,
		// No systemd on many development hosts; containerd's runc uses
		// cgroupfs too.
		"cgroupDriver": "cgroupfs",
		"cgroupRoot":   n.cgroups.name,
		"failSwapOn":   false,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": n.cfg.ClientCAFile},
		},
		"authorization":       map[string]any{"mode": "Webhook"},
		"serializeImagePulls": false,
		"resolvConf":          "/etc/resolv.conf",
		"clusterDNS":          []string{n.cfg.ClusterDNS},
		"clusterDomain":       n.cfg.ClusterDomain,
		// All the node's state under the data directory.
		"podLogsDir": filepath.Join(n.dir, "pod-logs"),
		// The node's disk is the developer's: never evict pods over it.
		"evictionHard": map[string]string{"memory.available": "50Mi"},
	}
	if CgroupV1() {
		// kubelet v1.35+ refuses cgroup v1 unless told; many hosts (this
		// project's CI among them) still have v1 or hybrid hierarchies.
		cfg["failCgroupV1"] = false
	}
	return cfg
}

// devicePluginSocket is where every kubelet of a host listens for device
// plugins, whatever its --root-dir. A kubelet removes it and binds it as
// it starts: of two starting at once, one may find the other's bound and
// exit ("Failed to start ContainerManager ... address already in use").
const devicePluginSocket = "/var/lib/kubelet/device-plugins/kubelet.sock"

// kubeletBinding is held from a kubelet's start until it listens on
// devicePluginSocket (or gave up): the nodes of one standalone start their
// kubelets one after the other through that instant, and at once
// otherwise.
var kubeletBinding sync.Mutex

// devicePluginBindWait bounds how long the next kubelet waits for one to
// bind devicePluginSocket.
const devicePluginBindWait = 30 * time.Second

func (n *Node) startKubelet(ctx context.Context) (*process, error) {
	kubeletBinding.Lock()
	before := fileID(devicePluginSocket)
	p, err := n.execKubelet()
	if err != nil {
		kubeletBinding.Unlock()
		return nil, err
	}
	go func() {
		defer kubeletBinding.Unlock()
		_ = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, devicePluginBindWait, true, func(context.Context) (bool, error) {
			now := fileID(devicePluginSocket)
			return p.exited() != nil || now != (fileKey{}) && now != before, nil
		})
	}()
	return p, nil
}

// fileKey identifies a file: its device, inode and change time (a file
// made anew may get the inode number of the one it replaced); zero if there
// is none.
type fileKey struct {
	dev, ino uint64
	ctime    syscall.Timespec
}

func fileID(path string) fileKey {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileKey{}
	}
	return fileKey{dev: uint64(st.Dev), ino: st.Ino, ctime: st.Ctim} //nolint:unconvert // Dev's type differs across architectures
}

// execKubelet runs the node's kubelet.
func (n *Node) execKubelet() (*process, error) {
	ip, port := n.cfg.Address, 10250 // a node of its own: the usual port
	data, err := yaml.Marshal(n.kubeletConfig(ip, port))
	if err != nil {
		return nil, err
	}
	config := filepath.Join(n.dir, "kubelet", "config.yaml")
	if err := os.WriteFile(config, data, 0o600); err != nil {
		return nil, fmt.Errorf("kubelet configuration: %w", err)
	}
	args := []string{
		n.cfg.Executable, "kubelet",
		"--config=" + config,
		"--kubeconfig=" + n.cfg.Kubeconfig,
		"--hostname-override=" + n.cfg.Name,
		// The API server reaches the kubelet (logs, exec, port-forward)
		// at the Node's InternalIP, which may not be loopback.
		"--node-ip=" + ip.String(),
		"--root-dir=" + filepath.Join(n.dir, "kubelet"),
		"--cert-dir=" + filepath.Join(n.dir, "kubelet", "pki"),
		"--v=1",
	}
	// SIGKILL if the standalone dies: on SIGTERM the kubelet stops its
	// loops but its process stays.
	return startProcess("kubelet", filepath.Join(n.cfg.DataDir, "logs", "kubelet.log"), inNetns(n.cfg.Netns, args), syscall.SIGKILL)
}
