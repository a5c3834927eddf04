package overlap

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

var t0 = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

func entry(name string, age int, prefixes ...string) Entry {
	e := Entry{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), Created: t0.Add(time.Duration(age) * time.Second)}
	for _, p := range prefixes {
		e.Prefixes = append(e.Prefixes, netip.MustParsePrefix(p).Masked())
	}
	return e
}

func names(entries []Entry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, e.Name)
	}
	slices.Sort(out)
	return out
}

func overlapping(ix *Index, except types.UID, prefixes ...string) []string {
	var ps []netip.Prefix
	for _, p := range prefixes {
		ps = append(ps, netip.MustParsePrefix(p))
	}
	var out []Entry
	ix.Overlapping(ps, except, func(e Entry) bool { out = append(out, e); return true })
	return names(out)
}

func TestIndexOverlapping(t *testing.T) {
	ix := NewIndex()
	for _, e := range []Entry{
		entry("wide", 0, "10.0.0.0/8"),
		entry("a", 0, "10.1.0.0/16"),
		entry("a-twin", 0, "10.1.0.0/16"),
		entry("a-sub", 0, "10.1.2.0/24"),
		entry("b", 0, "10.2.0.0/16"),
		entry("other", 0, "192.168.0.0/16"),
		entry("v6", 0, "fd00::/64"),
		entry("dual", 0, "172.16.0.0/24", "fd00:1::/64"),
	} {
		ix.Set(e)
	}
	for _, tc := range []struct {
		prefixes []string
		except   types.UID
		want     []string
	}{
		{[]string{"10.1.0.0/16"}, "", []string{"a", "a-sub", "a-twin", "wide"}},
		{[]string{"10.1.0.0/16"}, "uid-a", []string{"a-sub", "a-twin", "wide"}},
		{[]string{"10.1.2.128/25"}, "", []string{"a", "a-sub", "a-twin", "wide"}},
		{[]string{"10.2.3.0/24"}, "", []string{"b", "wide"}},
		{[]string{"10.3.0.0/16"}, "", []string{"wide"}},
		{[]string{"0.0.0.0/0"}, "", []string{"a", "a-sub", "a-twin", "b", "dual", "other", "wide"}},
		{[]string{"11.0.0.0/8"}, "", nil},
		{[]string{"fd00::/16"}, "", []string{"dual", "v6"}},
		{[]string{"fd00:1::1/128"}, "", []string{"dual"}},
		{[]string{"172.16.0.0/16", "fd00::/64"}, "", []string{"dual", "v6"}},
	} {
		if got := overlapping(ix, tc.except, tc.prefixes...); !slices.Equal(got, tc.want) {
			t.Errorf("Overlapping(%v except %q) = %v, want %v", tc.prefixes, tc.except, got, tc.want)
		}
	}

	// Moving and removing entries leaves nothing behind at the old prefix.
	ix.Set(entry("a", 0, "10.9.0.0/16"))
	if got := overlapping(ix, "", "10.1.0.0/16"); !slices.Equal(got, []string{"a-sub", "a-twin", "wide"}) {
		t.Errorf("after moving a: %v", got)
	}
	ix.Remove("uid-a-twin")
	ix.Remove("uid-a-sub")
	ix.Remove("uid-wide")
	if got := overlapping(ix, "", "10.1.0.0/16"); got != nil {
		t.Errorf("after removals: %v", got)
	}
	if ix.Len() != 5 {
		t.Errorf("Len = %d, want 5", ix.Len())
	}
}

func TestOlder(t *testing.T) {
	a, b := entry("a", 0), entry("b", 1)
	if !a.Older(b) || b.Older(a) {
		t.Error("an earlier creationTimestamp must win")
	}
	// Same second: the smaller UID wins, so that both sides agree.
	c, d := entry("c", 5), entry("d", 5)
	if !c.Older(d) || d.Older(c) || c.Older(c) {
		t.Error("same second: the smaller UID must win, and only one way")
	}
}

func TestArbiter(t *testing.T) {
	a := NewArbiter()
	old := entry("old", 0, "10.0.0.0/16")
	young := entry("young", 1, "10.0.1.0/24")
	apart := entry("apart", 2, "10.1.0.0/24")

	// The young one is seen and built first.
	a.Contend(young)
	if v := a.Acquire(young); !v.Build() {
		t.Fatalf("young alone: %+v, want build", v)
	}
	// The older one arrives: it wins, but must wait for young's network.
	if affected := a.Contend(old); !slices.Equal(names(affected), []string{"young"}) {
		t.Errorf("Contend(old) affected %v, want [young]", names(affected))
	}
	v := a.Acquire(old)
	if v.Winner != nil || !slices.Equal(names(v.Waiting), []string{"young"}) {
		t.Fatalf("old: %+v, want waiting for young", v)
	}
	if a.Present(old.UID) {
		t.Error("a waiting Network must not be recorded as present")
	}
	// young loses now and gives its network up.
	if v := a.Acquire(young); v.Winner == nil || v.Winner.Name != "old" {
		t.Fatalf("young after old: %+v, want old as winner", v)
	}
	if w, ok := a.Loses(young); !ok || w.Name != "old" {
		t.Errorf("Loses(young) = %v, %v", w, ok)
	}
	if affected := a.Release(young.UID); !slices.Equal(names(affected), []string{"old"}) {
		t.Errorf("Release(young) affected %v, want [old]", names(affected))
	}
	if v := a.Acquire(old); !v.Build() {
		t.Fatalf("old after young released: %+v, want build", v)
	}
	// A disjoint Network is not concerned.
	a.Contend(apart)
	if v := a.Acquire(apart); !v.Build() {
		t.Fatalf("apart: %+v", v)
	}
	// old goes: young may win, once old's network is released.
	if affected := a.Withdraw(old.UID); !slices.Equal(names(affected), []string{"young"}) {
		t.Errorf("Withdraw(old) affected %v, want [young]", names(affected))
	}
	if v := a.Acquire(young); v.Winner != nil || !slices.Equal(names(v.Waiting), []string{"old"}) {
		t.Fatalf("young while old's network is still there: %+v", v)
	}
	a.Release(old.UID)
	if v := a.Acquire(young); !v.Build() {
		t.Fatalf("young after old released: %+v", v)
	}
}

// A Network that moves keeps its claim on the old prefix until its backend
// network moved too.
func TestArbiterMove(t *testing.T) {
	a := NewArbiter()
	n := entry("n", 0, "10.0.0.0/24")
	a.Contend(n)
	a.Acquire(n)
	moved := entry("n", 0, "10.0.1.0/24")
	a.Contend(moved)
	a.Acquire(moved)
	other := entry("other", 1, "10.0.0.0/24")
	a.Contend(other)
	if v := a.Acquire(other); v.Build() {
		t.Fatal("the old prefix was free before the moving Network's backend network moved")
	}
	a.Built(moved)
	if v := a.Acquire(other); !v.Build() {
		t.Fatalf("after the move: %+v", v)
	}
}

// Workers acquire overlapping Networks at the same instant: at every moment
// at most one of a group of overlapping Networks is present, and the oldest
// is the one that ends up present.
func TestArbiterConcurrent(t *testing.T) {
	for round := range 200 {
		a := NewArbiter()
		var group []Entry
		for i := range 4 {
			// A /16 and three /24s inside it, ages shuffled by round.
			prefix := fmt.Sprintf("10.%d.%d.0/24", round%200, i)
			if i == 0 {
				prefix = fmt.Sprintf("10.%d.0.0/16", round%200)
			}
			group = append(group, entry(fmt.Sprintf("n%d", i), (i+round)%4, prefix))
		}
		// present mirrors the arbiter's record from outside: stored after
		// an Acquire that allowed building, deleted before a Release.
		var present sync.Map
		var violations atomic.Int64
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, e := range group {
			wg.Go(func() {
				<-start
				a.Contend(e)
				// Each worker retries as the controller would when told
				// to wait or that it lost, until its verdict is stable.
				for range 50 {
					v := a.Acquire(e)
					if v.Build() {
						present.Store(e.UID, e)
						present.Range(func(_, o any) bool {
							if o := o.(Entry); o.UID != e.UID && o.Prefixes[0].Overlaps(e.Prefixes[0]) {
								violations.Add(1)
							}
							return true
						})
						return
					}
					if v.Winner != nil {
						present.Delete(e.UID)
						a.Release(e.UID)
						return
					}
				}
			})
		}
		close(start)
		wg.Wait()
		if n := violations.Load(); n > 0 {
			t.Fatalf("round %d: %d times two overlapping Networks were present at once", round, n)
		}
		// Then every verdict is re-taken (the controller enqueues the
		// Networks that Contend and Release name) until none changes: the
		// present ones are exactly those with no older overlapping one.
		for range len(group) {
			for _, e := range group {
				if v := a.Acquire(e); v.Winner != nil {
					a.Release(e.UID)
				}
			}
		}
		for _, e := range group {
			winner := false
			for _, o := range group {
				winner = winner || o.Older(e) && o.Prefixes[0].Overlaps(e.Prefixes[0])
			}
			if a.Present(e.UID) == winner {
				t.Errorf("round %d: %s present = %v, want %v", round, e.Name, a.Present(e.UID), !winner)
			}
		}
	}
}

// The cost of deciding for one Network does not grow with the number of
// Networks: the sync of a Network that overlaps nothing, among N others.
func BenchmarkAcquire(b *testing.B) {
	for _, n := range []int{100, 10000, 100000} {
		b.Run(fmt.Sprintf("networks=%d", n), func(b *testing.B) {
			a := NewArbiter()
			for i := range n {
				// Networks in 10.0.0.0/8, one /30 each.
				e := entry(fmt.Sprintf("n%d", i), i)
				e.Prefixes = []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 14), byte(i >> 6), byte(i << 2)}), 30)}
				a.Contend(e)
				a.Acquire(e)
			}
			probe := entry("probe", n+1, "172.16.0.0/24")
			a.Contend(probe)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if v := a.Acquire(probe); !v.Build() {
					b.Fatal("the probe overlaps nothing")
				}
			}
		})
	}
}
