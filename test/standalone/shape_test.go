package standalone

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/controller/podnet"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/standalone/node"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/podprobe"
	"github.com/netop-dev/netop/internal/testing/testenv"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

// Issue 35 on the standalone's real node: a /28 with reserved addresses
// fills to its last free address and never hands out a reserved one, the
// pod one too many waits saying why; the pods' net1 has the Network's
// routes and MTU; egress takes them to the host through the node.
func TestShapedNetwork(t *testing.T) {
	sa, dataDir, stop := startWithNode(t)
	defer stop()
	cfg := restConfig(t, sa.kubeconfig)
	kube := kubernetes.NewForConfigOrDie(cfg)
	ctx := t.Context()
	// 16 addresses: the network, gateway and broadcast addresses and five
	// reserved leave eight for pods.
	if _, err := versioned.NewForConfigOrDie(cfg).SamplecrdV2().Networks("default").Create(ctx, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: "shaped"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.183.0.0/28"}, Reserved: []string{"10.183.0.2-10.183.0.5", "10.183.0.9"},
			Routes: []samplecrdv2.NetworkRoute{{Destination: "10.200.0.0/16"}}, MTU: 1400}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := range 9 {
		p := busyboxPod(fmt.Sprintf("shaped-%d", i), corev1.RestartPolicyAlways, "sleep 3600")
		p.Annotations = map[string]string{netselect.NetworksAnnotation: "shaped"}
		testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
			_, err := kube.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
			return err == nil, fmt.Sprintf("creating pod %s: %v", p.Name, err)
		})
		names = append(names, p.Name)
	}
	defer deletePods(t, kube, "default")

	reserved := func(a netip.Addr) bool {
		return a.Compare(netip.MustParseAddr("10.183.0.2")) >= 0 && a.Compare(netip.MustParseAddr("10.183.0.5")) <= 0 || a == netip.MustParseAddr("10.183.0.9")
	}
	var running []string
	var waiting string
	testenv.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, string) {
		running, waiting = nil, ""
		for _, name := range names {
			p, err := kube.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			have, _ := netselect.ParseAllocations(p.Annotations[netselect.AllocationsAnnotation])
			if len(have) == 0 {
				waiting = name
				continue
			}
			addr := netip.MustParsePrefix(have[0].IPs[0]).Addr()
			if reserved(addr) {
				t.Fatalf("pod %s got %s, a reserved address", name, addr)
			}
			if p.Status.Phase == corev1.PodRunning {
				running = append(running, name)
			}
		}
		return len(running) == 8 && waiting != "", fmt.Sprintf("%d pods running, waiting: %q", len(running), waiting)
	})
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		events, err := kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + waiting})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range events.Items {
			if e.Reason == podnet.ReasonNoFreeAddress && strings.Contains(e.Message, "Network default/shaped has no free address") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("no %s Event on %s: %v", podnet.ReasonNoFreeAddress, waiting, events.Items)
	})

	// Inside a pod: the route through the gateway and the MTU.
	if got := execIn(t, cfg, kube, running[0], "ip", "-o", "route", "show", "dev", "net1"); !strings.Contains(got, "10.200.0.0/16 via 10.183.0.1") {
		t.Errorf("routes of net1: %q, want 10.200.0.0/16 via 10.183.0.1", got)
	}
	if got := execIn(t, cfg, kube, running[0], "ip", "-o", "link", "show", "net1"); !strings.Contains(got, "mtu 1400 ") {
		t.Errorf("net1: %q, want mtu 1400", got)
	}
	// Egress through the single node, to the host.
	checkEgressToHost(t, cfg, kube, dataDir, testNodeName, "10.186.0.0/24")
}

// Issue 35 across nodes: on netop-standalone --nodes 3 (the built-in
// operator, an agent per node), a Network's default MTU is the underlay's
// less VXLAN's 50 bytes, on the pods' interfaces too: a datagram that
// fills it, with don't-fragment, crosses from a pod on one node to a pod
// on the other; one byte more is refused at the sender, not lost. And
// egress: a pod routed to the host (outside the cluster) through its
// Network reaches it only while the Network has egress.
func TestShapingAcrossNodes(t *testing.T) {
	nettest.RequireRoot(t)
	if err := node.Check(); err != nil {
		t.Fatalf("this host cannot run a node: %v", err)
	}
	prefix := nettest.NetnsName("nm")
	netnss := []string{prefix, prefix + "-1", prefix + "-2", prefix + "-3"}
	t.Cleanup(func() {
		for _, ns := range netnss {
			_ = nettest.DeleteNetns(ns)
		}
	})
	dataDir := t.TempDir()
	sa := startStandaloneWith(t, "--data-dir", dataDir, "--netns", prefix, "--node-name", prefix, "--nodes", "3", "--node=true",
		"--metrics-addr", "0", "--webhook-addr", "127.0.0.1:0", "--network-release-delay", onDemandRelease.String())
	cfg := restConfig(t, sa.kubeconfig)
	kube := kubernetes.NewForConfigOrDie(cfg)
	ctx := t.Context()
	spans, err := versioned.NewForConfigOrDie(cfg).SamplecrdV2().Networks("default").Create(ctx, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: "spans"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.184.0.0/24"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods := map[string]*probedPod{}
	for i, nodeName := range []string{prefix + "-1", prefix + "-2"} {
		p := busyboxPod(fmt.Sprintf("on-%d", i+1), corev1.RestartPolicyAlways, "sleep 3600")
		p.Spec.NodeName = nodeName
		p.Annotations = map[string]string{netselect.NetworksAnnotation: "spans"}
		testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
			_, err := kube.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
			return err == nil, fmt.Sprintf("creating pod %s: %v", p.Name, err)
		})
		pods[p.Name] = &probedPod{ns: "default", name: p.Name}
		waitProbedPod(t, kube, dataDir, pods[p.Name])
	}
	defer func() {
		deletePods(t, kube, "default")
		sa.stop(t)
	}()

	// Issue 37: on demand, the Network's devices are on nodes 1 and 2,
	// where its pods are, and not on node 3; each VXLAN device floods to
	// the one other node that realises it.
	checkRealised(t, netnss[1:], spans.UID, true, true, false)
	node2, err := kube.CoreV1().Nodes().Get(ctx, prefix+"-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
		got := nettest.FloodsTo(t, netnss[1], linux.VXLANName(spans.UID))
		return slices.Equal(got, []string{node2.Status.Addresses[0].Address}), fmt.Sprintf("node 1 floods to %v, want node 2 alone (%v)", got, node2.Status.Addresses)
	})

	from, to := pods["on-1"], pods["on-2"]
	var mtu int
	if err := linux.InNetns(from.netns, func() error {
		link, err := netlink.LinkByName("net1")
		if err == nil {
			mtu = link.Attrs().MTU
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	underlay, err := exec.Command("ip", "-n", prefix+"-1", "-o", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	if mtu != 1450 || !strings.Contains(string(underlay), "mtu 1500") {
		t.Fatalf("net1's MTU %d, want 1450: the underlay's 1500 less VXLAN's 50 (node links: %s)", mtu, underlay)
	}
	testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
		ok, err := podprobe.DatagramArrives(from.netns, to.addr, 80, mtu-28)
		return ok && err == nil, fmt.Sprintf("%d bytes with don't-fragment from node 1 to node 2: answered %v (%v)", mtu-28, ok, err)
	})
	if ok, err := podprobe.DatagramArrives(from.netns, to.addr, 80, mtu-27); ok || !errors.Is(err, unix.EMSGSIZE) {
		t.Errorf("%d bytes with don't-fragment: answered %v (%v), want refused with EMSGSIZE", mtu-27, ok, err)
	}

	checkEgressToHost(t, cfg, kube, dataDir, prefix+"-1", "10.185.0.0/24")

	// Issue 36 across nodes: hot-plug on node 2, whose agent is not the
	// controller, its peer on node 3.
	checkHotPlug(t, cfg, kube, prefix+"-2", prefix+"-3")
	deletePods(t, kube, "default")
	var records []string
	for _, n := range []string{prefix + "-1", prefix + "-2", prefix + "-3"} {
		records = append(records, node.CNIDataDir(filepath.Join(dataDir, "nodes", n)))
	}
	checkNothingAttached(t, cfg, records, netnss[1:])
	// The pods gone, every node removes the Networks' devices after the
	// release delay.
	testenv.Eventually(t, onDemandRelease+30*time.Second, func(context.Context) (bool, string) {
		var left []string
		for _, ns := range netnss[1:] {
			left = append(left, netopDevices(t, ns)...)
		}
		return len(left) == 0, fmt.Sprintf("devices left with no pod: %v", left)
	})
}

// onDemandRelease is the standalone's --network-release-delay in the
// tests of Networks realised on demand.
const onDemandRelease = 5 * time.Second

// checkRealised waits until each node namespace has the bridge and the
// VXLAN device of the Network of uid or not, as want says, and checks that
// none has more VXLAN devices than bridges.
func checkRealised(t *testing.T, netnss []string, uid types.UID, want ...bool) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
		var got []bool
		for _, ns := range netnss {
			bridge := exec.Command("ip", "-n", ns, "link", "show", ifname.Bridge(uid)).Run() == nil
			vxlan := exec.Command("ip", "-n", ns, "link", "show", linux.VXLANName(uid)).Run() == nil
			got = append(got, bridge && vxlan)
		}
		return slices.Equal(got, want), fmt.Sprintf("nodes %v realise the Network: %v, want %v", netnss, got, want)
	})
	for _, ns := range netnss {
		bridges, vxlans := 0, 0
		for _, d := range netopDevices(t, ns) {
			if strings.HasPrefix(d, "netvx") {
				vxlans++
			} else {
				bridges++
			}
		}
		if vxlans > bridges {
			t.Errorf("node %s has %d VXLAN devices for %d Networks", ns, vxlans, bridges)
		}
	}
}

// netopDevices lists netop's bridges and VXLAN devices in namespace ns.
func netopDevices(t *testing.T, ns string) []string {
	t.Helper()
	var out []string
	for _, kind := range []string{"bridge", "vxlan"} {
		list, err := exec.Command("ip", "-n", ns, "-o", "link", "show", "type", kind).Output()
		if err != nil {
			t.Fatalf("ip -n %s link show type %s: %v", ns, kind, err)
		}
		for line := range strings.SplitSeq(string(list), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if name != node.PodBridge && (strings.HasPrefix(name, "netop") || strings.HasPrefix(name, "netvx")) {
				out = append(out, name)
			}
		}
	}
	return out
}

// checkEgressToHost checks a Network's egress from a pod on node: the
// host, on the underlay (the standalone's first address of
// --underlay-cidr), is outside the cluster; a pod routed to it through a
// Network of cidr reaches it only while the Network has egress.
func checkEgressToHost(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, dataDir, nodeName, cidr string) {
	t.Helper()
	ctx := t.Context()
	host, err := net.Listen("tcp4", "10.254.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = host.Close() }()
	go nettest.AcceptAndClose(host)
	hostPort := podprobe.Port{Number: host.Addr().(*net.TCPAddr).Port, Protocol: podprobe.TCP}
	nets := versioned.NewForConfigOrDie(cfg).SamplecrdV2().Networks("default")
	if _, err := nets.Create(ctx, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: "out"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{cidr}, Routes: []samplecrdv2.NetworkRoute{{Destination: "10.254.0.1/32"}},
			Egress: &samplecrdv2.NetworkEgress{Mode: samplecrdv2.EgressNAT}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := busyboxPod("egress", corev1.RestartPolicyAlways, "sleep 3600")
	p.Spec.NodeName = nodeName
	p.Annotations = map[string]string{netselect.NetworksAnnotation: "out"}
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		_, err := kube.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		return err == nil, fmt.Sprintf("creating pod %s: %v", p.Name, err)
	})
	egress := &probedPod{ns: "default", name: "egress"}
	waitProbedPod(t, kube, dataDir, egress)
	testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
		return podprobe.Reaches(egress.netns, 0, "10.254.0.1", hostPort), "the pod does not reach the host through its Network with egress"
	})
	n, err := nets.Get(ctx, "out", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Egress = nil
	if _, err := nets.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
		return !podprobe.Reaches(egress.netns, 0, "10.254.0.1", hostPort), "egress removed, the pod still reaches the host through its Network"
	})
}
