package netspec

import (
	"fmt"
	"strings"
	"testing"

	"github.com/netop-dev/netop/pkg/apis/samplecrd"
)

// Every reserved range is refused, by default, with its purpose; a prefix
// that contains one is refused naming it; with AllowReserved only the
// ranges the CRD refuses too (loopback, multicast, and what contains them)
// stay refused.
func TestReservedPrefixes(t *testing.T) {
	strict, allowing := Resolver{}, Resolver{AllowReserved: true}
	for _, r := range reserved {
		cidr := r.prefix.String()
		want := fmt.Sprintf(`spec.cidr: Invalid value: %q: is in %s, reserved for %s`, cidr, r.prefix, r.purpose)
		if r.prefix.Addr().Is4In6() {
			want = fmt.Sprintf(`spec.cidr: Invalid value: %q: must not be an IPv4-mapped IPv6 prefix; write the IPv4 prefix`, cidr)
		}
		if _, errs := resolveOne(strict, cidr, ""); errs.ToAggregate() == nil || errs.ToAggregate().Error() != want {
			t.Errorf("Resolve(%s) = %v, want %s", cidr, errs, want)
		}
		_, errs := resolveOne(allowing, cidr, "")
		// Single addresses are refused anyway (no room for a host), and so
		// are ranges that contain one refused always.
		wantRefused := r.always || !hasHostRange(r.prefix) || r.prefix.Addr().Is4In6()
		for _, other := range reserved {
			wantRefused = wantRefused || other.always && other.prefix.Overlaps(r.prefix)
		}
		if wantRefused != (len(errs) > 0) {
			t.Errorf("AllowReserved: Resolve(%s) = %v, want refused: %v", cidr, errs, wantRefused)
		}
	}

	for _, tc := range []struct {
		cidr, gateway string
		// want is the error by default, wantAllowed with AllowReserved;
		// "" for accepted.
		want, wantAllowed string
	}{
		// The special-purpose ranges every Network must avoid.
		{cidr: "0.0.0.0/0", want: "contains 127.0.0.0/8, reserved for loopback (RFC 1122)", wantAllowed: "contains 127.0.0.0/8, reserved for loopback"},
		{cidr: "::/0", want: "contains ::1/128, reserved for loopback (RFC 4291)", wantAllowed: "contains ::1/128, reserved for loopback"},
		{cidr: "127.0.0.0/8", want: `spec.cidr: Invalid value: "127.0.0.0/8": is in 127.0.0.0/8, reserved for loopback (RFC 1122)`, wantAllowed: "is in 127.0.0.0/8"},
		{cidr: "127.1.2.0/24", want: "is in 127.0.0.0/8, reserved for loopback", wantAllowed: "is in 127.0.0.0/8"},
		{cidr: "169.254.0.0/16", want: "is in 169.254.0.0/16, reserved for link-local addresses, the cloud metadata service 169.254.169.254 among them (RFC 3927)"},
		{cidr: "169.254.169.0/24", want: "is in 169.254.0.0/16, reserved for link-local"},
		{cidr: "224.0.0.0/4", want: "is in 224.0.0.0/4, reserved for multicast (RFC 5771)", wantAllowed: "multicast"},
		{cidr: "239.1.0.0/16", want: "is in 224.0.0.0/4, reserved for multicast", wantAllowed: "multicast"},
		{cidr: "240.0.0.0/4", want: "is in 240.0.0.0/4, reserved for future use (RFC 1112)"},
		{cidr: "255.255.255.255/32", want: "is in 255.255.255.255/32, reserved for the limited broadcast address (RFC 919)",
			wantAllowed: "use a prefix of /30 or shorter"},
		{cidr: "255.255.255.0/24", want: "is in 240.0.0.0/4, reserved for future use"},
		{cidr: "0.0.0.0/8", want: "is in 0.0.0.0/8, reserved for this-network addresses"},
		{cidr: "ff00::/8", want: "is in ff00::/8, reserved for multicast (RFC 4291)", wantAllowed: "multicast"},
		{cidr: "ff02::/16", want: "is in ff00::/8, reserved for multicast", wantAllowed: "multicast"},
		{cidr: "::1/128", want: "is in ::1/128, reserved for loopback (RFC 4291)", wantAllowed: "loopback"},
		{cidr: "::/127", want: "is in ::/96, reserved for IPv4-compatible addresses", wantAllowed: "contains ::1/128, reserved for loopback"},
		{cidr: "fe80::/10", want: "is in fe80::/10, reserved for link-local addresses (RFC 4291)"},
		{cidr: "fe80::/64", want: "is in fe80::/10, reserved for link-local addresses"},
		// Prefixes that contain reserved ranges.
		{cidr: "128.0.0.0/1", want: "contains 224.0.0.0/4, reserved for multicast (RFC 5771)", wantAllowed: "contains 224.0.0.0/4"},
		{cidr: "0.0.0.0/1", want: "contains 127.0.0.0/8, reserved for loopback", wantAllowed: "contains 127.0.0.0/8"},
		{cidr: "192.0.0.0/16", want: "contains 192.0.0.0/24, reserved for IETF protocol assignments"},
		{cidr: "160.0.0.0/3", want: "contains 169.254.0.0/16, reserved for link-local"},
		{cidr: "::/64", want: "contains ::1/128, reserved for loopback", wantAllowed: "contains ::1/128"},
		{cidr: "::/80", want: "contains ::1/128, reserved for loopback", wantAllowed: "contains ::1/128"},
		{cidr: "64::/16", want: "contains 64:ff9b::/96, reserved for IPv4/IPv6 translation (RFC 6052)"},
		{cidr: "2001::/16", want: "contains 2001::/32, reserved for Teredo tunnelling (RFC 4380)"},
		{cidr: "2001:1::/64", want: "contains 2001:1::1/128, reserved for the PCP anycast address (RFC 7723)"},
		{cidr: "2000::/3", want: "contains 2001::/32, reserved for Teredo tunnelling"},
		{cidr: "fe00::/7", want: "contains ff00::/8, reserved for multicast", wantAllowed: "contains ff00::/8"},
		{cidr: "100::/64", want: "is in 100::/64, reserved for discard-only traffic (RFC 6666)"},
		{cidr: "2002:a00::/24", want: "is in 2002::/16, reserved for 6to4 tunnelling (RFC 3056)"},
		{cidr: "::ffff:0:0/96", want: "IPv4-mapped", wantAllowed: "IPv4-mapped"},

		// What users give their networks stays allowed.
		{cidr: "192.168.0.0/16", gateway: "192.168.0.1"},
		{cidr: "192.168.1.0/16"},
		{cidr: "10.0.0.0/8"},
		{cidr: "10.12.0.0/16"},
		{cidr: "172.16.0.0/12"},
		{cidr: "172.31.255.0/24"},
		{cidr: "100.64.0.0/10"},
		{cidr: "192.0.2.0/24"},
		{cidr: "198.51.100.0/24"},
		{cidr: "203.0.113.0/24"},
		{cidr: "198.18.0.0/15"},
		{cidr: "192.0.1.0/24"},
		{cidr: "192.0.0.0/30", want: "is in 192.0.0.0/24, reserved for IETF protocol assignments such as DS-Lite (RFC 6890)"},
		{cidr: "126.0.0.0/8"},
		{cidr: "128.0.0.0/8"},
		{cidr: "223.255.255.0/24"},
		{cidr: "169.253.0.0/16"},
		{cidr: "1.0.0.0/8"},
		{cidr: "fd00::/8"},
		{cidr: "fd00:1:2::/64"},
		{cidr: "fc00::/7"},
		{cidr: "2001:db8::/64"},
		{cidr: "2001:db8::/32"},
		{cidr: "3fff::/20"},
		{cidr: "2001:2::/48"},
		{cidr: "2a00::/12"},
		{cidr: "fe7f::/16"},
		{cidr: "febf:ffff::/32", want: "is in fe80::/10, reserved for link-local"},
		{cidr: "fec0::/10"},

		// Gateways that can never be assigned, and never defaulted.
		{cidr: "10.0.0.0/8", gateway: "10.255.255.255", want: "spec.gateway: Invalid value: \"10.255.255.255\": must not be the broadcast address of 10.0.0.0/8",
			wantAllowed: "broadcast address"},
		{cidr: "0.0.0.0/8", gateway: "0.0.0.0", want: "is in 0.0.0.0/8", wantAllowed: "spec.gateway: Invalid value: \"0.0.0.0\": must not be the unspecified address"},
		{cidr: "240.0.0.0/4", gateway: "255.255.255.255", want: "is in 240.0.0.0/4", wantAllowed: "must not be the broadcast address of 240.0.0.0/4"},
		{cidr: "160.0.0.0/3", gateway: "169.254.0.1", want: "contains 169.254.0.0/16",
			wantAllowed: "spec.gateway: Invalid value: \"169.254.0.1\": must not be a link-local address: 160.0.0.0/3 is not a link-local prefix"},
		{cidr: "160.0.0.0/3", gateway: "169.254.169.254", want: "contains 169.254.0.0/16", wantAllowed: "must not be a link-local address"},
		{cidr: "fd00::/64", gateway: "::1", want: "spec.gateway: Invalid value: \"::1\": must be an address inside spec.cidr fd00::/64", wantAllowed: "inside spec.cidr"},
		{cidr: "fd00::/64", gateway: "ff02::1", want: "inside spec.cidr", wantAllowed: "inside spec.cidr"},
		{cidr: "fd00::/64", gateway: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", want: "inside spec.cidr", wantAllowed: "inside spec.cidr"},
		{cidr: "169.254.0.0/16", gateway: "169.254.0.1", want: "is in 169.254.0.0/16"},
		{cidr: "fe80::/64", gateway: "fe80::1", want: "is in fe80::/10"},
		{cidr: "fe80::/64", want: "is in fe80::/10"},
	} {
		for _, c := range []struct {
			rv   Resolver
			want string
		}{{strict, tc.want}, {allowing, tc.wantAllowed}} {
			r, errs := resolveOne(c.rv, tc.cidr, tc.gateway)
			switch {
			case c.want == "" && len(errs) > 0:
				t.Errorf("%+v.Resolve(%q, %q): %v", c.rv, tc.cidr, tc.gateway, errs)
			case c.want != "" && (len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), c.want)):
				t.Errorf("%+v.Resolve(%q, %q) = %s %s, %v; want an error containing %q", c.rv, tc.cidr, tc.gateway, r.Prefix, r.Gateway, errs, c.want)
			case c.want == "" && tc.gateway == "" && r.Gateway != r.Prefix.Addr().Next():
				t.Errorf("%+v.Resolve(%q) defaulted the gateway to %s", c.rv, tc.cidr, r.Gateway)
			}
		}
	}
}

// Resolve runs on every admission, and on each version of a Network in
// the controllers.
func BenchmarkResolve(b *testing.B) {
	for _, spec := range []samplecrd.NetworkSpec{
		{CIDRs: []string{"192.168.0.0/16"}, Gateways: []string{"192.168.0.1"}},
		{CIDRs: []string{"fd00:1:2::/64"}},
		{CIDRs: []string{"0.0.0.0/0"}},
	} {
		b.Run(spec.CIDRs[0], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = Resolver{}.Resolve(&spec, Fields{V1: true})
			}
		})
	}
}

// A dual-stack Network with reserved ranges and a route, as v2 writes it.
func BenchmarkResolveDualStack(b *testing.B) {
	spec := samplecrd.NetworkSpec{CIDRs: []string{"10.80.0.0/16", "fd80::/64"}, Reserved: []string{"10.80.0.200-10.80.0.209", "fd80::100/120"},
		Routes: []samplecrd.NetworkRoute{{Destination: "10.99.0.0/16"}}}
	b.ReportAllocs()
	for b.Loop() {
		if _, errs := (Resolver{}).Resolve(&spec, Fields{}); len(errs) > 0 {
			b.Fatal(errs)
		}
	}
}
