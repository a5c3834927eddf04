package network

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/metrics"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned/fake"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

// convergedBackend reports every network as already right, so that the
// benchmark measures the controller's own work.
type convergedBackend struct{}

func (convergedBackend) Type() samplecrdv1.BackendType { return samplecrdv1.BackendLinux }
func (convergedBackend) Ensure(_ context.Context, want backend.Network, _ *samplecrdv1.NetworkBackendStatus) (backend.Result, error) {
	return backend.Result{Status: samplecrdv1.NetworkBackendStatus{Type: samplecrdv1.BackendLinux, Interface: "netop0123456789"}}, nil
}
func (convergedBackend) Delete(context.Context, backend.Owner, *samplecrdv1.NetworkBackendStatus) error {
	return nil
}
func (convergedBackend) ListOwned(context.Context) ([]backend.Observed, error) { return nil, nil }

// A sync of a Network that is already right: no write, no change, and few
// allocations.
func BenchmarkSyncUnchanged(b *testing.B) {
	n := &samplecrdv1.Network{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", UID: "0badc0de-0000-4000-8000-000000000001",
			Generation: 1, ResourceVersion: "5", Finalizers: []string{samplecrdv1.Finalizer}},
		Spec: samplecrdv1.NetworkSpec{CIDR: "192.168.0.0/16", Gateway: "192.168.0.1"},
	}
	n.Status = samplecrdv1.NetworkStatus{
		ObservedGeneration: 1, CIDR: "192.168.0.0/16", Gateway: "192.168.0.1",
		Backend: &samplecrdv1.NetworkBackendStatus{Type: samplecrdv1.BackendLinux, Interface: "netop0123456789"},
		Conditions: []metav1.Condition{{Type: samplecrdv1.ConditionReady, Status: metav1.ConditionTrue, Reason: samplecrdv1.ReasonProvisioned,
			Message: "linux network netop0123456789 has 192.168.0.0/16 with gateway 192.168.0.1", ObservedGeneration: 1,
			LastTransitionTime: metav1.NewTime(time.Now())}},
	}
	client := fake.NewSimpleClientset(n)
	factory := informers.NewSharedInformerFactory(client, 0)
	informer := factory.Samplecrd().V1().Networks()
	c, err := New(context.Background(), client, informer, convergedBackend{}, record.NewFakeRecorder(1), metrics.New(), Options{Workers: 1, Resync: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	if err := informer.Informer().GetIndexer().Add(n); err != nil {
		b.Fatal(err)
	}
	client.ClearActions()
	b.ReportAllocs()
	for b.Loop() {
		if err := c.sync(context.Background(), "ns/n"); err != nil {
			b.Fatal(err)
		}
	}
	if actions := client.Actions(); len(actions) != 0 {
		b.Fatalf("a sync of an unchanged Network sent %d requests, first %v", len(actions), actions[0])
	}
}
