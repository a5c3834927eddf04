package deploynet

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
)

// Pool hands out cidrs of one prefix length from a range, none overlapping
// another Network's or another cidr handed out. What the Network cache
// already shows is passed to Allocate; what was handed out and is not in
// the cache yet is remembered here until Seen or Release, so two
// Deployments never get one cidr even when the cache lags (the
// controller's workers are the pool's only users: one writer).
type Pool struct {
	Range        netip.Prefix
	PrefixLength int

	mu sync.Mutex
	// pending are the cidrs handed out and not yet in the cache, by owner.
	pending map[string]netip.Prefix
}

// NewPool checks the range and the prefix length.
func NewPool(rangePrefix string, prefixLength int) (*Pool, error) {
	r, err := netip.ParsePrefix(rangePrefix)
	if err != nil {
		return nil, fmt.Errorf("pool %q: %w", rangePrefix, err)
	}
	if r.Masked() != r {
		return nil, fmt.Errorf("pool %q: host bits set; the range is %s", rangePrefix, r.Masked())
	}
	if prefixLength < r.Bits() || prefixLength > r.Addr().BitLen()-2 {
		return nil, fmt.Errorf("prefix length %d: must be between the pool's (%d) and %d", prefixLength, r.Bits(), r.Addr().BitLen()-2)
	}
	return &Pool{Range: r, PrefixLength: prefixLength, pending: map[string]netip.Prefix{}}, nil
}

// ErrExhausted says every cidr of the pool is taken.
var ErrExhausted = errors.New("no free cidr")

// Allocate hands owner the first cidr of the pool that overlaps none of
// the taken ones and none handed out to another owner; an owner asking
// again gets the same one. taken is read under the pool's lock, so that a
// Network that reaches the cache (and is released from the pending ones)
// meanwhile is seen one way or the other.
func (p *Pool) Allocate(owner string, taken func() ([]netip.Prefix, error)) (netip.Prefix, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cidr, ok := p.pending[owner]; ok {
		return cidr, nil
	}
	all, err := taken()
	if err != nil {
		return netip.Prefix{}, err
	}
	var used []netip.Prefix
	for _, t := range all {
		if t.Overlaps(p.Range) {
			used = append(used, t.Masked())
		}
	}
	for _, cidr := range p.pending {
		used = append(used, cidr)
	}
	bits := p.Range.Addr().BitLen()
	for cidr := netip.PrefixFrom(p.Range.Addr(), p.PrefixLength); p.Range.Contains(cidr.Addr()); {
		i := slices.IndexFunc(used, cidr.Overlaps)
		if i < 0 {
			p.pending[owner] = cidr
			return cidr, nil
		}
		// On past what it overlaps: a taken prefix larger than a cidr in
		// one step (a /17 in a pool of /64s), else the next cidr.
		start, step := cidr.Addr(), bits-p.PrefixLength
		if u := used[i]; u.Bits() < p.PrefixLength {
			start, step = u.Addr(), bits-u.Bits()
		}
		next, ok := advance(start, step)
		if !ok {
			break
		}
		cidr = netip.PrefixFrom(next, p.PrefixLength)
	}
	return netip.Prefix{}, fmt.Errorf("pool %s: %w of /%d", p.Range, ErrExhausted, p.PrefixLength)
}

// Reserve records that owner takes cidr, named rather than handed out,
// so that no allocation hands it out before its Network is in the cache.
func (p *Pool) Reserve(owner string, cidr netip.Prefix) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending[owner] = cidr.Masked()
}

// Release forgets what owner was handed out: it is in the cache now, or
// was never used.
func (p *Pool) Release(owner string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pending, owner)
}

// advance adds 2^step to addr; false past the end of the address space.
func advance(addr netip.Addr, step int) (netip.Addr, bool) {
	b := addr.AsSlice()
	// Add 1 at bit `step` from the right, carrying leftwards.
	i := len(b) - 1 - step/8
	carry := uint(1) << (step % 8)
	for ; i >= 0 && carry > 0; i-- {
		sum := uint(b[i]) + carry
		b[i] = byte(sum)
		carry = sum >> 8
	}
	if carry > 0 {
		return netip.Addr{}, false
	}
	next, _ := netip.AddrFromSlice(b)
	return next, true
}
