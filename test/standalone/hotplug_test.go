package standalone

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/controller/hotplug"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/standalone/node"
	"github.com/netop-dev/netop/internal/testing/testenv"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

// Issue 36 on the standalone's real node: a running pod joins a second
// Network when its annotation names it, and leaves it when it no longer
// does, keeping net1 untouched throughout; deleting the pods leaves
// nothing behind.
func TestHotPlug(t *testing.T) {
	sa, dataDir, stop := startWithNode(t)
	defer stop()
	cfg := restConfig(t, sa.kubeconfig)
	kube := kubernetes.NewForConfigOrDie(cfg)
	checkHotPlug(t, cfg, kube, "", "")
	deletePods(t, kube, "default")
	checkNothingAttached(t, cfg, []string{node.CNIDataDir(dataDir)}, []string{sa.netns})
}

// checkHotPlug plugs a second Network into a running pod on node
// ("" the scheduler's choice) and unplugs it, with a peer on peerNode.
func checkHotPlug(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, onNode, peerNode string) {
	t.Helper()
	nets := versioned.NewForConfigOrDie(cfg).SamplecrdV2().Networks("default")
	// hp-b has two addresses for pods (.2 and .3): its second holder's
	// address can only be the one hot-plug frees.
	for _, n := range []*samplecrdv2.Network{
		{ObjectMeta: metav1.ObjectMeta{Name: "hp-a"}, Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.184.1.0/24"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "hp-b"}, Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.184.2.0/28"}, Reserved: []string{"10.184.2.4-10.184.2.14"}}},
	} {
		if _, err := nets.Create(t.Context(), n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	runOn := func(name, node, networks string) {
		p := busyboxPod(name, corev1.RestartPolicyAlways, "sleep 3600")
		p.Spec.NodeName = node
		p.Annotations = map[string]string{netselect.NetworksAnnotation: networks}
		runPod(t, kube, p)
	}
	runOn("hp", onNode, "hp-a")
	runOn("hp-peer", peerNode, "hp-b")
	waitRunning(t, kube, "hp", "c")
	waitRunning(t, kube, "hp-peer", "c")
	net1Before := execIn(t, cfg, kube, "hp", "ip", "-o", "-4", "addr", "show", "dev", "net1")
	macBefore := execIn(t, cfg, kube, "hp", "cat", "/sys/class/net/net1/address")
	peer := allocation(t, kube, "hp-peer", "net1")

	// A ping over net1 runs through both changes: 60 at 0.2 s.
	var pinged string
	var pinging sync.WaitGroup
	pinging.Go(func() {
		out, errOut, code := execCode(t, cfg, kube, "hp", "ping", "-c", "60", "-i", "0.2", "-W", "1", "10.184.1.1")
		pinged = fmt.Sprintf("%s%s(exit %d)", out, errOut, code)
	})

	annotate(t, kube, "hp", "hp-a,hp-b")
	net2 := waitInterface(t, kube, "hp", "net2", true)
	addr := strings.Split(net2.IPs[0], "/")[0]
	if net2.Network != "default/hp-b" || !strings.Contains(execIn(t, cfg, kube, "hp", "ip", "-o", "addr", "show", "dev", "net2"), net2.IPs[0]) {
		t.Errorf("net2 %+v: not configured as allocated", net2)
	}
	for _, target := range []string{"10.184.2.1", strings.Split(peer.IPs[0], "/")[0]} {
		if !pings(t, cfg, kube, "hp", target, 10*time.Second) {
			var diag []string
			for _, pod := range []string{"hp", "hp-peer"} {
				out, _, _ := execCode(t, cfg, kube, pod, "sh", "-c", "ip -o link; ip -o addr; ip neigh; ip route")
				diag = append(diag, pod+":\n"+out)
			}
			list, _ := kube.CoreV1().Events("default").List(t.Context(), metav1.ListOptions{})
			for _, e := range list.Items {
				diag = append(diag, fmt.Sprintf("event %s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message))
			}
			t.Errorf("hp cannot ping %s over its new net2:\n%s", target, strings.Join(diag, "\n"))
		}
	}

	// Removing it: the address goes to another pod only once hp's node
	// has taken net2 down, as the pods' changes, in order, show.
	events := watchPods(t, kube)
	annotate(t, kube, "hp", "hp-a")
	runOn("hp-next", peerNode, "hp-b")
	waitInterface(t, kube, "hp", "net2", false)
	next := allocation(t, kube, "hp-next", "net1")
	if next.IPs[0] != net2.IPs[0] {
		t.Errorf("hp-next got %v, want the address hp-b had free, %s", next.IPs, net2.IPs[0])
	}
	order := events.until(t, func(p *corev1.Pod) bool {
		return p.Name == "hp-next" && p.Annotations[netselect.AllocationsAnnotation] != ""
	})
	acked := slices.IndexFunc(order, func(p *corev1.Pod) bool {
		return p.Name == "hp" && strings.Contains(p.Annotations[netselect.DetachedAnnotation], "net2/")
	})
	if acked < 0 {
		t.Errorf("%s was allocated to hp-next before hp's node acknowledged net2 down", addr)
	}
	if out := execIn(t, cfg, kube, "hp", "ls", "/sys/class/net"); strings.Contains(out, "net2") {
		t.Errorf("hp still has net2: %s", out)
	}

	pinging.Wait()
	if !strings.Contains(pinged, " 0% packet loss") || !strings.HasSuffix(pinged, "(exit 0)") {
		t.Errorf("the ping over net1 lost packets during the changes:\n%s", pinged)
	}
	if after := execIn(t, cfg, kube, "hp", "ip", "-o", "-4", "addr", "show", "dev", "net1"); after != net1Before {
		t.Errorf("net1 changed: %q, then %q", net1Before, after)
	}
	if after := execIn(t, cfg, kube, "hp", "cat", "/sys/class/net/net1/address"); after != macBefore {
		t.Errorf("net1's MAC changed: %s, then %s", macBefore, after)
	}
	checkEvents(t, kube, "hp", hotplug.ReasonAttached, hotplug.ReasonDetached)
}

// pings says whether pod pings target within timeout.
func pings(t *testing.T, cfg *rest.Config, kube kubernetes.Interface, pod, target string, timeout time.Duration) bool {
	t.Helper()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		if _, _, code := execCode(t, cfg, kube, pod, "ping", "-c", "1", "-W", "1", target); code == 0 {
			return true
		}
	}
	return false
}

// checkNothingAttached checks, once the pods are gone, that no Network
// counts an address held, and that the nodes (their CNI records and the
// namespaces of their bridges) keep no pod interface.
func checkNothingAttached(t *testing.T, cfg *rest.Config, recordDirs, netnss []string) {
	t.Helper()
	nets := versioned.NewForConfigOrDie(cfg).SamplecrdV2().Networks("default")
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		list, err := nets.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var held, records, veths []string
		for _, n := range list.Items {
			if n.Status.Addresses != nil && n.Status.Addresses.Allocated > 0 {
				held = append(held, fmt.Sprintf("%s: %d", n.Name, n.Status.Addresses.Allocated))
			}
		}
		for _, dir := range recordDirs {
			found, _ := filepath.Glob(filepath.Join(dir, "*.json"))
			records = append(records, found...)
		}
		for _, ns := range netnss {
			veths = append(veths, hostVeths(t, ns)...)
		}
		return len(held) == 0 && len(records) == 0 && len(veths) == 0,
			fmt.Sprintf("addresses held %v, records %v, host veths %v", held, records, veths)
	})
}

// allocation is pod's allocation of interface iface, once written.
func allocation(t *testing.T, kube kubernetes.Interface, pod, iface string) netselect.Allocation {
	t.Helper()
	var out netselect.Allocation
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		p, err := kube.CoreV1().Pods("default").Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		have, _ := netselect.ParseAllocations(p.Annotations[netselect.AllocationsAnnotation])
		for _, a := range have {
			if a.Interface == iface && !a.Detaching {
				out = a
				return true, ""
			}
		}
		return false, fmt.Sprintf("pod %s has no allocation for %s: %v", pod, iface, have)
	})
	return out
}

// annotate sets pod's Networks, as `kubectl annotate --overwrite` does.
func annotate(t *testing.T, kube kubernetes.Interface, pod, networks string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{netselect.NetworksAnnotation: networks}}})
	if _, err := kube.CoreV1().Pods("default").Patch(t.Context(), pod, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("annotating pod %s with %q: %v", pod, networks, err)
	}
}

// waitInterface waits until pod's network-status lists iface (present)
// or no longer does, and returns its allocation when present.
func waitInterface(t *testing.T, kube kubernetes.Interface, pod, iface string, present bool) netselect.Allocation {
	t.Helper()
	var out netselect.Allocation
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		p, err := kube.CoreV1().Pods("default").Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		var statuses []netselect.Status
		_ = json.Unmarshal([]byte(p.Annotations[netselect.StatusAnnotation]), &statuses)
		listed := slices.ContainsFunc(statuses, func(s netselect.Status) bool { return s.Interface == iface })
		have, _ := netselect.ParseAllocations(p.Annotations[netselect.AllocationsAnnotation])
		allocated := slices.IndexFunc(have, func(a netselect.Allocation) bool { return a.Interface == iface })
		if present && listed && allocated >= 0 {
			out = have[allocated]
			return true, ""
		}
		if !present && !listed && allocated < 0 {
			return true, ""
		}
		return false, fmt.Sprintf("pod %s: network-status %s, allocations %s", pod, p.Annotations[netselect.StatusAnnotation], p.Annotations[netselect.AllocationsAnnotation])
	})
	return out
}

// podEvents are the pods' changes as one watch delivered them, in order.
type podEvents struct {
	w watch.Interface
}

func watchPods(t *testing.T, kube kubernetes.Interface) *podEvents {
	t.Helper()
	list, err := kube.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := kube.CoreV1().Pods("default").Watch(t.Context(), metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return &podEvents{w: w}
}

// until returns the pods' states seen until one matches (included).
func (e *podEvents) until(t *testing.T, match func(*corev1.Pod) bool) []*corev1.Pod {
	t.Helper()
	var seen []*corev1.Pod
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-e.w.ResultChan():
			if !ok {
				t.Fatal("the pods' watch ended")
			}
			if p, ok := ev.Object.(*corev1.Pod); ok {
				seen = append(seen, p)
				if match(p) {
					return seen
				}
			}
		case <-timeout:
			t.Fatalf("no matching pod change in 30s after %d changes", len(seen))
		}
	}
}

// checkEvents checks that pod has Events of each reason.
func checkEvents(t *testing.T, kube kubernetes.Interface, pod string, reasons ...string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		list, err := kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err.Error()
		}
		var have []string
		for _, e := range list.Items {
			have = append(have, e.Reason+": "+e.Message)
		}
		for _, r := range reasons {
			if !slices.ContainsFunc(have, func(h string) bool { return strings.HasPrefix(h, r+": ") }) {
				return false, fmt.Sprintf("pod %s has no %s Event: %v", pod, r, have)
			}
		}
		return true, ""
	})
}

// hostVeths are the host ends of pods' interfaces in netns.
func hostVeths(t *testing.T, netns string) []string {
	t.Helper()
	out, err := exec.Command("ip", "-n", netns, "-o", "link", "show", "type", "veth").CombinedOutput()
	if err != nil {
		t.Fatalf("ip link in %s: %v: %s", netns, err, out)
	}
	var veths []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], "nv") {
			veths = append(veths, strings.TrimSuffix(strings.Split(f[1], "@")[0], ":"))
		}
	}
	return veths
}

// Issue 36: the node side killed (SIGKILL of the standalone, which takes
// its node's processes with it) right after a running pod's Networks
// changed, then started again on the same data directory: the pod ends
// with the interface attached once, as allocated, and leaving the Network
// frees its address; the pods' deletion leaves nothing behind.
func TestHotPlugSIGKILL(t *testing.T) {
	// The first run is killed: its stop is not called.
	sa, dataDir, _ := startWithNode(t)
	cfg := restConfig(t, sa.kubeconfig)
	kube := kubernetes.NewForConfigOrDie(cfg)
	nets := versioned.NewForConfigOrDie(cfg).SamplecrdV2().Networks("default")
	for _, n := range []*samplecrdv2.Network{
		{ObjectMeta: metav1.ObjectMeta{Name: "hp-a"}, Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.184.1.0/24"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "hp-b"}, Spec: samplecrdv2.NetworkSpec{CIDRs: []string{"10.184.2.0/24"}}},
	} {
		if _, err := nets.Create(t.Context(), n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	p := busyboxPod("hp", corev1.RestartPolicyAlways, "sleep 3600")
	p.Annotations = map[string]string{netselect.NetworksAnnotation: "hp-a"}
	runPod(t, kube, p)
	waitRunning(t, kube, "hp", "c")

	annotate(t, kube, "hp", "hp-a,hp-b")
	sa.kill(t)
	// Where the kill struck: the allocation written or not, net2 recorded
	// or not (made or not).
	records, _, _ := cni.Store{Dir: node.CNIDataDir(dataDir)}.List()
	recorded := slices.ContainsFunc(records, func(r cni.Record) bool {
		return slices.ContainsFunc(r.Interfaces, func(i cni.RecordedInterface) bool { return i.Interface == "net2" })
	})
	restarted := startStandaloneWith(t, sa.args...)
	restarted.netns = sa.netns
	sa = restarted
	cfg = restConfig(t, sa.kubeconfig)
	kube = kubernetes.NewForConfigOrDie(cfg)
	if pod, err := kube.CoreV1().Pods("default").Get(t.Context(), "hp", metav1.GetOptions{}); err == nil {
		t.Logf("killed with allocations %s; net2 recorded: %v", pod.Annotations[netselect.AllocationsAnnotation], recorded)
	}
	net2 := waitInterface(t, kube, "hp", "net2", true)
	// The restarted kubelet takes its running pods back a moment later.
	testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
		out, _, code, err := tryExec(ctx, cfg, kube, "default", "hp", "ip", "-o", "addr", "show", "dev", "net2")
		return err == nil && code == 0 && strings.Contains(out, net2.IPs[0]), fmt.Sprintf("net2 after the restart: %q (%v), want %s", out, err, net2.IPs[0])
	})
	annotate(t, kube, "hp", "hp-a")
	waitInterface(t, kube, "hp", "net2", false)
	deletePods(t, kube, "default")
	checkNothingAttached(t, cfg, []string{node.CNIDataDir(dataDir)}, []string{sa.netns})
	sa.stop(t)
	if left := leftovers(dataDir); len(left) > 0 {
		t.Errorf("after Ctrl-C, left behind:\n%s", strings.Join(left, "\n"))
	}
}
