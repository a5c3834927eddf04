package podnet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubeinformers "k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netselect"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned/fake"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

// newTestController is a controller on kube's pods and namespaces and on
// Networks of a fake clientset, with the informer factories whose caches
// the test fills by hand; no informer runs.
func newTestController(t *testing.T, kube *kubefake.Clientset) (*Controller, kubeinformers.SharedInformerFactory, informers.SharedInformerFactory) {
	t.Helper()
	pods := kubeinformers.NewSharedInformerFactory(kube, 0)
	nets := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	c, err := New(context.Background(), kube, pods.Core().V1().Pods(), nets.Samplecrd().V2().Networks(), pods.Core().V1().Namespaces(),
		record.NewFakeRecorder(10), metrics.New(), Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	return c, pods, nets
}

// cached puts network and pod in the caches of a test controller and
// returns the allocations the pod carries.
func cached(t *testing.T, pods kubeinformers.SharedInformerFactory, nets informers.SharedInformerFactory, network *samplecrdv2.Network, pod *corev1.Pod) []netselect.Allocation {
	t.Helper()
	if err := nets.Samplecrd().V2().Networks().Informer().GetIndexer().Add(network); err != nil {
		t.Fatal(err)
	}
	if err := pods.Core().V1().Pods().Informer().GetIndexer().Add(pod); err != nil {
		t.Fatal(err)
	}
	have, err := netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	return have
}

// A replica that does not lead runs no sync, so its pools never learn of
// the leader's allocations; Held, which the Network webhook asks on every
// replica, must still count the pods that hold addresses (from the pods
// cache), or a cidr could move under them.
func TestHeldOnAReplicaThatDoesNotLead(t *testing.T) {
	c, pods, _ := newTestController(t, kubefake.NewClientset())
	network := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", UID: "net-uid"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.70.0.0/24"}}}
	if h, err := c.Held(network, netip.MustParsePrefix("10.70.0.0/24"), 3); err != nil || h.Count != 0 {
		t.Fatalf("no pods yet: %+v %v", h, err)
	}
	// The leader allocates; this replica's cache sees the pod.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "pod-uid", Annotations: map[string]string{
		netselect.AllocationsAnnotation: `[{"network":"ns/n","networkUID":"net-uid","interface":"net1","ips":["10.70.0.2/24"],"mac":"0a:58:0a:46:00:02"}]`,
	}}}
	if err := pods.Core().V1().Pods().Informer().GetIndexer().Add(pod); err != nil {
		t.Fatal(err)
	}
	h, err := c.Held(network, netip.MustParsePrefix("10.70.0.0/24"), 3)
	if err != nil || h.Count != 1 || len(h.Pods) != 1 || h.Pods[0] != "ns/p" {
		t.Fatalf("after the leader's allocation: %+v %v, want ns/p", h, err)
	}
}

// A running pod's added Network whose write fails (a conflict) gives its
// address back, and says so: a Network being deleted counted it while
// the write was under way, and waits to be told (CI of 9245ce6, the
// hot-plug test's Network deleted while attaching).
func TestFailedHotPlugWriteTellsTheNetwork(t *testing.T) {
	kube := kubefake.NewClientset()
	kube.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(corev1.Resource("pods"), "p", errors.New("modified"))
	})
	c, _, nets := newTestController(t, kube)
	var told []string
	c.OnUsageChanged(func(n cache.ObjectName) { told = append(told, n.String()) })
	network := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "late", UID: "late-uid"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.95.0.0/24"}}}
	if err := nets.Samplecrd().V2().Networks().Informer().GetIndexer().Add(network); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "pod-uid", ResourceVersion: "1"},
		Spec: corev1.PodSpec{NodeName: "node"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	selections, err := netselect.Parse("late", "ns")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.follow(context.Background(), pod, nil, selections); !apierrors.IsConflict(err) {
		t.Fatalf("follow: %v, want the conflict", err)
	}
	if !slices.Contains(told, "ns/late") {
		t.Errorf("Networks told of a change: %v, want ns/late", told)
	}
	if h, err := c.Held(network, netip.Prefix{}, 1); err != nil || h.Count != 0 {
		t.Errorf("holders of late after the failed write: %+v %v, want none", h, err)
	}
}

// No two interfaces on a Network share a MAC, whose bridge would send one's
// frames to the other: a pod that pins the MAC another pod's interface on
// it has waits (its predecessor may be leaving), and gets it once that one
// is gone; on another Network it is free. A controller that starts (a new
// leader) knows the MACs from the pods' allocations.
func TestPinnedMACIsOnePods(t *testing.T) {
	c, _, nets := newTestController(t, kubefake.NewClientset())
	for _, n := range []*samplecrdv2.Network{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", UID: "a-uid"}, Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.71.0.0/24"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b", UID: "b-uid"}, Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.72.0.0/24"}}},
	} {
		if err := nets.Samplecrd().V2().Networks().Informer().GetIndexer().Add(n); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name + "-uid")}}
	}
	pinning := func(network string) []netselect.Selection {
		t.Helper()
		selections, err := netselect.Parse(`[{"name":"`+network+`","mac":"02:00:00:00:00:07"}]`, "ns")
		if err != nil {
			t.Fatal(err)
		}
		return selections
	}
	first, err := c.allocate(pod("first"), pinning("a"))
	if err != nil || first[0].MAC != "02:00:00:00:00:07" {
		t.Fatalf("first: %+v %v", first, err)
	}
	var wait *waitError
	if _, err := c.allocate(pod("second"), pinning("a")); !errors.As(err, &wait) || wait.refused || !strings.Contains(wait.msg, "mac 02:00:00:00:00:07: another pod's interface on it has it") {
		t.Fatalf("second, the same MAC on the same Network: %v, want it to wait, saying why", err)
	}
	if got, err := c.allocate(pod("other"), pinning("b")); err != nil || got[0].MAC != "02:00:00:00:00:07" {
		t.Fatalf("the same MAC on another Network: %+v %v", got, err)
	}
	if allocated, _ := c.pools["a-uid"].usage(); allocated != 1 {
		t.Errorf("a after the refusal: %d addresses handed out, want first's alone", allocated)
	}
	c.release(cache.ObjectName{Namespace: "ns", Name: "first"}, "first-uid")
	if got, err := c.allocate(pod("second"), pinning("a")); err != nil || got[0].MAC != "02:00:00:00:00:07" {
		t.Fatalf("second, once first is gone: %+v %v", got, err)
	}

	// A new leader, whose pods cache has second's allocation.
	leader, leaderPods, leaderNets := newTestController(t, kubefake.NewClientset())
	for _, n := range nets.Samplecrd().V2().Networks().Informer().GetIndexer().List() {
		if err := leaderNets.Samplecrd().V2().Networks().Informer().GetIndexer().Add(n); err != nil {
			t.Fatal(err)
		}
	}
	held := pod("second")
	held.Annotations = map[string]string{netselect.AllocationsAnnotation: `[{"network":"ns/a","networkUID":"a-uid","interface":"net1","ips":["10.71.0.2/24"],"mac":"02:00:00:00:00:07"}]`}
	if err := leaderPods.Core().V1().Pods().Informer().GetIndexer().Add(held); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.allocate(pod("third"), pinning("a")); !errors.As(err, &wait) || !strings.Contains(wait.msg, "mac 02:00:00:00:00:07") {
		t.Fatalf("third, on a new leader: %v, want it to wait for second's MAC", err)
	}
}

// The MACs netop makes from addresses are kept apart from pinned ones: two
// interfaces whose addresses end alike (IPv6 addresses equal in their last
// four bytes) get the same made MAC, as before, and neither waits for the
// other, whose bridge port it never was to share with a pin.
func TestMadeMACsDoNotWait(t *testing.T) {
	c, _, nets := newTestController(t, kubefake.NewClientset())
	if err := nets.Samplecrd().V2().Networks().Informer().GetIndexer().Add(&samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "v6", UID: "v6-uid"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"fd00:71::/64"}}}); err != nil {
		t.Fatal(err)
	}
	for i, ip := range []string{"fd00:71::1:0:0:7", "fd00:71::7"} {
		selections, err := netselect.Parse(`[{"name":"v6","ips":["`+ip+`"]}]`, "ns")
		if err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("p%d", i), UID: types.UID(fmt.Sprintf("p%d-uid", i))}}
		if got, err := c.allocate(pod, selections); err != nil || got[0].MAC != "0a:58:00:00:00:07" {
			t.Fatalf("%s: %+v %v, want it allocated with its made MAC", ip, got, err)
		}
	}
}

// An interface with a pinned MAC, removed and asked for again under its
// name before its node took it down, gets the MAC again once the node
// says it is down, and keeps it: freeing the old one after the new was
// allocated (the same owner) took it from the new, for another pod to
// take.
func TestPinnedMACAskedForAgain(t *testing.T) {
	const pinned = "02:00:00:00:00:09"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "p-uid", ResourceVersion: "1", Annotations: map[string]string{
		netselect.NetworksAnnotation:    `[{"name":"x","interface":"net2","mac":"` + pinned + `"}]`,
		netselect.AllocationsAnnotation: `[{"network":"ns/x","networkUID":"x-uid","interface":"net2","ips":["10.73.0.2/24"],"mac":"` + pinned + `","detaching":true}]`,
		netselect.DetachedAnnotation:    "net2/x-uid",
	}}, Spec: corev1.PodSpec{NodeName: "node"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	c, pods, nets := newTestController(t, kubefake.NewClientset(pod))
	have := cached(t, pods, nets, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "x", UID: "x-uid"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.73.0.0/24"}}}, pod)
	selections, err := netselect.Parse(pod.Annotations[netselect.NetworksAnnotation], "ns")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.follow(context.Background(), pod, have, selections); err != nil {
		t.Fatalf("follow: %v", err)
	}
	if got := c.held[cache.ObjectName{Namespace: "ns", Name: "p"}].allocations; len(got) != 1 || got[0].Detaching || got[0].MAC != pinned {
		t.Fatalf("p holds %+v, want net2 again with %s", got, pinned)
	}
	other, err := netselect.Parse(`[{"name":"x","mac":"`+pinned+`"}]`, "ns")
	if err != nil {
		t.Fatal(err)
	}
	var wait *waitError
	if _, err := c.allocate(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "q", UID: "q-uid"}}, other); !errors.As(err, &wait) {
		t.Errorf("another pod pinning p's MAC: %v, want it to wait", err)
	}
}

// An address a pod no node runs gives up (its selection edited) is freed
// only once the write that says so lands: until then the pod's annotation
// still holds it, and a node that runs the pod meanwhile attaches it.
func TestUnboundRemovalFreedOnceWritten(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "p-uid", ResourceVersion: "1", Annotations: map[string]string{
		netselect.AllocationsAnnotation: `[{"network":"ns/n","networkUID":"n-uid","interface":"net1","ips":["10.74.0.2/24"],"mac":"0a:58:0a:4a:00:02"}]`,
	}}}
	kube := kubefake.NewClientset(pod)
	kube.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(corev1.Resource("pods"), "p", errors.New("bound meanwhile"))
	})
	c, pods, nets := newTestController(t, kube)
	have := cached(t, pods, nets, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", UID: "n-uid"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.74.0.0/24"}}}, pod)
	if err := c.follow(context.Background(), pod, have, nil); !apierrors.IsConflict(err) {
		t.Fatalf("follow: %v, want the conflict", err)
	}
	if owner := c.pools["n-uid"].of(netip.MustParseAddr("10.74.0.2")).Owner(netip.MustParseAddr("10.74.0.2")); owner != ownerKey("p-uid", "net1") {
		t.Errorf("10.74.0.2 after the failed write: held by %q, want still p's", owner)
	}
}
