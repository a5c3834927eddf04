package networkcache_test

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/networkcache"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// A version of a Network is resolved once: asked again, Specs answers
// what it resolved then, even of a spec changed behind its back (which the
// API server never does without a new resourceVersion); a new
// resourceVersion is resolved anew, and so is every call for a Network the
// API server did not store.
func TestSpecsResolveEachVersionOnce(t *testing.T) {
	specs := networkcache.NewSpecs(netspec.Resolver{})
	n := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", UID: "n-uid", ResourceVersion: "1"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.1.0.0/16"}}}
	resolvedCIDRs := func(n *samplecrdv2.Network) string {
		t.Helper()
		families, errs := specs.Resolve(n)
		if len(errs) > 0 {
			return errs.ToAggregate().Error()
		}
		return strings.Join(families.CIDRs(), ",")
	}
	if got := resolvedCIDRs(n); got != "10.1.0.0/16" {
		t.Fatalf("first resolution: %s", got)
	}
	n.Spec.CIDRs = []string{"10.2.0.0/16"}
	if got := resolvedCIDRs(n); got != "10.1.0.0/16" {
		t.Errorf("the same version asked again: %s, want what was resolved (10.1.0.0/16), not parsed again", got)
	}
	n.ResourceVersion = "2"
	if got := resolvedCIDRs(n); got != "10.2.0.0/16" {
		t.Errorf("a new resourceVersion: %s, want it resolved anew (10.2.0.0/16)", got)
	}

	// An invalid spec's errors are kept as well, naming v2's fields.
	n.ResourceVersion, n.Spec.CIDRs = "3", []string{"10.3.0.0/31"}
	want := `spec.cidrs[0]: Invalid value: "10.3.0.0/31"`
	if got := resolvedCIDRs(n); !strings.Contains(got, want) {
		t.Errorf("an invalid spec: %s, want an error containing %s", got, want)
	}
	n.Spec.CIDRs = []string{"10.3.0.0/16"}
	if got := resolvedCIDRs(n); !strings.Contains(got, want) {
		t.Errorf("an invalid spec asked again: %s, want the error kept", got)
	}

	// Forgotten, a Network's version is resolved anew.
	specs.Forget(n.UID)
	if got := resolvedCIDRs(n); got != "10.3.0.0/16" {
		t.Errorf("after Forget: %s, want 10.3.0.0/16", got)
	}

	// Objects the API server did not store are never kept.
	for _, unstored := range []metav1.ObjectMeta{{UID: "n-uid"}, {ResourceVersion: "3"}} {
		m := &samplecrdv2.Network{ObjectMeta: unstored, Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.4.0.0/16"}}}
		_ = resolvedCIDRs(m)
		m.Spec.CIDRs = []string{"10.5.0.0/16"}
		if got := resolvedCIDRs(m); got != "10.5.0.0/16" {
			t.Errorf("a Network with %+v: %s, want it resolved on every call (10.5.0.0/16)", unstored, got)
		}
	}
}
