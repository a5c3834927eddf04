package allocator

import (
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strings"

	"github.com/netop-dev/netop/internal/ipam"
	"github.com/netop-dev/netop/internal/netspec"
)

// familyPools are a Network's pools, one per address family, in the order
// of its cidrs: a pod's interface gets an address of each.
type familyPools []*ipam.Pool

// newFamilyPools makes empty pools for families.
func newFamilyPools(families netspec.Families) (familyPools, error) {
	pools := make(familyPools, 0, len(families))
	for _, f := range families {
		p, err := ipam.NewPool(f.Prefix, f.Gateway, f.Reserved...)
		if err != nil {
			return nil, err
		}
		pools = append(pools, p)
	}
	return pools, nil
}

// match says whether the pools are those of families: same cidrs,
// gateways and reserved ranges, in order.
func (ps familyPools) match(families netspec.Families) bool {
	if len(ps) != len(families) {
		return false
	}
	for i, p := range ps {
		if p.Prefix() != families[i].Prefix || p.Gateway() != families[i].Gateway || !slices.Equal(p.ReservedRanges(), families[i].Reserved) {
			return false
		}
	}
	return true
}

// of is the pool whose cidr holds addr, or nil.
func (ps familyPools) of(addr netip.Addr) *ipam.Pool {
	for _, p := range ps {
		if p.Prefix().Contains(addr) {
			return p
		}
	}
	return nil
}

// prefix is the pool with cidr prefix, or nil.
func (ps familyPools) prefix(prefix netip.Prefix) *ipam.Pool {
	for _, p := range ps {
		if p.Prefix() == prefix {
			return p
		}
	}
	return nil
}

func (ps familyPools) String() string {
	cidrs := make([]string, len(ps))
	for i, p := range ps {
		cidrs[i] = p.Prefix().String()
	}
	return strings.Join(cidrs, ",")
}

// refusedError: an address the pod asked for cannot be its. retry says
// whether that may change (another pod holds it, the Network's cidr may
// move) or never will.
type refusedError struct {
	msg   string
	retry bool
}

func (e *refusedError) Error() string { return e.msg }

// fullError: the pool of a family has no free address.
type fullError struct{ prefix netip.Prefix }

func (e *fullError) Error() string        { return fmt.Sprintf("no free address in %s", e.prefix) }
func (e *fullError) Is(target error) bool { return target == ipam.ErrFull }

// allocate gives owner the addresses asked for, each from the pool of its
// family, and one address of every family none was asked for in (a pod
// that pins its IPv4 address still gets an IPv6 one): all or none. The
// addresses carry their cidr's prefix length.
func (ps familyPools) allocate(owner string, asked []netip.Prefix) (_ []netip.Prefix, err error) {
	var out []netip.Prefix
	defer func() {
		if err != nil {
			ps.release(owner, out)
		}
	}()
	for _, want := range asked {
		p := ps.of(want.Addr())
		if p == nil {
			return nil, &refusedError{msg: fmt.Sprintf("address %s: not in cidr %s", want.Addr(), ps), retry: true}
		}
		if want.Bits() != want.Addr().BitLen() && want.Bits() != p.Prefix().Bits() {
			return nil, &refusedError{msg: fmt.Sprintf("address %s: prefix length %d, the Network's is %d", want, want.Bits(), p.Prefix().Bits())}
		}
		if err := p.AllocateStatic(want.Addr(), owner); err != nil {
			return nil, &refusedError{msg: err.Error(), retry: true}
		}
		out = append(out, netip.PrefixFrom(want.Addr(), p.Prefix().Bits()))
	}
	for _, p := range ps {
		if hasAddressIn(out, p.Prefix()) {
			continue
		}
		addr, err := p.Allocate(owner)
		if errors.Is(err, ipam.ErrFull) {
			return nil, &fullError{p.Prefix()}
		}
		if err != nil {
			return nil, err
		}
		out = append(out, netip.PrefixFrom(addr, p.Prefix().Bits()))
	}
	return out, nil
}

func hasAddressIn(addrs []netip.Prefix, prefix netip.Prefix) bool {
	for _, a := range addrs {
		if prefix.Contains(a.Addr()) {
			return true
		}
	}
	return false
}

// take records that owner holds addr, as a pod's annotation says, even
// if the Network has reserved it since; a second holder of one address is
// not given it.
func (ps familyPools) take(owner string, addr netip.Addr) {
	if p := ps.of(addr); p != nil {
		_ = p.Hold(addr, owner)
	}
}

// release frees the addrs that owner holds.
func (ps familyPools) release(owner string, addrs []netip.Prefix) {
	for _, a := range addrs {
		if p := ps.of(a.Addr()); p != nil {
			p.Release(a.Addr(), owner)
		}
	}
}

// usage is how many pod interfaces hold addresses, the most any family has
// handed out (pods made before a second family was added hold none of
// it), and how many more can get theirs, the fewest any family has left,
// since each takes one of every family.
func (ps familyPools) usage() (allocated int64, available *big.Int) {
	for _, p := range ps {
		allocated = max(allocated, int64(p.Allocated()))
		if left := p.Available(); available == nil || left.Cmp(available) < 0 {
			available = left
		}
	}
	if available == nil {
		available = new(big.Int)
	}
	return allocated, available
}

// reserved is how many addresses the Network keeps from pods, in every
// family.
func (ps familyPools) reserved() *big.Int {
	n := new(big.Int)
	for _, p := range ps {
		n.Add(n, new(big.Int).SetUint64(p.Reserved()))
	}
	return n
}
