// Package neutron tests the Network controller with the Neutron backend
// against a real Neutron API server (Debian's python3-neutron, started by
// hack/neutron.sh) and a real kube-apiserver.
package neutron

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netop-dev/netop/internal/backend"
	neutronbackend "github.com/netop-dev/netop/internal/backend/neutron"
	"github.com/netop-dev/netop/internal/operator"
	"github.com/netop-dev/netop/internal/testing/neutrontest"
	"github.com/netop-dev/netop/internal/testing/testenv"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(*testenv.Env) (func(), error) { return neutrontest.CloseShared, nil }))
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func mustAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }

// countingTransport counts the HTTP requests the backend sends to Neutron,
// and remembers the last ones for failure messages.
type countingTransport struct {
	n    atomic.Int64
	mu   sync.Mutex
	last []string
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.n.Add(1)
	c.mu.Lock()
	c.last = append(c.last, req.Method+" "+req.URL.RequestURI())
	if len(c.last) > 40 {
		c.last = c.last[1:]
	}
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

func (c *countingTransport) recent() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.last, "\n")
}

type harness struct {
	t        *testing.T
	env      *testenv.Env
	ns       string
	srv      *neutrontest.Server
	project  string
	requests *countingTransport
	backend  *neutronbackend.Backend
	neutron  *gophercloud.ServiceClient
	opts     *operator.Options
	op       *operator.Operator
	stop     func()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newHarness runs an operator with the Neutron backend in a project of its
// own, against srv (nil: the test binary's shared Neutron).
func newHarness(t *testing.T, srv *neutrontest.Server, resync time.Duration) *harness {
	t.Helper()
	if srv == nil {
		srv = neutrontest.Shared(t)
	}
	env := testenv.Get(t)
	h := &harness{t: t, env: env, ns: env.Namespace(t), srv: srv, project: randomHex(16), requests: &countingTransport{}}
	var err error
	h.backend, err = neutronbackend.New(t.Context(), neutronbackend.Config{
		Endpoint: srv.URL, ProjectID: h.project, Transport: h.requests, RequestTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	h.neutron = &gophercloud.ServiceClient{
		ProviderClient: &gophercloud.ProviderClient{HTTPClient: http.Client{Timeout: 10 * time.Second}},
		Endpoint:       srv.URL,
		ResourceBase:   srv.URL + "v2.0/",
	}
	h.opts = operator.NewOptions()
	h.opts.Backend.Type = string(samplecrd.BackendNeutron)
	h.opts.Namespace = h.ns
	h.opts.Resync = resync
	h.opts.Metrics.Addr, h.opts.Webhooks.Addr, h.opts.Workloads.Enabled = "0", "0", false
	h.opts.Client.QPS, h.opts.Client.Burst = 500, 1000
	return h
}

func (h *harness) start() {
	h.t.Helper()
	h.op, h.stop = testenv.StartOperator(h.t, h.env.Config, h.opts, h.backend)
}

func (h *harness) create(name, cidr, gateway string) {
	h.t.Helper()
	_, err := h.env.Netop.SamplecrdV1().Networks(h.ns).Create(context.Background(), &samplecrdv1.Network{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       samplecrdv1.NetworkSpec{CIDR: cidr, Gateway: gateway},
	}, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatalf("creating %s: %v", name, err)
	}
}

func (h *harness) waitReady(name string, status metav1.ConditionStatus, reason string, timeout time.Duration) *samplecrdv1.Network {
	h.t.Helper()
	return h.env.WaitReady(h.t, h.ns, name, status, reason, timeout)
}

// projectNetworks lists what Neutron holds for the harness's project.
func (h *harness) projectNetworks() ([]networks.Network, []subnets.Subnet) {
	h.t.Helper()
	pages, err := networks.List(h.neutron, networks.ListOpts{ProjectID: h.project}).AllPages(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	nets, err := networks.ExtractNetworks(pages)
	if err != nil {
		h.t.Fatal(err)
	}
	pages, err = subnets.List(h.neutron, subnets.ListOpts{ProjectID: h.project}).AllPages(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	subs, err := subnets.ExtractSubnets(pages)
	if err != nil {
		h.t.Fatal(err)
	}
	return nets, subs
}

func (h *harness) subnet(id string) *subnets.Subnet {
	h.t.Helper()
	s, err := subnets.Get(context.Background(), h.neutron, id).Extract()
	if err != nil {
		h.t.Fatalf("subnet %s: %v", id, err)
	}
	return s
}

func (h *harness) waitNothingLeft() {
	h.t.Helper()
	testenv.Eventually(h.t, 15*time.Second, func(context.Context) (bool, string) {
		nets, subs := h.projectNetworks()
		return len(nets) == 0 && len(subs) == 0, fmt.Sprintf("%d networks and %d subnets left", len(nets), len(subs))
	})
}

// The tutorial on Neutron: create 192.168.0.0/16 gateway 192.168.0.1,
// update to 192.168.1.0/16 gateway 192.168.1.1, delete.
func TestNeutronTutorialWalkthrough(t *testing.T) {
	h := newHarness(t, nil, time.Minute)
	h.start()
	h.create("example-network", "192.168.0.0/16", "192.168.0.1")
	n := h.waitReady("example-network", metav1.ConditionTrue, samplecrd.ReasonProvisioned, 20*time.Second)
	b := n.Status.Backend
	if b == nil || b.Type != samplecrdv1.BackendNeutron || b.NetworkID == "" || b.SubnetID == "" {
		t.Fatalf("status.backend = %+v", b)
	}
	if s := h.subnet(b.SubnetID); s.CIDR != "192.168.0.0/16" || s.GatewayIP != "192.168.0.1" || s.NetworkID != b.NetworkID {
		t.Fatalf("subnet = %s gateway %s network %s", s.CIDR, s.GatewayIP, s.NetworkID)
	}

	n.Spec.CIDR, n.Spec.Gateway = "192.168.1.0/16", "192.168.1.1"
	if _, err := h.env.Netop.SamplecrdV1().Networks(h.ns).Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n = h.waitReady("example-network", metav1.ConditionTrue, samplecrd.ReasonProvisioned, 20*time.Second)
	if s := h.subnet(n.Status.Backend.SubnetID); s.CIDR != "192.168.0.0/16" || s.GatewayIP != "192.168.1.1" {
		t.Fatalf("after the update: subnet %s gateway %s", s.CIDR, s.GatewayIP)
	}

	if err := h.env.Netop.SamplecrdV1().Networks(h.ns).Delete(context.Background(), "example-network", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func(ctx context.Context) (bool, string) {
		_, err := h.env.Netop.SamplecrdV1().Networks(h.ns).Get(ctx, "example-network", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("still there: %v", err)
	})
	h.waitNothingLeft()
}

// A network deleted by hand in Neutron comes back with new IDs in status,
// and an owned network no Network claims is swept.
func TestNeutronDriftAndOrphans(t *testing.T) {
	h := newHarness(t, nil, 300*time.Millisecond)
	// Recorded with this cluster's identity (the UID of kube-system): only
	// then is an orphan this netop's to sweep.
	kubeSystem, err := h.env.Kube.CoreV1().Namespaces().Get(context.Background(), metav1.NamespaceSystem, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := h.backend.Ensure(context.Background(), backend.Network{
		Owner:    backend.Owner{Cluster: string(kubeSystem.UID), Namespace: h.ns, Name: "never-existed", UID: types.UID("0badc0de-0000-4000-8000-" + randomHex(6))},
		Families: []backend.Family{{CIDR: mustPrefix("10.99.0.0/24"), Gateway: mustAddr("10.99.0.1")}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.start()
	h.create("drift", "10.98.0.0/24", "")
	n := h.waitReady("drift", metav1.ConditionTrue, samplecrd.ReasonProvisioned, 20*time.Second)
	old := *n.Status.Backend

	testenv.Eventually(t, 20*time.Second, func(context.Context) (bool, string) {
		_, err := networks.Get(context.Background(), h.neutron, orphan.Status.NetworkID).Extract()
		return gophercloud.ResponseCodeIs(err, http.StatusNotFound), fmt.Sprintf("orphan network still there: %v", err)
	})

	if err := networks.Delete(context.Background(), h.neutron, old.NetworkID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func(ctx context.Context) (bool, string) {
		got, err := h.env.Netop.SamplecrdV1().Networks(h.ns).Get(ctx, "drift", metav1.GetOptions{})
		if err != nil || got.Status.Backend == nil {
			return false, fmt.Sprint(err)
		}
		return got.Status.Backend.NetworkID != old.NetworkID && got.Status.Backend.SubnetID != "", fmt.Sprintf("status.backend %+v", got.Status.Backend)
	})
	n = h.waitReady("drift", metav1.ConditionTrue, samplecrd.ReasonProvisioned, 20*time.Second)
	if s := h.subnet(n.Status.Backend.SubnetID); s.CIDR != "10.98.0.0/24" || s.GatewayIP != "10.98.0.1" {
		t.Fatalf("recreated subnet: %s gateway %s", s.CIDR, s.GatewayIP)
	}
	nets, _ := h.projectNetworks()
	if len(nets) != 1 {
		t.Fatalf("%d networks in the project, want exactly the recreated one", len(nets))
	}
}

// Neutron goes down while Networks are being created: they show
// BackendError with Neutron's message; once it is back, everything
// converges with nothing leaked or duplicated.
func TestNeutronOutage(t *testing.T) {
	neutrontest.Require(t)
	srv, err := neutrontest.Start(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	h := newHarness(t, srv, time.Hour)
	h.start()
	h.create("before", "10.97.0.0/24", "")
	h.waitReady("before", metav1.ConditionTrue, samplecrd.ReasonProvisioned, 20*time.Second)

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	const during = 5
	for i := range during {
		h.create(fmt.Sprintf("during-%d", i), fmt.Sprintf("10.97.%d.0/24", i+1), "")
	}
	for i := range during {
		n := h.waitReady(fmt.Sprintf("during-%d", i), metav1.ConditionFalse, samplecrd.ReasonBackendError, 30*time.Second)
		if c := meta.FindStatusCondition(n.Status.Conditions, samplecrd.ConditionReady); !strings.Contains(c.Message, "neutron") && !strings.Contains(c.Message, "Neutron") {
			t.Errorf("BackendError message %q does not say Neutron failed", c.Message)
		}
	}
	attempts := h.requests.n.Load()

	if err := srv.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i := range during {
		h.waitReady(fmt.Sprintf("during-%d", i), metav1.ConditionTrue, samplecrd.ReasonProvisioned, 60*time.Second)
	}
	nets, subs := h.projectNetworks()
	if len(nets) != during+1 || len(subs) != during+1 {
		t.Fatalf("after the outage: %d networks and %d subnets, want %d of each", len(nets), len(subs), during+1)
	}
	t.Logf("outage: %d requests while Neutron was down or coming back, %d networks after", attempts, len(nets))
}

// An idle resync of many Networks costs a fixed number of Neutron requests,
// not one per Network, and no API writes.
func TestNeutronIdleResyncRequestBudget(t *testing.T) {
	const count, budgetPerResync = 20, 2
	h := newHarness(t, nil, 200*time.Millisecond)
	h.start()
	for i := range count {
		h.create(fmt.Sprintf("n%02d", i), fmt.Sprintf("10.96.%d.0/24", i), "")
	}
	for i := range count {
		h.waitReady(fmt.Sprintf("n%02d", i), metav1.ConditionTrue, samplecrd.ReasonProvisioned, 60*time.Second)
	}
	lists := func() float64 { return backendOps(t, h.op, "list") }
	reconciles := func() float64 {
		return testutil.ToFloat64(h.op.Metrics().ReconcileTotal.WithLabelValues("network", "success"))
	}
	// Idle means no reconcile for three resyncs: keys that resyncs marked
	// while their Networks were still being created are done by then.
	waitResyncs := func(n float64) {
		t.Helper()
		from := lists()
		testenv.Eventually(t, 10*time.Second, func(context.Context) (bool, string) {
			return lists() >= from+n, fmt.Sprintf("waiting for %v resyncs", n)
		})
	}
	for deadline, settled := time.Now().Add(60*time.Second), false; !settled; {
		if time.Now().After(deadline) {
			t.Fatal("reconciles did not stop within 60s of every Network being Ready")
		}
		r := reconciles()
		waitResyncs(3)
		settled = reconciles() == r
	}

	requests, resyncs, before := h.requests.n.Load(), lists(), reconciles()
	waitResyncs(5)
	spent := float64(h.requests.n.Load() - requests)
	done := lists() - resyncs
	// A resync may be in flight at either end of the window.
	if spent > budgetPerResync*(done+2) {
		t.Fatalf("%v Neutron requests over %v idle resyncs of %d Networks; budget %d per resync; last requests:\n%s", spent, done, count, budgetPerResync, h.requests.recent())
	}
	if got := reconciles() - before; got != 0 {
		t.Fatalf("%v reconciles during idle resyncs, want 0", got)
	}
	t.Logf("idle resync: %v requests over %v resyncs of %d Networks", spent, done, count)
}

// Two Networks whose readable Neutron names collide never share a Neutron
// network: ownership goes by UID.
func TestNeutronNameCollision(t *testing.T) {
	h := newHarness(t, nil, time.Hour)
	suffix := randomHex(3)
	nsA, nsB := "x-"+suffix+"-y", "x-"+suffix
	for _, ns := range []string{nsA, nsB} {
		if _, err := h.env.Kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.env.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	}
	h.opts.Namespace = ""
	h.start()
	var ids []string
	for i, nn := range [][2]string{{nsA, "z"}, {nsB, "y-z"}} {
		if _, err := h.env.Netop.SamplecrdV1().Networks(nn[0]).Create(t.Context(), &samplecrdv1.Network{
			ObjectMeta: metav1.ObjectMeta{Name: nn[1]},
			Spec:       samplecrdv1.NetworkSpec{CIDR: fmt.Sprintf("10.95.%d.0/24", i)},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, nn := range [][2]string{{nsA, "z"}, {nsB, "y-z"}} {
		h.ns = nn[0]
		n := h.waitReady(nn[1], metav1.ConditionTrue, samplecrd.ReasonProvisioned, 20*time.Second)
		ids = append(ids, n.Status.Backend.NetworkID)
	}
	if ids[0] == ids[1] {
		t.Fatalf("%s/z and %s/y-z share Neutron network %s", nsA, nsB, ids[0])
	}
	nets, _ := h.projectNetworks()
	named := 0
	for _, n := range nets {
		if strings.Contains(n.Name, suffix) {
			named++
		}
	}
	if named != 2 {
		t.Fatalf("%d Neutron networks named like netop-x-%s-y-z, want 2", named, suffix)
	}
}

// backendOps is how many backend operations of a kind the operator did.
func backendOps(t *testing.T, op *operator.Operator, operation string) float64 {
	t.Helper()
	return float64(testenv.HistogramCount(t, op.Metrics().BackendDuration.WithLabelValues(string(samplecrd.BackendNeutron), operation, "success")))
}

// A dual-stack v2 Network on Neutron: one network with a subnet per family,
// both recorded in status.backend.subnetIDs in the order of the cidrs, and
// nothing left once it is deleted.
func TestNeutronDualStack(t *testing.T) {
	h := newHarness(t, nil, time.Minute)
	h.start()
	nets := h.env.Netop.SamplecrdV2().Networks(h.ns)
	if _, err := nets.Create(t.Context(), &samplecrdv2.Network{
		ObjectMeta: metav1.ObjectMeta{Name: "dual"},
		Spec:       samplecrdv2.NetworkSpec{CIDRs: []string{"fd00:140::/64", "10.140.0.0/24"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitReady("dual", metav1.ConditionTrue, samplecrd.ReasonProvisioned, 20*time.Second)
	n, err := nets.Get(t.Context(), "dual", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b := n.Status.Backend
	if b == nil || b.Type != samplecrdv2.BackendNeutron || b.NetworkID == "" || len(b.SubnetIDs) != 2 {
		t.Fatalf("status.backend = %+v, want a network and two subnets", b)
	}
	for i, want := range []struct{ cidr, gateway string }{{"fd00:140::/64", "fd00:140::1"}, {"10.140.0.0/24", "10.140.0.1"}} {
		if s := h.subnet(b.SubnetIDs[i]); s.CIDR != want.cidr || s.GatewayIP != want.gateway || s.NetworkID != b.NetworkID {
			t.Errorf("subnet %d: %s gateway %s in network %s, want %s gateway %s in %s", i, s.CIDR, s.GatewayIP, s.NetworkID, want.cidr, want.gateway, b.NetworkID)
		}
	}
	if !slices.Equal(n.Status.Gateways, []string{"fd00:140::1", "10.140.0.1"}) {
		t.Errorf("status.gateways = %v", n.Status.Gateways)
	}

	if err := nets.Delete(t.Context(), "dual", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func(ctx context.Context) (bool, string) {
		_, err := nets.Get(ctx, "dual", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("still there: %v", err)
	})
	h.waitNothingLeft()
}
