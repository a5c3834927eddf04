package network

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// unreadReports are the reports of one node that runs an agent and has
// every Network ready, read once the test opens the gate.
type unreadReports struct{ *gate }

func (r unreadReports) Nodes(*samplecrdv2.Network, int) (ready, total, of int32, lagging []string) {
	if !r.read() {
		return 0, 0, 0, nil
	}
	return 1, 1, 1, nil
}

func (r unreadReports) OnChange(func(uids []types.UID, all bool)) {}
func (r unreadReports) HasSyncedChecker() cache.DoneChecker       { return r.gate }

// A controller that just became leader syncs no Network before it has read
// the agents' reports: it would write each one as having no agent anywhere
// (CI of 57f1e02, the failover in TestNodesWithManifests).
func TestClusterSyncsAfterTheNodeReports(t *testing.T) {
	n := network("net", "10.0.0.0/24", "10.0.0.1")
	reports := unreadReports{newGate("the nodes' reports")}
	client := runOn(t, n, Options{Workers: 1, Resync: time.Hour, Outcome: Cluster(reports)})
	reports.open(t)
	waitFor(t, client, n, "the Network is not Ready once the reports were read", func(got *samplecrdv2.Network) bool {
		return meta.IsStatusConditionTrue(got.Status.Conditions, samplecrd.ConditionReady)
	})
	if reports.early.Load() {
		t.Error("a Network was synced before the nodes' reports were read")
	}
}
