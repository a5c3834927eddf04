// Package overlap decides which of several overlapping Networks is built.
// Admission refuses an overlap it can see, but it checks against a cache:
// Networks created at the same instant all pass. The guarantee lives here,
// with the one writer of backend networks, the controller:
//
//   - The rule is deterministic: of two overlapping Networks the older one
//     wins (earlier creationTimestamp, then the smaller UID). A Network is
//     built only if no older Network overlaps it.
//   - A winner is built only once no other overlapping Network may still
//     have a backend network: the Arbiter records which Networks may have
//     one (present) and lets a winner wait for a loser to remove its own.
//
// So two overlapping backend networks never exist at once, even for a
// moment, whatever the order in which the controller's workers see them.
//
// Prefixes either nest or are disjoint, so the Networks overlapping a
// prefix are those at its supernets and its subnets: a prefix trie
// (gaissmai/bart) finds them in time bounded by the address length plus
// the number found, whatever the number of Networks.
package overlap

import (
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/gaissmai/bart"
	"k8s.io/apimachinery/pkg/types"
)

// Entry is one Network as arbitration sees it.
type Entry struct {
	Namespace, Name string
	UID             types.UID
	Created         time.Time
	// Prefixes are canonical (masked).
	Prefixes []netip.Prefix
}

// Overlapping is the first of e's prefixes that overlaps one of prefixes,
// for messages that name it; the first of e's if none does.
func (e Entry) Overlapping(prefixes ...netip.Prefix) netip.Prefix {
	for _, q := range e.Prefixes {
		for _, p := range prefixes {
			if q.Overlaps(p) {
				return q
			}
		}
	}
	if len(e.Prefixes) == 0 {
		return netip.Prefix{}
	}
	return e.Prefixes[0]
}

// Older reports whether e wins over o: created earlier, then the smaller
// UID, so that Networks created in the same second are still ordered.
func (e Entry) Older(o Entry) bool {
	if !e.Created.Equal(o.Created) {
		return e.Created.Before(o.Created)
	}
	return e.UID < o.UID
}

// Index holds entries by UID and by prefix. It is not safe for concurrent
// use on its own; the Arbiter guards it.
type Index struct {
	byUID map[types.UID]Entry
	// byPrefix holds the UIDs at each exact prefix: Networks in different
	// namespaces may have the same cidr.
	byPrefix bart.Table[map[types.UID]struct{}]
}

// NewIndex returns an empty index.
func NewIndex() *Index { return &Index{byUID: map[types.UID]Entry{}} }

// Len is the number of entries.
func (ix *Index) Len() int { return len(ix.byUID) }

// Get returns the entry of uid.
func (ix *Index) Get(uid types.UID) (Entry, bool) {
	e, ok := ix.byUID[uid]
	return e, ok
}

// Set adds e, replacing the entry of the same UID.
func (ix *Index) Set(e Entry) {
	ix.Remove(e.UID)
	ix.byUID[e.UID] = e
	for _, p := range e.Prefixes {
		ix.byPrefix.Modify(p, func(uids map[types.UID]struct{}, ok bool) (map[types.UID]struct{}, bool) {
			if !ok {
				uids = map[types.UID]struct{}{}
			}
			uids[e.UID] = struct{}{}
			return uids, false
		})
	}
}

// Remove removes the entry of uid and returns it.
func (ix *Index) Remove(uid types.UID) (Entry, bool) {
	e, ok := ix.byUID[uid]
	if !ok {
		return Entry{}, false
	}
	delete(ix.byUID, uid)
	for _, p := range e.Prefixes {
		ix.byPrefix.Modify(p, func(uids map[types.UID]struct{}, ok bool) (map[types.UID]struct{}, bool) {
			if !ok {
				return nil, true
			}
			delete(uids, uid)
			return uids, len(uids) == 0
		})
	}
	return e, true
}

// Overlapping calls f for each entry other than except with a prefix that
// overlaps one of prefixes, each entry once, until f returns false.
func (ix *Index) Overlapping(prefixes []netip.Prefix, except types.UID, f func(Entry) bool) {
	seen := map[types.UID]struct{}{}
	visit := func(uids map[types.UID]struct{}) bool {
		for uid := range uids {
			if _, done := seen[uid]; done || uid == except {
				continue
			}
			seen[uid] = struct{}{}
			if !f(ix.byUID[uid]) {
				return false
			}
		}
		return true
	}
	for _, p := range prefixes {
		// Supernets include p itself.
		for _, uids := range ix.byPrefix.Supernets(p) {
			if !visit(uids) {
				return
			}
		}
		for _, uids := range ix.byPrefix.Subnets(p) {
			if !visit(uids) {
				return
			}
		}
	}
}

// Verdict is what a Network may do about its backend network.
type Verdict struct {
	// Winner is set when an older Network overlaps: the Network must have
	// no backend network.
	Winner *Entry
	// Waiting lists the overlapping Networks that may still have a backend
	// network; the Network may build only once they have removed theirs.
	Waiting []Entry
}

// Build reports whether the Network may build its backend network.
func (v Verdict) Build() bool { return v.Winner == nil && len(v.Waiting) == 0 }

// Arbiter decides between overlapping Networks. Its contenders are the
// Networks that want a backend network (valid spec, not being deleted);
// present are those that may have one.
type Arbiter struct {
	mu         sync.Mutex
	contenders *Index
	present    *Index
}

// NewArbiter returns an arbiter with no Networks.
func NewArbiter() *Arbiter {
	return &Arbiter{contenders: NewIndex(), present: NewIndex()}
}

// Contend records e as wanting a backend network, and returns the
// contenders whose verdict may have changed: the younger ones that
// overlapped its previous prefixes (they may win now) or overlap its new
// ones (they lose now). Older ones won over e before and still do.
func (a *Arbiter) Contend(e Entry) []Entry {
	a.mu.Lock()
	defer a.mu.Unlock()
	old, had := a.contenders.Get(e.UID)
	if had && slices.Equal(old.Prefixes, e.Prefixes) && old.Created.Equal(e.Created) {
		return nil
	}
	affected := a.youngerContenders(old)
	a.contenders.Set(e)
	return append(affected, a.youngerContenders(e)...)
}

// Withdraw records that the Network of uid no longer wants a backend
// network (deleted, being deleted, or invalid), and returns the younger
// contenders that overlapped it, which may win now.
func (a *Arbiter) Withdraw(uid types.UID) []Entry {
	a.mu.Lock()
	defer a.mu.Unlock()
	old, ok := a.contenders.Remove(uid)
	if !ok {
		return nil
	}
	return a.youngerContenders(old)
}

func (a *Arbiter) youngerContenders(e Entry) []Entry {
	var out []Entry
	a.contenders.Overlapping(e.Prefixes, e.UID, func(o Entry) bool {
		if e.Older(o) {
			out = append(out, o)
		}
		return true
	})
	return out
}

// MayBePresent records that e may have a backend network with its
// prefixes, besides any it was already recorded with: what a restart finds
// in the cache's statuses or in the backend.
func (a *Arbiter) MayBePresent(e Entry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if old, ok := a.present.Get(e.UID); ok {
		e.Prefixes = unionPrefixes(old.Prefixes, e.Prefixes)
	}
	a.present.Set(e)
}

// Acquire decides for e. When e may build, it is recorded as present with
// its prefixes (and any it had) before Acquire returns, so that no
// overlapping Network can be allowed to build until e is Released.
func (a *Arbiter) Acquire(e Entry) Verdict {
	a.mu.Lock()
	defer a.mu.Unlock()
	var v Verdict
	if winner, ok := a.oldestOverlapping(e); ok {
		v.Winner = &winner
		return v
	}
	a.present.Overlapping(e.Prefixes, e.UID, func(o Entry) bool {
		v.Waiting = append(v.Waiting, o)
		return true
	})
	if !v.Build() {
		return v
	}
	if old, ok := a.present.Get(e.UID); ok {
		e.Prefixes = unionPrefixes(old.Prefixes, e.Prefixes)
	}
	a.present.Set(e)
	return v
}

// Built records that the backend network of e now has exactly e's
// prefixes (an update moved it off the old ones).
func (a *Arbiter) Built(e Entry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.present.Get(e.UID); ok {
		a.present.Set(e)
	}
}

// Release records that the Network of uid has no backend network any
// more, and returns the contenders that may have been waiting for it.
func (a *Arbiter) Release(uid types.UID) []Entry {
	a.mu.Lock()
	defer a.mu.Unlock()
	old, ok := a.present.Remove(uid)
	if !ok {
		return nil
	}
	return a.overlappingContenders(old.Prefixes, uid)
}

// Present reports whether the Network of uid may have a backend network.
func (a *Arbiter) Present(uid types.UID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.present.Get(uid)
	return ok
}

// Loses returns the oldest contender that overlaps e and is older than e.
func (a *Arbiter) Loses(e Entry) (Entry, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.oldestOverlapping(e)
}

// oldestOverlapping returns the oldest contender that overlaps e and is
// older than e. The caller holds a.mu.
func (a *Arbiter) oldestOverlapping(e Entry) (Entry, bool) {
	var winner *Entry
	a.contenders.Overlapping(e.Prefixes, e.UID, func(o Entry) bool {
		if o.Older(e) && (winner == nil || o.Older(*winner)) {
			winner = &o
		}
		return true
	})
	if winner == nil {
		return Entry{}, false
	}
	return *winner, true
}

func (a *Arbiter) overlappingContenders(prefixes []netip.Prefix, except types.UID) []Entry {
	var out []Entry
	a.contenders.Overlapping(prefixes, except, func(o Entry) bool {
		out = append(out, o)
		return true
	})
	return out
}

func unionPrefixes(a, b []netip.Prefix) []netip.Prefix {
	out := slices.Clone(a)
	for _, p := range b {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}
