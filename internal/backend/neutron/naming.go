package neutron

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/netspec"
)

const (
	// TagOwned is on every network and subnet netop makes, so that
	// ListOwned finds them all with one server-side filter.
	TagOwned = "netop"
	// TagUIDPrefix, followed by the Network's UID, is the tag that says
	// which Network a network belongs to.
	TagUIDPrefix = "netop-uid="
	// TagClusterPrefix, followed by the cluster identity, says which
	// cluster's Network it is, so that clusters sharing a project leave
	// each other's networks alone.
	TagClusterPrefix = "netop-cluster="

	namePrefix = "netop-"

	// maxNameLen and maxDescriptionLen are Neutron's limits for the name
	// and description attributes; maxTagLen is its limit for one tag.
	maxNameLen        = 255
	maxDescriptionLen = 255
	maxTagLen         = 60
)

// NetworkName returns the name of the Neutron network (and subnet) of owner,
// "netop-<namespace>-<name>", for people browsing the cloud: netop finds its
// networks by tags and description, never by name, since names are neither
// unique nor fixed in Neutron.
func NetworkName(owner backend.Owner) string {
	name := namePrefix + owner.Namespace + "-" + owner.Name
	if len(name) > maxNameLen {
		name = name[:maxNameLen]
	}
	return name
}

// Description returns the description that records owner on a network and
// subnet: "netop:<namespace>/<name>/<uid>". Neutron accepts it in the
// create request itself, unlike tags, so a network is never without a
// record of its owner, even if netop dies right after creating it. The
// name, then the namespace, is shortened to fit Neutron's limit; the UID
// is kept whole because it is what ownership is decided by.
func Description(owner backend.Owner) string { return owner.Record(maxDescriptionLen) }

// ParseDescription returns the owner recorded by Description, and false
// for any other description.
func ParseDescription(desc string) (backend.Owner, bool) {
	owner, ok := backend.ParseRecord(desc)
	if !ok || !validUID(owner.UID) {
		return backend.Owner{}, false
	}
	return owner, true
}

// Tags returns the tags of owner's network and subnet.
func Tags(owner backend.Owner) []string {
	tags := []string{TagOwned, TagUIDPrefix + string(owner.UID)}
	if owner.Cluster != "" {
		tags = append(tags, TagClusterPrefix+owner.Cluster)
	}
	return tags
}

// validUID accepts what fits in a tag and can be searched for: Neutron's
// tag filter splits on commas, and Kubernetes UIDs are UUIDs anyway.
func validUID(uid types.UID) bool {
	if len(uid) == 0 || len(TagUIDPrefix)+len(uid) > maxTagLen {
		return false
	}
	for i := 0; i < len(uid); i++ {
		switch c := uid[i]; {
		case '0' <= c && c <= '9', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}

// recordOf returns the owner recorded on a network or subnet: the UID and
// cluster tags if there are, else the description, which is all a network
// has if netop died between creating and tagging it. Only the UID and the
// cluster are set.
func recordOf(tags []string, description string) (backend.Owner, bool) {
	var rec backend.Owner
	tagged := false
	for _, t := range tags {
		if uid, ok := strings.CutPrefix(t, TagUIDPrefix); ok {
			if !validUID(types.UID(uid)) {
				return backend.Owner{}, false
			}
			rec.UID, tagged = types.UID(uid), true
		}
		if cluster, ok := strings.CutPrefix(t, TagClusterPrefix); ok {
			rec.Cluster = cluster
		}
	}
	if tagged {
		return rec, true
	}
	if o, ok := ParseDescription(description); ok {
		return backend.Owner{Cluster: o.Cluster, UID: o.UID}, true
	}
	return backend.Owner{}, false
}

// hasTags reports whether have contains every tag in want.
func hasTags(have, want []string) bool {
	for _, t := range want {
		if !slices.Contains(have, t) {
			return false
		}
	}
	return true
}

// mergeTags returns have with want added, keeping tags others set.
func mergeTags(have, want []string) []string {
	out := slices.Clone(have)
	for _, t := range want {
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// addrRange is an inclusive range of addresses, as Neutron's allocation
// pools are.
type addrRange struct{ start, end netip.Addr }

// allocationPools returns the pools Neutron would choose itself for cidr and
// gw: every address but the network address, the IPv4 broadcast address and
// the gateway. netop sends them explicitly because Neutron refuses to move
// the gateway into the pools of a subnet unless the pools change in the
// same request; sending the same on create keeps the comparison simple.
// Large prefixes stay two ranges at most.
func allocationPools(cidr netip.Prefix, gw netip.Addr) []addrRange {
	first := cidr.Masked().Addr()
	last := netspec.LastAddr(cidr)
	lo := first.Next()
	hi := last
	if first.Is4() {
		hi = last.Prev()
	}
	if !lo.IsValid() || !hi.IsValid() || hi.Less(lo) {
		return nil // /31, /32, /127, /128: nothing but the ends
	}
	var pools []addrRange
	switch {
	case gw.Less(lo) || hi.Less(gw):
		pools = append(pools, addrRange{lo, hi})
	default:
		if lo.Less(gw) {
			pools = append(pools, addrRange{lo, gw.Prev()})
		}
		if gw.Less(hi) {
			pools = append(pools, addrRange{gw.Next(), hi})
		}
	}
	return pools
}

func toNeutronPools(pools []addrRange) []subnets.AllocationPool {
	out := make([]subnets.AllocationPool, 0, len(pools))
	for _, p := range pools {
		out = append(out, subnets.AllocationPool{Start: p.start.String(), End: p.end.String()})
	}
	return out
}

// samePools compares pools as sets of ranges: Neutron may return them in
// any order and writes IPv6 addresses in its own way.
func samePools(have []subnets.AllocationPool, want []addrRange) bool {
	if len(have) != len(want) {
		return false
	}
	got := make([]addrRange, 0, len(have))
	for _, p := range have {
		s, err1 := netip.ParseAddr(p.Start)
		e, err2 := netip.ParseAddr(p.End)
		if err1 != nil || err2 != nil {
			return false
		}
		got = append(got, addrRange{s, e})
	}
	cmp := func(a, b addrRange) int { return a.start.Compare(b.start) }
	slices.SortFunc(got, cmp)
	want = slices.Clone(want)
	slices.SortFunc(want, cmp)
	return slices.Equal(got, want)
}

// parseSubnet returns the canonical prefix and the gateway of a subnet, or
// an error if Neutron's strings do not parse.
func parseSubnet(s *subnets.Subnet) (netip.Prefix, netip.Addr, error) {
	p, err := netip.ParsePrefix(s.CIDR)
	if err != nil {
		return netip.Prefix{}, netip.Addr{}, fmt.Errorf("subnet %s has cidr %q: %w", s.ID, s.CIDR, err)
	}
	var gw netip.Addr
	if s.GatewayIP != "" {
		gw, err = netip.ParseAddr(s.GatewayIP)
		if err != nil {
			return netip.Prefix{}, netip.Addr{}, fmt.Errorf("subnet %s has gateway_ip %q: %w", s.ID, s.GatewayIP, err)
		}
	}
	return p.Masked(), gw.Unmap(), nil
}

// validNetwork adds Neutron's rule for UIDs, which must fit in a tag, to
// what every backend checks.
func validNetwork(n backend.Network) error {
	if !validUID(n.UID) {
		return fmt.Errorf("invalid UID %q", n.UID)
	}
	return n.Validate()
}
