package network

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// report is an agent's report in memory.
type report map[types.UID]int64

func (r report) Node() string                               { return "node-a" }
func (r report) ReadyAt(uid types.UID) int64                { return r[uid] }
func (r report) Ready(n *samplecrdv2.Network)               { r[n.UID] = n.Generation }
func (r report) Failed(n *samplecrdv2.Network, _, _ string) { delete(r, n.UID) }
func (r report) Forget(uid types.UID)                       { delete(r, uid) }
func (r report) Retain(keep func(types.UID) bool) {
	for uid := range r {
		if !keep(uid) {
			delete(r, uid)
		}
	}
}

// demand is which Networks a node needs, set by hand; released records
// the names Release was told of.
type demand struct {
	wants    map[types.UID]bool
	released []cache.ObjectName
}

func (d *demand) Wants(uid types.UID) bool { return d.wants[uid] }
func (d *demand) Release(name cache.ObjectName) time.Duration {
	d.released = append(d.released, name)
	return 0
}

// An agent on demand builds and reports a Network its node
// needs; once the node no longer needs it, the sync removes the backend
// network and forgets it in the report, without a write to the Network;
// but while something on the node is attached to it (a pod attached just
// before its allocation reached the node's cache), it keeps it. A resync
// finds an unneeded, unbuilt, unreported Network in sync. Once removed,
// the node's cache is told it may stop following it.
func TestSyncOnDemand(t *testing.T) {
	n := network("net1", "10.0.0.0/24", "10.0.0.1")
	r, d := report{}, &demand{wants: map[types.UID]bool{n.UID: true}}
	f := newFixtureWith(t, Options{Workers: 1, Resync: time.Hour, Outcome: Agent(r, false, d)}, n)
	sync := func() {
		t.Helper()
		if err := f.controller.sync(context.Background(), cache.MetaObjectToName(n)); err != nil {
			t.Fatal(err)
		}
	}
	built := func() bool {
		_, ok := f.backend.Networks()[n.UID]
		return ok
	}

	sync()
	if !built() || r[n.UID] != n.Generation {
		t.Fatalf("needed: built %v, report %v", built(), r)
	}

	d.wants[n.UID] = false
	f.backend.SetInUse(n.UID, true)
	sync()
	if !built() || r[n.UID] != n.Generation || len(d.released) != 0 {
		t.Errorf("no longer needed, but a pod's port on it: built %v, report %v, released %v; want kept", built(), r, d.released)
	}

	f.backend.SetInUse(n.UID, false)
	sync()
	if built() || len(r) != 0 {
		t.Errorf("no longer needed: built %v, report %v; want neither", built(), r)
	}
	if want := []cache.ObjectName{cache.MetaObjectToName(n)}; !slices.Equal(d.released, want) {
		t.Errorf("released %v, want %v", d.released, want)
	}
	if got := f.actions(); len(got) != 0 {
		t.Errorf("an agent wrote %v", got)
	}
	if !f.controller.inSync(n, nil) {
		t.Error("an unneeded Network without a backend network or a report is not in sync")
	}
}

// An agent on demand caches only the Networks its node needs.
// The resync removes a backend network whose Network is not in the cache
// (an agent restarted after its last pod left) without asking the API
// server, unless the node needs it (its cache is still listing it) or
// something is attached to it.
func TestResyncOnDemand(t *testing.T) {
	used, left := network("used", "10.0.0.0/24", "10.0.0.1"), network("left", "10.0.1.0/24", "10.0.1.1")
	r, d := report{}, &demand{wants: map[types.UID]bool{used.UID: true, left.UID: true}}
	f := newFixtureWith(t, Options{Workers: 1, Resync: time.Hour, Outcome: Agent(r, false, d)}, used, left)
	for _, n := range []*samplecrdv2.Network{used, left} {
		if err := f.controller.sync(context.Background(), cache.MetaObjectToName(n)); err != nil {
			t.Fatal(err)
		}
	}
	// The cache no longer follows it, as after a restart.
	if err := f.controller.indexer.Delete(left); err != nil {
		t.Fatal(err)
	}
	f.client.ClearActions()
	built := func() []types.UID {
		return slices.Sorted(maps.Keys(f.backend.Networks()))
	}
	both := []types.UID{left.UID, used.UID}

	f.controller.resync(context.Background())
	if got := built(); !slices.Equal(got, both) {
		t.Errorf("needed, not yet in the cache: built %v, want %v", got, both)
	}
	d.wants[left.UID] = false
	f.backend.SetInUse(left.UID, true)
	f.controller.resync(context.Background())
	if got := built(); !slices.Equal(got, both) {
		t.Errorf("not needed, but something attached: built %v, want %v", got, both)
	}
	f.backend.SetInUse(left.UID, false)
	f.controller.resync(context.Background())
	if got, want := built(), []types.UID{used.UID}; !slices.Equal(got, want) {
		t.Errorf("not needed: built %v, want %v", got, want)
	}
	if got := f.actions(); len(got) != 0 {
		t.Errorf("the agent asked the API server %v", got)
	}
}

// On an agent on demand, a Network the node does not need is
// built nowhere here and contends with nothing here, though the cache
// delivered it: a younger overlapping Network the node's pods use builds.
func TestOnDemandUnneededDoesNotContend(t *testing.T) {
	older, younger := network("older", "10.0.0.0/24", "10.0.0.1"), network("younger", "10.0.0.0/24", "10.0.0.1")
	younger.CreationTimestamp = metav1.NewTime(older.CreationTimestamp.Add(time.Minute))
	r, d := report{}, &demand{wants: map[types.UID]bool{younger.UID: true}}
	f := newFixtureWith(t, Options{Workers: 1, Resync: time.Hour, Outcome: Agent(r, false, d)}, older, younger)
	if err := f.controller.sync(context.Background(), cache.MetaObjectToName(younger)); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.backend.Networks()[younger.UID]; !ok || r[younger.UID] != younger.Generation {
		t.Errorf("the younger Network the node needs: built %v, report %v; want built and ready", ok, r)
	}
}
