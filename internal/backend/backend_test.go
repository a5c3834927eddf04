package backend

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestRecordRoundTripAndTruncation(t *testing.T) {
	o := Owner{Namespace: "ns", Name: "example-network", UID: "9ec99581-a593-4fcf-a774-4ded5666c744"}
	if got, ok := ParseRecord(o.Record(255)); !ok || got != o {
		t.Fatalf("round trip: %+v %v", got, ok)
	}
	long := Owner{Namespace: strings.Repeat("n", 63), Name: strings.Repeat("x", 253), UID: o.UID}
	rec := long.Record(255)
	got, ok := ParseRecord(rec)
	if len(rec) != 255 || !ok || got.UID != o.UID || got.Namespace != long.Namespace || !strings.HasPrefix(long.Name, got.Name) {
		t.Fatalf("truncated record %q (%d bytes) parsed as %+v %v", rec, len(rec), got, ok)
	}
	// With a cluster: kept whole when the name is shortened.
	clustered := long
	clustered.Cluster = "c0ffee00-1111-4222-8333-444455556666"
	rec = clustered.Record(255)
	if got, ok := ParseRecord(rec); len(rec) != 255 || !ok || got.Cluster != clustered.Cluster || got.UID != o.UID || got.Namespace != long.Namespace {
		t.Fatalf("record with a cluster %q parsed as %+v %v", rec, got, ok)
	}
	short := o
	short.Cluster = "cluster-a"
	if rec := short.Record(255); rec != "netop:cluster-a:ns/example-network/"+string(o.UID) {
		t.Errorf("record %q", rec)
	}
	if got, ok := ParseRecord(short.Record(255)); !ok || got != short {
		t.Errorf("round trip with a cluster: %+v %v", got, ok)
	}
	for _, bad := range []string{"", "netop:", "netop:a/b", "other:a/b/c", "netop:a/b/", "netop::ns/n/u", "netop:bad cluster:ns/n/u"} {
		if _, ok := ParseRecord(bad); ok {
			t.Errorf("ParseRecord(%q) accepted", bad)
		}
	}
}

// An owner claims records of its UID from its own cluster and from before
// clusters were recorded, never another cluster's.
func TestOwnerClaims(t *testing.T) {
	ours := Owner{Cluster: "a", UID: "u1"}
	for _, tc := range []struct {
		rec  Owner
		want bool
	}{
		{Owner{Cluster: "a", UID: "u1"}, true},
		{Owner{UID: "u1"}, true},
		{Owner{Cluster: "b", UID: "u1"}, false},
		{Owner{Cluster: "a", UID: "u2"}, false},
	} {
		if got := ours.Claims(tc.rec); got != tc.want {
			t.Errorf("Claims(%+v) = %v, want %v", tc.rec, got, tc.want)
		}
	}
	for _, bad := range []string{"", "a:b", "a/b", strings.Repeat("x", MaxClusterLen+1)} {
		if ValidCluster(bad) == nil {
			t.Errorf("ValidCluster(%q) accepted", bad)
		}
	}
	if err := ValidCluster("c0ffee00-1111-4222-8333-444455556666"); err != nil {
		t.Error(err)
	}
}

func TestNetworkValidate(t *testing.T) {
	good := Network{
		Owner:    Owner{Namespace: "ns", Name: "n", UID: "9ec99581-a593-4fcf-a774-4ded5666c744"},
		Families: []Family{{CIDR: netip.MustParsePrefix("10.1.0.0/16"), Gateway: netip.MustParseAddr("10.1.0.1")}},
	}
	if err := good.Validate(); err != nil {
		t.Fatalf("Validate(%+v) = %v", good, err)
	}
	v6 := good
	v6.Families = []Family{{CIDR: netip.MustParsePrefix("fd00:1::/64"), Gateway: netip.MustParseAddr("fd00:1::1")}}
	if err := v6.Validate(); err != nil {
		t.Errorf("Validate(%+v) = %v", v6, err)
	}
	for name, tc := range map[string]struct {
		mutate      func(n *Network)
		errContains string
	}{
		"empty UID":          {func(n *Network) { n.UID = "" }, "missing owner UID"},
		"zero CIDR":          {func(n *Network) { n.Families[0].CIDR = netip.Prefix{} }, "invalid CIDR"},
		"mapped IPv6 prefix": {func(n *Network) { n.Families[0].CIDR = netip.MustParsePrefix("::ffff:10.1.0.0/112") }, "IPv4-mapped"},
		"host bits":          {func(n *Network) { n.Families[0].CIDR = netip.MustParsePrefix("10.1.2.0/16") }, "did you mean 10.1.0.0/16?"},
		"zero gateway":       {func(n *Network) { n.Families[0].Gateway = netip.Addr{} }, "is not an address in"},
		"gateway outside":    {func(n *Network) { n.Families[0].Gateway = netip.MustParseAddr("10.2.0.1") }, "gateway 10.2.0.1 is not an address in 10.1.0.0/16"},
		"gateway of v6":      {func(n *Network) { n.Families[0].Gateway = netip.MustParseAddr("fd00::1") }, "is not an address in"},
		"mapped gateway":     {func(n *Network) { n.Families[0].Gateway = netip.MustParseAddr("::ffff:10.1.0.1") }, "is not an address in"},
		"two IPv4 families": {func(n *Network) {
			n.Families = append(n.Families, Family{CIDR: netip.MustParsePrefix("10.2.0.0/16"), Gateway: netip.MustParseAddr("10.2.0.1")})
		}, "a dual-stack network has one IPv4 and one IPv6"},
		"secondary gateway outside": {func(n *Network) {
			n.Families = append(n.Families, Family{CIDR: netip.MustParsePrefix("fd00:1::/64"), Gateway: netip.MustParseAddr("fd00:2::1")})
		}, "gateway fd00:2::1 is not an address in fd00:1::/64"},
		"no family": {func(n *Network) { n.Families = nil }, "0 address families"},
		"three families": {func(n *Network) {
			n.Families = append(n.Families, Family{CIDR: netip.MustParsePrefix("fd00:1::/64"), Gateway: netip.MustParseAddr("fd00:1::1")}, n.Families[0])
		}, "3 address families"},
	} {
		n := good
		n.Families = slices.Clone(good.Families)
		tc.mutate(&n)
		if err := n.Validate(); err == nil || !strings.Contains(err.Error(), tc.errContains) {
			t.Errorf("%s: Validate = %v, want an error containing %q", name, err, tc.errContains)
		}
	}
}

// Observed families are in no order: a dual-stack network matches with
// either family first, and only with exactly its families.
func TestObservedProvides(t *testing.T) {
	v4 := Family{CIDR: netip.MustParsePrefix("10.1.0.0/16"), Gateway: netip.MustParseAddr("10.1.0.1")}
	v6 := Family{CIDR: netip.MustParsePrefix("fd00:1::/64"), Gateway: netip.MustParseAddr("fd00:1::1")}
	dual := Network{Families: []Family{v4, v6}}
	single := Network{Families: []Family{v4}}
	for _, tc := range []struct {
		families []Family
		want     Network
		provides bool
	}{
		{[]Family{v4, v6}, dual, true},
		{[]Family{v6, v4}, dual, true},
		{[]Family{v4}, dual, false},
		{[]Family{v4, v6}, single, false},
		{[]Family{v4}, single, true},
		{nil, single, false},
		{[]Family{{CIDR: v4.CIDR, Gateway: netip.MustParseAddr("10.1.0.2")}}, single, false},
	} {
		if got := (Observed{Families: tc.families}).Provides(tc.want); got != tc.provides {
			t.Errorf("%+v provides %+v: %v, want %v", tc.families, tc.want.Families, got, tc.provides)
		}
	}
}
