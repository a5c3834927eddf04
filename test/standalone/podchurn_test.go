package standalone

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
)

// duplicateWatch watches every pod's allocations and counts the moments
// when two live pods hold one address: it checks the whole cache on every
// event, the way a user listing pods at that moment would see it.
type duplicateWatch struct {
	mu         sync.Mutex
	violations []string
	events     atomic.Int64
}

func (w *duplicateWatch) check(store cache.Store) {
	w.events.Add(1)
	held := map[string]string{}
	for _, obj := range store.List() {
		pod := obj.(*corev1.Pod)
		allocations, err := netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
		if err != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, a := range allocations {
			for _, ip := range a.IPs {
				key := a.Network + " " + ip
				if other, ok := held[key]; ok {
					w.mu.Lock()
					w.violations = append(w.violations, fmt.Sprintf("%s held by %s and %s", key, other, pod.Name))
					w.mu.Unlock()
				}
				held[key] = pod.Name
			}
		}
	}
}

// Pods created and deleted in waves, more of them over the run than the
// Network has addresses, with a SIGKILL of netop-standalone in the middle
// of a wave: no two live pods ever hold one address, every pod that lives
// gets one, and once they are all gone the Network shows none allocated.
func TestPodChurnWithSIGKILL(t *testing.T) {
	nettest.RequireRoot(t)
	const (
		waves   = 4
		perWave = 50
		cidr    = "10.77.0.0/25" // 125 addresses for 200 pods
		cidr2   = "10.77.1.0/26" // 61 for the pods that join it later
	)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("%d waves of %d pods in %s, random seed %d", waves, perWave, cidr, seed)
	netns := nettest.NetnsName("netop-c-")
	t.Cleanup(func() { _ = nettest.DeleteNetns(netns) })
	args := []string{"--data-dir", t.TempDir(), "--netns", netns, "--metrics-addr", "0", "--webhook-addr", "127.0.0.1:0"}
	sa := startStandaloneWith(t, args...)
	kube := kubernetes.NewForConfigOrDie(restConfig(t, sa.kubeconfig))
	nets := client(t, sa.kubeconfig).SamplecrdV1().Networks("default")
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		_, err := nets.Create(ctx, &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: "churn"}, Spec: samplecrdv1.NetworkSpec{CIDR: cidr}}, metav1.CreateOptions{})
		return err == nil, fmt.Sprint(err)
	})

	// Hot-plug in the mix: a second Network, which pods join and leave
	// while they live. Half the pods are bound to a node that never runs
	// them, whose acknowledgement never comes: the addresses they leave
	// stay theirs until they go.
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		_, err := nets.Create(ctx, &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: "churn2"}, Spec: samplecrdv1.NetworkSpec{CIDR: cidr2}}, metav1.CreateOptions{})
		return err == nil, fmt.Sprint(err)
	})
	if _, err := kube.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "churn-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	watch := &duplicateWatch{}
	factory := kubeinformers.NewSharedInformerFactoryWithOptions(kube, 0, kubeinformers.WithNamespace("default"))
	informer := factory.Core().V1().Pods().Informer()
	check := func(any) { watch.check(informer.GetStore()) }
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: check, UpdateFunc: func(_, n any) { check(n) }, DeleteFunc: check,
	}); err != nil {
		t.Fatal(err)
	}
	stopInformer := make(chan struct{})
	defer close(stopInformer)
	factory.Start(stopInformer)

	live := map[string]bool{}
	killWave := 1 + rng.IntN(waves-2)
	for wave := range waves {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i := range perWave {
			name := fmt.Sprintf("w%d-p%02d", wave, i)
			wg.Go(func() {
				pod := busyboxPod(name, corev1.RestartPolicyAlways, "sleep 3600")
				pod.Annotations = map[string]string{netselect.NetworksAnnotation: "churn"}
				if i%2 == 0 {
					pod.Spec.NodeName = "churn-node"
				}
				if _, err := kube.CoreV1().Pods("default").Create(context.Background(), pod, metav1.CreateOptions{}); err == nil {
					mu.Lock()
					live[name] = true
					mu.Unlock()
				}
			})
		}
		if wave == killWave {
			// Somewhere in the middle of the wave's allocations.
			killAt := perWave/5 + rng.IntN(perWave*3/5)
			testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
				n := allocatedWithPrefix(informer.GetStore(), fmt.Sprintf("w%d-", wave))
				return n >= killAt, fmt.Sprintf("%d of the wave's pods allocated, waiting for %d", n, killAt)
			})
			sa.kill(t)
			wg.Wait()
			t.Logf("wave %d: SIGKILL with %d of its pods allocated (%d created)", wave, allocatedWithPrefix(informer.GetStore(), fmt.Sprintf("w%d-", wave)),
				countPrefix(live, fmt.Sprintf("w%d-", wave)))
			sa = startStandaloneWith(t, args...)
		}
		wg.Wait()
		waitAllocated(t, kube)
		// A fifth of the live pods join churn2, or leave it.
		var names []string
		for name := range live {
			names = append(names, name)
		}
		slices.Sort(names)
		rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
		for _, name := range names[:len(names)/5] {
			wg.Go(func() { toggleNetwork(t, kube, name, "churn2") })
		}
		wg.Wait()
		// Delete a random half of the live pods, making room for the next
		// wave's.
		names = names[:0]
		for name := range live {
			names = append(names, name)
		}
		slices.Sort(names)
		rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
		for _, name := range names[:len(names)/2] {
			wg.Go(func() {
				if err := kube.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
					t.Errorf("deleting %s: %v", name, err)
				}
			})
			delete(live, name)
		}
		wg.Wait()
	}

	// All gone (with any whose creation the kill answered with an error
	// but which was stored): nothing stays allocated.
	if err := kube.CoreV1().Pods("default").DeleteCollection(t.Context(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, available := range map[string]string{"churn": "125", "churn2": "61"} {
		testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
			n, err := nets.Get(ctx, name, metav1.GetOptions{})
			if err != nil || n.Status.Addresses == nil {
				return false, fmt.Sprintf("%s: no usage (%v)", name, err)
			}
			return n.Status.Addresses.Allocated == 0 && n.Status.Addresses.Available == available, fmt.Sprintf("%s: %+v", name, *n.Status.Addresses)
		})
	}
	watch.mu.Lock()
	defer watch.mu.Unlock()
	t.Logf("%d pod events checked", watch.events.Load())
	if len(watch.violations) > 0 {
		t.Errorf("%d duplicate addresses seen, first: %s", len(watch.violations), strings.Join(watch.violations[:min(5, len(watch.violations))], "; "))
	}
	sa.stop(t)
}

func allocatedWithPrefix(store cache.Store, prefix string) int {
	n := 0
	for _, obj := range store.List() {
		pod := obj.(*corev1.Pod)
		if strings.HasPrefix(pod.Name, prefix) && pod.Annotations[netselect.AllocationsAnnotation] != "" {
			n++
		}
	}
	return n
}

func countPrefix(m map[string]bool, prefix string) int {
	n := 0
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// waitAllocated waits until every pod carries its allocation.
func waitAllocated(t *testing.T, kube kubernetes.Interface) {
	t.Helper()
	testenv.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, string) {
		pods, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var missing []string
		for _, p := range pods.Items {
			if p.Annotations[netselect.AllocationsAnnotation] == "" {
				missing = append(missing, p.Name)
			}
		}
		return len(missing) == 0, fmt.Sprintf("%d pods without addresses: %v", len(missing), missing[:min(5, len(missing))])
	})
}

// toggleNetwork has pod join network, or leave it if it is on it, as
// `kubectl annotate --overwrite` would; a pod gone meanwhile is not an
// error.
func toggleNetwork(t *testing.T, kube kubernetes.Interface, pod, network string) {
	p, err := kube.CoreV1().Pods("default").Get(context.Background(), pod, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Errorf("reading %s: %v", pod, err)
		return
	}
	networks := "churn," + network
	if strings.Contains(p.Annotations[netselect.NetworksAnnotation], network) {
		networks = "churn"
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{netselect.NetworksAnnotation: networks}}})
	// An edit of a pod's Networks goes through netop's webhook, which a
	// restart has serve at a new address a moment after it starts.
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, err := kube.CoreV1().Pods("default").Patch(context.Background(), pod, types.MergePatchType, patch, metav1.PatchOptions{})
		switch {
		case err == nil || apierrors.IsNotFound(err):
			return
		case apierrors.IsInternalError(err) && strings.Contains(err.Error(), "failed calling webhook") && time.Now().Before(deadline):
			time.Sleep(100 * time.Millisecond)
		default:
			t.Errorf("annotating %s: %v", pod, err)
			return
		}
	}
}
