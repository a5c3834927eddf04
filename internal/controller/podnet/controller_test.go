package podnet

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubeinformers "k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/netop-dev/netop/internal/controller/podnet/allocator"
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
	c.Allocator().OnUsageChanged(func(n cache.ObjectName) { told = append(told, n.String()) })
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
	if h, err := c.Allocator().Held(network, netip.Prefix{}, 1); err != nil || h.Count != 0 {
		t.Errorf("holders of late after the failed write: %+v %v, want none", h, err)
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
	kube := kubefake.NewClientset(pod)
	c, pods, nets := newTestController(t, kube)
	have := cached(t, pods, nets, &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "x", UID: "x-uid"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.73.0.0/24"}}}, pod)
	selections, err := netselect.Parse(pod.Annotations[netselect.NetworksAnnotation], "ns")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.follow(context.Background(), pod, have, selections); err != nil {
		t.Fatalf("follow: %v", err)
	}
	written, err := kube.CoreV1().Pods("ns").Get(context.Background(), "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := netselect.ParseAllocations(written.Annotations[netselect.AllocationsAnnotation]); err != nil || len(got) != 1 || got[0].Detaching || got[0].MAC != pinned {
		t.Fatalf("p holds %+v %v, want net2 again with %s", got, err, pinned)
	}
	other, err := netselect.Parse(`[{"name":"x","mac":"`+pinned+`"}]`, "ns")
	if err != nil {
		t.Fatal(err)
	}
	var wait *allocator.WaitError
	if _, err := c.Allocator().Allocate(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "q", UID: "q-uid"}}, other); !errors.As(err, &wait) {
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
	network := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", UID: "n-uid"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.74.0.0/24"}}}
	have := cached(t, pods, nets, network, pod)
	if err := c.follow(context.Background(), pod, have, nil); !apierrors.IsConflict(err) {
		t.Fatalf("follow: %v, want the conflict", err)
	}
	if usage, err := c.Allocator().Usage(network); err != nil || usage.Allocated != 1 {
		t.Errorf("n after the failed write: %+v %v, want p's 10.74.0.2 still held", usage, err)
	}
}

// sync writes a new pod's allocations on it, as netop's annotation and
// Multus's network-status, and tells the Network; a pod that asks for an
// address that can never be its (of another prefix length) has the
// refusal written on it, for its node to fail its sandbox with; a pod
// that went frees its addresses.
func TestSyncWritesAllocationsAndRefusals(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "p-uid", Annotations: map[string]string{
		netselect.NetworksAnnotation: "n",
	}}}
	refused := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "g", UID: "g-uid", Annotations: map[string]string{
		netselect.NetworksAnnotation: `[{"name":"n","ips":["10.75.0.9/16"]}]`,
	}}}
	kube := kubefake.NewClientset(pod, refused)
	c, pods, nets := newTestController(t, kube)
	var told []string
	c.Allocator().OnUsageChanged(func(n cache.ObjectName) { told = append(told, n.String()) })
	network := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", UID: "n-uid"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.75.0.0/24"}}}
	cached(t, pods, nets, network, pod)
	cached(t, pods, nets, network, refused)
	ctx := context.Background()
	written := func(name string) *corev1.Pod {
		t.Helper()
		p, err := kube.CoreV1().Pods("ns").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	if err := c.sync(ctx, cache.ObjectName{Namespace: "ns", Name: "p"}); err != nil {
		t.Fatalf("sync p: %v", err)
	}
	p := written("p")
	got, err := netselect.ParseAllocations(p.Annotations[netselect.AllocationsAnnotation])
	if err != nil || len(got) != 1 || !slices.Equal(got[0].IPs, []string{"10.75.0.2/24"}) || p.Annotations[netselect.StatusAnnotation] == "" {
		t.Fatalf("p's annotations: %v (%v), want 10.75.0.2/24 and network-status", p.Annotations, err)
	}
	if !slices.Equal(told, []string{"ns/n"}) {
		t.Errorf("Networks told: %v, want ns/n", told)
	}

	if err := c.sync(ctx, cache.ObjectName{Namespace: "ns", Name: "g"}); err != nil {
		t.Fatalf("sync g: %v", err)
	}
	if refusal := written("g").Annotations[netselect.RefusedAnnotation]; !strings.Contains(refusal, "10.75.0.9/16: prefix length 16") {
		t.Errorf("g's refusal: %q, want the prefix length named", refusal)
	}

	if err := pods.Core().V1().Pods().Informer().GetIndexer().Delete(pod); err != nil {
		t.Fatal(err)
	}
	if err := c.sync(ctx, cache.ObjectName{Namespace: "ns", Name: "p"}); err != nil {
		t.Fatalf("sync p once gone: %v", err)
	}
	if usage, err := c.Allocator().Usage(network); err != nil || usage.Allocated != 0 || len(told) != 2 {
		t.Errorf("once p went: %+v %v, told %v; want nothing held, ns/n told again", usage, err, told)
	}
}
