// Package netspec turns a Network's spec into the exact network a backend
// makes: the canonical prefix and the gateway. The controller and the
// admission webhook both use it, so that they never disagree about what a
// spec means or why it is invalid.
package netspec

import (
	"fmt"
	"net/netip"

	"k8s.io/apimachinery/pkg/util/validation/field"

	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
)

var (
	cidrPath    = field.NewPath("spec", "cidr")
	gatewayPath = field.NewPath("spec", "gateway")
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
}

// Resolve checks spec and resolves it. The errors name the field and the
// reason.
func Resolve(spec samplecrdv1.NetworkSpec) (Resolved, field.ErrorList) {
	var r Resolved
	if spec.CIDR == "" {
		return r, field.ErrorList{field.Required(cidrPath, "an IP prefix such as 192.168.0.0/16")}
	}
	prefix, err := netip.ParsePrefix(spec.CIDR)
	if err != nil {
		return r, field.ErrorList{field.Invalid(cidrPath, spec.CIDR, "must be an IPv4 or IPv6 prefix in CIDR notation, such as 192.168.0.0/16")}
	}
	if prefix.Addr().Is4In6() {
		return r, field.ErrorList{field.Invalid(cidrPath, spec.CIDR, "must not be an IPv4-mapped IPv6 prefix; write the IPv4 prefix")}
	}
	r.Prefix = prefix.Masked()
	r.Canonical = r.Prefix == prefix

	if spec.Gateway == "" {
		gw, ok := FirstUsable(r.Prefix)
		if !ok {
			return r, field.ErrorList{field.Invalid(cidrPath, spec.CIDR, "has no usable address for a gateway")}
		}
		r.Gateway = gw
		return r, nil
	}
	gw, err := netip.ParseAddr(spec.Gateway)
	if err != nil || gw.Zone() != "" {
		return r, field.ErrorList{field.Invalid(gatewayPath, spec.Gateway, "must be an IP address, such as 192.168.0.1")}
	}
	switch {
	case gw.Is4() != r.Prefix.Addr().Is4():
		return r, field.ErrorList{field.Invalid(gatewayPath, spec.Gateway, fmt.Sprintf("must be of the same IP family as spec.cidr %s", spec.CIDR))}
	case !r.Prefix.Contains(gw):
		return r, field.ErrorList{field.Invalid(gatewayPath, spec.Gateway, fmt.Sprintf("must be an address inside spec.cidr %s", r.Prefix))}
	case hasHostRange(r.Prefix) && gw == r.Prefix.Addr():
		return r, field.ErrorList{field.Invalid(gatewayPath, spec.Gateway, fmt.Sprintf("must not be the network address of %s", r.Prefix))}
	case gw.Is4() && hasHostRange(r.Prefix) && gw == LastAddr(r.Prefix):
		return r, field.ErrorList{field.Invalid(gatewayPath, spec.Gateway, fmt.Sprintf("must not be the broadcast address of %s", r.Prefix))}
	}
	r.Gateway = gw
	return r, nil
}

// FirstUsable returns the first address of prefix that a host may use: the
// one after the network address, or for a /31, /32 (IPv4) or /127, /128
// (IPv6), which have no network address, the first address.
func FirstUsable(prefix netip.Prefix) (netip.Addr, bool) {
	prefix = prefix.Masked()
	if !hasHostRange(prefix) {
		return prefix.Addr(), prefix.IsValid()
	}
	return prefix.Addr().Next(), true
}

// hasHostRange reports whether prefix reserves its first (and, for IPv4,
// last) address; point-to-point and single-address prefixes do not.
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
