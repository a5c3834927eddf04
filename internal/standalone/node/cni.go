package node

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/netop-dev/netop/internal/cni/cniapi"
)

// PodCIDR is the pods' eth0 network on the nodes, a /24 of it per node,
// routed from the standalone's namespace to the node.
const PodCIDR = "10.88.0.0/16"

// PodBridge is the name of the pods' bridge.
const PodBridge = "netop-pods"

// PodNetwork is the name of the pods' network configuration, under which
// netop's plugin records the interfaces it attaches.
const PodNetwork = "netop-pods"

// CNIDataDir is where netop's CNI plugin records attachments on the node
// whose data directory is dataDir (Config.DataDir).
func CNIDataDir(dataDir string) string { return filepath.Join(dataDir, "node", "cni", "netop") }

// cniPluginDir holds Debian's CNI plugins (containernetworking-plugins).
const cniPluginDir = "/usr/lib/cni"

// writeCNI writes the pod network's configuration and the plugin directory
// containerd runs plugins from. containerd runs in the node's network
// namespace, and so do the plugins: the pods' bridge is made there, beside
// netop's bridges.
//
// netop's plugin is chained after the bridge: it attaches the Networks a
// pod declares (net1, …) beside eth0, asking netop's node side (the
// standalone's operator, or the node's agent) over the socket both know by
// default. See pluginBinary for which binary it is.
func writeCNI(dir string, cfg Config) error {
	binDir := filepath.Join(dir, "cni", "bin")
	for _, name := range []string{"bridge", "host-local", "loopback", "portmap"} {
		path := filepath.Join(binDir, name)
		_ = os.Remove(path)
		if err := os.Symlink(filepath.Join(cniPluginDir, name), path); err != nil {
			return fmt.Errorf("CNI plugin %s: %w", name, err)
		}
	}
	netopPlugin := filepath.Join(binDir, cniapi.Type)
	_ = os.Remove(netopPlugin)
	if err := os.Symlink(pluginBinary(cfg.Executable), netopPlugin); err != nil {
		return fmt.Errorf("CNI plugin %s: %w", cniapi.Type, err)
	}
	netop := cniapi.Config{Socket: cniapi.DefaultSocket, DataDir: CNIDataDir(cfg.DataDir)}
	netop.Type = cniapi.Type
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       PodNetwork,
		"plugins": []any{map[string]any{
			"type":        "bridge",
			"bridge":      PodBridge,
			"isGateway":   true,
			"ipMasq":      false,
			"hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": cfg.PodCIDR}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": filepath.Join(dir, "cni", "ipam"),
			},
		}, netop},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "cni", "net.d", "10-netop-pods.conflist"), data, 0o600); err != nil {
		return fmt.Errorf("CNI configuration: %w", err)
	}
	return nil
}

// pluginBinary is the binary the runtime executes as netop's plugin: the
// thin plugin (cmd/netop-cni) if it is beside the standalone's binary, as
// `make build` puts it, else the standalone's own binary
// under the plugin's name, which is one too. The runtime executes it on
// every pod start and stop: the thin one starts in about 4 ms of CPU and
// 6 MB, the standalone's, which links the whole cluster, in about 45 ms
// and 110 MB.
func pluginBinary(executable string) string {
	thin := filepath.Join(filepath.Dir(executable), cniapi.Type)
	if fi, err := os.Stat(thin); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
		return thin
	}
	return executable
}
