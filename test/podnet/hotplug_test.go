package podnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubeinformers "k8s.io/client-go/informers"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/cni/allocated"
	"github.com/netop-dev/netop/internal/controller/hotplug"
	"github.com/netop-dev/netop/internal/cri"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
)

// hotPlugNode is the node hot-plug tests' pods run on.
const hotPlugNode = "hotplug-node"

// sandboxes stand for the node's container runtime: the sandboxes the
// test made (a network namespace each), by pod UID; err, when set, is
// what every call answers (a runtime that does not answer).
type sandboxes struct {
	mu    sync.Mutex
	byUID map[string]cri.Sandbox
	err   error
	// asked, if set, is told of each pod whose sandbox is asked for, and
	// readyAsked of each sandbox asked whether it is still ready.
	asked      func(uid string)
	readyAsked func(id string)
}

func (s *sandboxes) PodSandbox(_ context.Context, uid string) (cri.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.asked != nil {
		s.asked(uid)
	}
	if s.err != nil {
		return cri.Sandbox{}, s.err
	}
	sb, ok := s.byUID[uid]
	if !ok {
		return cri.Sandbox{}, cri.ErrNoSandbox
	}
	return sb, nil
}

func (s *sandboxes) SandboxReady(_ context.Context, id string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readyAsked != nil {
		s.readyAsked(id)
	}
	if s.err != nil {
		return false, s.err
	}
	for _, sb := range s.byUID {
		if sb.ID == id {
			return true, nil
		}
	}
	return false, nil
}

func (s *sandboxes) set(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

// stop has the runtime no longer have the pod's sandbox (the kubelet
// stops it before its DEL).
func (s *sandboxes) stop(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byUID, string(uid))
}

// deletePod deletes the pod named at once, as no kubelet runs here.
func (n *cniNode) deletePod(t *testing.T, name string) {
	t.Helper()
	if err := n.env.Kube.CoreV1().Pods(n.ns).Delete(t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
}

// waitSwept waits until the sandbox's record is gone.
func (n *cniNode) waitSwept(t *testing.T, s *sandbox) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
		_, ok, err := cni.Store{Dir: n.dataDir}.Load(s.containerID)
		return !ok && err == nil, fmt.Sprintf("%s's record: %v %v", s.pod.Name, ok, err)
	})
}

// runningSandbox makes a pod of networks on hotPlugNode, attaches it as
// the runtime does (CNI ADD), marks it Running and registers its sandbox.
func (n *cniNode) runningSandbox(t *testing.T, runtime *sandboxes, name, networks string) *sandbox {
	t.Helper()
	s := n.newSandboxOn(t, n.ns, name, networks, hotPlugNode, true)
	if _, err := n.runtime.AddNetworkList(t.Context(), n.conf(t, "1.0.0", ""), s.rt("eth0")); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	s.pod.Status.Phase = corev1.PodRunning
	var err error
	if s.pod, err = n.env.Kube.CoreV1().Pods(n.ns).UpdateStatus(t.Context(), s.pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	runtime.mu.Lock()
	runtime.byUID[string(s.pod.UID)] = cri.Sandbox{ID: s.containerID, Netns: s.netns}
	runtime.mu.Unlock()
	return s
}

// startHotPlug runs the node's hot-plug controller for hotPlugNode, on the
// node's namespace and records, asking runtime.
func (n *cniNode) startHotPlug(t *testing.T, runtime *sandboxes) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	ns, err := netns.GetFromPath(n.netns)
	if err != nil {
		t.Fatal(err)
	}
	attacher, err := cni.NewAttacher(ns)
	_ = ns.Close()
	if err != nil {
		t.Fatal(err)
	}
	factory := kubeinformers.NewSharedInformerFactoryWithOptions(n.env.Kube, 0, kubeinformers.WithNamespace(n.ns))
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: n.env.Kube.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme(), corev1.EventSource{Component: "netop"})
	c, err := hotplug.New(ctx, n.env.Kube, factory.Core().V1().Pods(), recorder, metrics.New(), hotplug.Options{
		Node: hotPlugNode, Runtime: runtime, Attacher: attacher, Store: cni.Store{Dir: n.dataDir}, Config: "netop-test", Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		factory.Shutdown()
		broadcaster.Shutdown()
		attacher.Close()
	})
}

// setNetworks sets the pod's Networks, as `kubectl annotate --overwrite`.
func (n *cniNode) setNetworks(t *testing.T, s *sandbox, networks string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{netselect.NetworksAnnotation: networks}}})
	if _, err := n.env.Kube.CoreV1().Pods(n.ns).Patch(t.Context(), s.pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitStatus waits until the pod's allocations hold interfaces ifaces
// (detaching ones left out) and its network-status lists exactly them;
// s.allocations are then those.
func (n *cniNode) waitStatus(t *testing.T, s *sandbox, ifaces ...string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
		pod, err := n.env.Kube.CoreV1().Pods(n.ns).Get(ctx, s.pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		have, _ := netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
		var allocated, listed []string
		for _, a := range have {
			allocated = append(allocated, a.Interface)
		}
		var statuses []netselect.Status
		_ = json.Unmarshal([]byte(pod.Annotations[netselect.StatusAnnotation]), &statuses)
		for _, st := range statuses {
			listed = append(listed, st.Interface)
		}
		s.pod, s.allocations = pod, have
		return slices.Equal(allocated, ifaces) && slices.Equal(listed, ifaces),
			fmt.Sprintf("pod %s: allocations %v, network-status %v, want %v", s.pod.Name, allocated, listed, ifaces)
	})
}

// requireNoInterface checks that the pod has no iface, nor a host end or
// a record of it.
func (n *cniNode) requireNoInterface(t *testing.T, s *sandbox, iface string) {
	t.Helper()
	if _, err := s.handle.LinkByName(iface); err == nil {
		t.Errorf("pod %s: %s is there", s.pod.Name, iface)
	}
	if _, err := n.node.LinkByName(ifname.HostVeth(s.containerID, iface)); err == nil {
		t.Errorf("pod %s: the host end of %s is there", s.pod.Name, iface)
	}
	if r, _, _ := (cni.Store{Dir: n.dataDir}).Load(s.containerID); slices.ContainsFunc(r.Interfaces, func(i cni.RecordedInterface) bool { return i.Interface == iface }) {
		t.Errorf("pod %s: the record still has %s", s.pod.Name, iface)
	}
}

// allocated is how many addresses the Network shows held.
func (n *cniNode) allocated(t *testing.T, network string) int64 {
	t.Helper()
	got, err := n.env.Netop.SamplecrdV2().Networks(n.ns).Get(t.Context(), network, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Addresses == nil {
		return 0
	}
	return got.Status.Addresses.Allocated
}

// Hot-plug's failures, on a node of real namespaces and a real API server,
// with the runtime stood for: whatever happens, no interface is left half
// made, no address is lost, and the pod's Events say why.
func TestHotPlugFailures(t *testing.T) {
	n := startCNINode(t)
	runtime := &sandboxes{byUID: map[string]cri.Sandbox{}}
	if _, err := n.env.Kube.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: hotPlugNode}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.env.Kube.CoreV1().Nodes().Delete(context.Background(), hotPlugNode, metav1.DeleteOptions{})
	})
	p1 := n.runningSandbox(t, runtime, "p1", "example-network")
	p2 := n.runningSandbox(t, runtime, "p2", "example-network")
	parent := t

	t.Run("killed between the record and the interface", func(t *testing.T) {
		// p1 is given v6 while no node side runs; what a SIGKILL after
		// the record was written and before the interface was made
		// leaves: a record of net2, no net2.
		n.setNetworks(t, p1, "example-network,v6")
		testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
			pod, _ := n.env.Kube.CoreV1().Pods(n.ns).Get(ctx, "p1", metav1.GetOptions{})
			p1.allocations, _ = netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
			return len(p1.allocations) == 2, fmt.Sprintf("allocations %v", p1.allocations)
		})
		store := cni.Store{Dir: n.dataDir}
		rec, _, err := store.Load(p1.containerID)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Save(rec.With(allocated.Interfaces("netop-test", p1.containerID, p1.allocations[1:]...)...)); err != nil {
			t.Fatal(err)
		}
		n.startHotPlug(parent, runtime)
		n.waitStatus(t, p1, "net1", "net2")
		n.requireAttached(t, p1)
		ping(t, p1, "fd00:42::1")
	})

	t.Run("the runtime does not answer", func(t *testing.T) {
		before := n.allocated(t, "v6")
		runtime.set(errors.New("connection refused"))
		n.setNetworks(t, p2, "example-network,v6")
		waitEvent(t, n.env, n.ns, "p2", hotplug.ReasonRuntimeUnreachable, "")
		n.requireNoInterface(t, p2, "net2")
		// The address stays the pod's, counted, while it waits.
		testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
			got := n.allocated(t, "v6")
			return got == before+1, fmt.Sprintf("v6 shows %d addresses held, want %d", got, before+1)
		})
		// The runtime answers again: the retry attaches.
		runtime.set(nil)
		n.waitStatus(t, p2, "net1", "net2")
		n.requireAttached(t, p2)
	})

	t.Run("the Network deleted while attaching", func(t *testing.T) {
		createNetwork(t, n.env, n.ns, "late", "10.95.0.0/24")
		late := n.env.WaitReady(t, n.ns, "late", metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)
		n.setNetworks(t, p2, "example-network,v6,late")
		if err := n.env.Netop.SamplecrdV1().Networks(n.ns).Delete(t.Context(), "late", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// Either way (attached before the deletion, or refused for it),
		// taking it out of the list lets the Network go, with its bridge,
		// and leaves p2 nothing of it.
		n.setNetworks(t, p2, "example-network,v6")
		n.waitStatus(t, p2, "net1", "net2")
		testenv.Eventually(t, time.Minute, func(ctx context.Context) (bool, string) {
			_, err := n.env.Netop.SamplecrdV1().Networks(n.ns).Get(ctx, "late", metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprintf("Network late still there: %v", err)
		})
		n.requireNoInterface(t, p2, "net3")
		if _, err := n.node.LinkByName(ifname.Bridge(late.UID)); err == nil {
			t.Error("Network late's bridge is still there")
		}
	})

	t.Run("the sandbox stopped while hot-plug waited for its lock", func(t *testing.T) {
		// The runtime stops a sandbox, then sends its DEL. A change that
		// found the sandbox ready and then waited for its lock (here the
		// test's, in a DEL's place) attaches nothing into it.
		p3 := n.runningSandbox(t, runtime, "p3", "example-network")
		uid := string(p3.pod.UID)
		asked := make(chan struct{})
		var once sync.Once
		runtime.mu.Lock()
		runtime.asked = func(u string) {
			if u == uid {
				once.Do(func() { close(asked) })
			}
		}
		runtime.mu.Unlock()
		lock, err := cni.Store{Dir: n.dataDir}.Lock(p3.containerID)
		if err != nil {
			t.Fatal(err)
		}
		n.setNetworks(t, p3, "example-network,v6")
		select {
		case <-asked:
		case <-time.After(30 * time.Second):
			t.Fatal("hot-plug did not ask for p3's sandbox")
		}
		// Stopped; hot-plug, given the lock, either asks again and is told
		// so, or attaches.
		var readyAsked atomic.Bool
		runtime.mu.Lock()
		runtime.asked = nil
		runtime.readyAsked = func(id string) { readyAsked.Store(readyAsked.Load() || id == p3.containerID) }
		delete(runtime.byUID, uid)
		runtime.mu.Unlock()
		if err := lock.Unlock(); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
			_, err := p3.handle.LinkByName("net2")
			return readyAsked.Load() || err == nil, "hot-plug neither asked whether p3's sandbox is ready nor attached net2"
		})
		runtime.mu.Lock()
		runtime.readyAsked = nil
		runtime.mu.Unlock()
		n.requireNoInterface(t, p3, "net2")

		n.deletePod(t, p3.pod.Name)
		if err := n.runtime.DelNetworkList(t.Context(), n.conf(t, "1.0.0", ""), p3.rt("eth0")); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		n.requireDetached(t, p3)
	})

	t.Run("an interface found broken is made again", func(t *testing.T) {
		// Someone in p2 sets net2 down. The next change of p2's Networks
		// finds it recorded but not as attached: it is made again, and
		// stays recorded (under the configuration that made it: here a
		// delegate's, as Multus's would be) and listed, never an
		// interface no record knows.
		store := cni.Store{Dir: n.dataDir}
		rec, _, err := store.Load(p2.containerID)
		if err != nil {
			t.Fatal(err)
		}
		for i := range rec.Interfaces {
			if rec.Interfaces[i].Interface == "net2" {
				rec.Interfaces[i].Config = "delegate-v6"
			}
		}
		if err := store.Save(rec); err != nil {
			t.Fatal(err)
		}
		link, err := p2.handle.LinkByName("net2")
		if err != nil {
			t.Fatal(err)
		}
		if err := p2.handle.LinkSetDown(link); err != nil {
			t.Fatal(err)
		}
		createNetwork(t, n.env, n.ns, "third", "10.96.0.0/24")
		n.networks["third"] = n.env.WaitReady(t, n.ns, "third", metav1.ConditionTrue, samplecrd.ReasonProvisioned, time.Minute)
		n.setNetworks(t, p2, "example-network,v6,third")
		n.waitStatus(t, p2, "net1", "net2", "net3")
		n.requireAttached(t, p2)
		if rec, _, err := store.Load(p2.containerID); err != nil || !slices.ContainsFunc(rec.Interfaces, func(i cni.RecordedInterface) bool { return i.Interface == "net2" && i.Config == "delegate-v6" }) {
			t.Errorf("net2's record after it was made again: %+v %v, want it under delegate-v6", rec.Interfaces, err)
		}

		n.setNetworks(t, p2, "example-network,v6")
		n.waitStatus(t, p2, "net1", "net2")
		n.requireNoInterface(t, p2, "net3")
		if err := n.env.Netop.SamplecrdV1().Networks(n.ns).Delete(t.Context(), "third", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a pod made again under its name is not swept with it", func(t *testing.T) {
		// A StatefulSet's pod is deleted and made again under its name,
		// and its successor's sandbox is recorded (the runtime not yet
		// saying it is ready: it is being made) before hot-plug sweeps
		// what the first one's records still hold. Records sort by name,
		// so the successor's ("0…") comes first.
		p4 := n.runningSandbox(t, runtime, "p4", "example-network")
		store := cni.Store{Dir: n.dataDir}
		successor := cni.Record{ContainerID: "0successor", Netns: "/run/netns/0successor", Pod: n.ns + "/p4", PodUID: "successor-uid",
			Interfaces: []cni.RecordedInterface{{Config: "netop-test", Interface: "net1", Network: n.ns + "/example-network", HostVeth: ifname.HostVeth("0successor", "net1")}}}
		if err := store.Save(successor); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Remove(successor.ContainerID) })
		runtime.stop(p4.pod.UID)
		n.deletePod(t, p4.pod.Name)
		n.waitSwept(t, p4)
		n.requireDetached(t, p4)
		if _, ok, err := store.Load(successor.ContainerID); !ok || err != nil {
			t.Errorf("the successor's record was swept with p4's: %v %v", ok, err)
		}
	})

	t.Run("a pod deleted while its sandbox runs, then made again under its name", func(t *testing.T) {
		// Deleted while the runtime still has its sandbox ready, p5 is
		// looked at again later; by then its successor of the same name
		// is in the cache. What p5's records hold is still swept once its
		// sandbox stops, and the successor's sync goes on as any.
		p5 := n.runningSandbox(t, runtime, "p5", "example-network")
		n.deletePod(t, p5.pod.Name)
		successor := n.newSandboxOn(t, n.ns, "p5", "", hotPlugNode, false)
		runtime.stop(p5.pod.UID)
		n.waitSwept(t, p5)
		n.requireDetached(t, p5)
		n.deletePod(t, successor.pod.Name)
	})

	t.Run("two pods of a name deleted before the first's sandbox stops", func(t *testing.T) {
		// p6 is deleted while its sandbox runs; its successor of the same
		// name is made and deleted too before p6's sandbox stops. What
		// p6's records hold is still swept.
		p6 := n.runningSandbox(t, runtime, "p6", "example-network")
		n.deletePod(t, p6.pod.Name)
		successor := n.newSandboxOn(t, n.ns, "p6", "", hotPlugNode, false)
		n.deletePod(t, successor.pod.Name)
		testenv.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, string) {
			_, err := n.env.Kube.CoreV1().Pods(n.ns).Get(ctx, "p6", metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprintf("p6's successor: %v", err)
		})
		runtime.stop(p6.pod.UID)
		n.waitSwept(t, p6)
		n.requireDetached(t, p6)
	})

	t.Run("removed, then the pods deleted", func(t *testing.T) {
		n.setNetworks(t, p1, "example-network")
		n.waitStatus(t, p1, "net1")
		n.requireNoInterface(t, p1, "net2")
		for _, s := range []*sandbox{p1, p2} {
			n.deletePod(t, s.pod.Name)
			if err := n.runtime.DelNetworkList(t.Context(), n.conf(t, "1.0.0", ""), s.rt("eth0")); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			runtime.stop(s.pod.UID)
			n.requireDetached(t, s)
		}
		for _, network := range []string{"example-network", "v6"} {
			testenv.Eventually(t, 30*time.Second, func(context.Context) (bool, string) {
				got := n.allocated(t, network)
				return got == 0, fmt.Sprintf("%s shows %d addresses held", network, got)
			})
		}
	})
}
