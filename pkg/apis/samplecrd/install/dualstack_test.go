package install

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// A dual-stack v2 Network read as v1 shows its IPv4 family; a v1 client
// that moves the IPv4 cidr and writes it back keeps the IPv6 half.
func TestV1ClientKeepsSecondFamily(t *testing.T) {
	scheme := runtime.NewScheme()
	Install(scheme)
	v2 := &samplecrdv2.Network{
		ObjectMeta: metav1.ObjectMeta{Name: "dual", Annotations: map[string]string{"team": "a"}},
		Spec:       samplecrdv2.NetworkSpec{CIDRs: []string{"10.1.0.0/24", "fd00:1::/64"}, Gateways: []string{"10.1.0.1", "fd00:1::1"}},
		Status: samplecrdv2.NetworkStatus{CIDRs: []string{"10.1.0.0/24", "fd00:1::/64"}, Gateways: []string{"10.1.0.1", "fd00:1::1"},
			Backend: &samplecrdv2.NetworkBackendStatus{Type: "neutron", NetworkID: "n", SubnetIDs: []string{"s4", "s6"}}},
	}
	hub := &samplecrd.Network{}
	if err := scheme.Convert(v2, hub, nil); err != nil {
		t.Fatal(err)
	}
	v1 := &samplecrdv1.Network{}
	if err := scheme.Convert(hub, v1, nil); err != nil {
		t.Fatal(err)
	}
	if v1.Spec.CIDR != "10.1.0.0/24" || v1.Spec.Gateway != "10.1.0.1" || v1.Status.Backend.SubnetID != "s4" {
		t.Errorf("as v1: spec %+v, subnet %s; want the IPv4 family", v1.Spec, v1.Status.Backend.SubnetID)
	}
	if v1.Annotations[samplecrdv1.SpecFamiliesAnnotation] == "" || v1.Annotations["team"] != "a" {
		t.Errorf("as v1: annotations %v", v1.Annotations)
	}
	if _, ok := v2.Annotations[samplecrdv1.SpecFamiliesAnnotation]; ok {
		t.Error("converting wrote into the original's annotations")
	}

	// The v1 client's change: a new IPv4 cidr, the gateway defaulted.
	v1.Spec.CIDR, v1.Spec.Gateway = "10.2.0.0/24", ""
	back := &samplecrd.Network{}
	if err := scheme.Convert(v1, back, nil); err != nil {
		t.Fatal(err)
	}
	if v1.Annotations[samplecrdv1.SpecFamiliesAnnotation] == "" {
		t.Error("converting to the hub took the annotation out of the v1 object itself")
	}
	after := &samplecrdv2.Network{}
	if err := scheme.Convert(back, after, nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(after.Spec.CIDRs, []string{"10.2.0.0/24", "fd00:1::/64"}) || !slices.Equal(after.Spec.Gateways, []string{"", "fd00:1::1"}) {
		t.Errorf("after the v1 update: spec %+v, want the new IPv4 cidr (gateway to default) and the IPv6 half kept", after.Spec)
	}
	if !slices.Equal(after.Status.Backend.SubnetIDs, []string{"s4", "s6"}) {
		t.Errorf("after the v1 update: subnets %v", after.Status.Backend.SubnetIDs)
	}
	if len(after.Annotations) != 1 || after.Annotations["team"] != "a" {
		t.Errorf("after the v1 update: annotations %v, want only the user's", after.Annotations)
	}
}
