package network

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/testing/backendtest"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned/fake"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

// unreadReports are the reports of one node that runs an agent and has
// every Network ready, read once the test says so.
type unreadReports struct {
	asked     chan struct{} // closed when someone first waits for the reports
	askedOnce sync.Once
	read      chan struct{}
	early     atomic.Bool // Nodes was called before the reports were read
}

func (r *unreadReports) Nodes(*samplecrdv2.Network, int) (ready, total, of int32, lagging []string) {
	select {
	case <-r.read:
		return 1, 1, 1, nil
	default:
		r.early.Store(true)
		return 0, 0, 0, nil
	}
}

func (r *unreadReports) OnChange(func(uids []types.UID, all bool)) {}
func (r *unreadReports) HasSyncedChecker() cache.DoneChecker       { return r }
func (r *unreadReports) Name() string                              { return "the nodes' reports" }
func (r *unreadReports) Done() <-chan struct{} {
	r.askedOnce.Do(func() { close(r.asked) })
	return r.read
}

// A controller that just became leader syncs no Network before it has read
// the agents' reports: it would write each one as having no agent anywhere
// (CI of 57f1e02, the failover in TestNodesWithManifests).
func TestClusterSyncsAfterTheNodeReports(t *testing.T) {
	n := network("net", "10.0.0.0/24", "10.0.0.1")
	client := fake.NewSimpleClientset(n)
	factory := informers.NewSharedInformerFactory(client, 0)
	reports := &unreadReports{asked: make(chan struct{}), read: make(chan struct{})}
	c, err := New(t.Context(), client, factory.Samplecrd().V2().Networks().Informer(), backendtest.New(), record.NewFakeRecorder(100), metrics.New(),
		Options{Workers: 1, Resync: time.Hour, Outcome: Cluster(reports)})
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(t.Context().Done())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = c.Run(t.Context())
	}()
	t.Cleanup(func() { <-ran })

	select {
	case <-reports.asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the controller did not wait for the nodes' reports")
	}
	close(reports.read)
	var got *samplecrdv2.Network
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err = client.SamplecrdV2().Networks(n.Namespace).Get(ctx, n.Name, metav1.GetOptions{})
		return err == nil && meta.IsStatusConditionTrue(got.Status.Conditions, samplecrd.ConditionReady), nil
	}); err != nil {
		t.Fatalf("the Network is not Ready once the reports were read: %+v", got.Status)
	}
	if reports.early.Load() {
		t.Error("a Network was synced before the nodes' reports were read")
	}
}
