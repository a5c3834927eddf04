package podnetworks

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/tenancy"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v2"
)

// admission with Networks neta (tenant-a, admits team=b) and the
// namespaces tenant-a, tenant-b (team=b) and tenant-c, from caches.
func admission(t testing.TB) *Admission {
	t.Helper()
	networks := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := networks.Add(&samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "neta"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.71.0.0/24"}, NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "b"}}}}); err != nil {
		t.Fatal(err)
	}
	namespaces := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for name, labels := range map[string]map[string]string{"tenant-a": nil, "tenant-b": {"team": "b"}, "tenant-c": {"team": "c"}} {
		if err := namespaces.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}); err != nil {
			t.Fatal(err)
		}
	}
	return &Admission{Networks: samplecrdlisters.NewNetworkLister(networks), Namespaces: tenancy.Namespaces{Lister: corelisters.NewNamespaceLister(namespaces)}}
}

func podReview(t testing.TB, namespace, networks string) *admissionv1.AdmissionRequest {
	t.Helper()
	raw, err := json.Marshal(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "p",
		Annotations: map[string]string{netselect.NetworksAnnotation: networks}}})
	if err != nil {
		t.Fatal(err)
	}
	return &admissionv1.AdmissionRequest{Operation: admissionv1.Create, Namespace: namespace, Object: runtime.RawExtension{Raw: raw}}
}

func TestPods(t *testing.T) {
	a := admission(t)
	for _, tc := range []struct {
		namespace, networks, refused string
	}{
		{"tenant-a", "neta", ""},
		{"tenant-b", "tenant-a/neta", ""},
		{"tenant-c", "tenant-a/neta", "pod tenant-c/p: metadata.annotations[k8s.v1.cni.cncf.io/networks]: pods of namespace tenant-c may not join Network tenant-a/neta: its spec.namespaceSelector (team=b) does not select the namespace"},
		{"tenant-c", "tenant-a/gone", "may not join Network tenant-a/gone: the Network does not exist"},
		{"tenant-c", "gone", ""}, // its own: waits for it, with a warning
		{"tenant-c", "[{\"name\":\"x\",\"mac\":\"01:00:5e:00:00:01\"}]", "a multicast address cannot be an interface's"},
	} {
		resp := a.Pods(context.Background(), podReview(t, tc.namespace, tc.networks))
		switch {
		case tc.refused == "" && !resp.Allowed:
			t.Errorf("%s naming %s: refused: %s", tc.namespace, tc.networks, resp.Result.Message)
		case tc.refused != "" && (resp.Allowed || !strings.Contains(resp.Result.Message, tc.refused)):
			t.Errorf("%s naming %s: %+v, want refused with %q", tc.namespace, tc.networks, resp.Result, tc.refused)
		}
	}
}

// The cost of admitting a pod that joins a Network of another namespace
// (the namespace's labels read from the cache).
func BenchmarkPodOfAnotherNamespace(b *testing.B) {
	a := admission(b)
	req := podReview(b, "tenant-b", "tenant-a/neta")
	b.ReportAllocs()
	for b.Loop() {
		if resp := a.Pods(context.Background(), req); !resp.Allowed {
			b.Fatal(resp.Result.Message)
		}
	}
}

// A running pod's edit may add and remove Networks, but not rename an
// interface it keeps.
func TestPodUpdateKeepsInterfaceNames(t *testing.T) {
	a := admission(t)
	allocations, _ := json.Marshal([]netselect.Allocation{{Network: "tenant-a/neta", NetworkUID: "u", Interface: "net1", IPs: []string{"10.71.0.2/24"}}})
	update := func(networks string) *admissionv1.AdmissionResponse {
		raw, err := json.Marshal(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "p", Annotations: map[string]string{
			netselect.NetworksAnnotation: networks, netselect.AllocationsAnnotation: string(allocations)}}})
		if err != nil {
			t.Fatal(err)
		}
		return a.Pods(context.Background(), &admissionv1.AdmissionRequest{Operation: admissionv1.Update, Namespace: "tenant-a", Object: runtime.RawExtension{Raw: raw}})
	}
	if r := update("neta,gone"); !r.Allowed {
		t.Errorf("adding a Network: refused: %v", r.Result)
	}
	r := update("neta@data")
	if r.Allowed || !strings.Contains(r.Result.Message, `"data": the pod's interface on Network tenant-a/neta is net1, and a running pod's interface is not renamed`) {
		t.Errorf("renaming net1: %+v", r.Result)
	}
}
