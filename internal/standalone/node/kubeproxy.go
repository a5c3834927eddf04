package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/netop-dev/netop/internal/backend/linux"
)

// kubeProxyTable is the nftables table kube-proxy's nftables mode keeps,
// in the ip and ip6 families.
const kubeProxyTable = "kube-proxy"

// kubeProxyConfig is the KubeProxyConfiguration, as a map for the same
// reason as the kubelet's.
func (n *Node) kubeProxyConfig() map[string]any {
	zero := 0
	return map[string]any{
		"apiVersion":       "kubeproxy.config.k8s.io/v1alpha1",
		"kind":             "KubeProxyConfiguration",
		"mode":             "nftables",
		"clientConnection": map[string]any{"kubeconfig": n.cfg.KubeProxyKubeconfig},
		"hostnameOverride": n.cfg.Name,
		// Traffic to a Service from outside the pods (the host, a NodePort)
		// is masqueraded, so that replies come back through this node.
		"detectLocalMode": "ClusterCIDR",
		"clusterCIDR":     PodCIDR,
		// NodePorts on the node's InternalIP, which the host routes to.
		"nodePortAddresses":  []string{"primary"},
		"healthzBindAddress": "127.0.0.1:10256",
		"metricsBindAddress": "127.0.0.1:10249",
		// The conntrack limits are the host's, shared by every node and
		// the developer's own traffic: leave them alone (0: unchanged).
		"conntrack": map[string]any{"maxPerCore": zero, "min": zero},
	}
}

// startKubeProxy runs kube-proxy in the node's namespace, where the pods'
// traffic to Services is routed: the standalone binary re-executed as
// `netop-standalone kube-proxy`, like the kubelet.
func (n *Node) startKubeProxy(_ context.Context) (*process, error) {
	ns, err := netns.GetFromName(n.cfg.Netns)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", n.cfg.Netns, err)
	}
	defer func() { _ = ns.Close() }()
	// A Service's reply from a pod to a pod on the same bridge is bridged:
	// without br_netfilter it misses conntrack and the reverse NAT.
	if err := linux.SeeBridgedTraffic(ns); err != nil {
		return nil, fmt.Errorf("kube-proxy: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(n.dir, "kube-proxy"), 0o700); err != nil {
		return nil, fmt.Errorf("kube-proxy directory: %w", err)
	}
	data, err := yaml.Marshal(n.kubeProxyConfig())
	if err != nil {
		return nil, err
	}
	config := filepath.Join(n.dir, "kube-proxy", "config.yaml")
	if err := os.WriteFile(config, data, 0o600); err != nil {
		return nil, fmt.Errorf("kube-proxy configuration: %w", err)
	}
	args := []string{n.cfg.Executable, "kube-proxy", "--config=" + config, "--v=1"}
	return startProcess("kube-proxy", filepath.Join(n.cfg.DataDir, "logs", "kube-proxy.log"), inNetns(n.cfg.Netns, args), syscall.SIGKILL)
}

// nodeTables are the nftables tables the node's components make in its
// namespace: kube-proxy's, and those the kubelet (its canary and firewall
// chains) and CNI's portmap plugin make through iptables-nft. netop's own
// tables (inet) are its backend's, which stay with its bridges.
var nodeTables = []string{kubeProxyTable, "filter", "nat", "mangle"}

// removeNodeTables deletes the tables the node's components left in its
// namespace, which outlives the standalone: kube-proxy's rules would
// otherwise still send Services' traffic to the last endpoints it knew.
func removeNodeTables(name string) error {
	conn, release, err := linux.NFTablesIn(name)
	if err != nil {
		return err
	}
	defer release()
	tables, err := conn.ListTables()
	if err != nil {
		return fmt.Errorf("listing nftables tables: %w", err)
	}
	for _, t := range tables {
		if (t.Family == nftables.TableFamilyIPv4 || t.Family == nftables.TableFamilyIPv6) && slices.Contains(nodeTables, t.Name) {
			conn.DelTable(t)
		}
	}
	if err := conn.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("deleting the node's nftables tables: %w", err)
	}
	return nil
}
