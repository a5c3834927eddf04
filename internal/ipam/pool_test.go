package ipam

import (
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"strings"
	"testing"
)

func mustPool(t testing.TB, cidr, gateway string) *Pool {
	t.Helper()
	var gw netip.Addr
	if gateway != "" {
		gw = netip.MustParseAddr(gateway)
	}
	p, err := NewPool(netip.MustParsePrefix(cidr), gw)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A /29 has eight addresses: network, gateway and broadcast are never
// handed out, the other five are, once each, then the pool is full.
func TestAllocateNeverReservedNeverTwice(t *testing.T) {
	p := mustPool(t, "192.168.0.0/29", "192.168.0.1")
	seen := map[netip.Addr]bool{}
	for i := range 5 {
		a, err := p.Allocate(fmt.Sprint("pod", i))
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		if seen[a] || a == netip.MustParseAddr("192.168.0.0") || a == netip.MustParseAddr("192.168.0.1") || a == netip.MustParseAddr("192.168.0.7") {
			t.Fatalf("allocation %d gave %s (seen %v)", i, a, seen)
		}
		seen[a] = true
	}
	if _, err := p.Allocate("one-too-many"); !errors.Is(err, ErrFull) {
		t.Fatalf("a full pool gave %v", err)
	}
	if p.Allocated() != 5 || p.Available().Sign() != 0 {
		t.Errorf("allocated %d, available %s", p.Allocated(), p.Available())
	}
}

// Only the owner frees an address; freed addresses come back oldest first,
// after the never-used ones.
func TestReleaseByOwnerAndReuseOrder(t *testing.T) {
	p := mustPool(t, "10.0.0.0/28", "10.0.0.1")
	a, _ := p.Allocate("a")
	b, _ := p.Allocate("b")
	if p.Release(a, "b") {
		t.Fatal("b freed a's address")
	}
	if p.Owner(a) != "a" {
		t.Fatalf("owner of %s: %q", a, p.Owner(a))
	}
	if !p.Release(a, "a") || !p.Release(b, "b") {
		t.Fatal("owners could not free their addresses")
	}
	if p.Release(a, "a") {
		t.Fatal("freed twice")
	}
	// 10.0.0.4 … 10.0.0.14 were never used: they go first.
	for want := 4; want <= 14; want++ {
		got, err := p.Allocate("x")
		if err != nil || got != netip.AddrFrom4([4]byte{10, 0, 0, byte(want)}) {
			t.Fatalf("got %s (%v), want 10.0.0.%d", got, err, want)
		}
	}
	for _, want := range []netip.Addr{a, b} {
		if got, err := p.Allocate("y"); err != nil || got != want {
			t.Fatalf("got %s (%v), want the oldest freed %s", got, err, want)
		}
	}
}

func TestAllocateStatic(t *testing.T) {
	p := mustPool(t, "192.168.0.0/24", "192.168.0.1")
	for _, tc := range []struct {
		addr, owner, wantErr string
	}{
		{"192.168.0.10", "a", ""},
		{"192.168.0.10", "a", ""}, // again, same owner
		{"192.168.0.10", "b", "in use by a"},
		{"192.168.0.1", "b", "the gateway of cidr"},
		{"192.168.0.255", "b", "the broadcast address"},
		{"192.168.0.0", "b", "the network address"},
		{"192.168.1.1", "b", "not in cidr 192.168.0.0/24"},
		{"fd00::1", "b", "not in cidr"},
	} {
		err := p.AllocateStatic(netip.MustParseAddr(tc.addr), tc.owner)
		if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s for %s: %v, want %q", tc.addr, tc.owner, err, tc.wantErr)
		}
	}
	// The dynamic allocator steps over the static address.
	for range 252 {
		a, err := p.Allocate("d")
		if err != nil {
			t.Fatal(err)
		}
		if a == netip.MustParseAddr("192.168.0.10") {
			t.Fatal("a static address handed out again")
		}
	}
	if _, err := p.Allocate("d"); !errors.Is(err, ErrFull) {
		t.Fatalf("want full, got %v", err)
	}
}

func TestIPv6(t *testing.T) {
	p := mustPool(t, "fd00:10::/64", "fd00:10::1")
	a, err := p.Allocate("a")
	if err != nil || a != netip.MustParseAddr("fd00:10::2") {
		t.Fatalf("first IPv6 address %s (%v)", a, err)
	}
	if err := p.AllocateStatic(netip.MustParseAddr("fd00:10::ffff:1"), "b"); err != nil {
		t.Fatal(err)
	}
	if p.Owner(netip.MustParseAddr("fd00:10::ffff:1")) != "b" {
		t.Fatal("static IPv6 address not recorded")
	}
	if p.Available().Cmp(bigPow2(62)) >= 0 {
		t.Errorf("available %s", p.Available())
	}
	wide := mustPool(t, "fd00:20::/48", "")
	if err := wide.AllocateStatic(netip.MustParseAddr("fd00:20:0:1::5"), "c"); err == nil {
		t.Error("an address beyond the first 2^62 of a /48 was accepted")
	}
}

func TestNewPoolRefuses(t *testing.T) {
	if _, err := NewPool(netip.MustParsePrefix("10.0.0.0/24"), netip.MustParseAddr("10.0.1.1")); err == nil {
		t.Error("a gateway outside the cidr was accepted")
	}
	if _, err := NewPool(netip.MustParsePrefix("10.0.0.0/30"), netip.MustParseAddr("10.0.0.1")); err != nil {
		t.Errorf("a /30 has one address for a pod: %v", err)
	}
}

// Allocate and release in a /16 at several fill levels: the cost per
// operation must not grow as the pool fills (goal: ≤ 1 µs, flat).
func BenchmarkAllocateRelease(b *testing.B) {
	// 64 reserved /26s, every fourth of the /16's first 256: the most
	// spec.reserved holds, each a span to look up.
	var reserved []Range
	for i := range 64 {
		first := netip.AddrFrom4([4]byte{10, 1, byte(i * 4), 0})
		reserved = append(reserved, Range{First: first, Last: netip.AddrFrom4([4]byte{10, 1, byte(i * 4), 63})})
	}
	for _, fill := range []int{0, 50, 99} {
		for _, ranges := range [][]Range{nil, reserved} {
			name := fmt.Sprintf("fill=%d%%", fill)
			if ranges != nil {
				name += "/reserved=64"
			}
			b.Run(name, func(b *testing.B) {
				p, err := NewPool(netip.MustParsePrefix("10.1.0.0/16"), netip.MustParseAddr("10.1.0.1"), ranges...)
				if err != nil {
					b.Fatal(err)
				}
				benchAllocateRelease(b, p, int(p.Available().Int64())*fill/100)
			})
		}
	}
}

// benchAllocateRelease times an allocation and its release in p with
// held addresses taken.
func benchAllocateRelease(b *testing.B, p *Pool, held int) {
	for i := range held {
		if _, err := p.Allocate(fmt.Sprint("held", i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		a, err := p.Allocate("pod")
		if err != nil {
			b.Fatal(err)
		}
		p.Release(a, "pod")
	}
}

func bigPow2(n uint) *big.Int { return new(big.Int).Lsh(big.NewInt(1), n) }

func rng(first, last string) Range {
	return Range{First: netip.MustParseAddr(first), Last: netip.MustParseAddr(last)}
}

// Reserved ranges are never handed out, whether the pool grows into them
// or a pod asks for one of their addresses, and are counted apart: a /28
// with .2–.6 and .10 reserved (and .5 twice, overlapping) fills with the
// other seven addresses.
func TestReservedRanges(t *testing.T) {
	p, err := NewPool(netip.MustParsePrefix("10.0.0.0/28"), netip.MustParseAddr("10.0.0.1"),
		rng("10.0.0.2", "10.0.0.6"), rng("10.0.0.10", "10.0.0.10"), rng("10.0.0.5", "10.0.0.5"), rng("10.1.0.0", "10.1.0.9"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Reserved() != 6 || p.Available().Int64() != 16-3-6 {
		t.Errorf("reserved %d, available %s; want 6 and 7", p.Reserved(), p.Available())
	}
	if err := p.AllocateStatic(netip.MustParseAddr("10.0.0.4"), "pinned"); err == nil || !strings.Contains(err.Error(), "reserved by the Network (spec.reserved)") {
		t.Errorf("a pod pinning a reserved address: %v", err)
	}
	var got []string
	for i := range 7 {
		a, err := p.Allocate(fmt.Sprint("pod", i))
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		got = append(got, a.String())
	}
	if want := "10.0.0.7 10.0.0.8 10.0.0.9 10.0.0.11 10.0.0.12 10.0.0.13 10.0.0.14"; strings.Join(got, " ") != want {
		t.Errorf("allocated %v, want %s", got, want)
	}
	if _, err := p.Allocate("one-too-many"); !errors.Is(err, ErrFull) {
		t.Errorf("a full pool gave %v", err)
	}
	// Freed, reused; never a reserved one.
	p.Release(netip.MustParseAddr("10.0.0.8"), "pod1")
	if a, err := p.Allocate("again"); err != nil || a != netip.MustParseAddr("10.0.0.8") {
		t.Errorf("after a release: %v %v", a, err)
	}
}

// An address a pod held before it was reserved stays that pod's (Hold)
// and goes to nobody else; released, it is not handed out again.
func TestHoldReservedAddress(t *testing.T) {
	p, err := NewPool(netip.MustParsePrefix("10.0.0.0/29"), netip.MustParseAddr("10.0.0.1"), rng("10.0.0.2", "10.0.0.3"))
	if err != nil {
		t.Fatal(err)
	}
	held := netip.MustParseAddr("10.0.0.3")
	if err := p.Hold(held, "old"); err != nil {
		t.Fatal(err)
	}
	if err := p.Hold(held, "other"); err == nil {
		t.Error("a second holder of a reserved address")
	}
	if err := p.Hold(netip.MustParseAddr("10.0.0.1"), "gw"); err == nil {
		t.Error("holding the gateway")
	}
	if p.Allocated() != 1 || p.HeldReserved() != 1 || p.Available().Int64() != 3 {
		t.Errorf("allocated %d, held reserved %d, available %s; want 1, 1, 3", p.Allocated(), p.HeldReserved(), p.Available())
	}
	if !p.Release(held, "old") || p.HeldReserved() != 0 || p.Available().Int64() != 3 {
		t.Errorf("released: held reserved %d, available %s", p.HeldReserved(), p.Available())
	}
	for i := range 3 {
		if a, err := p.Allocate(fmt.Sprint("pod", i)); err != nil || a == held {
			t.Fatalf("allocation %d: %v %v", i, a, err)
		}
	}
}

// IPv6: a reserved range in a /64 costs a span, not its size; the pool
// is the /64's first 2^62 addresses, and ranges beyond them count for
// nothing.
func TestReservedRangeIPv6(t *testing.T) {
	p, err := NewPool(netip.MustParsePrefix("fd00::/64"), netip.MustParseAddr("fd00::1"), rng("fd00::2", "fd00::ffff:ffff"), rng("fd00::4000:0:0:0", "fd00::ffff:ffff:ffff:ffff"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.Allocate("pod")
	if err != nil || a != netip.MustParseAddr("fd00::1:0:0") {
		t.Errorf("first allocation %v %v, want fd00::1:0:0", a, err)
	}
	if p.Reserved() != 0xffff_fffe {
		t.Errorf("reserved %d", p.Reserved())
	}
}
