package netspec

import (
	"fmt"
	"net/netip"
)

// A reservedPrefix is a special-purpose range that a Network may not use,
// or contain, unless the operator allows reserved prefixes.
type reservedPrefix struct {
	prefix netip.Prefix
	// purpose completes "reserved for ...", with its reference.
	purpose string
	// always: refused even with AllowReserved. The CRD's CEL rules refuse
	// the same ranges (loopback, multicast), so the webhook's message and
	// the schema's never disagree about what is allowed.
	always bool
}

// reserved lists the special-purpose ranges of the IANA IPv4 and IPv6
// Special-Purpose Address Registries (RFC 6890 and its updates), plus
// multicast and IPv6 link-local from the address architecture, that cannot
// be a bridge's network or are dangerous on a node: a bridge carrying one
// would shadow the node's own use of the range (its loopback, the cloud
// metadata service at 169.254.169.254, NAT64, 6to4, Teredo tunnels) or
// could never work (multicast, discard-only, unroutable identifiers).
//
// The ranges that users normally give such networks stay allowed, although
// the same registries list them: private use (10.0.0.0/8, 172.16.0.0/12,
// 192.168.0.0/16, RFC 1918), shared address space (100.64.0.0/10, RFC
// 6598), unique local (fc00::/7, RFC 4193), documentation (192.0.2.0/24,
// 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32, 3fff::/20) and
// benchmarking (198.18.0.0/15, 2001:2::/48): they are ordinary unicast
// ranges that a node does not use itself, and the tutorial's network is
// 192.168.0.0/16. Globally reachable anycast ranges in the registries
// (AS112, AMT, the deprecated 6to4 relay anycast) are allowed as any
// public range is.
//
// The ones refused always come first: when a prefix contains several
// ranges, the first one it contains is named, and that should be the one
// that no flag lets through.
var reserved = []reservedPrefix{
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback (RFC 1122)", true},
	{netip.MustParsePrefix("::1/128"), "loopback (RFC 4291)", true},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast (RFC 5771)", true},
	{netip.MustParsePrefix("ff00::/8"), "multicast (RFC 4291)", true},

	{netip.MustParsePrefix("0.0.0.0/8"), "this-network addresses, the unspecified 0.0.0.0 among them (RFC 791)", false},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local addresses, the cloud metadata service 169.254.169.254 among them (RFC 3927)", false},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments such as DS-Lite (RFC 6890)", false},
	{netip.MustParsePrefix("240.0.0.0/4"), "future use (RFC 1112)", false},
	{netip.MustParsePrefix("255.255.255.255/32"), "the limited broadcast address (RFC 919)", false},

	{netip.MustParsePrefix("::/128"), "the unspecified address (RFC 4291)", false},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible addresses, deprecated (RFC 4291)", false},
	{netip.MustParsePrefix("::ffff:0:0/96"), "IPv4-mapped addresses (RFC 4291)", false},
	{netip.MustParsePrefix("64:ff9b::/96"), "IPv4/IPv6 translation (RFC 6052)", false},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use IPv4/IPv6 translation (RFC 8215)", false},
	{netip.MustParsePrefix("100::/64"), "discard-only traffic (RFC 6666)", false},
	{netip.MustParsePrefix("2001::/32"), "Teredo tunnelling (RFC 4380)", false},
	{netip.MustParsePrefix("2001:1::1/128"), "the PCP anycast address (RFC 7723)", false},
	{netip.MustParsePrefix("2001:1::2/128"), "the TURN anycast address (RFC 8155)", false},
	{netip.MustParsePrefix("2001:1::3/128"), "the DNS-SD service registration anycast address (RFC 9665)", false},
	{netip.MustParsePrefix("2001:10::/28"), "ORCHID identifiers, deprecated and not routable (RFC 4843)", false},
	{netip.MustParsePrefix("2001:20::/28"), "ORCHIDv2 identifiers, not routable (RFC 7343)", false},
	{netip.MustParsePrefix("2001:30::/28"), "drone remote ID entity tags (RFC 9374)", false},
	{netip.MustParsePrefix("2002::/16"), "6to4 tunnelling (RFC 3056)", false},
	{netip.MustParsePrefix("5f00::/16"), "SRv6 segment identifiers (RFC 9602)", false},
	{netip.MustParsePrefix("fe80::/10"), "link-local addresses (RFC 4291)", false},
}

// checkReserved returns why prefix (canonical) may not be used, naming the
// reserved range it is in (the most specific one) or else the first one it
// contains; ok is true when it overlaps none. With allowReserved only the
// ranges refused always count.
func checkReserved(prefix netip.Prefix, allowReserved bool) (msg string, ok bool) {
	var in, contains *reservedPrefix
	for i := range reserved {
		r := &reserved[i]
		if allowReserved && !r.always || !r.prefix.Overlaps(prefix) {
			continue
		}
		// Prefixes that overlap are nested: one contains the other.
		if r.prefix.Bits() <= prefix.Bits() {
			if in == nil || r.prefix.Bits() > in.prefix.Bits() {
				in = r
			}
		} else if contains == nil {
			contains = r
		}
	}
	switch {
	case in != nil:
		return fmt.Sprintf("is in %s, reserved for %s", in.prefix, in.purpose), false
	case contains != nil:
		return fmt.Sprintf("contains %s, reserved for %s", contains.prefix, contains.purpose), false
	}
	return "", true
}
