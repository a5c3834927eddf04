// Package ipam hands out the addresses of one Network's cidr to pods: never
// the network address, the gateway, (IPv4) the broadcast address or those
// the Network reserves for other uses (spec.reserved), never
// one address twice, each address recorded with its owner so that only the
// owner frees it (a stale release cannot free a live address, a failure
// other IPAMs' users met). Released addresses are reused last, in the order they
// were freed, so that an address just given up is not handed straight to
// another pod while peers still hold ARP or conntrack entries for it.
//
// A Pool is not safe for concurrent use: it belongs to the one writer of a
// Network's allocations (the controller), which serialises access to it.
// Allocate, AllocateStatic and Release are O(1) and about the same cost
// whether the pool is empty or nearly full.
package ipam

import (
	"cmp"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"sort"
)

// ErrFull says the pool has no free address.
var ErrFull = errors.New("no free address")

// maxSize bounds the addresses a pool hands out (an IPv6 /64 has 2^64):
// offsets are uint64 and the allocator never needs more.
const maxSize = uint64(1) << 62

// Pool is the allocator of one cidr.
type Pool struct {
	prefix  netip.Prefix
	gateway netip.Addr
	// size is the number of offsets from the prefix's first address that
	// can be handed out or are reserved: [0, size).
	size uint64
	// next is the lowest offset never handed out: the pool grows upward
	// first and reuses freed offsets only when it has grown to size.
	next uint64
	// freed holds released offsets, oldest first, as a ring.
	freed []uint64
	head  int
	// owners of the offsets in use.
	owners map[uint64]string
	// reserved offsets, and what they are: network, gateway, broadcast.
	reserved map[uint64]string
	// excluded are the spans the Network reserves for other uses, sorted
	// and apart; excludedCount is how many offsets they take that
	// reserved does not, heldExcluded how many of them pods still hold
	// (taken before they were reserved).
	excluded      []span
	excludedCount uint64
	heldExcluded  int
	// ranges are the reserved ranges as NewPool was given them.
	ranges []Range
}

// Range is the addresses First to Last, both included, of one family.
type Range struct{ First, Last netip.Addr }

func (r Range) String() string {
	if r.First == r.Last {
		return r.First.String()
	}
	return r.First.String() + "-" + r.Last.String()
}

// Contains reports whether addr is in r.
func (r Range) Contains(addr netip.Addr) bool {
	return r.First.Compare(addr) <= 0 && addr.Compare(r.Last) <= 0
}

// span is a Range as offsets in a pool, first to last included.
type span struct{ first, last uint64 }

// NewPool makes the pool of prefix, which has the gateway gateway and
// keeps the reserved ranges (their parts inside prefix) from pods.
func NewPool(prefix netip.Prefix, gateway netip.Addr, reserved ...Range) (*Pool, error) {
	prefix = prefix.Masked()
	if !prefix.IsValid() {
		return nil, fmt.Errorf("cidr %v: not a prefix", prefix)
	}
	if gateway.IsValid() && !prefix.Contains(gateway) {
		return nil, fmt.Errorf("gateway %s: not in cidr %s", gateway, prefix)
	}
	hostBits := prefix.Addr().BitLen() - prefix.Bits()
	size := maxSize
	if hostBits < 62 {
		size = uint64(1) << hostBits
	}
	p := &Pool{prefix: prefix, gateway: gateway, size: size, owners: map[uint64]string{}, reserved: map[uint64]string{0: "the network address"}}
	if prefix.Addr().Is4() && hostBits < 62 {
		p.reserved[size-1] = "the broadcast address"
	}
	if gateway.IsValid() {
		off, _ := p.offset(gateway)
		p.reserved[off] = "the gateway"
	}
	if uint64(len(p.reserved)) >= size {
		return nil, fmt.Errorf("cidr %s: no address left for pods after the network, gateway and broadcast addresses", prefix)
	}
	p.ranges = slices.Clone(reserved)
	p.exclude(reserved)
	return p, nil
}

// ReservedRanges are the ranges the pool was made to keep from pods, as
// given.
func (p *Pool) ReservedRanges() []Range { return p.ranges }

// exclude makes the spans of ranges, clipped to the pool, sorted and
// merged, and counts what they take.
func (p *Pool) exclude(ranges []Range) {
	first, last := p.prefix.Addr(), p.addr(p.size-1)
	for _, r := range ranges {
		if r.Last.Less(first) || last.Less(r.First) || r.Last.Less(r.First) {
			continue
		}
		lo, _ := p.offset(laterAddr(r.First, first))
		hi, ok := p.offset(earlierAddr(r.Last, last))
		if !ok {
			hi = p.size - 1
		}
		p.excluded = append(p.excluded, span{lo, hi})
	}
	slices.SortFunc(p.excluded, func(a, b span) int { return cmp.Compare(a.first, b.first) })
	merged := p.excluded[:0]
	for _, s := range p.excluded {
		if n := len(merged); n > 0 && s.first <= merged[n-1].last+1 {
			merged[n-1].last = max(merged[n-1].last, s.last)
			continue
		}
		merged = append(merged, s)
	}
	p.excluded = merged
	for _, s := range p.excluded {
		p.excludedCount += s.last - s.first + 1
	}
	for off := range p.reserved {
		if p.isExcluded(off) {
			p.excludedCount--
		}
	}
}

func laterAddr(a, b netip.Addr) netip.Addr {
	if a.Less(b) {
		return b
	}
	return a
}

func earlierAddr(a, b netip.Addr) netip.Addr {
	if a.Less(b) {
		return a
	}
	return b
}

// excludedSpan is the index of the span holding off, or -1.
func (p *Pool) excludedSpan(off uint64) int {
	i := sort.Search(len(p.excluded), func(i int) bool { return p.excluded[i].last >= off })
	if i < len(p.excluded) && p.excluded[i].first <= off {
		return i
	}
	return -1
}

func (p *Pool) isExcluded(off uint64) bool { return p.excludedSpan(off) >= 0 }

// Prefix is the pool's cidr.
func (p *Pool) Prefix() netip.Prefix { return p.prefix }

// Gateway is the pool's gateway, never handed out.
func (p *Pool) Gateway() netip.Addr { return p.gateway }

// offset is addr's place in the prefix, if it is in the pool's range.
func (p *Pool) offset(addr netip.Addr) (uint64, bool) {
	if !p.prefix.Contains(addr) {
		return 0, false
	}
	a, base := addr.As16(), p.prefix.Addr().As16()
	var off uint64
	// The host part is at most 64 bits of the 128 that As16 gives (the
	// pool is at most 2^62 long), so the low 8 bytes hold it.
	for i := 8; i < 16; i++ {
		off = off<<8 | uint64(a[i]-base[i])
	}
	if p.prefix.Addr().BitLen()-p.prefix.Bits() > 64 {
		// Wider than a /64: the high bytes must equal the base's.
		for i := 0; i < 8; i++ {
			if a[i] != base[i] {
				return 0, false
			}
		}
	}
	return off, off < p.size
}

func (p *Pool) addr(off uint64) netip.Addr {
	base := p.prefix.Addr().As16()
	var b [16]byte
	copy(b[:], base[:])
	carry := off
	for i := 15; i >= 0 && carry > 0; i-- {
		sum := uint64(b[i]) + carry&0xff
		b[i] = byte(sum)
		carry = carry>>8 + sum>>8
	}
	a := netip.AddrFrom16(b)
	if p.prefix.Addr().Is4() {
		a = a.Unmap()
	}
	return a
}

// Allocate hands out a free address to owner.
func (p *Pool) Allocate(owner string) (netip.Addr, error) {
	for p.next < p.size {
		off := p.next
		if i := p.excludedSpan(off); i >= 0 {
			p.next = p.excluded[i].last + 1
			continue
		}
		p.next++
		if p.take(off, owner) {
			return p.addr(off), nil
		}
	}
	for p.head < len(p.freed) {
		off := p.freed[p.head]
		p.head++
		if p.head == len(p.freed) || p.head > 1024 && p.head*2 > len(p.freed) {
			p.freed = append(p.freed[:0], p.freed[p.head:]...)
			p.head = 0
		}
		// A freed offset may have been taken since by a static request.
		if p.take(off, owner) {
			return p.addr(off), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("cidr %s: %w", p.prefix, ErrFull)
}

func (p *Pool) take(off uint64, owner string) bool {
	if _, reserved := p.reserved[off]; reserved || p.isExcluded(off) {
		return false
	}
	if _, used := p.owners[off]; used {
		return false
	}
	p.owners[off] = owner
	return true
}

// AllocateStatic gives addr to owner, or says why it cannot: outside the
// cidr, reserved, or someone else's. Giving an owner its own address again
// is not an error.
func (p *Pool) AllocateStatic(addr netip.Addr, owner string) error {
	return p.claim(addr, owner, false)
}

// Hold records that owner holds addr, as a pod's record says, even where
// the Network has reserved it since: the address stays the pod's (never
// handed to another) until it is released. Its network, gateway or
// broadcast address, or another's, is refused.
func (p *Pool) Hold(addr netip.Addr, owner string) error {
	return p.claim(addr, owner, true)
}

// claim gives addr to owner; held says the owner has it already, so a
// range the Network reserved since does not stop it.
func (p *Pool) claim(addr netip.Addr, owner string, held bool) error {
	off, ok := p.offset(addr)
	if !ok {
		return fmt.Errorf("address %s: not in cidr %s", addr, p.prefix)
	}
	if what, reserved := p.reserved[off]; reserved {
		return fmt.Errorf("address %s: %s of cidr %s, which no pod may hold", addr, what, p.prefix)
	}
	if have, used := p.owners[off]; used {
		if have == owner {
			return nil
		}
		return fmt.Errorf("address %s: in use by %s", addr, have)
	}
	if p.isExcluded(off) {
		if !held {
			return fmt.Errorf("address %s: reserved by the Network (spec.reserved), which no pod may hold", addr)
		}
		p.heldExcluded++
	}
	p.owners[off] = owner
	return nil
}

// Release frees addr if owner holds it, and reports whether it did.
func (p *Pool) Release(addr netip.Addr, owner string) bool {
	off, ok := p.offset(addr)
	if !ok || p.owners[off] != owner {
		return false
	}
	delete(p.owners, off)
	switch {
	case p.isExcluded(off):
		p.heldExcluded--
	case off < p.next:
		p.freed = append(p.freed, off)
	}
	return true
}

// Owner is who holds addr, or "".
func (p *Pool) Owner(addr netip.Addr) string {
	off, ok := p.offset(addr)
	if !ok {
		return ""
	}
	return p.owners[off]
}

// HeldIn is the number of addresses in r that owners hold.
func (p *Pool) HeldIn(r Range) int {
	n := 0
	for off := range p.owners {
		if r.Contains(p.addr(off)) {
			n++
		}
	}
	return n
}

// Allocated is the number of addresses in use.
func (p *Pool) Allocated() int { return len(p.owners) }

// Available is the number of addresses still free: a decimal string, since
// an IPv6 pool's count does not fit an int.
func (p *Pool) Available() *big.Int {
	n := new(big.Int).SetUint64(p.size)
	n.Sub(n, new(big.Int).SetUint64(p.excludedCount))
	n.Sub(n, big.NewInt(int64(len(p.reserved)+len(p.owners)-p.heldExcluded)))
	return n
}

// Reserved is the number of addresses the Network's reserved ranges keep
// from pods, besides the network, gateway and broadcast addresses.
func (p *Pool) Reserved() uint64 { return p.excludedCount }

// HeldReserved is the number of reserved addresses that pods still hold.
func (p *Pool) HeldReserved() int { return p.heldExcluded }
