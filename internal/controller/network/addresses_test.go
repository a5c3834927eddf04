package network

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/testing/backendtest"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned/fake"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

// unreadUsage is the allocation controller of one pod on every Network,
// whose caches are filled once the test says so.
type unreadUsage struct {
	asked     chan struct{} // closed when someone first waits for the caches
	askedOnce sync.Once
	filled    chan struct{}
	early     atomic.Bool // read before the caches were filled
}

func (u *unreadUsage) read() bool {
	select {
	case <-u.filled:
		return true
	default:
		u.early.Store(true)
		return false
	}
}

func (u *unreadUsage) Usage(*samplecrdv2.Network) (*samplecrdv2.NetworkAddresses, error) {
	if !u.read() {
		return &samplecrdv2.NetworkAddresses{Available: "253"}, nil
	}
	return &samplecrdv2.NetworkAddresses{Allocated: 1, Available: "252"}, nil
}

func (u *unreadUsage) Retire(*samplecrdv2.Network, int) (netselect.Holders, error) {
	u.read()
	return netselect.Holders{}, nil
}

func (u *unreadUsage) Outsiders(*samplecrdv2.Network, int) (netselect.Holders, error) {
	u.read()
	return netselect.Holders{}, nil
}

func (u *unreadUsage) OnUsageChanged(func(cache.ObjectName)) {}
func (u *unreadUsage) Synced() []cache.DoneChecker           { return []cache.DoneChecker{u} }
func (u *unreadUsage) Name() string                          { return "the pods and namespaces" }
func (u *unreadUsage) Done() <-chan struct{} {
	u.askedOnce.Do(func() { close(u.asked) })
	return u.filled
}

// A controller that just became leader syncs no Network before the
// allocation controller's caches are filled: it would write the addresses
// of pods it has not seen as free (and the pods of a namespace it has not
// seen as outsiders).
func TestSyncsAfterTheAddressUsage(t *testing.T) {
	n := network("net", "10.0.0.0/24", "10.0.0.1")
	client := fake.NewSimpleClientset(n)
	factory := informers.NewSharedInformerFactory(client, 0)
	usage := &unreadUsage{asked: make(chan struct{}), filled: make(chan struct{})}
	c, err := New(t.Context(), client, factory.Samplecrd().V2().Networks().Informer(), backendtest.New(), record.NewFakeRecorder(100), metrics.New(),
		Options{Workers: 1, Resync: time.Hour, Addresses: usage})
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
	case <-usage.asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the controller did not wait for the address usage")
	}
	close(usage.filled)
	var got *samplecrdv2.Network
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err = client.SamplecrdV2().Networks(n.Namespace).Get(ctx, n.Name, metav1.GetOptions{})
		return err == nil && got.Status.Addresses != nil && got.Status.Addresses.Allocated == 1, nil
	}); err != nil {
		t.Fatalf("the Network's status does not count the pod once the caches were filled: %+v", got.Status)
	}
	if usage.early.Load() {
		t.Error("a Network's address usage was read before the caches were filled")
	}
}
