package kubeclient

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
)

// network is a Network as the API server returns it after netop made it
// Ready: with the managedFields of kubectl, the webhook and the controller.
func readyNetwork(i int) *samplecrdv1.Network {
	fields := func(manager, sub string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{
			Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "samplecrd.k8s.io/v1",
			Time: &metav1.Time{Time: time.Now()}, FieldsType: "FieldsV1", Subresource: sub,
			FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{}},"f:finalizers":{".":{},"v:\"samplecrd.k8s.io/network-cleanup\"":{}}},"f:spec":{".":{},"f:cidr":{},"f:gateway":{}},"f:status":{".":{},"f:backend":{".":{},"f:interface":{},"f:type":{}},"f:cidr":{},"f:conditions":{".":{},"k:{\"type\":\"Ready\"}":{".":{},"f:lastTransitionTime":{},"f:message":{},"f:observedGeneration":{},"f:reason":{},"f:status":{},"f:type":{}}},"f:gateway":{},"f:observedGeneration":{}}}`),
		}
	}
	return &samplecrdv1.Network{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: fmt.Sprintf("network-%05d", i), UID: "9ec99581-a593-4fcf-a774-4ded5666c744",
			ResourceVersion: "123456", Generation: 1, CreationTimestamp: metav1.Now(),
			Finalizers:    []string{samplecrd.Finalizer},
			ManagedFields: []metav1.ManagedFieldsEntry{fields("kubectl-client-side-apply", ""), fields("netop", ""), fields("netop", "status")},
		},
		Spec: samplecrdv1.NetworkSpec{CIDR: fmt.Sprintf("10.%d.%d.0/24", i/256, i%256), Gateway: fmt.Sprintf("10.%d.%d.1", i/256, i%256)},
		Status: samplecrdv1.NetworkStatus{ObservedGeneration: 1, CIDR: "10.0.0.0/24", Gateway: "10.0.0.1",
			Backend: &samplecrdv1.NetworkBackendStatus{Type: samplecrdv1.BackendLinux, Interface: "netop9ec99581a5"},
			Conditions: []metav1.Condition{{Type: samplecrd.ConditionReady, Status: metav1.ConditionTrue, Reason: samplecrd.ReasonProvisioned,
				Message: "linux network netop9ec99581a5 has 10.0.0.0/24 with gateway 10.0.0.1", ObservedGeneration: 1, LastTransitionTime: metav1.Now()}}},
	}
}

// Informer cache bytes per Network, with and without the transform that
// drops managedFields. It reports heap bytes per cached Network.
func BenchmarkInformerCacheBytesPerNetwork(b *testing.B) {
	for _, tc := range []struct {
		name      string
		transform func(any) (any, error)
	}{
		{"untrimmed", func(o any) (any, error) { return o, nil }},
		{"trimmed", DropManagedFields},
	} {
		b.Run(tc.name, func(b *testing.B) {
			const count = 2000
			var perNetwork float64
			for b.Loop() {
				store := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				for i := range count {
					obj, _ := tc.transform(readyNetwork(i))
					_ = store.Add(obj)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perNetwork = float64(after.HeapAlloc-before.HeapAlloc) / count
				runtime.KeepAlive(store)
			}
			b.ReportMetric(perNetwork, "bytes/network")
		})
	}
}
