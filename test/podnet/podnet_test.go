// Package podnet tests the allocation of pods' addresses against a real API
// server, without a node: the allocation happens when a pod is created,
// before it is scheduled.
package podnet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeinformers "k8s.io/client-go/informers"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"

	"github.com/netop-dev/netop/internal/controller/podnet"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/testing/testenv"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	informers "github.com/netop-dev/netop/pkg/generated/informers/externalversions"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// startController runs the allocation controller until the returned stop.
func startController(t *testing.T, env *testenv.Env) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	kubeFactory := kubeinformers.NewSharedInformerFactory(env.Kube, 0)
	netFactory := informers.NewSharedInformerFactory(env.Netop, 0)
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: env.Kube.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme(), corev1.EventSource{Component: "netop"})
	c, err := podnet.New(ctx, env.Kube, kubeFactory.Core().V1().Pods(), netFactory.Samplecrd().V2().Networks(), kubeFactory.Core().V1().Namespaces(),
		recorder, metrics.New(), podnet.Options{Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	kubeFactory.Start(ctx.Done())
	netFactory.Start(ctx.Done())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-done
		kubeFactory.Shutdown()
		netFactory.Shutdown()
		broadcaster.Shutdown()
	}
	t.Cleanup(stop)
	return stop
}

func createNetwork(t *testing.T, env *testenv.Env, ns, name, cidr string) {
	t.Helper()
	if _, err := env.Netop.SamplecrdV1().Networks(ns).Create(t.Context(), &samplecrdv1.Network{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: samplecrdv1.NetworkSpec{CIDR: cidr}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func createPod(t *testing.T, env *testenv.Env, ns, name, networks string) {
	t.Helper()
	createPodOn(t, env, ns, name, networks, "")
}

// createPodOn is createPod bound to node ("" leaves it unscheduled).
func createPodOn(t *testing.T, env *testenv.Env, ns, name, networks, node string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{netselect.NetworksAnnotation: networks}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	if _, err := env.Kube.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// allocations reads the allocations of every pod of ns, by pod.
func allocations(t *testing.T, env *testenv.Env, ns string) map[string][]netselect.Allocation {
	t.Helper()
	pods, err := env.Kube.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]netselect.Allocation{}
	for _, p := range pods.Items {
		if v := p.Annotations[netselect.AllocationsAnnotation]; v != "" {
			var a []netselect.Allocation
			if err := json.Unmarshal([]byte(v), &a); err != nil {
				t.Fatalf("pod %s: %v", p.Name, err)
			}
			out[p.Name] = a
		}
	}
	return out
}

// duplicates lists addresses held by more than one pod.
func duplicates(all map[string][]netselect.Allocation) []string {
	seen := map[string]string{}
	var dups []string
	for pod, as := range all {
		for _, a := range as {
			for _, ip := range a.IPs {
				key := a.Network + " " + ip
				if other, ok := seen[key]; ok {
					dups = append(dups, fmt.Sprintf("%s held by %s and %s", key, other, pod))
				}
				seen[key] = pod
			}
		}
	}
	return dups
}

// waitEvent waits for an Event of reason on pod, with message if given.
func waitEvent(t *testing.T, env *testenv.Env, ns, pod, reason, message string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		events, err := env.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range events.Items {
			if e.Reason == reason && (message == "" || e.Message == message) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events, none %s %q", len(events.Items), reason, message)
	})
}

func waitAllocated(t *testing.T, env *testenv.Env, ns string, n int) map[string][]netselect.Allocation {
	t.Helper()
	var all map[string][]netselect.Allocation
	testenv.Eventually(t, 60*time.Second, func(context.Context) (bool, string) {
		all = allocations(t, env, ns)
		return len(all) == n, fmt.Sprintf("%d of %d pods allocated", len(all), n)
	})
	return all
}

// Fifty pods created at once get fifty distinct addresses of the cidr,
// never the network, gateway or broadcast address, with Multus's
// network-status beside; several Networks and interfaces per pod work.
func TestConcurrentPodsGetDistinctAddresses(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	createNetwork(t, env, ns, "example-network", "192.168.0.0/16")
	createNetwork(t, env, ns, "second", "fd00:42::/64")
	startController(t, env)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() { createPod(t, env, ns, fmt.Sprintf("p%02d", i), "example-network,second@data") })
	}
	wg.Wait()
	all := waitAllocated(t, env, ns, 50)
	if dups := duplicates(all); len(dups) > 0 {
		t.Fatalf("duplicates: %v", dups)
	}
	prefix := netip.MustParsePrefix("192.168.0.0/16")
	for pod, as := range all {
		if len(as) != 2 || as[0].Interface != "net1" || as[1].Interface != "data" {
			t.Fatalf("pod %s: %+v", pod, as)
		}
		p := netip.MustParsePrefix(as[0].IPs[0])
		if !prefix.Contains(p.Addr()) || p.Bits() != 16 || p.Addr() == netip.MustParseAddr("192.168.0.0") || p.Addr() == netip.MustParseAddr("192.168.0.1") || p.Addr() == netip.MustParseAddr("192.168.255.255") {
			t.Errorf("pod %s: address %s", pod, p)
		}
	}
	got, err := env.Kube.CoreV1().Pods(ns).Get(t.Context(), "p00", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var status []netselect.Status
	if err := json.Unmarshal([]byte(got.Annotations[netselect.StatusAnnotation]), &status); err != nil || len(status) != 2 {
		t.Fatalf("network-status %q: %v", got.Annotations[netselect.StatusAnnotation], err)
	}
	if status[0].Name != ns+"/example-network" || status[0].Interface != "net1" || len(status[0].IPs) != 1 || status[0].MAC == "" {
		t.Errorf("network-status %+v", status[0])
	}
}

// A full Network leaves the pod waiting, with an Event naming the Network;
// when a pod goes, the waiting one gets its address.
func TestFullNetworkWaitsThenRecovers(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	createNetwork(t, env, ns, "tiny", "10.77.0.0/29") // 5 addresses for pods
	startController(t, env)
	for i := range 5 {
		createPod(t, env, ns, fmt.Sprintf("p%d", i), "tiny")
	}
	waitAllocated(t, env, ns, 5)
	createPod(t, env, ns, "late", "tiny")
	waitEvent(t, env, ns, "late", podnet.ReasonNoFreeAddress, fmt.Sprintf("Network %s/tiny has no free address", ns))
	freed := allocations(t, env, ns)["p2"][0].IPs[0]
	if err := env.Kube.CoreV1().Pods(ns).Delete(t.Context(), "p2", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	all := waitAllocated(t, env, ns, 5) // p2 gone, late in
	if got := all["late"]; len(got) != 1 || got[0].IPs[0] != freed {
		t.Errorf("late got %+v, want the freed %s", got, freed)
	}

	// A pod that failed (here before its sandbox ever ran) frees its
	// address too, with the pod still there.
	createPod(t, env, ns, "later", "tiny")
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p3, err := env.Kube.CoreV1().Pods(ns).Get(t.Context(), "p3", metav1.GetOptions{})
		if err != nil {
			return err
		}
		p3.Status.Phase = corev1.PodFailed
		_, err = env.Kube.CoreV1().Pods(ns).UpdateStatus(t.Context(), p3, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
		got := allocations(t, env, ns)["later"]
		return len(got) == 1 && got[0].IPs[0] == all["p3"][0].IPs[0], fmt.Sprintf("later has %+v, want p3's %s", got, all["p3"][0].IPs[0])
	})
}

// A restarted controller rebuilds from the pods: new pods never get an
// address a live pod has, and the addresses of pods deleted while it was
// down are free again.
func TestRestartRebuildsFromPods(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	createNetwork(t, env, ns, "n", "10.78.0.0/28") // 13 addresses for pods
	stop := startController(t, env)
	for i := range 10 {
		createPod(t, env, ns, fmt.Sprintf("a%d", i), "n")
	}
	waitAllocated(t, env, ns, 10)
	stop()
	for i := range 5 {
		if err := env.Kube.CoreV1().Pods(ns).Delete(t.Context(), fmt.Sprintf("a%d", i), metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	}
	startController(t, env)
	for i := range 8 {
		createPod(t, env, ns, fmt.Sprintf("b%d", i), "n")
	}
	all := waitAllocated(t, env, ns, 13)
	if dups := duplicates(all); len(dups) > 0 {
		t.Fatalf("duplicates after the restart: %v", dups)
	}
}

// A static address is honoured, or refused with an Event saying why.
func TestStaticAddress(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	createNetwork(t, env, ns, "n", "10.79.0.0/24")
	startController(t, env)
	createPod(t, env, ns, "fixed", `[{"name":"n","ips":["10.79.0.50/24"],"mac":"02:00:00:00:00:50"}]`)
	createPod(t, env, ns, "gateway", `[{"name":"n","ips":["10.79.0.1"]}]`)
	all := waitAllocated(t, env, ns, 1)
	if got := all["fixed"]; len(got) != 1 || got[0].IPs[0] != "10.79.0.50/24" || got[0].MAC != "02:00:00:00:00:50" {
		t.Errorf("fixed got %+v", got)
	}
	waitEvent(t, env, ns, "gateway", podnet.ReasonAddressRefused, "")
}

// A node that goes takes its pods' addresses with it: kube-controller-
// manager's pod garbage collector deletes the pods bound to a Node that no
// longer exists (after its quarantine of about 40 s), and their deletion
// frees the addresses, here the only one of a /30.
func TestNodeGoneFreesAddresses(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	createNetwork(t, env, ns, "one", "10.79.0.0/30") // one address for a pod
	startController(t, env)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gone-" + ns}}
	if _, err := env.Kube.CoreV1().Nodes().Create(t.Context(), node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "on-gone-node", Annotations: map[string]string{netselect.NetworksAnnotation: "one"}},
		Spec: corev1.PodSpec{NodeName: node.Name, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	if _, err := env.Kube.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	held := waitAllocated(t, env, ns, 1)["on-gone-node"][0].IPs[0]
	createPod(t, env, ns, "waiting", "one")
	if err := env.Kube.CoreV1().Nodes().Delete(t.Context(), node.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 3*time.Minute, func(context.Context) (bool, string) {
		got := allocations(t, env, ns)
		return len(got) == 1 && len(got["waiting"]) == 1 && got["waiting"][0].IPs[0] == held, fmt.Sprintf("allocations %v", got)
	})
}

// A dual-stack Network gives each pod interface an address of each family,
// distinct across pods created at once, in the order of the Network's
// cidrs, with both in Multus's network-status; a pod that pins its IPv6
// address gets an IPv4 one beside it; a restarted controller rebuilds both
// families' pools from the pods.
func TestDualStackPodsGetAnAddressPerFamily(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	if _, err := env.Netop.SamplecrdV2().Networks(ns).Create(t.Context(), &samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Name: "dual"},
		Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"fd82::/120", "10.82.0.0/27"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stop := startController(t, env)
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() { createPod(t, env, ns, fmt.Sprintf("p%02d", i), "dual") })
	}
	wg.Wait()
	createPod(t, env, ns, "pinned", `[{"name":"dual","ips":["fd82::80"]}]`)
	all := waitAllocated(t, env, ns, 13)
	v6, v4 := netip.MustParsePrefix("fd82::/120"), netip.MustParsePrefix("10.82.0.0/27")
	for pod, as := range all {
		if len(as) != 1 || len(as[0].IPs) != 2 {
			t.Fatalf("pod %s: %+v, want one interface with two addresses", pod, as)
		}
		first, second := netip.MustParsePrefix(as[0].IPs[0]), netip.MustParsePrefix(as[0].IPs[1])
		if !v6.Contains(first.Addr()) || first.Bits() != 120 || !v4.Contains(second.Addr()) || second.Bits() != 27 {
			t.Errorf("pod %s: addresses %v, want one of %s then one of %s with their prefix lengths", pod, as[0].IPs, v6, v4)
		}
		for _, gateway := range []string{"fd82::1", "10.82.0.1"} {
			if first.Addr().String() == gateway || second.Addr().String() == gateway {
				t.Errorf("pod %s got the gateway %s", pod, gateway)
			}
		}
	}
	if got := all["pinned"][0].IPs[0]; got != "fd82::80/120" {
		t.Errorf("pinned got %s, want the fd82::80 it asked for", got)
	}
	if dups := duplicates(all); len(dups) > 0 {
		t.Fatalf("duplicates: %v", dups)
	}
	got, err := env.Kube.CoreV1().Pods(ns).Get(t.Context(), "p00", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var status []netselect.Status
	if err := json.Unmarshal([]byte(got.Annotations[netselect.StatusAnnotation]), &status); err != nil || len(status) != 1 || len(status[0].IPs) != 2 {
		t.Fatalf("network-status %q (%v), want both addresses", got.Annotations[netselect.StatusAnnotation], err)
	}

	// The IPv4 /27 has 29 addresses for pods: after a restart the 16 left
	// go to new pods, none twice in either family.
	stop()
	startController(t, env)
	for i := range 16 {
		createPod(t, env, ns, fmt.Sprintf("q%02d", i), "dual")
	}
	all = waitAllocated(t, env, ns, 29)
	if dups := duplicates(all); len(dups) > 0 {
		t.Fatalf("duplicates after the restart: %v", dups)
	}
	// Full in IPv4, though IPv6 has addresses left: the pod waits, told
	// which family is full.
	createPod(t, env, ns, "late", "dual")
	waitEvent(t, env, ns, "late", podnet.ReasonNoFreeAddress, fmt.Sprintf("Network %s/dual has no free address in 10.82.0.0/27", ns))
}
