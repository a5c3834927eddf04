package network

import (
	"context"
	"testing"
	"time"

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

// demand is which Networks a node needs, set by hand.
type demand map[types.UID]bool

func (d demand) Wants(uid types.UID) bool { return d[uid] }

// Issue 37: an agent on demand builds and reports a Network its node
// needs; once the node no longer needs it, the sync removes the backend
// network and forgets it in the report, without a write to the Network;
// but while something on the node is attached to it (a pod attached just
// before its allocation reached the node's cache), it keeps it. A resync
// finds an unneeded, unbuilt, unreported Network in sync.
func TestSyncOnDemand(t *testing.T) {
	n := network("net1", "10.0.0.0/24", "10.0.0.1")
	r, d := report{}, demand{n.UID: true}
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

	d[n.UID] = false
	f.backend.SetInUse(n.UID, true)
	sync()
	if !built() || r[n.UID] != n.Generation {
		t.Errorf("no longer needed, but a pod's port on it: built %v, report %v; want kept", built(), r)
	}

	f.backend.SetInUse(n.UID, false)
	sync()
	if built() || len(r) != 0 {
		t.Errorf("no longer needed: built %v, report %v; want neither", built(), r)
	}
	if got := f.actions(); len(got) != 0 {
		t.Errorf("an agent wrote %v", got)
	}
	if !f.controller.inSync(n, nil) {
		t.Error("an unneeded Network without a backend network or a report is not in sync")
	}
}
