package backend

import (
	"net/netip"
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
	for _, bad := range []string{"", "netop:", "netop:a/b", "other:a/b/c", "netop:a/b/"} {
		if _, ok := ParseRecord(bad); ok {
			t.Errorf("ParseRecord(%q) accepted", bad)
		}
	}
}

func TestNetworkValidate(t *testing.T) {
	good := Network{
		Owner:   Owner{Namespace: "ns", Name: "n", UID: "9ec99581-a593-4fcf-a774-4ded5666c744"},
		CIDR:    netip.MustParsePrefix("10.1.0.0/16"),
		Gateway: netip.MustParseAddr("10.1.0.1"),
	}
	if err := good.Validate(); err != nil {
		t.Fatalf("Validate(%+v) = %v", good, err)
	}
	v6 := good
	v6.CIDR, v6.Gateway = netip.MustParsePrefix("fd00:1::/64"), netip.MustParseAddr("fd00:1::1")
	if err := v6.Validate(); err != nil {
		t.Errorf("Validate(%+v) = %v", v6, err)
	}
	for name, tc := range map[string]struct {
		mutate      func(n *Network)
		errContains string
	}{
		"empty UID":          {func(n *Network) { n.UID = "" }, "missing owner UID"},
		"zero CIDR":          {func(n *Network) { n.CIDR = netip.Prefix{} }, "invalid CIDR"},
		"mapped IPv6 prefix": {func(n *Network) { n.CIDR = netip.MustParsePrefix("::ffff:10.1.0.0/112") }, "IPv4-mapped"},
		"host bits":          {func(n *Network) { n.CIDR = netip.MustParsePrefix("10.1.2.0/16") }, "did you mean 10.1.0.0/16?"},
		"zero gateway":       {func(n *Network) { n.Gateway = netip.Addr{} }, "is not an address in"},
		"gateway outside":    {func(n *Network) { n.Gateway = netip.MustParseAddr("10.2.0.1") }, "gateway 10.2.0.1 is not an address in 10.1.0.0/16"},
		"gateway of v6":      {func(n *Network) { n.Gateway = netip.MustParseAddr("fd00::1") }, "is not an address in"},
		"mapped gateway":     {func(n *Network) { n.Gateway = netip.MustParseAddr("::ffff:10.1.0.1") }, "is not an address in"},
	} {
		n := good
		tc.mutate(&n)
		if err := n.Validate(); err == nil || !strings.Contains(err.Error(), tc.errContains) {
			t.Errorf("%s: Validate = %v, want an error containing %q", name, err, tc.errContains)
		}
	}
}
