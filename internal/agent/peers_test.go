package agent

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubeinformers "k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	netopv1alpha1 "github.com/netop-dev/netop/pkg/apis/netop/v1alpha1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned/fake"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

// Once Peers say they are synced, every node of the initial lists that
// realises a Network is its peer, at its InternalIP; the node itself and
// the nodes that do not realise it are not.
func TestPeersSynced(t *testing.T) {
	node := func(name, ip string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
	}
	report := func(name string, ready map[types.UID]int64) *netopv1alpha1.NetworkNode {
		return &netopv1alpha1.NetworkNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: netopv1alpha1.NetworkNodeStatus{Ready: ready}}
	}
	kube := kubefake.NewClientset(node("self", "192.0.2.1"), node("a", "192.0.2.2"), node("b", "192.0.2.3"), node("c", "192.0.2.4"))
	netop := fake.NewClientset(report("self", map[types.UID]int64{"u": 1}), report("a", map[types.UID]int64{"u": 1}),
		report("b", map[types.UID]int64{"u": 2, "v": 1}), report("c", map[types.UID]int64{"v": 1}))
	kubeFactory := kubeinformers.NewSharedInformerFactory(kube, 0)
	factory := informers.NewSharedInformerFactory(netop, 0)
	peers, err := NewPeers(kubeFactory.Core().V1().Nodes(), factory.Netop().V1alpha1().NetworkNodes(), "self")
	if err != nil {
		t.Fatal(err)
	}
	kubeFactory.Start(t.Context().Done())
	factory.Start(t.Context().Done())
	if !cache.WaitFor(t.Context(), "", peers.Synced()...) {
		t.Fatal("stopped")
	}
	got := peers.Of("u")
	slices.SortFunc(got, netip.Addr.Compare)
	if want := []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")}; !slices.Equal(got, want) {
		t.Errorf("peers of u: %v, want %v", got, want)
	}
}
