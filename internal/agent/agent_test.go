package agent

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubeinformers "k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/controller/network"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/testing/backendtest"
	netopv1alpha1 "github.com/netop-dev/netop/pkg/apis/netop/v1alpha1"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned/fake"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

// An agent that installs the CNI plugin is ready only once it is in place:
// before, pods on its node cannot be attached.
func TestReadyWaitsForCNIInstall(t *testing.T) {
	if err := (&Agent{}).Ready(); err != nil {
		t.Errorf("agent without --install-cni: %v, want ready", err)
	}
	if err := (&Agent{cni: &CNIInstall{}}).Ready(); err == nil || !strings.Contains(err.Error(), "CNI plugin") {
		t.Errorf("agent before the install: %v, want an error naming the CNI plugin", err)
	}
}

// firstEnsure is a backend that notes the peers the overlay gave the first
// Network it was asked to build.
type firstEnsure struct {
	*backendtest.Backend
	overlay *linux.Overlay
	once    sync.Once
	done    chan struct{}
	peers   []netip.Addr
}

func (b *firstEnsure) Ensure(ctx context.Context, want backend.Network, recorded *backend.Ref) (backend.Result, error) {
	b.once.Do(func() {
		b.peers = b.overlay.PeersOf(want.UID)
		close(b.done)
	})
	return b.Backend.Ensure(ctx, want, recorded)
}

// An agent on an overlay builds no Network before it has seen the Nodes
// and the reports of the initial lists: a Network built before would flood
// to none of its peers, and go on so until one of them changed.
func TestBuildsAfterThePeers(t *testing.T) {
	uid := types.UID("0badc0de-0000-4000-8000-000000000001")
	n := &samplecrdv2.Network{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "net", UID: uid, Generation: 1, ResourceVersion: "5", Finalizers: []string{samplecrd.Finalizer}},
		Spec:       samplecrdv2.NetworkSpec{CIDRs: []string{"10.0.0.0/24"}, Gateways: []string{"10.0.0.1"}},
		Status:     samplecrdv2.NetworkStatus{VNI: 7},
	}
	node := func(name, ip string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
	}
	kube := kubefake.NewClientset(node("self", "192.0.2.1"), node("peer", "192.0.2.2"))
	client := fake.NewSimpleClientset(n, &netopv1alpha1.NetworkNode{ObjectMeta: metav1.ObjectMeta{Name: "peer"},
		Status: netopv1alpha1.NetworkNodeStatus{Ready: map[types.UID]int64{uid: 1}}})
	overlay := &linux.Overlay{Local: netip.MustParseAddr("192.0.2.1")}
	b := &firstEnsure{Backend: backendtest.New(), overlay: overlay, done: make(chan struct{})}
	// The list of the peers' Nodes returns once the Network was built, or
	// after a second: an agent that did not wait builds it well within
	// that second, without its peer.
	kube.PrependReactor("list", "nodes", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if list, ok := action.(k8stesting.ListAction); ok && list.GetListRestrictions().Fields.Empty() {
			select {
			case <-b.done:
			case <-time.After(time.Second):
			}
		}
		return false, nil, nil
	})
	factory := informers.NewSharedInformerFactory(client, 0)
	kubeFactory := kubeinformers.NewSharedInformerFactory(kube, 0)
	a, err := New(t.Context(), Options{NodeName: "self"}, Deps{Kube: kube, Client: client,
		Networks: factory.Samplecrd().V2().Networks(), Reports: factory.Netop().V1alpha1().NetworkNodes(), Pods: kubeFactory.Core().V1().Pods(),
		Backend: b, Overlay: overlay, Recorder: record.NewFakeRecorder(100), Metrics: metrics.New(),
		Network: network.Options{Cluster: "test", Workers: 1, Resync: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(t.Context().Done())
	kubeFactory.Start(t.Context().Done())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = a.Run(t.Context())
	}()
	t.Cleanup(func() { <-ran })
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not build the Network")
	}
	if want := netip.MustParseAddr("192.0.2.2"); !slices.Contains(b.peers, want) {
		t.Errorf("the Network was first built with peers %v, want %v among them", b.peers, want)
	}
}
