package install

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
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
	"github.com/netop-dev/netop/internal/nettest"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/testenv"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
)

const agentServiceAccount = "system:serviceaccount:" + operatorNamespace + ":netop-agent"

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
		out[o.UID] = o.CIDR
	}
	return out
}

func (n *node) writes() float64 { return testutil.ToFloat64(n.op.Metrics().APIWrites) }

// Issue 16: `netop controller` and a `netop agent` per node, each as its
// service account of the manifests. A Network is Ready once every node's
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

	agentCfg := rest.CopyConfig(env.Config)
	agentCfg.Impersonate = rest.ImpersonationConfig{UserName: agentServiceAccount, Groups: serviceAccountGroups}
	nodes := make([]*node, 3)
	suffix := strings.ToLower(nettest.NetnsName(""))
	for i := range nodes {
		n := &node{name: fmt.Sprintf("agents-%c-%s", 'a'+i, suffix), netns: nettest.NetnsName("netopag")}
		nodes[i] = n
		if _, err := env.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("192.0.2.%d", i+1)}}}},
			metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = env.Kube.CoreV1().Nodes().Delete(context.Background(), n.name, metav1.DeleteOptions{})
			_ = nettest.DeleteNetns(n.netns)
		})
	}
	startAgent := func(n *node) {
		opts := operator.NewOptions()
		opts.Role = operator.RoleAgent
		opts.NodeName = n.name
		opts.Netns = n.netns
		opts.Namespace = ns
		opts.MetricsAddr, opts.WebhookAddr, opts.InitializeWorkloads = "0", "0", false
		n.op, n.stop = testenv.StartOperator(t, agentCfg, opts, nil)
	}
	for _, n := range nodes {
		startAgent(n)
	}
	opts := operator.NewOptions()
	opts.Role = operator.RoleController
	opts.Namespace = ns
	opts.OperatorNamespace = operatorNamespace
	opts.MetricsAddr, opts.WebhookAddr, opts.InitializeWorkloads = "0", "0", false
	testenv.StartOperator(t, asServiceAccount(env), opts, nil)

	create := func(name, cidr string) *samplecrdv1.Network {
		n, err := nets.Create(ctx, &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: samplecrdv1.NetworkSpec{CIDR: cidr}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
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

	first := create("first", "10.140.0.0/24")
	got := env.WaitReady(t, ns, "first", metav1.ConditionTrue, samplecrdv1.ReasonProvisioned, 30*time.Second)
	wantNodes(got, 3, 3)
	if want := linux.BridgeName(first.UID); got.Status.Backend == nil || got.Status.Backend.Interface != want {
		t.Errorf("status.backend %+v, want interface %s", got.Status.Backend, want)
	}
	for _, n := range nodes {
		if !hasBridge(n, first, "10.140.0.0/24") {
			t.Errorf("node %s has no bridge for first: %v", n.name, n.bridges(t))
		}
	}

	// An agent down: the next Network is ready on two nodes of three, and
	// its condition names the third.
	lagging := nodes[2]
	lagging.stop()
	second := create("second", "10.141.0.0/24")
	waitNodes("second", "2/3")
	got = env.WaitReady(t, ns, "second", metav1.ConditionFalse, samplecrdv1.ReasonNodesNotReady, 30*time.Second)
	wantNodes(got, 2, 3)
	if msg := got.Status.Conditions[0].Message; !strings.Contains(msg, lagging.name+": not built yet") {
		t.Errorf("Ready condition %q does not name the lagging node %s", msg, lagging.name)
	}
	// Back, it builds what it missed and says so in one write.
	startAgent(lagging)
	got = env.WaitReady(t, ns, "second", metav1.ConditionTrue, samplecrdv1.ReasonProvisioned, 30*time.Second)
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
		env.WaitReady(t, ns, name, metav1.ConditionTrue, samplecrdv1.ReasonProvisioned, 30*time.Second)
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
