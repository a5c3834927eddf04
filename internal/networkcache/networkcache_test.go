package networkcache_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/networkcache"
	"github.com/netop-dev/netop/internal/testing/testenv"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// events records what the handlers are told, as "add|update|delete name".
type events struct {
	mu   sync.Mutex
	told []string
}

func (e *events) add(kind string, obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.told = append(e.told, kind+" "+obj.(*samplecrdv2.Network).Name)
}

func (e *events) take() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.told
	e.told = nil
	return out
}

// A node's cache holds the Networks it is told to watch, from
// a real API server, and tells its handlers of their changes alone: the
// other Networks of the cluster cost it nothing. A Network it stops
// watching leaves the cache without a deletion being told; one watched
// before it exists arrives when it is made.
func TestByName(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	networks := env.Netop.SamplecrdV2().Networks(ns)
	create := func(name string, third int) {
		t.Helper()
		n := &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: samplecrdv2.NetworkSpec{CIDRs: []string{fmt.Sprintf("10.9.%d.0/24", third)}, Gateways: []string{fmt.Sprintf("10.9.%d.1", third)}}}
		if _, err := networks.Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	label := func(name string) {
		t.Helper()
		patch := []byte(`{"metadata":{"labels":{"touched":"yes"}}}`)
		if _, err := networks.Patch(ctx, name, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i, name := range []string{"a", "b", "c"} {
		create(name, i)
	}

	b := networkcache.NewByName(env.Netop, ns, time.Hour)
	initial := make(chan struct{})
	b.SetInitial(closedWhen(initial))
	told := &events{}
	if _, err := b.AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { told.add("add", obj) },
		UpdateFunc: func(_, obj any) { told.add("update", obj) },
		DeleteFunc: func(obj any) { told.add("delete", obj) },
	}, cache.HandlerOptions{}); err != nil {
		t.Fatal(err)
	}
	name := func(n string) cache.ObjectName { return cache.ObjectName{Namespace: ns, Name: n} }
	b.Watch(name("a"))
	b.Watch(cache.ObjectName{Namespace: "elsewhere", Name: "c"}) // not the cache's namespace: ignored
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- b.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	b.Watch(name("b"))
	close(initial)
	if !cache.WaitFor(ctx, "networks", b.HasSyncedChecker()) {
		t.Fatal("not synced")
	}
	cached := func() []string {
		var out []string
		for _, obj := range b.GetIndexer().List() {
			out = append(out, obj.(*samplecrdv2.Network).Name)
		}
		slices.Sort(out)
		return out
	}
	// Synced means listed: both are there at once.
	if got, want := cached(), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("cache %v at sync, want %v", got, want)
	}
	expect := func(want ...string) {
		t.Helper()
		var got []string
		testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
			got = append(got, told.take()...)
			return len(got) >= len(want), fmt.Sprintf("told %v, want %v", got, want)
		})
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("told %v, want %v", got, want)
		}
	}
	expect("add a", "add b")

	// c is not watched: its change is told to no one. a's is, after it.
	label("c")
	label("a")
	expect("update a")
	// Watched before it exists, then made.
	b.Watch(name("d"))
	create("d", 3)
	expect("add d")
	// Unwatched: gone from the cache, no deletion told, no more changes.
	b.Unwatch(name("b"))
	label("b")
	if err := networks.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("delete a")
	if got, want := cached(), []string{"d"}; !slices.Equal(got, want) {
		t.Errorf("cache %v, want %v", got, want)
	}
	if got := b.Watched(); got != 2 {
		t.Errorf("watching %d names, want 2 (a and d)", got)
	}
}

// closedWhen is a cache.DoneChecker done once ch is closed.
func closedWhen(ch chan struct{}) cache.DoneChecker { return doneChan(ch) }

type doneChan chan struct{}

func (d doneChan) Name() string          { return "initial names" }
func (d doneChan) Done() <-chan struct{} { return d }
