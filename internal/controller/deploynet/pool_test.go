package deploynet

import (
	"errors"
	"net/netip"
	"testing"
)

func TestPool(t *testing.T) {
	p, err := NewPool("10.30.0.0/22", 24)
	if err != nil {
		t.Fatal(err)
	}
	taken := func() ([]netip.Prefix, error) {
		return []netip.Prefix{netip.MustParsePrefix("10.30.0.128/25"), netip.MustParsePrefix("192.168.0.0/16")}, nil
	}
	want := []string{"10.30.1.0/24", "10.30.2.0/24", "10.30.3.0/24"}
	for i, w := range want {
		got, err := p.Allocate(w, taken)
		if err != nil || got.String() != w {
			t.Fatalf("allocation %d = %v, %v; want %s", i, got, err, w)
		}
	}
	if again, _ := p.Allocate("10.30.2.0/24", taken); again.String() != "10.30.2.0/24" {
		t.Errorf("an owner asking again got %v", again)
	}
	if _, err := p.Allocate("more", taken); !errors.Is(err, ErrExhausted) {
		t.Errorf("a full pool gave %v", err)
	}
	// A cidr a Deployment names is not handed out while its Network is
	// on its way to the cache.
	p.Release("10.30.3.0/24")
	p.Reserve("named", netip.MustParsePrefix("10.30.3.0/24"))
	if _, err := p.Allocate("more", taken); !errors.Is(err, ErrExhausted) {
		t.Errorf("a reserved cidr was handed out: %v", err)
	}
	p.Release("named")
	p.Reserve("10.30.3.0/24", netip.MustParsePrefix("10.30.3.0/24"))
	// Released (the Network is in the cache, and so in taken, or went).
	p.Release("10.30.2.0/24")
	if got, err := p.Allocate("more", taken); err != nil || got.String() != "10.30.2.0/24" {
		t.Errorf("after a release: %v, %v", got, err)
	}

	v6, err := NewPool("fd00:1::/48", 64)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := v6.Allocate("a", fixed("fd00:1::/64")); got.String() != "fd00:1:0:1::/64" {
		t.Errorf("IPv6: %v", got)
	}
	// A taken prefix far larger than a cidr is passed in one step, not
	// 2^47 (the test would not end).
	big, err := NewPool("fd00::/16", 64)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := big.Allocate("a", fixed("fd00::/17")); err != nil || got.String() != "fd00:8000::/64" {
		t.Errorf("past a /17: %v, %v", got, err)
	}
	if _, err := big.Allocate("b", fixed("fd00::/16")); !errors.Is(err, ErrExhausted) {
		t.Errorf("a pool inside a taken prefix: %v", err)
	}
	for _, bad := range []struct {
		r string
		l int
	}{{"10.0.0.1/16", 24}, {"10.0.0.0/16", 8}, {"10.0.0.0/16", 31}, {"nope", 24}} {
		if _, err := NewPool(bad.r, bad.l); err == nil {
			t.Errorf("NewPool(%s, %d) accepted", bad.r, bad.l)
		}
	}
}

// The last cidr of the address space ends the walk instead of wrapping.
func TestPoolEndOfSpace(t *testing.T) {
	p, err := NewPool("255.255.255.0/24", 25)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"255.255.255.0/25", "255.255.255.128/25"} {
		if got, err := p.Allocate(w, fixed()); err != nil || got.String() != w {
			t.Fatalf("got %v, %v; want %s", got, err, w)
		}
	}
	if _, err := p.Allocate("x", fixed()); !errors.Is(err, ErrExhausted) {
		t.Errorf("got %v", err)
	}
}

func fixed(prefixes ...string) func() ([]netip.Prefix, error) {
	return func() ([]netip.Prefix, error) {
		var out []netip.Prefix
		for _, p := range prefixes {
			out = append(out, netip.MustParsePrefix(p))
		}
		return out, nil
	}
}
