package install

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/ktesting"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	netopv1alpha1 "github.com/netop-dev/netop/pkg/apis/netop/v1alpha1"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

const agentServiceAccount = "system:serviceaccount:" + operatorNamespace + ":netop-agent"

// nodeClaim is the user info extra of a token bound to a pod: its node.
const nodeClaim = "authentication.kubernetes.io/node-name"

// asAgent is env's configuration impersonating the agent of node, as the
// token kubelet projects into the agent's pod authenticates it; "" for a
// token bound to no node.
func asAgent(env *testenv.Env, node string) *rest.Config {
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: agentServiceAccount, Groups: serviceAccountGroups}
	if node != "" {
		cfg.Impersonate.Extra = map[string][]string{nodeClaim: {node}}
	}
	return cfg
}

// Issue 33: an agent speaks only for its own node. The API server, by
// netop's ValidatingAdmissionPolicy (no webhook in the path), lets an
// agent create and update its own node's NetworkNode and refuses it
// another node's, with or without a node claim; others (the controller,
// an administrator) are not concerned.
func TestAgentWritesOnlyItsOwnNetworkNode(t *testing.T) {
	env := testenv.Get(t)
	applyManifests(t, env)
	ctx := t.Context()
	suffix := strings.ToLower(nettest.NetnsName(""))
	own, other := "own-"+suffix, "other-"+suffix
	agent, err := versioned.NewForConfig(asAgent(env, own))
	if err != nil {
		t.Fatal(err)
	}
	unbound, err := versioned.NewForConfig(asAgent(env, ""))
	if err != nil {
		t.Fatal(err)
	}
	nodes := agent.NetopV1alpha1().NetworkNodes()
	t.Cleanup(func() {
		for _, name := range []string{own, other} {
			_ = env.Netop.NetopV1alpha1().NetworkNodes().Delete(context.Background(), name, metav1.DeleteOptions{})
		}
	})
	// The policy takes a moment to be enforced once created.
	var refused error
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		_, refused = nodes.Create(ctx, &netopv1alpha1.NetworkNode{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{})
		if refused == nil {
			// Made before the policy was enforced: not the agent's to
			// keep, and the administrator makes it below.
			if err := env.Netop.NetopV1alpha1().NetworkNodes().Delete(ctx, other, metav1.DeleteOptions{}); err != nil {
				return false, fmt.Sprintf("deleting the NetworkNode made before the policy was enforced: %v", err)
			}
		}
		return apierrors.IsForbidden(refused) || apierrors.IsInvalid(refused), fmt.Sprintf("creating another node's NetworkNode: %v", refused)
	})
	if !strings.Contains(refused.Error(), "the agent of node "+own+" may write only its own NetworkNode, not "+other) {
		t.Errorf("refusal %q does not say why", refused)
	}
	mine, err := nodes.Create(ctx, &netopv1alpha1.NetworkNode{ObjectMeta: metav1.ObjectMeta{Name: own}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating its own NetworkNode: %v", err)
	}
	if mine, err = nodes.UpdateStatus(ctx, mine, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("updating its own NetworkNode's status: %v", err)
	}
	theirs, err := env.Netop.NetopV1alpha1().NetworkNodes().Create(ctx, &netopv1alpha1.NetworkNode{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("an administrator creating a node's NetworkNode: %v", err)
	}
	if _, err := nodes.UpdateStatus(ctx, theirs, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("updating another node's NetworkNode's status: %v, want refused", err)
	}
	if _, err := unbound.NetopV1alpha1().NetworkNodes().UpdateStatus(ctx, mine, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "has none") {
		t.Errorf("updating with a token bound to no node: %v, want refused for the missing node claim", err)
	}
}

// node is one node of the test: a Node object, a network namespace that
// stands for its host, and its agent.
type node struct {
	name, netns string
	op          *operator.Operator
	stop        func()
}

// bridges lists the backend networks in the node's namespace, by owner UID.
func (n *node) bridges(t *testing.T) map[types.UID]netip.Prefix {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	be, err := linux.New(ctx, linux.Config{Netns: n.netns})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	owned, err := be.ListOwned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[types.UID]netip.Prefix{}
	for _, o := range owned {
		if len(o.Families) == 1 {
			out[o.UID] = o.Families[0].CIDR
		}
	}
	return out
}

func (n *node) writes() float64 { return testutil.ToFloat64(n.op.Metrics().APIWrites) }

// ip runs ip(8), failing the test on an error.
func ip(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// underlay makes the network the nodes' hosts share: a bridge in a
// namespace of its own, and a veth from each node's namespace to it with
// the node's address, as a switch between hosts would be.
func underlay(t *testing.T, nodes []*node, addrs []string) {
	t.Helper()
	ul := nettest.NetnsName("netopul")
	ip(t, "netns", "add", ul)
	t.Cleanup(func() { _ = nettest.DeleteNetns(ul) })
	ip(t, "-n", ul, "link", "add", "ul0", "type", "bridge")
	ip(t, "-n", ul, "link", "set", "ul0", "up")
	for i, n := range nodes {
		ip(t, "netns", "add", n.netns)
		port := fmt.Sprintf("port%d", i)
		ip(t, "-n", n.netns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", ul)
		ip(t, "-n", n.netns, "addr", "add", addrs[i]+"/24", "dev", "eth0")
		ip(t, "-n", n.netns, "link", "set", "eth0", "up")
		ip(t, "-n", ul, "link", "set", port, "master", "ul0", "up")
	}
}

// attachPod makes a network namespace standing for a pod on n, its
// interface on bridge with addr, at the bridge's MTU (as netop's CNI
// plugin does), and returns it.
func attachPod(t *testing.T, n *node, bridge, addr string) string {
	t.Helper()
	pod := nettest.NetnsName("netoppod")
	ip(t, "netns", "add", pod)
	t.Cleanup(func() { _ = nettest.DeleteNetns(pod) })
	host := "h" + pod[len(pod)-8:]
	mtu := strings.Fields(ip(t, "-n", n.netns, "-o", "link", "show", bridge))
	ip(t, "-n", n.netns, "link", "add", host, "type", "veth", "peer", "name", "net1", "netns", pod)
	ip(t, "-n", n.netns, "link", "set", host, "master", bridge, "mtu", mtu[slices.Index(mtu, "mtu")+1], "up")
	ip(t, "-n", pod, "link", "set", "net1", "mtu", mtu[slices.Index(mtu, "mtu")+1], "up")
	ip(t, "-n", pod, "addr", "add", addr, "dev", "net1")
	return pod
}

// ping pings to from the pod namespace from, once.
func ping(from, to string) error {
	out, err := exec.Command("nsenter", "--net=/run/netns/"+from, "/bin/busybox", "ping", "-c", "1", "-W", "3", to).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s: %w\n%s", to, err, out)
	}
	return nil
}

// Issue 16: `netop controller` and a `netop agent` per node, each as its
// service account of the manifests, agents building every Network
// (--networks-on-demand=false). A Network is Ready once every node's
// agent has its bridge (3/3); a node whose agent is down lags, by name, and
// converges when the agent is back, at the cost of one report write; a
// Node removed takes its report with it and its agent removes its bridges,
// and nobody else's change.
func TestControllerAndAgents(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	applyManifests(t, env)
	ns := env.Namespace(t)
	nets := env.Netop.SamplecrdV1().Networks(ns)
	ctx := t.Context()

	nodes, addrs, startAgent := startCluster(t, env, ns, func(o *operator.Options) { o.Agent.OnDemand = false })

	wantNodes := func(n *samplecrdv1.Network, ready, total int32) {
		t.Helper()
		want := samplecrdv1.NetworkNodes{Ready: ready, Total: total, Summary: fmt.Sprintf("%d/%d", ready, total)}
		if n.Status.Nodes == nil || *n.Status.Nodes != want {
			t.Errorf("Network %s: status.nodes %+v, want %+v", n.Name, n.Status.Nodes, want)
		}
	}
	// waitNodes waits for status.nodes to say summary: the controller may
	// first write what it knew before the agents reported.
	waitNodes := func(name, summary string) *samplecrdv1.Network {
		t.Helper()
		var got *samplecrdv1.Network
		testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
			var err error
			if got, err = nets.Get(ctx, name, metav1.GetOptions{}); err != nil {
				return false, err.Error()
			}
			return got.Status.Nodes != nil && got.Status.Nodes.Summary == summary, fmt.Sprintf("Network %s on nodes %+v, want %s", name, got.Status.Nodes, summary)
		})
		return got
	}
	hasBridge := func(n *node, net *samplecrdv1.Network, cidr string) bool {
		got, ok := n.bridges(t)[net.UID]
		return ok && got.String() == cidr
	}

	first := createNetwork(t, env, ns, "first", "10.140.0.0/24")
	got := env.WaitReady(t, ns, "first", metav1.ConditionTrue, samplecrd.ReasonProvisioned, 30*time.Second)
	wantNodes(got, 3, 3)
	if want := ifname.Bridge(first.UID); got.Status.Backend == nil || got.Status.Backend.Interface != want {
		t.Errorf("status.backend %+v, want interface %s", got.Status.Backend, want)
	}
	for _, n := range nodes {
		if !hasBridge(n, first, "10.140.0.0/24") {
			t.Errorf("node %s has no bridge for first: %v", n.name, n.bridges(t))
		}
	}
	// The overlay: a VNI of its own, a VXLAN port flooding to the two
	// other nodes, and pods on different nodes reaching each other.
	if got.Status.VNI < 1 {
		t.Fatalf("status.vni %d", got.Status.VNI)
	}
	vx := linux.VXLANName(first.UID)
	for i, n := range nodes {
		// Each floods to the nodes that report the Network: the last
		// reports come with the Ready condition.
		waitFlooding(t, 10*time.Second, n, vx, slices.DeleteFunc(slices.Clone(addrs), func(a string) bool { return a == addrs[i] })...)
		if link := ip(t, "-n", n.netns, "-d", "-o", "link", "show", vx); !strings.Contains(link, fmt.Sprintf("vxlan id %d ", got.Status.VNI)) ||
			!strings.Contains(link, "master "+ifname.Bridge(first.UID)) || !strings.Contains(link, "mtu 1450 ") {
			t.Errorf("node %s: %s", n.name, link)
		}
	}
	podA := attachPod(t, nodes[0], ifname.Bridge(first.UID), "10.140.0.10/24")
	attachPod(t, nodes[2], ifname.Bridge(first.UID), "10.140.0.30/24")
	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		err := ping(podA, "10.140.0.30")
		return err == nil, fmt.Sprintf("pod on %s to pod on %s over the overlay: %v", nodes[0].name, nodes[2].name, err)
	})

	// An agent down: the next Network is ready on two nodes of three, and
	// its condition names the third.
	lagging := nodes[2]
	lagging.stop()
	second := createNetwork(t, env, ns, "second", "10.141.0.0/24")
	waitNodes("second", "2/3")
	got = env.WaitReady(t, ns, "second", metav1.ConditionFalse, samplecrd.ReasonNodesNotReady, 30*time.Second)
	wantNodes(got, 2, 3)
	if msg := got.Status.Conditions[0].Message; !strings.Contains(msg, lagging.name+": not built yet") {
		t.Errorf("Ready condition %q does not name the lagging node %s", msg, lagging.name)
	}
	// Back, it builds what it missed and says so in one write.
	startAgent(lagging)
	got = env.WaitReady(t, ns, "second", metav1.ConditionTrue, samplecrd.ReasonProvisioned, 30*time.Second)
	wantNodes(got, 3, 3)
	if !hasBridge(lagging, second, "10.141.0.0/24") {
		t.Errorf("node %s has no bridge for second after its agent came back", lagging.name)
	}
	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		return lagging.writes() == 1, fmt.Sprintf("the agent back wrote %v times for one Network it missed", lagging.writes())
	})

	// A node removed: its report goes with its Node (the garbage
	// collector), its agent removes its bridges, and the Networks are
	// ready on the nodes that are left.
	removed := nodes[1]
	if err := env.Kube.CoreV1().Nodes().Delete(ctx, removed.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, func(ctx context.Context) (bool, string) {
		_, err := env.Netop.NetopV1alpha1().NetworkNodes().Get(ctx, removed.name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("NetworkNode of the removed node: %v", err)
	})
	for _, name := range []string{"first", "second"} {
		waitNodes(name, "2/2")
		env.WaitReady(t, ns, name, metav1.ConditionTrue, samplecrd.ReasonProvisioned, 30*time.Second)
	}
	testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
		left := removed.bridges(t)
		return len(left) == 0, fmt.Sprintf("bridges left on the removed node: %v", left)
	})
	for _, n := range []*node{nodes[0], nodes[2]} {
		if !hasBridge(n, first, "10.140.0.0/24") || !hasBridge(n, second, "10.141.0.0/24") {
			t.Errorf("node %s lost a bridge when %s was removed: %v", n.name, removed.name, n.bridges(t))
		}
	}
	// The others no longer flood to it, and still reach each other.
	waitFlooding(t, 30*time.Second, nodes[0], vx, addrs[2])
	if err := ping(podA, "10.140.0.30"); err != nil {
		t.Error(err)
	}

	// A Network deleted: its bridges go from every node.
	if err := nets.Delete(ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
		for _, n := range []*node{nodes[0], nodes[2]} {
			if _, ok := n.bridges(t)[first.UID]; ok {
				return false, "node " + n.name + " still has the bridge of the deleted Network"
			}
		}
		return true, ""
	})
}

// startCluster starts three nodes of the test on their underlay, each with
// its agent (its options tweaked by agentOptions, if set), and the
// cluster's controller, all watching namespace ns. startAgent starts a
// node's agent again.
func startCluster(t *testing.T, env *testenv.Env, ns string, agentOptions func(*operator.Options)) (nodes []*node, addrs []string, startAgent func(*node)) {
	t.Helper()
	ctx := t.Context()
	nodes = make([]*node, 3)
	addrs = []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"}
	suffix := strings.ToLower(nettest.NetnsName(""))
	for i := range nodes {
		nodes[i] = &node{name: fmt.Sprintf("agents-%c-%s", 'a'+i, suffix), netns: nettest.NetnsName("netopag")}
	}
	underlay(t, nodes, addrs)
	for i, n := range nodes {
		if err := testenv.RegisterNode(ctx, env.Kube, n.name, addrs[i]); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = env.Kube.CoreV1().Nodes().Delete(context.Background(), n.name, metav1.DeleteOptions{})
			_ = nettest.DeleteNetns(n.netns)
		})
	}
	startAgent = func(n *node) {
		opts := operator.NewOptions()
		opts.Role = operator.RoleAgent
		opts.Agent.NodeName = n.name
		opts.Backend.Netns = n.netns
		opts.Namespace = ns
		opts.Metrics.Addr, opts.Webhooks.Addr, opts.Workloads.Enabled = "0", "0", false
		if agentOptions != nil {
			agentOptions(opts)
		}
		n.op, n.stop = testenv.StartOperator(t, asAgent(env, n.name), opts, nil)
	}
	for _, n := range nodes {
		startAgent(n)
	}
	opts := operator.NewOptions()
	opts.Role = operator.RoleController
	opts.Namespace = ns
	opts.OperatorNamespace = operatorNamespace
	opts.Metrics.Addr, opts.Webhooks.Addr, opts.Workloads.Enabled = "0", "0", false
	testenv.StartOperator(t, asServiceAccount(env), opts, nil)

	return nodes, addrs, startAgent
}

// createNetwork creates the v1 Network name of cidr in namespace ns.
func createNetwork(t *testing.T, env *testenv.Env, ns, name, cidr string) *samplecrdv1.Network {
	t.Helper()
	n, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: samplecrdv1.NetworkSpec{CIDR: cidr}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFlooding waits until the VXLAN device vx on n floods to exactly the
// underlay addresses want.
func waitFlooding(t *testing.T, timeout time.Duration, n *node, vx string, want ...string) {
	t.Helper()
	testenv.Eventually(t, timeout, func(context.Context) (bool, string) {
		got := nettest.FloodsTo(t, n.netns, vx)
		return slices.Equal(got, want), fmt.Sprintf("node %s: %s floods to %v, want %v", n.name, vx, got, want)
	})
}

// placePod creates pod name on node n (bound, with no kubelet to run it),
// asking for network: the controller allocates, and n's agent follows.
func placePod(t *testing.T, env *testenv.Env, ns, name string, n *node, network string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{netselect.NetworksAnnotation: network}},
		Spec: corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	if _, err := env.Kube.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// Issue 37: with --networks-on-demand (the default), a node realises a Network only while
// a pod there holds an interface on it. A Network no pod uses is Ready and
// on no node ("0/0 (of 3)"); pods placed on two nodes (allocated by the
// controller, no kubelet needed) bring its bridge and VXLAN device there
// and nowhere else, each flooding only to the other; a pod on the third
// node brings it there too, and every node floods to the two others; once
// that pod is gone, the third node removes it after the release delay,
// and the others stop flooding to it.
func TestAgentsOnDemand(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	applyManifests(t, env)
	ns := env.Namespace(t)
	nets := env.Netop.SamplecrdV1().Networks(ns)
	ctx := t.Context()
	const releaseDelay = 3 * time.Second
	nodes, addrs, _ := startCluster(t, env, ns, func(o *operator.Options) { o.Agent.ReleaseDelay = releaseDelay })

	network := createNetwork(t, env, ns, "used", "10.142.0.0/24")
	waitSummary := func(summary string) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
			n, err := nets.Get(ctx, network.Name, metav1.GetOptions{})
			if err != nil || n.Status.Nodes == nil || len(n.Status.Conditions) == 0 {
				return false, fmt.Sprintf("%+v %v", n.Status, err)
			}
			c := n.Status.Conditions[0]
			return n.Status.Nodes.Summary == summary && c.Status == metav1.ConditionTrue,
				fmt.Sprintf("nodes %s, Ready=%s %s: %s; want %s and Ready", n.Status.Nodes.Summary, c.Status, c.Reason, c.Message, summary)
		})
	}
	realises := func(n *node) bool {
		_, ok := n.bridges(t)[network.UID]
		return ok && exec.Command("ip", "-n", n.netns, "link", "show", linux.VXLANName(network.UID)).Run() == nil
	}
	waitRealised := func(want ...bool) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
			var got []bool
			for _, n := range nodes {
				got = append(got, realises(n))
			}
			return slices.Equal(got, want), fmt.Sprintf("nodes realise the Network: %v, want %v", got, want)
		})
	}
	vx := linux.VXLANName(network.UID)

	waitSummary("0/0 (of 3)")
	waitRealised(false, false, false)

	placePod(t, env, ns, "on-a", nodes[0], network.Name)
	placePod(t, env, ns, "on-c", nodes[2], network.Name)
	waitSummary("2/2 (of 3)")
	waitRealised(true, false, true)
	waitFlooding(t, 30*time.Second, nodes[0], vx, addrs[2])
	waitFlooding(t, 30*time.Second, nodes[2], vx, addrs[0])
	podA := attachPod(t, nodes[0], ifname.Bridge(network.UID), "10.142.0.10/24")
	attachPod(t, nodes[2], ifname.Bridge(network.UID), "10.142.0.30/24")
	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		err := ping(podA, "10.142.0.30")
		return err == nil, fmt.Sprintf("pod on %s to pod on %s over the overlay: %v", nodes[0].name, nodes[2].name, err)
	})

	placePod(t, env, ns, "on-b", nodes[1], network.Name)
	waitSummary("3/3")
	waitRealised(true, true, true)
	waitFlooding(t, 30*time.Second, nodes[0], vx, addrs[1], addrs[2])
	waitFlooding(t, 30*time.Second, nodes[1], vx, addrs[0], addrs[2])
	podB := attachPod(t, nodes[1], ifname.Bridge(network.UID), "10.142.0.20/24")
	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		err := ping(podB, "10.142.0.10")
		return err == nil, fmt.Sprintf("pod on %s, realised on demand, to pod on %s: %v", nodes[1].name, nodes[0].name, err)
	})

	// The pod goes, and its sandbox with its interface (as a CNI DEL
	// does): a bridge with a pod's port on it is never removed.
	if err := env.Kube.CoreV1().Pods(ns).Delete(ctx, "on-b", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	if err := nettest.DeleteNetns(podB); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	waitRealised(true, false, true)
	if held := time.Since(gone); held < releaseDelay {
		t.Errorf("node %s removed the Network %v after its last pod left, before the release delay (%v)", nodes[1].name, held, releaseDelay)
	}
	waitSummary("2/2 (of 3)")
	waitFlooding(t, 30*time.Second, nodes[0], vx, addrs[2])
	waitFlooding(t, 30*time.Second, nodes[2], vx, addrs[0])
	if err := ping(podA, "10.142.0.30"); err != nil {
		t.Error(err)
	}
}

// Issue 37's upgrade: agents that built every Network are replaced, one
// node at a time, by agents on demand. The Network pods use keeps its
// bridges on their nodes (not made again: the same links) and its pods
// keep reaching each other across the overlay; the Network no pod uses is
// removed from every node. The ping's loss during the upgrade is logged.
func TestAgentsUpgradeToOnDemand(t *testing.T) {
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	applyManifests(t, env)
	ns := env.Namespace(t)
	nets := env.Netop.SamplecrdV1().Networks(ns)
	onDemand := false
	nodes, addrs, startAgent := startCluster(t, env, ns, func(o *operator.Options) { o.Agent.OnDemand = onDemand })

	used, unused := createNetwork(t, env, ns, "used", "10.143.0.0/24"), createNetwork(t, env, ns, "unused", "10.144.0.0/24")
	for _, name := range []string{"used", "unused"} {
		env.WaitReady(t, ns, name, metav1.ConditionTrue, samplecrd.ReasonProvisioned, 30*time.Second)
	}
	placePod(t, env, ns, "on-a", nodes[0], used.Name)
	placePod(t, env, ns, "on-c", nodes[2], used.Name)
	bridge := ifname.Bridge(used.UID)
	podA := attachPod(t, nodes[0], bridge, "10.143.0.10/24")
	attachPod(t, nodes[2], bridge, "10.143.0.30/24")
	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		err := ping(podA, "10.143.0.30")
		return err == nil, fmt.Sprintf("before the upgrade: %v", err)
	})
	index := func(n *node) string {
		out, err := exec.Command("ip", "-n", n.netns, "-o", "link", "show", bridge).Output()
		if err != nil {
			return ""
		}
		return strings.Fields(string(out))[0]
	}
	before := []string{index(nodes[0]), index(nodes[2])}

	// A ping every 50 ms through the upgrade.
	pinging := exec.Command("nsenter", "--net=/run/netns/"+podA, "/bin/busybox", "ping", "-i", "0.05", "-W", "1", "10.143.0.30")
	var out strings.Builder
	pinging.Stdout, pinging.Stderr = &out, &out
	if err := pinging.Start(); err != nil {
		t.Fatal(err)
	}
	onDemand = true
	for _, n := range nodes {
		n.stop()
		startAgent(n)
	}
	// Upgraded: the unused Network is on no node, the used one on its
	// pods' nodes only, reported there, each flooding to the other.
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		var left []string
		for _, n := range nodes {
			if _, ok := n.bridges(t)[unused.UID]; ok {
				left = append(left, n.name)
			}
		}
		_, onB := nodes[1].bridges(t)[used.UID]
		got, err := nets.Get(ctx, used.Name, metav1.GetOptions{})
		if err != nil || got.Status.Nodes == nil {
			return false, fmt.Sprint(err)
		}
		floods := nettest.FloodsTo(t, nodes[0].netns, linux.VXLANName(used.UID))
		return len(left) == 0 && !onB && got.Status.Nodes.Summary == "2/2 (of 3)" && slices.Equal(floods, []string{addrs[2]}),
			fmt.Sprintf("after the upgrade: the unused Network's bridge on %v, the used one's on the node without pods %v, NODES %s, node a floods to %v",
				left, onB, got.Status.Nodes.Summary, floods)
	})
	_ = pinging.Process.Signal(syscall.SIGINT)
	_ = pinging.Wait()
	if after := []string{index(nodes[0]), index(nodes[2])}; !slices.Equal(after, before) {
		t.Errorf("the used Network's bridges were made again: links %v, then %v", before, after)
	}
	if err := ping(podA, "10.143.0.30"); err != nil {
		t.Errorf("after the upgrade: %v", err)
	}
	summary := out.String()
	if i := strings.Index(summary, "packets transmitted"); i >= 0 {
		summary = summary[strings.LastIndexByte(summary[:i], '\n')+1:]
	}
	t.Logf("ping every 50 ms through the upgrade of the three agents: %s", strings.TrimSpace(summary))
}
