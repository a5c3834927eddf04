package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/standalone/node"
	"github.com/netop-dev/netop/test/bench/whereabouts"
)

// The pods' eth0 networks, one per configuration, so that a pod's
// address says which configuration containerd used.
var (
	plainRange       = netip.MustParsePrefix("10.98.0.0/16")
	whereaboutsRange = netip.MustParsePrefix("10.99.0.0/16")
	netopRange       = netip.MustParsePrefix(node.PodCIDR)
)

// peerRound is one IPAM's round of pods created at once through the
// kubelet.
type peerRound struct {
	Name string  `json:"name"`
	P50S float64 `json:"createToRunningP50S"`
	P99S float64 `json:"createToRunningP99S"`
	// AllS is each pass's time until all pods ran.
	AllS     []float64 `json:"allRunningS"`
	Failures int       `json:"failedSandboxes"`
	// Messages are the distinct failures, as the kubelet's Events say.
	Messages   []string `json:"messages,omitempty"`
	Duplicates int      `json:"duplicateAddresses"`
	took       []float64
}

// runPeers runs pods at once on the standalone's real node, four times,
// switching the configuration containerd loads (a file before netop's,
// which it reloads its directory for):
//   - eth0 from the reference bridge and host-local: the floor;
//   - eth0 from the bridge with whereabouts as its IPAM, as whereabouts'
//     own examples give it (the node has no Multus to add a second
//     interface: whereabouts' round has one);
//   - the node's own configuration, eth0 as the floor's with netop's
//     plugin chained, the pods on no Network: what netop costs every pod;
//   - the same, the pods on the tutorial's Network: net1 from netop too.
//
// passes times, in that order and then the reverse, and so on: a round
// is slower the more rounds the node has run before it.
func runPeers(pods, passes int, version string) error {
	binary, dataDir, netnsName, done, err := workspace()
	if err != nil {
		return err
	}
	defer done()
	wbPlugin := filepath.Join(filepath.Dir(dataDir), "whereabouts")
	moduleDir, err := whereabouts.Build(wbPlugin, version)
	if err != nil {
		return err
	}
	sa, kubeconfig, kube, err := startStandalone(binary, dataDir, netnsName, netnsName)
	if err != nil {
		return err
	}
	defer sa.stop()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if err := whereabouts.InstallCRDs(ctx, cfg, moduleDir); err != nil {
		return err
	}
	if err := createNetwork(kubeconfig); err != nil {
		return err
	}
	// The image pulled and the node warm before the first round.
	if _, _, err := runPods(kube, "warm", 1, "example-network"); err != nil {
		return err
	}
	if err := deletePods(kube); err != nil {
		return err
	}
	nodeDir := filepath.Join(dataDir, "node")
	plainConf, wbConf, err := peerConfs(nodeDir, wbPlugin, kubeconfig, filepath.Join(dataDir, "logs", "whereabouts.log"))
	if err != nil {
		return err
	}
	podIPs := func(p *corev1.Pod) []string {
		var ips []string
		for _, ip := range p.Status.PodIPs {
			ips = append(ips, ip.IP)
		}
		return ips
	}
	net1IPs := func(p *corev1.Pod) []string {
		var statuses []netselect.Status
		_ = json.Unmarshal([]byte(p.Annotations[netselect.StatusAnnotation]), &statuses)
		var ips []string
		for _, s := range statuses {
			if s.Interface != "eth0" {
				ips = append(ips, s.IPs...)
			}
		}
		return ips
	}
	type configuration struct {
		name, prefix, network string
		conf                  []byte
		eth0                  netip.Prefix
		addresses             func(*corev1.Pod) []string
	}
	configurations := []configuration{
		{"eth0: bridge, host-local (the floor)", "floor", "", plainConf, plainRange, podIPs},
		{"eth0: bridge, whereabouts " + version, "wb", "", wbConf, whereaboutsRange, podIPs},
		{"eth0: bridge, host-local, netop's plugin; no Network", "netop0", "", nil, netopRange, podIPs},
		{"the same, and net1 on a Network by netop", "netop1", "example-network", nil, netopRange, net1IPs},
	}
	rounds := make([]peerRound, len(configurations))
	for pass := range passes {
		for k := range configurations {
			if pass%2 == 1 {
				k = len(configurations) - 1 - k
			}
			c := configurations[k]
			if err := useConf(kube, filepath.Join(nodeDir, "cni", "net.d"), c.conf, c.eth0); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			rounds[k].Name = c.name
			if err := peersRound(kube, dataDir, &rounds[k], fmt.Sprintf("%s-%d", c.prefix, pass), pods, c.network, c.addresses); err != nil {
				return err
			}
		}
	}
	for i := range rounds {
		rounds[i].P50S, rounds[i].P99S = percentiles(rounds[i].took)
	}

	fmt.Printf("%d pods at once through the kubelet on the standalone's node, %d passes, %s, %d CPUs\n", pods, passes, time.Now().UTC().Format(time.RFC3339), runtime.NumCPU())
	fmt.Println("| pods' interfaces | create to Running, p50 | p99 | all Running, each pass | failed sandboxes | duplicate addresses |")
	fmt.Println("| --- | --- | --- | --- | --- | --- |")
	for _, r := range rounds {
		all := make([]string, len(r.AllS))
		for i, s := range r.AllS {
			all[i] = fmt.Sprintf("%.1f s", s)
		}
		fmt.Printf("| %s | %.2f s | %.2f s | %s | %d | %d |\n", r.Name, r.P50S, r.P99S, strings.Join(all, ", "), r.Failures, r.Duplicates)
	}
	for _, r := range rounds {
		for _, m := range r.Messages {
			fmt.Printf("%s: %s\n", r.Name, m)
		}
	}
	out, _ := json.Marshal(map[string]any{"date": time.Now().UTC().Format(time.DateOnly), "cpus": runtime.NumCPU(), "pods": pods, "passes": passes, "rounds": rounds})
	fmt.Println(string(out))
	return nil
}

// peersRound creates pods at once, each declaring network (if any), and
// waits for all to run; then counts into r the sandboxes the kubelet failed
// to make and the addresses (addresses of a pod) given twice, and deletes
// the pods.
func peersRound(kube kubernetes.Interface, dataDir string, r *peerRound, prefix string, pods int, network string, addresses func(*corev1.Pod) []string) error {
	began := time.Now()
	took, _, err := runPods(kube, prefix, pods, network)
	if err != nil {
		return fmt.Errorf("%s: %w", r.Name, err)
	}
	r.AllS = append(r.AllS, time.Since(began).Seconds())
	r.took = append(r.took, took...)
	ctx := context.Background()
	list, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "bench=" + prefix})
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for i := range list.Items {
		ips := addresses(&list.Items[i])
		if len(ips) == 0 {
			return fmt.Errorf("%s: pod %s runs without an address", r.Name, list.Items[i].Name)
		}
		for _, ip := range ips {
			if seen[ip] {
				r.Duplicates++
			}
			seen[ip] = true
		}
	}
	events, err := kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedCreatePodSandBox"})
	if err != nil {
		return err
	}
	for _, e := range events.Items {
		if !strings.HasPrefix(e.InvolvedObject.Name, prefix+"-") {
			continue
		}
		r.Failures += max(1, int(e.Count))
		if m := e.Message; !slices.Contains(r.Messages, m) && len(r.Messages) < 3 {
			r.Messages = append(r.Messages, m)
		}
	}
	if err := deletePods(kube); err != nil {
		return err
	}
	return settle(dataDir)
}

// peerConfs installs whereabouts' plugin and the file its DaemonSet
// would, and returns the floor's configuration and whereabouts'.
func peerConfs(nodeDir, wbPlugin, kubeconfig, logFile string) (plain, wb []byte, err error) {
	// Linked, as the node links its other plugins.
	if err := os.Symlink(wbPlugin, filepath.Join(nodeDir, "cni", "bin", "whereabouts")); err != nil {
		return nil, nil, err
	}
	flatFile := filepath.Join(nodeDir, "cni", "whereabouts.conf")
	if err := whereabouts.FlatFile(flatFile, kubeconfig); err != nil {
		return nil, nil, err
	}
	defaultRoute := []map[string]string{{"dst": "0.0.0.0/0"}}
	conf := func(name string, ipam map[string]any) ([]byte, error) {
		return json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": name, "plugins": []any{map[string]any{
			"type": "bridge", "bridge": name, "isGateway": true, "ipam": ipam}}})
	}
	plain, err = conf("bench-plain", map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": plainRange.String()}}},
		"routes": defaultRoute, "dataDir": filepath.Join(nodeDir, "cni", "ipam")})
	if err != nil {
		return nil, nil, err
	}
	wb, err = conf("bench-wb", map[string]any{"type": "whereabouts", "range": whereaboutsRange.String(), "routes": defaultRoute,
		"kubernetes": map[string]any{"kubeconfig": kubeconfig}, "configuration_path": flatFile, "log_file": logFile, "log_level": "error"})
	return plain, wb, err
}

// useConf makes containerd use conf (the node's own if nil) for the pods'
// eth0: a file before the node's. containerd loads its directory again in
// its own time: this returns once a pod has an address of eth0, the
// configuration's range.
func useConf(kube kubernetes.Interface, netD string, conf []byte, eth0 netip.Prefix) error {
	path := filepath.Join(netD, "05-bench.conflist")
	if conf == nil {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	} else if err := os.WriteFile(path, conf, 0o600); err != nil {
		return err
	}
	try := 0
	return wait.PollUntilContextTimeout(context.Background(), 0, time.Minute, true, func(ctx context.Context) (bool, error) {
		try++
		prefix := fmt.Sprintf("probe%d", try)
		if _, _, err := runPods(kube, prefix, 1, ""); err != nil {
			return false, err
		}
		pod, err := kube.CoreV1().Pods("default").Get(ctx, prefix+"-000", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if err := deletePods(kube); err != nil {
			return false, err
		}
		ip, err := netip.ParseAddr(pod.Status.PodIP)
		if err != nil {
			return false, errors.New("a pod runs without an address")
		}
		return eth0.Contains(ip), nil
	})
}
