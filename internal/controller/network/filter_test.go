package network

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

func TestNeedsReconcile(t *testing.T) {
	base := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1", Generation: 1, Finalizers: []string{samplecrd.Finalizer}}}
	base.Status.ObservedGeneration = 1
	now := metav1.Now()
	for name, tc := range map[string]struct {
		change func(n *samplecrdv2.Network)
		want   bool
	}{
		"resync, same resourceVersion": {func(*samplecrdv2.Network) {}, false},
		"own status write":             {func(n *samplecrdv2.Network) { n.ResourceVersion = "2"; n.Status.CIDRs = []string{"10.0.0.0/8"} }, false},
		"spec change":                  {func(n *samplecrdv2.Network) { n.ResourceVersion = "2"; n.Generation = 2 }, true},
		"deletion":                     {func(n *samplecrdv2.Network) { n.ResourceVersion = "2"; n.DeletionTimestamp = &now }, true},
		"finalizer removed by someone": {func(n *samplecrdv2.Network) { n.ResourceVersion = "2"; n.Finalizers = nil }, true},
		"status of an older generation": {func(n *samplecrdv2.Network) {
			n.ResourceVersion = "2"
			n.Status.ObservedGeneration = 0
		}, true},
	} {
		cur := base.DeepCopy()
		tc.change(cur)
		if got := needsReconcile(base, cur); got != tc.want {
			t.Errorf("%s: needsReconcile = %v, want %v", name, got, tc.want)
		}
	}
}
