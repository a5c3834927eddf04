// Package netspec turns a Network's spec into the exact network a backend
// makes: the canonical prefix and the gateway. The controllers and the
// admission webhook all use it, so that they never disagree about what a
// spec means or why it is invalid. It reads the hub's spec, which every
// API version converts through, and no version's own.
package netspec

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/netop-dev/netop/internal/ipam"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
)

// Paths are immutable: Index and Child make new ones.
var (
	cidrsPath, gatewaysPath   = field.NewPath("spec", "cidrs"), field.NewPath("spec", "gateways")
	v1CIDRPath, v1GatewayPath = field.NewPath("spec", "cidr"), field.NewPath("spec", "gateway")
)

// Resolved is a spec as a backend uses it.
type Resolved struct {
	// Prefix is canonical: host bits zero. 192.168.1.0/16 resolves to
	// 192.168.0.0/16, as the tutorial's update step expects.
	Prefix netip.Prefix
	// Gateway is spec.gateway, or the first usable address when it is empty.
	Gateway netip.Addr
	// Canonical reports whether spec.cidr was already written canonically.
	Canonical bool
	// Reserved are the ranges of spec.reserved inside Prefix (v2 only).
	Reserved []ipam.Range
	// Routes are the routes of spec.routes of Prefix's family, their via
	// defaulted to Gateway (v2 only).
	Routes []Route
}

// Route is a route handed to pods: to Destination through Via.
type Route struct {
	Destination netip.Prefix
	Via         netip.Addr
}

// Resolver resolves specs under a policy. Its zero value is the default
// policy: special-purpose prefixes (see reserved.go) are refused.
type Resolver struct {
	// AllowReserved lets the special-purpose prefixes through that the
	// operator may knowingly use (--allow-reserved-prefixes). Loopback and
	// multicast, and the prefixes that contain them (a /0 among them),
	// stay refused: they can never be a bridge's network, and the CRD's
	// CEL rules refuse them too.
	AllowReserved bool
}

// Fields name a spec's fields in errors as the client's version does. The
// zero value names them as v2 does, by item (spec.cidrs[1]); V1 names the
// family as v1 does (spec.cidr, spec.gateway), for a spec of one family,
// which is all a v1 client writes.
type Fields struct{ V1 bool }

// CIDR is the path of the i-th family's cidr.
func (f Fields) CIDR(i int) *field.Path {
	if f.V1 {
		return v1CIDRPath
	}
	return cidrsPath.Index(i)
}

// Gateway is the path of the i-th family's gateway.
func (f Fields) Gateway(i int) *field.Path {
	if f.V1 {
		return v1GatewayPath
	}
	return gatewaysPath.Index(i)
}

// Resolve checks a Network's spec, in the form of the hub that every
// version converts through, and resolves each of its families, in the
// order of spec.cidrs: at most one IPv4 and one IPv6. The errors name the
// field, as fields says, and the reason. It is the one reading of a spec:
// admission, the Network controller and the allocator all ask it.
func (rv Resolver) Resolve(spec *samplecrd.NetworkSpec, fields Fields) (Families, field.ErrorList) {
	switch {
	case len(spec.CIDRs) == 0:
		return nil, field.ErrorList{field.Required(cidrsPath, "one or two IP prefixes, such as 192.168.0.0/16")}
	case len(spec.CIDRs) > 2:
		return nil, field.ErrorList{field.TooMany(cidrsPath, len(spec.CIDRs), 2)}
	case len(spec.Gateways) > len(spec.CIDRs):
		return nil, field.ErrorList{field.TooMany(gatewaysPath, len(spec.Gateways), len(spec.CIDRs))}
	}
	families := make(Families, 0, len(spec.CIDRs))
	for i, cidr := range spec.CIDRs {
		gateway := ""
		if i < len(spec.Gateways) {
			gateway = spec.Gateways[i]
		}
		r, errs := rv.resolve(cidr, gateway, fields, i)
		if len(errs) > 0 {
			return nil, errs
		}
		families = append(families, r)
	}
	if len(families) == 2 && families[0].Prefix.Addr().Is4() == families[1].Prefix.Addr().Is4() {
		return nil, field.ErrorList{field.Invalid(cidrsPath, spec.CIDRs, "must be of different families: one IPv4 and one IPv6")}
	}
	errs := families.reserve(spec.Reserved)
	if spec.MTU != 0 && spec.MTU < 1280 && slices.ContainsFunc(families, func(f Resolved) bool { return f.Prefix.Addr().Is6() }) {
		errs = append(errs, field.Invalid(field.NewPath("spec", "mtu"), spec.MTU, "must be at least 1280 on a Network with an IPv6 cidr: IPv6 needs it of every link"))
	}
	errs = append(errs, families.route(spec.Routes)...)
	if len(errs) > 0 {
		return nil, errs
	}
	return families, nil
}

// route gives each family the routes of spec.routes of its IP version.
func (f Families) route(routes []samplecrd.NetworkRoute) field.ErrorList {
	if len(routes) == 0 {
		return nil
	}
	var errs field.ErrorList
	path := field.NewPath("spec", "routes")
	seen := map[netip.Prefix]bool{}
	for i, r := range routes {
		dstPath, viaPath := path.Index(i).Child("destination"), path.Index(i).Child("via")
		dst, err := netip.ParsePrefix(r.Destination)
		if err != nil || dst.Addr().Is4In6() || dst.Addr().Zone() != "" {
			errs = append(errs, field.Invalid(dstPath, r.Destination, "must be an IP prefix in CIDR notation, such as 10.200.0.0/16"))
			continue
		}
		dst = dst.Masked()
		j := slices.IndexFunc(f, func(family Resolved) bool { return family.Prefix.Addr().Is4() == dst.Addr().Is4() })
		switch {
		case j < 0:
			errs = append(errs, field.Invalid(dstPath, r.Destination, "has no cidr of its IP family in spec.cidrs to be reached through"))
			continue
		case dst.Overlaps(f[j].Prefix):
			errs = append(errs, field.Invalid(dstPath, r.Destination, fmt.Sprintf("must not overlap the Network's cidr %s, whose addresses are on the link already", f[j].Prefix)))
			continue
		case seen[dst]:
			errs = append(errs, field.Duplicate(dstPath, r.Destination))
			continue
		}
		seen[dst] = true
		via := f[j].Gateway
		if r.Via != "" {
			via, err = netip.ParseAddr(r.Via)
			switch {
			case err != nil || via.Zone() != "":
				errs = append(errs, field.Invalid(viaPath, r.Via, "must be an IP address, such as 10.0.0.254"))
				continue
			case !f[j].Prefix.Contains(via):
				errs = append(errs, field.Invalid(viaPath, r.Via, fmt.Sprintf("must be an address of the Network, inside its cidr %s", f[j].Prefix)))
				continue
			}
			if msg := checkGateway(f[j].Prefix, via); msg != "" {
				errs = append(errs, field.Invalid(viaPath, r.Via, msg))
				continue
			}
		}
		f[j].Routes = append(f[j].Routes, Route{Destination: dst, Via: via})
	}
	return errs
}

// reserve gives each family the entries of spec.reserved inside it.
func (f Families) reserve(entries []string) field.ErrorList {
	if len(entries) == 0 {
		return nil
	}
	var errs field.ErrorList
	path := field.NewPath("spec", "reserved")
	for i, entry := range entries {
		r, err := ParseRange(entry)
		if err != nil {
			errs = append(errs, field.Invalid(path.Index(i), entry, err.Error()))
			continue
		}
		j := slices.IndexFunc(f, func(family Resolved) bool { return family.Prefix.Contains(r.First) && family.Prefix.Contains(r.Last) })
		if j < 0 {
			msg := "is outside every cidr (" + strings.Join(f.CIDRs(), ", ") + ")"
			if slices.ContainsFunc(f, func(family Resolved) bool { return family.Prefix.Contains(r.First) || family.Prefix.Contains(r.Last) }) {
				msg = "must lie inside one cidr (" + strings.Join(f.CIDRs(), ", ") + "), not cross its end"
			}
			errs = append(errs, field.Invalid(path.Index(i), entry, msg))
			continue
		}
		f[j].Reserved = append(f[j].Reserved, r)
	}
	return errs
}

// ParseRange reads an entry of spec.reserved: an address (10.0.0.5), a
// prefix (10.0.0.16/28; host bits set mean the prefix that holds them, as
// in spec.cidrs) or a range first-last (10.0.0.2-10.0.0.20) of one family.
func ParseRange(entry string) (ipam.Range, error) {
	if first, last, ok := strings.Cut(entry, "-"); ok {
		a, errA := netip.ParseAddr(first)
		b, errB := netip.ParseAddr(last)
		switch {
		case errA != nil || errB != nil || a.Zone() != "" || b.Zone() != "":
			return ipam.Range{}, errors.New("must be a range of two addresses, first-last, such as 10.0.0.2-10.0.0.20")
		case a.Is4() != b.Is4() || a.Is4In6() || b.Is4In6():
			return ipam.Range{}, errors.New("must be a range of one IP family")
		case b.Less(a):
			return ipam.Range{}, errors.New("must be a range whose first address is not after its last")
		}
		return ipam.Range{First: a, Last: b}, nil
	}
	if strings.Contains(entry, "/") {
		p, err := netip.ParsePrefix(entry)
		if err != nil || p.Addr().Is4In6() {
			return ipam.Range{}, errors.New("must be an IP prefix in CIDR notation, such as 10.0.0.16/28")
		}
		p = p.Masked()
		return ipam.Range{First: p.Addr(), Last: LastAddr(p)}, nil
	}
	a, err := netip.ParseAddr(entry)
	if err != nil || a.Zone() != "" || a.Is4In6() {
		return ipam.Range{}, errors.New("must be an address, a prefix in CIDR notation, or a range first-last such as 10.0.0.2-10.0.0.20")
	}
	return ipam.Range{First: a, Last: a}, nil
}

// ParsePrefixes parses cidrs as written, masked, leaving out those that do
// not parse: what a Network may hold, whatever today's rules say of it.
func ParsePrefixes(cidrs ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, cidr := range cidrs {
		if p, err := netip.ParsePrefix(cidr); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// Families are a spec's families as a backend uses them, in the order
// of spec.cidrs: the primary first.
type Families []Resolved

// Prefixes are the families' prefixes.
func (f Families) Prefixes() []netip.Prefix {
	out := make([]netip.Prefix, len(f))
	for i, r := range f {
		out[i] = r.Prefix
	}
	return out
}

// CIDRs and Gateways are the families' prefixes and gateways as status
// shows them.
func (f Families) CIDRs() []string {
	out := make([]string, len(f))
	for i, r := range f {
		out[i] = r.Prefix.String()
	}
	return out
}

// Gateways are the families' gateways, as status shows them.
func (f Families) Gateways() []string {
	out := make([]string, len(f))
	for i, r := range f {
		out[i] = r.Gateway.String()
	}
	return out
}

// String says what the families are, for messages: "10.1.0.0/16 with
// gateway 10.1.0.1 and fd00::/64 with gateway fd00::1".
func (f Families) String() string {
	parts := make([]string, len(f))
	for i, r := range f {
		parts[i] = r.Prefix.String() + " with gateway " + r.Gateway.String()
	}
	return strings.Join(parts, " and ")
}

// resolve checks the i-th family, its errors naming its fields as fields
// does.
func (rv Resolver) resolve(cidr, gateway string, fields Fields, i int) (Resolved, field.ErrorList) {
	var r Resolved
	if cidr == "" {
		return r, field.ErrorList{field.Required(fields.CIDR(i), "an IP prefix such as 192.168.0.0/16")}
	}
	prefix, err := netip.ParsePrefix(cidr)
	if err != nil {
		return r, field.ErrorList{field.Invalid(fields.CIDR(i), cidr, "must be an IPv4 or IPv6 prefix in CIDR notation, such as 192.168.0.0/16")}
	}
	if prefix.Addr().Is4In6() {
		return r, field.ErrorList{field.Invalid(fields.CIDR(i), cidr, "must not be an IPv4-mapped IPv6 prefix; write the IPv4 prefix")}
	}
	r.Prefix = prefix.Masked()
	r.Canonical = r.Prefix == prefix
	if msg, ok := checkReserved(r.Prefix, rv.AllowReserved); !ok {
		return r, field.ErrorList{field.Invalid(fields.CIDR(i), cidr, msg)}
	}
	if !hasHostRange(r.Prefix) {
		shortest := "/30"
		if r.Prefix.Addr().Is6() {
			shortest = "/126"
		}
		return r, field.ErrorList{field.Invalid(fields.CIDR(i), cidr,
			fmt.Sprintf("must leave room for a gateway and at least one host address: use a prefix of %s or shorter", shortest))}
	}

	if gateway == "" {
		gw, ok := FirstUsable(r.Prefix)
		if !ok || checkGateway(r.Prefix, gw) != "" {
			return r, field.ErrorList{field.Invalid(fields.CIDR(i), cidr, "has no usable address for a gateway")}
		}
		r.Gateway = gw
		return r, nil
	}
	gw, err := netip.ParseAddr(gateway)
	if err != nil || gw.Zone() != "" {
		return r, field.ErrorList{field.Invalid(fields.Gateway(i), gateway, "must be an IP address, such as 192.168.0.1")}
	}
	switch {
	case gw.Is4() != r.Prefix.Addr().Is4():
		return r, field.ErrorList{field.Invalid(fields.Gateway(i), gateway, fmt.Sprintf("must be of the same IP family as %s %s", fields.CIDR(i), cidr))}
	case !r.Prefix.Contains(gw):
		return r, field.ErrorList{field.Invalid(fields.Gateway(i), gateway, fmt.Sprintf("must be an address inside %s %s", fields.CIDR(i), r.Prefix))}
	}
	if msg := checkGateway(r.Prefix, gw); msg != "" {
		return r, field.ErrorList{field.Invalid(fields.Gateway(i), gateway, msg)}
	}
	r.Gateway = gw
	return r, nil
}

// checkGateway returns why gw, an address of prefix, can never be the
// gateway of prefix, or "". Defaulting asks it too, so that it never picks
// such an address.
func checkGateway(prefix netip.Prefix, gw netip.Addr) string {
	switch {
	case gw.IsUnspecified():
		return "must not be the unspecified address"
	case gw.IsLoopback():
		return "must not be a loopback address: no interface but lo can carry it"
	case gw.IsMulticast():
		return "must not be a multicast address: an interface cannot carry it as its address"
	case gw == prefix.Addr():
		return fmt.Sprintf("must not be the network address of %s", prefix)
	case gw.Is4() && gw == LastAddr(prefix):
		return fmt.Sprintf("must not be the broadcast address of %s", prefix)
	case gw.IsLinkLocalUnicast() && !isLinkLocal(prefix):
		return fmt.Sprintf("must not be a link-local address: %s is not a link-local prefix", prefix)
	}
	return ""
}

// isLinkLocal reports whether prefix lies inside 169.254.0.0/16 or
// fe80::/10.
func isLinkLocal(prefix netip.Prefix) bool {
	return prefix.Addr().IsLinkLocalUnicast() && prefix.Bits() >= linkLocalBits(prefix.Addr())
}

func linkLocalBits(a netip.Addr) int {
	if a.Is4() {
		return 16
	}
	return 10
}

// FirstUsable returns the first address of prefix that a host may use, the
// one after the network address; ok is false for prefixes without room for
// a gateway and a host (IPv4 /31 and /32, IPv6 /127 and /128).
func FirstUsable(prefix netip.Prefix) (addr netip.Addr, ok bool) {
	prefix = prefix.Masked()
	if !prefix.IsValid() || !hasHostRange(prefix) {
		return netip.Addr{}, false
	}
	return prefix.Addr().Next(), true
}

// hasHostRange reports whether prefix has room for its network address
// (and, for IPv4, its broadcast address), a gateway and at least one host:
// IPv4 /30 or shorter, IPv6 /126 or shorter. Resolve refuses the others:
// /31 and /127 point-to-point links and single addresses are not networks a
// bridge serves.
func hasHostRange(prefix netip.Prefix) bool {
	return prefix.Addr().BitLen()-prefix.Bits() >= 2
}

// LastAddr returns the highest address of prefix, the broadcast address of
// an IPv4 prefix, or the zero Addr for an invalid prefix. Host bits set in
// prefix do not matter.
func LastAddr(prefix netip.Prefix) netip.Addr {
	if !prefix.IsValid() {
		return netip.Addr{}
	}
	b := prefix.Addr().AsSlice()
	for i := prefix.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
