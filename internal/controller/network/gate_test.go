package network

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"

	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/testing/backendtest"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned/fake"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

// gate stands for a cache the controller reads besides its Networks,
// filled once the test opens it. It is the cache's DoneChecker.
type gate struct {
	name      string
	asked     chan struct{} // closed when someone first waits for the cache
	askedOnce sync.Once
	filled    chan struct{}
	early     atomic.Bool // read before it was filled
}

func newGate(name string) *gate {
	return &gate{name: name, asked: make(chan struct{}), filled: make(chan struct{})}
}

func (g *gate) Name() string { return g.name }

func (g *gate) Done() <-chan struct{} {
	g.askedOnce.Do(func() { close(g.asked) })
	return g.filled
}

// read says whether the cache is filled, and notes a read before.
func (g *gate) read() bool {
	select {
	case <-g.filled:
		return true
	default:
		g.early.Store(true)
		return false
	}
}

// open checks that the controller waits for the cache, then fills it.
func (g *gate) open(t *testing.T) {
	t.Helper()
	select {
	case <-g.asked:
	case <-time.After(10 * time.Second):
		t.Fatalf("the controller did not wait for %s", g.name)
	}
	close(g.filled)
}

// runOn runs a controller of opts, with a fake backend, on n alone until
// the test ends, and returns its client.
func runOn(t *testing.T, n *samplecrdv2.Network, opts Options) *fake.Clientset {
	t.Helper()
	client := fake.NewSimpleClientset(n)
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := New(t.Context(), client, factory.Samplecrd().V2().Networks().Informer(), backendtest.New(), record.NewFakeRecorder(100), metrics.New(), opts)
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
	return client
}

// waitFor waits until n, as client has it, meets cond, and returns it.
func waitFor(t *testing.T, client *fake.Clientset, n *samplecrdv2.Network, what string, cond func(*samplecrdv2.Network) bool) *samplecrdv2.Network {
	t.Helper()
	var got *samplecrdv2.Network
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = client.SamplecrdV2().Networks(n.Namespace).Get(ctx, n.Name, metav1.GetOptions{})
		return err == nil && cond(got), nil
	}); err != nil {
		t.Fatalf("%s: %+v", what, got.Status)
	}
	return got
}
