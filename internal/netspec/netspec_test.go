package netspec

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/netop-dev/netop/pkg/apis/samplecrd"
)

// resolveOne resolves a spec of one family as a v1 client writes it, the
// errors naming v1's fields.
func resolveOne(rv Resolver, cidr, gateway string) (Resolved, field.ErrorList) {
	families, errs := rv.Resolve(&samplecrd.NetworkSpec{CIDRs: []string{cidr}, Gateways: []string{gateway}}, Fields{V1: true})
	if len(errs) > 0 {
		return Resolved{}, errs
	}
	return families[0], nil
}

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		cidr, gateway           string
		prefix, gw, errContains string
		canonical               bool
	}{
		{cidr: "192.168.0.0/16", gateway: "192.168.0.1", prefix: "192.168.0.0/16", gw: "192.168.0.1", canonical: true},
		{cidr: "192.168.1.0/16", gateway: "192.168.1.1", prefix: "192.168.0.0/16", gw: "192.168.1.1"},
		{cidr: "10.0.0.0/8", prefix: "10.0.0.0/8", gw: "10.0.0.1", canonical: true},
		{cidr: "10.0.0.4/30", prefix: "10.0.0.4/30", gw: "10.0.0.5", canonical: true},
		{cidr: "fd00::/126", prefix: "fd00::/126", gw: "fd00::1", canonical: true},
		{cidr: "10.0.0.4/31", errContains: `spec.cidr: Invalid value: "10.0.0.4/31": must leave room for a gateway and at least one host address: use a prefix of /30 or shorter`},
		{cidr: "10.0.0.4/32", errContains: "use a prefix of /30 or shorter"},
		{cidr: "fd00::/127", errContains: "use a prefix of /126 or shorter"},
		{cidr: "fd00::1/128", errContains: "use a prefix of /126 or shorter"},
		{cidr: "fd00::/64", gateway: "fd00::1", prefix: "fd00::/64", gw: "fd00::1", canonical: true},
		{cidr: "fd00::/64", prefix: "fd00::/64", gw: "fd00::1", canonical: true},
		{cidr: "", errContains: "spec.cidr: Required value"},
		{cidr: "10.0.0.0", errContains: "spec.cidr: Invalid value"},
		{cidr: "10.0.0.0/33", errContains: "spec.cidr: Invalid value"},
		{cidr: "::ffff:10.0.0.0/104", errContains: "IPv4-mapped"},
		{cidr: "10.0.0.0/8", gateway: "nope", errContains: "spec.gateway: Invalid value: \"nope\": must be an IP address"},
		{cidr: "10.0.0.0/8", gateway: "fe80::1%eth0", errContains: "spec.gateway: Invalid value"},
		{cidr: "10.0.0.0/8", gateway: "fd00::1", errContains: "same IP family"},
		{cidr: "10.0.0.0/8", gateway: "11.0.0.1", errContains: "inside spec.cidr 10.0.0.0/8"},
		{cidr: "10.0.0.0/8", gateway: "10.0.0.0", errContains: "network address"},
		{cidr: "10.0.0.0/8", gateway: "10.255.255.255", errContains: "broadcast address"},
		{cidr: "fd00::/64", gateway: "fd00::", errContains: "network address"},
		{cidr: "10.0.0.4/30", gateway: "10.0.0.7", errContains: "broadcast address of 10.0.0.4/30"},
	} {
		r, errs := resolveOne(Resolver{}, tc.cidr, tc.gateway)
		if tc.errContains != "" {
			if len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), tc.errContains) {
				t.Errorf("Resolve(%q, %q) = %v, want error containing %q", tc.cidr, tc.gateway, errs, tc.errContains)
			}
			continue
		}
		if len(errs) > 0 {
			t.Errorf("Resolve(%q, %q): %v", tc.cidr, tc.gateway, errs)
			continue
		}
		if r.Prefix.String() != tc.prefix || r.Gateway.String() != tc.gw || r.Canonical != tc.canonical {
			t.Errorf("Resolve(%q, %q) = %s %s canonical=%v, want %s %s %v", tc.cidr, tc.gateway, r.Prefix, r.Gateway, r.Canonical, tc.prefix, tc.gw, tc.canonical)
		}
	}
}

// A spec's errors name its fields as the client's version does: v2's
// items, or v1's fields for the one family a v1 client writes; the lists
// whole as v2 does.
func TestResolveNamesFields(t *testing.T) {
	outside := &samplecrd.NetworkSpec{CIDRs: []string{"10.0.0.0/8"}, Gateways: []string{"11.0.0.1"}}
	for _, tc := range []struct {
		spec   *samplecrd.NetworkSpec
		fields Fields
		want   string
	}{
		{outside, Fields{}, `spec.gateways[0]: Invalid value: "11.0.0.1": must be an address inside spec.cidrs[0] 10.0.0.0/8`},
		{outside, Fields{V1: true}, `spec.gateway: Invalid value: "11.0.0.1": must be an address inside spec.cidr 10.0.0.0/8`},
		{&samplecrd.NetworkSpec{CIDRs: []string{""}}, Fields{V1: true}, "spec.cidr: Required value: an IP prefix such as 192.168.0.0/16"},
		{&samplecrd.NetworkSpec{CIDRs: []string{"10.0.0.0/8", "fd00::/127"}}, Fields{}, `spec.cidrs[1]: Invalid value: "fd00::/127": must leave room`},
		{&samplecrd.NetworkSpec{}, Fields{}, "spec.cidrs: Required value: one or two IP prefixes"},
		{&samplecrd.NetworkSpec{CIDRs: []string{"10.0.0.0/8", "fd00::/64", "10.1.0.0/16"}}, Fields{}, "spec.cidrs: Too many: 3: must have at most 2 items"},
		{&samplecrd.NetworkSpec{CIDRs: []string{"10.0.0.0/8"}, Gateways: []string{"10.0.0.1", "fd00::1"}}, Fields{}, "spec.gateways: Too many: 2: must have at most 1 item"},
		{&samplecrd.NetworkSpec{CIDRs: []string{"10.0.0.0/8", "10.1.0.0/16"}}, Fields{}, `spec.cidrs: Invalid value: ["10.0.0.0/8","10.1.0.0/16"]: must be of different families`},
	} {
		if _, errs := (Resolver{}).Resolve(tc.spec, tc.fields); len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), tc.want) {
			t.Errorf("Resolve(%+v, %+v) = %v, want an error containing %q", tc.spec, tc.fields, errs, tc.want)
		}
	}
}

func FuzzResolve(f *testing.F) {
	for _, s := range [][2]string{{"192.168.0.0/16", "192.168.0.1"}, {"fd00::/64", ""}, {"10.0.0.0/8", "10.255.255.255"},
		{"::/0", ""}, {"169.254.0.0/16", ""}, {"160.0.0.0/3", "169.254.0.1"}, {"fe80::/64", "fe80::1"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, cidr, gateway string) {
		for _, rv := range []Resolver{{}, {AllowReserved: true}} {
			r, errs := resolveOne(rv, cidr, gateway)
			if len(errs) > 0 {
				continue
			}
			gw := r.Gateway
			if !r.Prefix.Contains(gw) || r.Prefix != r.Prefix.Masked() || !hasHostRange(r.Prefix) ||
				gw.IsUnspecified() || gw.IsLoopback() || gw.IsMulticast() || gw == r.Prefix.Addr() || gw.Is4() && gw == LastAddr(r.Prefix) {
				t.Fatalf("%+v.Resolve(%q, %q) accepted %s %s", rv, cidr, gateway, r.Prefix, gw)
			}
			for _, res := range reserved {
				if res.prefix.Overlaps(r.Prefix) && (res.always || !rv.AllowReserved) {
					t.Fatalf("%+v.Resolve(%q, %q) accepted %s, which overlaps the reserved %s", rv, cidr, gateway, r.Prefix, res.prefix)
				}
			}
		}
	})
}

func TestLastAddr(t *testing.T) {
	for _, tc := range []struct{ prefix, want string }{
		{"192.168.0.0/16", "192.168.255.255"},
		{"192.168.1.0/16", "192.168.255.255"}, // host bits set
		{"10.0.0.4/31", "10.0.0.5"},
		{"10.0.0.4/32", "10.0.0.4"},
		{"0.0.0.0/0", "255.255.255.255"},
		{"10.1.2.0/23", "10.1.3.255"},
		{"fd00::/64", "fd00::ffff:ffff:ffff:ffff"},
		{"2001:db8::/33", "2001:db8:7fff:ffff:ffff:ffff:ffff:ffff"},
		{"fd00::1/128", "fd00::1"},
	} {
		if got := LastAddr(netip.MustParsePrefix(tc.prefix)); got != netip.MustParseAddr(tc.want) {
			t.Errorf("LastAddr(%s) = %s, want %s", tc.prefix, got, tc.want)
		}
	}
	if got := LastAddr(netip.Prefix{}); got.IsValid() {
		t.Errorf("LastAddr of the zero Prefix = %s, want the zero Addr", got)
	}
}

// spec.reserved: addresses, prefixes and ranges, each given to the
// family it lies in; what is not one, or lies outside every cidr or
// across one's end, is refused naming the entry.
func TestReserved(t *testing.T) {
	spec := func(reserved ...string) *samplecrd.NetworkSpec {
		return &samplecrd.NetworkSpec{CIDRs: []string{"10.0.0.0/24", "fd00::/64"}, Reserved: reserved}
	}
	families, errs := Resolver{}.Resolve(spec("10.0.0.5", "10.0.0.16/28", "10.0.0.2-10.0.0.20", "fd00::10-fd00::1f", "10.0.0.33/28"), Fields{})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	var got []string
	for _, f := range families {
		for _, r := range f.Reserved {
			got = append(got, f.Prefix.String()+": "+r.String())
		}
	}
	want := "10.0.0.0/24: 10.0.0.5, 10.0.0.0/24: 10.0.0.16-10.0.0.31, 10.0.0.0/24: 10.0.0.2-10.0.0.20, 10.0.0.0/24: 10.0.0.32-10.0.0.47, fd00::/64: fd00::10-fd00::1f"
	slices.Sort(got)
	wantList := strings.Split(want, ", ")
	slices.Sort(wantList)
	if !slices.Equal(got, wantList) {
		t.Errorf("reserved %q, want %q", got, wantList)
	}
	for entry, msg := range map[string]string{
		"10.9.0.5":             `spec.reserved[0]: Invalid value: "10.9.0.5": is outside every cidr (10.0.0.0/24, fd00::/64)`,
		"10.0.0.250-10.0.1.5":  "must lie inside one cidr (10.0.0.0/24, fd00::/64), not cross its end",
		"10.0.0.0/16":          "not cross its end",
		"10.0.0.9-10.0.0.3":    "first address is not after its last",
		"10.0.0.2-fd00::1":     "one IP family",
		"10.0.0.2-":            "a range of two addresses",
		"ten":                  "must be an address, a prefix in CIDR notation, or a range",
		"10.0.0.0/40":          "must be an IP prefix in CIDR notation",
		"::ffff:10.0.0.5":      "must be an address",
		"fe80::1%eth0":         "must be an address",
		"fd00::1:0:0:0-fd01::": "not cross its end",
	} {
		_, errs := Resolver{}.Resolve(spec(entry), Fields{})
		if len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), msg) {
			t.Errorf("reserved %q: %v, want an error containing %q", entry, errs, msg)
		}
	}
}

// spec.routes: each given to the family of its destination, via defaulted
// to that family's gateway; a destination of no family of the Network,
// overlapping it, or twice, and a via outside it, are refused naming the
// field.
func TestRoutes(t *testing.T) {
	spec := func(routes ...samplecrd.NetworkRoute) *samplecrd.NetworkSpec {
		return &samplecrd.NetworkSpec{CIDRs: []string{"10.0.0.0/24"}, Gateways: []string{"10.0.0.1"}, Routes: routes}
	}
	route := func(dst, via string) samplecrd.NetworkRoute {
		return samplecrd.NetworkRoute{Destination: dst, Via: via}
	}
	families, errs := Resolver{}.Resolve(spec(route("10.200.0.0/16", ""), route("192.168.7.1/24", "10.0.0.254")), Fields{})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := fmt.Sprint(families[0].Routes); got != "[{10.200.0.0/16 10.0.0.1} {192.168.7.0/24 10.0.0.254}]" {
		t.Errorf("routes %s", got)
	}
	for _, tc := range []struct {
		routes []samplecrd.NetworkRoute
		want   string
	}{
		{[]samplecrd.NetworkRoute{route("fd00::/64", "")}, `spec.routes[0].destination: Invalid value: "fd00::/64": has no cidr of its IP family in spec.cidrs`},
		{[]samplecrd.NetworkRoute{route("10.0.0.0/16", "")}, `spec.routes[0].destination: Invalid value: "10.0.0.0/16": must not overlap the Network's cidr 10.0.0.0/24`},
		{[]samplecrd.NetworkRoute{route("0.0.0.0/0", "")}, "must not overlap the Network's cidr"},
		{[]samplecrd.NetworkRoute{route("10.0.0.128/25", "")}, "must not overlap"},
		{[]samplecrd.NetworkRoute{route("10.200.0.0/16", ""), route("10.200.1.0/16", "")}, `spec.routes[1].destination: Duplicate value: "10.200.1.0/16"`},
		{[]samplecrd.NetworkRoute{route("nope", "")}, "spec.routes[0].destination: Invalid value: \"nope\": must be an IP prefix"},
		{[]samplecrd.NetworkRoute{route("10.200.0.0/16", "10.9.0.1")}, `spec.routes[0].via: Invalid value: "10.9.0.1": must be an address of the Network, inside its cidr 10.0.0.0/24`},
		{[]samplecrd.NetworkRoute{route("10.200.0.0/16", "10.0.0.255")}, "spec.routes[0].via: Invalid value: \"10.0.0.255\": must not be the broadcast address"},
		{[]samplecrd.NetworkRoute{route("10.200.0.0/16", "x")}, "spec.routes[0].via: Invalid value: \"x\": must be an IP address"},
	} {
		_, errs := Resolver{}.Resolve(spec(tc.routes...), Fields{})
		if len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), tc.want) {
			t.Errorf("routes %v: %v, want an error containing %q", tc.routes, errs, tc.want)
		}
	}
}

// An IPv6 Network's MTU is at least IPv6's minimum link MTU.
func TestMTUOfIPv6(t *testing.T) {
	if _, errs := (Resolver{}).Resolve(&samplecrd.NetworkSpec{CIDRs: []string{"10.0.0.0/24", "fd00::/64"}, MTU: 1000}, Fields{}); len(errs) == 0 ||
		!strings.Contains(errs.ToAggregate().Error(), "spec.mtu: Invalid value: 1000: must be at least 1280 on a Network with an IPv6 cidr") {
		t.Errorf("IPv6 with MTU 1000: %v", errs)
	}
	if _, errs := (Resolver{}).Resolve(&samplecrd.NetworkSpec{CIDRs: []string{"10.0.0.0/24"}, MTU: 1000}, Fields{}); len(errs) > 0 {
		t.Errorf("IPv4 with MTU 1000: %v", errs)
	}
}
