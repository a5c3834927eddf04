package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeinformers "k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/netselect"
)

// podOn is a pod of node holding interfaces on the Networks of uids.
func podOn(t *testing.T, name, node string, uids ...types.UID) *corev1.Pod {
	t.Helper()
	var allocations []netselect.Allocation
	for i, uid := range uids {
		allocations = append(allocations, netselect.Allocation{Network: "ns/" + string(uid), NetworkUID: uid, Interface: "net" + string(rune('1'+i))})
	}
	value, err := json.Marshal(allocations)
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name),
		Annotations: map[string]string{netselect.AllocationsAnnotation: string(value)}}, Spec: corev1.PodSpec{NodeName: node}}
}

// A node needs a Network while a pod of its own holds an interface on it,
// and for the release delay after the last one left (deleted, finished or
// moved off it); other nodes' pods count for nothing. Each change of need
// is told once: at once when it begins, after the delay when it may end.
// The node's cache watches a Network from its first pod until it is
// released while not needed.
func TestDemand(t *testing.T) {
	kube := kubefake.NewClientset(podOn(t, "a", "here", "n1", "n2"), podOn(t, "elsewhere", "there", "n3"))
	factory := kubeinformers.NewSharedInformerFactory(kube, 0)
	networks := &watched{names: map[string]bool{}}
	d, err := NewDemand(factory.Core().V1().Pods(), "here", time.Minute, networks)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	d.now = func() time.Time { return now }
	type told struct {
		uid   types.UID
		after time.Duration
	}
	var mu sync.Mutex
	var changes []told
	d.OnChange(func(name cache.ObjectName, after time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		changes = append(changes, told{types.UID(name.Name), after})
	})
	take := func() []told {
		mu.Lock()
		defer mu.Unlock()
		out := changes
		changes = nil
		slices.SortFunc(out, func(a, b told) int { return cmp.Compare(a.uid, b.uid) })
		return out
	}
	factory.Start(t.Context().Done())
	if !cache.WaitFor(t.Context(), "pods", d.HasSyncedChecker()) {
		t.Fatal("pods not synced")
	}
	wants := func(want map[types.UID]bool) {
		t.Helper()
		for uid, w := range want {
			if got := d.Wants(uid); got != w {
				t.Errorf("at %v: Wants(%s) = %v, want %v", now.Sub(time.Unix(1000, 0)), uid, got, w)
			}
		}
	}
	wants(map[types.UID]bool{"n1": true, "n2": true, "n3": false})
	if got := take(); !slices.Equal(got, []told{{"n1", 0}, {"n2", 0}}) {
		t.Errorf("told %v at start", got)
	}
	networks.want(t, "ns/n1", "ns/n2")

	pods := kube.CoreV1().Pods("ns")
	ctx := t.Context()
	// A second pod on n1, then the first pod leaves n2 and n1 (deleted).
	if _, err := pods.Create(ctx, podOn(t, "b", "here", "n1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := pods.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// n1 still has a pod.
	waitTold(t, take, told{"n2", time.Minute})
	now = now.Add(59 * time.Second)
	wants(map[types.UID]bool{"n1": true, "n2": true})
	// Released within its delay: kept, and asked again at its end.
	if got := d.Release(cache.ObjectName{Namespace: "ns", Name: "n2"}); got != time.Second {
		t.Errorf("Release of n2 a second before its delay ends: retry after %v, want 1s", got)
	}
	networks.want(t, "ns/n1", "ns/n2")
	now = now.Add(time.Second)
	wants(map[types.UID]bool{"n1": true, "n2": false})
	d.Release(cache.ObjectName{Namespace: "ns", Name: "n1"})
	d.Release(cache.ObjectName{Namespace: "ns", Name: "n2"})
	networks.want(t, "ns/n1")

	// The last pod on n1 finishes: n1 is released after the delay, unless
	// a pod comes back to it first, which tells nothing (it never went).
	finished := podOn(t, "b", "here", "n1")
	finished.Status.Phase = corev1.PodSucceeded
	if _, err := pods.Update(ctx, finished, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTold(t, take, told{"n1", time.Minute})
	now = now.Add(30 * time.Second)
	if _, err := pods.Create(ctx, podOn(t, "c", "here", "n1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.users["n1"] == 1, "the new pod on n1 is not seen"
	})
	now = now.Add(time.Hour)
	wants(map[types.UID]bool{"n1": true})
	if got := take(); len(got) != 0 {
		t.Errorf("told %v when a pod came back to n1 within its delay", got)
	}
	// Released, and needed again: told at once.
	if err := pods.Delete(ctx, "c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTold(t, take, told{"n1", time.Minute})
	now = now.Add(time.Minute)
	wants(map[types.UID]bool{"n1": false})
	d.Release(cache.ObjectName{Namespace: "ns", Name: "n1"})
	networks.want(t)
	if _, err := pods.Create(ctx, podOn(t, "d", "here", "n1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTold(t, take, told{"n1", 0})
	networks.want(t, "ns/n1")
}

// watched is the node's cache of Networks, as the names it watches.
type watched struct {
	mu    sync.Mutex
	names map[string]bool
}

func (w *watched) Watch(name cache.ObjectName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.names[name.String()] = true
}

func (w *watched) Unwatch(name cache.ObjectName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.names, name.String())
}

func (w *watched) want(t *testing.T, names ...string) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if got := slices.Sorted(maps.Keys(w.names)); !slices.Equal(got, names) {
		t.Errorf("watching %v, want %v", got, names)
	}
}

func waitTold[T comparable](t *testing.T, take func() []T, want T) {
	t.Helper()
	var got []T
	eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		got = append(got, take()...)
		return len(got) > 0, "nothing told"
	})
	if !slices.Equal(got, []T{want}) {
		t.Errorf("told %v, want %v", got, []T{want})
	}
}

// eventually polls cond until it holds, failing the test after timeout
// with what cond last said.
func eventually(t *testing.T, timeout time.Duration, cond func(context.Context) (bool, string)) {
	t.Helper()
	var why string
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var ok bool
		ok, why = cond(ctx)
		return ok, nil
	}); err != nil {
		t.Fatalf("not within %v: %s", timeout, why)
	}
}
