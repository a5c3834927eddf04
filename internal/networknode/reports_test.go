package networknode

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubeinformers "k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	netopv1alpha1 "github.com/netop-dev/netop/pkg/apis/netop/v1alpha1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned/fake"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

func TestNodeReportsLagging(t *testing.T) {
	const agents = "netop-system"
	n := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "net", UID: "u1", Generation: 2}}
	report := func(node, pod string, ready map[types.UID]int64, failed ...netopv1alpha1.NetworkNodeFailure) *netopv1alpha1.NetworkNode {
		return &netopv1alpha1.NetworkNode{ObjectMeta: metav1.ObjectMeta{Name: node},
			Status: netopv1alpha1.NetworkNodeStatus{AgentPod: pod, Ready: ready, Failed: failed}}
	}
	onDemand := func(nn *netopv1alpha1.NetworkNode) *netopv1alpha1.NetworkNode {
		nn.Status.OnDemand = true
		return nn
	}
	pod := func(name string, ready corev1.ConditionStatus) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: agents, Name: name},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}}}
	}
	client := fake.NewClientset(
		report("a", "agent-a", map[types.UID]int64{"u1": 2}),
		report("b", "agent-b", map[types.UID]int64{"u1": 1}),
		report("c", "agent-c", nil, netopv1alpha1.NetworkNodeFailure{Network: "ns/net", UID: "u1", Generation: 2, Reason: "BackendError", Message: "no room"}),
		report("d", "agent-d", map[types.UID]int64{"u1": 2}),
		report("e", "", nil),
		onDemand(report("g", "", nil)),
		report("f", "", map[types.UID]int64{"u1": 2}),
	)
	kube := kubefake.NewClientset(pod("agent-a", corev1.ConditionTrue), pod("agent-b", corev1.ConditionTrue),
		pod("agent-c", corev1.ConditionTrue), pod("agent-d", corev1.ConditionFalse))
	factory := informers.NewSharedInformerFactory(client, 0)
	kubeFactory := kubeinformers.NewSharedInformerFactory(kube, 0)
	reports, err := NewNodeReports(factory.Netop().V1alpha1().NetworkNodes(), kubeFactory.Core().V1().Pods(), agents)
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(t.Context().Done())
	kubeFactory.Start(t.Context().Done())
	kubeFactory.WaitForCacheSync(t.Context().Done())
	// The reports are counted once they say they are synced.
	if !cache.WaitFor(t.Context(), "", reports.HasSyncedChecker()) {
		t.Fatal("stopped")
	}

	ready, total, of, lagging := reports.Nodes(n, 10)
	if ready != 2 || total != 6 || of != 7 {
		t.Errorf("ready on %d of %d (of %d), want 2 of 6 (a and f; g realises Networks on demand, not this one) of 7", ready, total, of)
	}
	want := []string{
		"b: ready at generation 1, not yet at 2",
		"c: BackendError: no room",
		"d: its agent's pod agent-d is not ready",
		"e: not built yet",
	}
	if !slices.Equal(lagging, want) {
		t.Errorf("lagging:\n%q\nwant\n%q", lagging, want)
	}
	if _, _, _, lagging := reports.Nodes(n, 2); len(lagging) != 2 {
		t.Errorf("limit 2 named %d nodes", len(lagging))
	}
}

func TestChangedNetworks(t *testing.T) {
	old := &netopv1alpha1.NetworkNodeStatus{
		Ready:  map[types.UID]int64{"same": 1, "newer": 1, "dropped": 1},
		Failed: []netopv1alpha1.NetworkNodeFailure{{UID: "failing", Generation: 1, Reason: "BackendError", Message: "x"}, {UID: "recovers", Generation: 1}},
	}
	cur := &netopv1alpha1.NetworkNodeStatus{
		Ready:  map[types.UID]int64{"same": 1, "newer": 2, "added": 1, "recovers": 1},
		Failed: []netopv1alpha1.NetworkNodeFailure{{UID: "failing", Generation: 1, Reason: "BackendError", Message: "y"}},
	}
	got := changedNetworks(old, cur)
	want := []types.UID{"added", "dropped", "failing", "newer", "recovers"}
	if !slices.Equal(got, want) {
		t.Errorf("changed %v, want %v", got, want)
	}
}
