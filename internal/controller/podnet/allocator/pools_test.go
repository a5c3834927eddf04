package allocator

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/netop-dev/netop/internal/ipam"
	"github.com/netop-dev/netop/internal/netspec"
)

func dualStackPools(t *testing.T, v4, v6 string) familyPools {
	t.Helper()
	var families netspec.Families
	for _, cidr := range []string{v4, v6} {
		p := netip.MustParsePrefix(cidr)
		families = append(families, netspec.Resolved{Prefix: p, Gateway: p.Addr().Next()})
	}
	ps, err := newFamilyPools(families)
	if err != nil {
		t.Fatal(err)
	}
	if !ps.match(families) || ps.match(families[:1]) {
		t.Fatalf("pools %s do not match their families alone", ps)
	}
	return ps
}

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

// An interface gets an address of each family, in the cidrs' order; one it
// asks for in one family leaves the other allocated as usual.
func TestFamilyPoolsAllocateOnePerFamily(t *testing.T) {
	ps := dualStackPools(t, "10.1.0.0/24", "fd01::/64")
	got, err := ps.allocate("a", nil)
	if want := prefixes("10.1.0.2/24", "fd01::2/64"); err != nil || !slices.Equal(got, want) {
		t.Fatalf("allocate = %v, %v; want %v", got, err, want)
	}
	got, err = ps.allocate("b", prefixes("fd01::50/128"))
	if want := prefixes("fd01::50/64", "10.1.0.3/24"); err != nil || !slices.Equal(got, want) {
		t.Fatalf("allocate with an IPv6 address asked for = %v, %v; want %v", got, err, want)
	}
	if allocated, available := ps.usage(); allocated != 2 || available.Int64() != 253-2 {
		t.Errorf("usage = %d allocated, %v available; want 2 and the IPv4 pool's 251", allocated, available)
	}
	ps.release("b", got)
	if allocated, _ := ps.usage(); allocated != 1 || ps[1].Owner(netip.MustParseAddr("fd01::50")) != "" {
		t.Errorf("release left %d allocated, fd01::50 held by %q", allocated, ps[1].Owner(netip.MustParseAddr("fd01::50")))
	}
}

// All or none: a family that is full, or an address refused, leaves the
// other family's address free.
func TestFamilyPoolsAllOrNone(t *testing.T) {
	ps := dualStackPools(t, "10.2.0.0/30", "fd02::/64") // one IPv4 address for pods
	if _, err := ps.allocate("a", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ps.allocate("b", nil); !errors.Is(err, ipam.ErrFull) {
		t.Fatalf("allocate in a full IPv4 pool = %v, want ErrFull", err)
	}
	if n := ps[1].Allocated(); n != 1 {
		t.Errorf("the IPv6 pool holds %d addresses after a failed allocation, want a's 1", n)
	}
	ps = dualStackPools(t, "10.3.0.0/24", "fd03::/64")
	for _, asked := range [][]netip.Prefix{prefixes("fd03::9/64", "10.9.0.1/24"), prefixes("fd03::9/64", "10.3.0.5/16"), prefixes("10.3.0.1/24")} {
		var refused *refusedError
		if _, err := ps.allocate("a", asked); !errors.As(err, &refused) {
			t.Errorf("allocate %v = %v, want refused", asked, err)
		}
		if allocated, _ := ps.usage(); allocated != 0 {
			t.Errorf("allocate %v refused left %d addresses held", asked, allocated)
		}
	}
}
