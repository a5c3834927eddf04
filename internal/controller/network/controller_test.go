package network_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/testing/backendtest"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// harness is one test's namespace, network namespace, backend and operator.
type harness struct {
	t       *testing.T
	env     *testenv.Env
	ns      string
	netns   string
	linux   *linux.Backend
	backend *backendtest.Backend
	opts    *operator.Options
	op      *operator.Operator
	stopOp  func()
}

func newHarness(t *testing.T, resync time.Duration) *harness {
	t.Helper()
	nettest.RequireRoot(t)
	env := testenv.Get(t)
	h := &harness{t: t, env: env, ns: env.Namespace(t), netns: nettest.NetnsName("netop-t-")}
	t.Cleanup(func() {
		if err := nettest.DeleteNetns(h.netns); err != nil {
			t.Errorf("deleting netns: %v", err)
		}
	})
	lb, err := linux.New(t.Context(), linux.Config{Netns: h.netns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lb.Close)
	h.linux, h.backend = lb, backendtest.Wrap(lb)
	h.opts = operator.NewOptions()
	h.opts.Namespace = h.ns
	h.opts.Resync = resync
	h.opts.Metrics.Addr = "0"
	h.opts.Webhooks.Addr = "0"
	h.opts.Workloads.Enabled = false
	h.opts.Client.QPS, h.opts.Client.Burst = 500, 1000
	return h
}

// start runs the operator until stop or the end of the test.
func (h *harness) start() {
	h.t.Helper()
	h.op, h.stopOp = testenv.StartOperator(h.t, h.env.Config, h.opts, h.backend)
}

func (h *harness) create(name, cidr, gateway string) *samplecrdv1.Network {
	h.t.Helper()
	n, err := h.env.Netop.SamplecrdV1().Networks(h.ns).Create(context.Background(), &samplecrdv1.Network{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       samplecrdv1.NetworkSpec{CIDR: cidr, Gateway: gateway},
	}, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatalf("creating %s: %v", name, err)
	}
	return n
}

func (h *harness) waitReady(name string, status metav1.ConditionStatus, reason string) *samplecrdv1.Network {
	h.t.Helper()
	return h.env.WaitReady(h.t, h.ns, name, status, reason, 15*time.Second)
}

func (h *harness) handle() *netlink.Handle {
	h.t.Helper()
	return nettest.Handle(h.t, h.netns)
}

// bridgeAddrs returns the addresses of the named bridge, or ok=false when
// it does not exist.
func bridgeAddrs(t *testing.T, handle *netlink.Handle, name string) (addrs []string, up bool, ok bool) {
	t.Helper()
	link, err := handle.LinkByName(name)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return nil, false, false
		}
		t.Fatal(err)
	}
	list, err := handle.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range list {
		if !a.IP.IsLinkLocalUnicast() {
			addrs = append(addrs, a.IPNet.String())
		}
	}
	return addrs, link.Attrs().Flags&(1<<0) != 0, true
}

func (h *harness) waitBridge(name string, want ...string) {
	h.t.Helper()
	handle := h.handle()
	testenv.Eventually(h.t, 10*time.Second, func(context.Context) (bool, string) {
		addrs, up, ok := bridgeAddrs(h.t, handle, name)
		if len(want) == 0 {
			return !ok, fmt.Sprintf("bridge %s still exists with %v", name, addrs)
		}
		return ok && up && strings.Join(addrs, ",") == strings.Join(want, ","),
			fmt.Sprintf("bridge %s: exists=%v up=%v addresses %v, want %v", name, ok, up, addrs, want)
	})
}

func (h *harness) eventReasons(name string) []string {
	h.t.Helper()
	events, err := h.env.Kube.CoreV1().Events(h.ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		h.t.Fatal(err)
	}
	var reasons []string
	for _, e := range events.Items {
		reasons = append(reasons, e.Type+"/"+e.Reason)
	}
	return reasons
}

func (h *harness) waitEvent(name, typeReason string) {
	h.t.Helper()
	testenv.Eventually(h.t, 10*time.Second, func(context.Context) (bool, string) {
		reasons := h.eventReasons(name)
		for _, r := range reasons {
			if r == typeReason {
				return true, ""
			}
		}
		return false, fmt.Sprintf("events of %s: %v, want %s", name, reasons, typeReason)
	})
}

// The tutorial: apply 192.168.0.0/16 gateway 192.168.0.1, update to the
// non-canonical 192.168.1.0/16 gateway 192.168.1.1, delete.
func TestTutorialWalkthrough(t *testing.T) {
	h := newHarness(t, time.Minute)
	h.start()

	h.create("example-network", "192.168.0.0/16", "192.168.0.1")
	n := h.waitReady("example-network", metav1.ConditionTrue, samplecrd.ReasonProvisioned)
	if n.Status.Backend == nil || n.Status.Backend.Type != samplecrdv1.BackendLinux || n.Status.Backend.Interface != ifname.Bridge(n.UID) {
		t.Fatalf("status.backend = %+v", n.Status.Backend)
	}
	if n.Status.CIDR != "192.168.0.0/16" || n.Status.Gateway != "192.168.0.1" {
		t.Fatalf("status cidr/gateway = %s %s", n.Status.CIDR, n.Status.Gateway)
	}
	if strings.Join(n.Finalizers, ",") != samplecrd.Finalizer {
		t.Fatalf("finalizers = %v", n.Finalizers)
	}
	bridge := n.Status.Backend.Interface
	h.waitBridge(bridge, "192.168.0.1/16")
	h.waitEvent("example-network", "Normal/Created")

	n.Spec.CIDR, n.Spec.Gateway = "192.168.1.0/16", "192.168.1.1"
	if _, err := h.env.Netop.SamplecrdV1().Networks(h.ns).Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n = h.waitReady("example-network", metav1.ConditionTrue, samplecrd.ReasonProvisioned)
	if n.Status.ObservedGeneration != 2 || n.Status.CIDR != "192.168.0.0/16" || n.Status.Gateway != "192.168.1.1" {
		t.Fatalf("after update: observedGeneration %d, status cidr %s gateway %s", n.Status.ObservedGeneration, n.Status.CIDR, n.Status.Gateway)
	}
	h.waitBridge(bridge, "192.168.1.1/16")
	h.waitEvent("example-network", "Normal/Updated")

	if err := h.env.Netop.SamplecrdV1().Networks(h.ns).Delete(context.Background(), "example-network", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, string) {
		_, err := h.env.Netop.SamplecrdV1().Networks(h.ns).Get(ctx, "example-network", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("Network still there: %v", err)
	})
	h.waitBridge(bridge)
	h.waitEvent("example-network", "Normal/Deleted")

	m := h.op.Metrics()
	if v := testutil.ToFloat64(m.ReconcileTotal.WithLabelValues("network", "success")); v < 3 {
		t.Errorf("netop_reconcile_total{result=success} = %v, want at least 3", v)
	}
	if v := testutil.ToFloat64(m.APIWrites.WithLabelValues("put", "networks/status")); v < 2 {
		t.Errorf("netop_api_writes_total{verb=put,resource=networks/status} = %v, want at least 2", v)
	}
	if n := testutil.CollectAndCount(m.BackendDuration); n == 0 {
		t.Error("no backend operation durations recorded")
	}
}

// A bridge deleted, or stripped of its address, by hand comes back without
// waiting for a resync.
func TestDriftRepair(t *testing.T) {
	h := newHarness(t, time.Hour)
	h.start()
	h.create("drift", "10.20.0.0/24", "10.20.0.1")
	n := h.waitReady("drift", metav1.ConditionTrue, samplecrd.ReasonProvisioned)
	bridge := n.Status.Backend.Interface
	handle := h.handle()
	h.waitBridge(bridge, "10.20.0.1/24")

	link, err := handle.LinkByName(bridge)
	if err != nil {
		t.Fatal(err)
	}
	if err := handle.LinkDel(link); err != nil {
		t.Fatal(err)
	}
	h.waitBridge(bridge, "10.20.0.1/24")

	link, err = handle.LinkByName(bridge)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("10.20.0.1/24")
	if err := handle.AddrDel(link, addr); err != nil {
		t.Fatal(err)
	}
	h.waitBridge(bridge, "10.20.0.1/24")
}

// A Network deleted while netop is down keeps its finalizer, and its bridge
// is removed when netop comes back.
func TestDeleteWhileStopped(t *testing.T) {
	h := newHarness(t, time.Hour)
	h.start()
	h.create("gone", "10.30.0.0/24", "10.30.0.1")
	n := h.waitReady("gone", metav1.ConditionTrue, samplecrd.ReasonProvisioned)
	bridge := n.Status.Backend.Interface
	h.waitBridge(bridge, "10.30.0.1/24")
	h.stopOp()

	if err := h.env.Netop.SamplecrdV1().Networks(h.ns).Delete(context.Background(), "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	still, err := h.env.Netop.SamplecrdV1().Networks(h.ns).Get(context.Background(), "gone", metav1.GetOptions{})
	if err != nil || still.DeletionTimestamp == nil {
		t.Fatalf("while netop is down the Network must wait on its finalizer: %v %v", still, err)
	}
	h.waitBridge(bridge, "10.30.0.1/24") // nobody removed it

	h.start()
	testenv.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, string) {
		_, err := h.env.Netop.SamplecrdV1().Networks(h.ns).Get(ctx, "gone", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("Network still there: %v", err)
	})
	h.waitBridge(bridge)
}

// A bridge that netop made for a Network that no longer exists is swept at
// start, and a live Network's bridge is not.
func TestOrphanSwept(t *testing.T) {
	h := newHarness(t, time.Hour)
	// The cluster's identity is the UID of kube-system: an orphan recorded
	// with it is ours to sweep; one recorded without any cluster (before
	// clusters were recorded) may be another cluster's and stays.
	kubeSystem, err := h.env.Kube.CoreV1().Namespaces().Get(context.Background(), metav1.NamespaceSystem, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	orphan := func(uid types.UID, cluster, cidr, gateway string) string {
		res, err := h.linux.Ensure(context.Background(), backend.Network{
			Owner:    backend.Owner{Cluster: cluster, Namespace: h.ns, Name: "never-existed", UID: uid},
			Families: []backend.Family{{CIDR: netip.MustParsePrefix(cidr), Gateway: netip.MustParseAddr(gateway)}},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		h.waitBridge(res.Status.Interface, gateway+"/24")
		return res.Status.Interface
	}
	ours := orphan("0badc0de-0000-4000-8000-000000000001", string(kubeSystem.UID), "10.40.0.0/24", "10.40.0.1")
	legacy := orphan("0badc0df-0000-4000-8000-000000000002", "", "10.42.0.0/24", "10.42.0.1")

	h.start()
	h.create("alive", "10.41.0.0/24", "10.41.0.1")
	n := h.waitReady("alive", metav1.ConditionTrue, samplecrd.ReasonProvisioned)
	h.waitBridge(ours)

	// The live one survives later sweeps too.
	lists := h.backend.Calls(backend.OperationList)
	h.opts.Resync = 50 * time.Millisecond
	h.stopOp()
	h.start()
	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		return h.backend.Calls(backend.OperationList) >= lists+3, "waiting for three sweeps"
	})
	h.waitBridge(n.Status.Backend.Interface, "10.41.0.1/24")
	h.waitBridge(legacy, "10.42.0.1/24")
}

// A failing backend shows as Ready=False with reason BackendError and the
// backend's message, with a Warning Event, and the Network recovers once
// the backend works again.
func TestBackendFailureAndRecovery(t *testing.T) {
	h := newHarness(t, time.Hour)
	injected := errors.New("injected: netlink said no")
	h.backend.Fail(injected, backend.OperationEnsure, backend.OperationDelete)
	h.start()
	h.create("flaky", "10.50.0.0/24", "10.50.0.1")
	n := h.waitReady("flaky", metav1.ConditionFalse, samplecrd.ReasonBackendError)
	if c := meta.FindStatusCondition(n.Status.Conditions, samplecrd.ConditionReady); !strings.Contains(c.Message, "injected: netlink said no") {
		t.Fatalf("Ready message %q does not say what failed", c.Message)
	}
	h.waitEvent("flaky", corev1.EventTypeWarning+"/"+samplecrd.ReasonBackendError)
	// It keeps trying while the backend fails (backoff from 100 ms).
	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		n := h.backend.Calls(backend.OperationEnsure)
		return n >= 3, fmt.Sprintf("the backend was tried %d times while failing, want retries", n)
	})

	h.backend.Fail(nil)
	n = h.waitReady("flaky", metav1.ConditionTrue, samplecrd.ReasonProvisioned)
	h.waitBridge(n.Status.Backend.Interface, "10.50.0.1/24")
}

// An invalid spec that the schema lets through (the gateway is the network
// address) is reported as Invalid, not retried, and makes no bridge.
func TestInvalidSpec(t *testing.T) {
	h := newHarness(t, time.Hour)
	h.start()
	h.create("invalid", "10.60.0.0/24", "10.60.0.0")
	n := h.waitReady("invalid", metav1.ConditionFalse, samplecrd.ReasonInvalid)
	if c := meta.FindStatusCondition(n.Status.Conditions, samplecrd.ConditionReady); !strings.Contains(c.Message, "spec.gateway") {
		t.Fatalf("message %q does not name spec.gateway", c.Message)
	}
	h.waitEvent("invalid", corev1.EventTypeWarning+"/"+samplecrd.ReasonInvalid)
	if got := h.backend.Calls(backend.OperationEnsure); got != 0 {
		t.Fatalf("the backend was called %d times for an invalid spec", got)
	}
	if owned, _ := h.backend.ListOwned(context.Background()); len(owned) != 0 {
		t.Fatalf("bridges made for an invalid spec: %v", owned)
	}
}

// Resyncs of Networks that are already right write nothing to the API
// server and change nothing in the backend: each costs one backend list.
func TestResyncIsANoop(t *testing.T) {
	h := newHarness(t, 100*time.Millisecond)
	h.start()
	for i := range 5 {
		h.create(fmt.Sprintf("n%d", i), fmt.Sprintf("10.70.%d.0/24", i), "")
	}
	for i := range 5 {
		h.waitReady(fmt.Sprintf("n%d", i), metav1.ConditionTrue, samplecrd.ReasonProvisioned)
	}
	// Events are posted asynchronously: once all five are visible, every
	// write of the creation has been counted.
	for i := range 5 {
		h.waitEvent(fmt.Sprintf("n%d", i), "Normal/Created")
	}
	m := h.op.Metrics()
	writes := func() float64 {
		var total float64
		for _, r := range []string{"networks", "networks/status", "events"} {
			for _, v := range []string{"post", "put", "patch", "delete"} {
				total += testutil.ToFloat64(m.APIWrites.WithLabelValues(v, r))
			}
		}
		return total
	}
	before := writes()
	mutations, lists := h.backend.Changes(), h.backend.Calls(backend.OperationList)

	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		return h.backend.Calls(backend.OperationList) >= lists+5, "waiting for five resyncs"
	})
	if got := writes() - before; got != 0 {
		t.Errorf("%v API writes during idle resyncs, want 0", got)
	}
	if got := h.backend.Changes() - mutations; got != 0 {
		t.Errorf("%d backend mutations during idle resyncs, want 0", got)
	}
}

// A restart of netop with Networks that are already right costs one backend
// list, no reconcile of each Network and no API write; a bridge changed
// while netop was down is still repaired by that list.
func TestRestartOfConvergedNetworksIsCheap(t *testing.T) {
	h := newHarness(t, time.Hour)
	h.start()
	for i := range 5 {
		h.create(fmt.Sprintf("r%d", i), fmt.Sprintf("10.80.%d.0/24", i), "")
	}
	var broken *samplecrdv1.Network
	for i := range 5 {
		broken = h.waitReady(fmt.Sprintf("r%d", i), metav1.ConditionTrue, samplecrd.ReasonProvisioned)
	}
	h.stopOp()

	// Behind netop's back: the last bridge loses its address.
	handle := h.handle()
	link, err := handle.LinkByName(broken.Status.Backend.Interface)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("10.80.4.1/24")
	if err := handle.AddrDel(link, addr); err != nil {
		t.Fatal(err)
	}

	h.backend.ResetCounts()
	h.start()
	h.waitBridge(broken.Status.Backend.Interface, "10.80.4.1/24")
	if got := h.backend.Calls(backend.OperationList); got != 1 {
		t.Errorf("%d backend lists at start, want 1", got)
	}
	for _, uid := range h.backend.EnsuredUIDs() {
		if uid != broken.UID {
			t.Errorf("Network %s was reconciled at restart though it was converged", uid)
		}
	}
	m := h.op.Metrics()
	// The bench's "synced after the initial list" comes from these. The
	// repair may come before the operator records the last phase: it
	// waits for every component, the repair for the Network controller.
	var listed, synced float64
	testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
		listed = testutil.ToFloat64(m.Startup.WithLabelValues(metrics.PhaseNetworksListed))
		synced = testutil.ToFloat64(m.Startup.WithLabelValues(metrics.PhaseCachesSynced))
		return synced > 0, "the caches-synced phase is not recorded"
	})
	if listed <= 0 || synced <= listed {
		t.Errorf("startup phases: networks listed after %v s, caches synced after %v s", listed, synced)
	}
	for _, v := range []string{"post", "put", "patch"} {
		for _, r := range []string{"networks", "networks/status"} {
			if got := testutil.ToFloat64(m.APIWrites.WithLabelValues(v, r)); got != 0 {
				t.Errorf("%v %s %s at restart, want 0", got, v, r)
			}
		}
	}
}

// With admission away, an overlapping Network gets in: the older one (by
// creationTimestamp, then UID: two creates in the same second are ordered
// by UID) keeps its bridge, the younger one reports Overlap and gets none,
// and is built once the older one is deleted.
func TestOverlapArbitrated(t *testing.T) {
	h := newHarness(t, time.Minute)
	h.start()

	first := h.create("first", "10.60.0.0/16", "10.60.0.1")
	second := h.create("second", "10.60.7.0/24", "10.60.7.1")
	winner, loser := first, second
	if !first.CreationTimestamp.Before(&second.CreationTimestamp) && (!first.CreationTimestamp.Equal(&second.CreationTimestamp) || second.UID < first.UID) {
		winner, loser = second, first
	}
	h.waitReady(winner.Name, metav1.ConditionTrue, samplecrd.ReasonProvisioned)
	got := h.waitReady(loser.Name, metav1.ConditionFalse, samplecrd.ReasonOverlap)
	if msg := meta.FindStatusCondition(got.Status.Conditions, samplecrd.ConditionReady).Message; !strings.Contains(msg, h.ns+"/"+winner.Name+" ("+winner.Spec.CIDR+")") {
		t.Errorf("Overlap message %q does not name the older Network", msg)
	}
	if got.Status.Backend != nil {
		t.Errorf("the losing Network has status.backend %+v", got.Status.Backend)
	}
	h.waitEvent(loser.Name, "Warning/"+samplecrd.ReasonOverlap)
	h.waitBridge(ifname.Bridge(winner.UID), winner.Spec.Gateway+"/"+strings.Split(winner.Spec.CIDR, "/")[1])
	h.waitBridge(ifname.Bridge(loser.UID))

	if err := h.env.Netop.SamplecrdV1().Networks(h.ns).Delete(context.Background(), winner.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitReady(loser.Name, metav1.ConditionTrue, samplecrd.ReasonProvisioned)
	h.waitBridge(ifname.Bridge(winner.UID))
	h.waitBridge(ifname.Bridge(loser.UID), loser.Spec.Gateway+"/"+strings.Split(loser.Spec.CIDR, "/")[1])
}
