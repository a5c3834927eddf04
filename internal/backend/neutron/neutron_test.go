package neutron

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/testing/neutrontest"
)

func TestMain(m *testing.M) { os.Exit(neutrontest.Main(m)) }

// testContext logs into the test's output; benchmarks log nothing, so as
// not to measure logging.
func testContext(tb testing.TB) context.Context {
	if _, ok := tb.(*testing.B); ok {
		return klog.NewContext(context.Background(), logr.Discard())
	}
	_, ctx := ktesting.NewTestContext(tb)
	return ctx
}

// counter counts the HTTP requests a backend makes.
type counter struct {
	next http.RoundTripper
	mu   sync.Mutex
	reqs []string
}

func (c *counter) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.reqs = append(c.reqs, req.Method+" "+req.URL.Path+"?"+req.URL.RawQuery)
	c.mu.Unlock()
	return c.next.RoundTrip(req)
}

// since returns the requests made since the mark n.
func (c *counter) since(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.reqs[n:])
}

func (c *counter) mark() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.reqs)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randUID() types.UID {
	h := randHex(16)
	return types.UID(h[:8] + "-" + h[8:12] + "-4" + h[13:16] + "-a" + h[17:20] + "-" + h[20:])
}

func newOwner(name string) backend.Owner {
	return backend.Owner{Namespace: "ns-" + randHex(3), Name: name, UID: randUID()}
}

type fixture struct {
	b       *Backend
	count   *counter
	project string
	srv     *neutrontest.Server
}

// newFixture returns a backend on the shared Neutron, in a project of its
// own so that tests do not see each other's networks.
func newFixture(t testing.TB) *fixture {
	t.Helper()
	return newFixtureOn(t, neutrontest.Shared(t))
}

func newFixtureOn(t testing.TB, srv *neutrontest.Server) *fixture {
	t.Helper()
	f := &fixture{count: &counter{next: http.DefaultTransport}, project: randHex(16), srv: srv}
	var err error
	f.b, err = New(testContext(t), Config{Endpoint: srv.URL, ProjectID: f.project, Transport: f.count})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func network(owner backend.Owner, cidr, gw string) backend.Network {
	return backend.Network{Owner: owner, Families: []backend.Family{{CIDR: netip.MustParsePrefix(cidr), Gateway: netip.MustParseAddr(gw)}}}
}

// record is what Ensure records, comparable: the network and its subnets,
// SubnetID the primary family's.
type record struct {
	NetworkID, SubnetID string
	subnets             string
}

func statusRecord(s backend.Ref) record {
	r := record{NetworkID: s.NetworkID, subnets: strings.Join(s.SubnetIDs, ",")}
	if len(s.SubnetIDs) > 0 {
		r.SubnetID = s.SubnetIDs[0]
	}
	return r
}

// status is r as status.backend holds it.
func (r record) status() *backend.Ref {
	s := &backend.Ref{Type: backend.TypeNeutron, NetworkID: r.NetworkID}
	if r.subnets != "" {
		s.SubnetIDs = strings.Split(r.subnets, ",")
	}
	return s
}

func (f *fixture) ensure(t testing.TB, want backend.Network, recorded *backend.Ref, action backend.Action) record {
	t.Helper()
	res, err := f.b.Ensure(testContext(t), want, recorded)
	if err != nil {
		t.Fatalf("Ensure(%s %v): %v\n%s", want.Name, want.Families, err, f.srv.LogTail(20))
	}
	if res.Action != action {
		t.Fatalf("Ensure(%s %v) action = %q, want %q", want.Name, want.Families, res.Action, action)
	}
	s := res.Status
	if s.Type != backend.TypeNeutron || s.NetworkID == "" || len(s.SubnetIDs) != len(want.Families) || s.Interface != "" {
		t.Fatalf("Ensure status = %+v", s)
	}
	return statusRecord(s)
}

// inProject lists what Neutron has in the fixture's project, bypassing the
// backend's own filters.
func (f *fixture) inProject(t testing.TB) ([]networks.Network, []subnets.Subnet) {
	t.Helper()
	ctx := testContext(t)
	nets, err := f.b.listNetworks(ctx, networks.ListOpts{ProjectID: f.project})
	if err != nil {
		t.Fatal(err)
	}
	subs, err := f.b.listSubnets(ctx, subnets.ListOpts{ProjectID: f.project})
	if err != nil {
		t.Fatal(err)
	}
	return nets, subs
}

func (f *fixture) subnet(t testing.TB, id string) *subnets.Subnet {
	t.Helper()
	s, err := subnets.Get(testContext(t), f.b.client, id).Extract()
	if err != nil {
		t.Fatalf("get subnet %s: %v", id, err)
	}
	return s
}

func (f *fixture) checkSubnet(t testing.TB, id, cidr, gw string, pools ...string) {
	t.Helper()
	s := f.subnet(t, id)
	var got []string
	for _, p := range s.AllocationPools {
		got = append(got, p.Start+"-"+p.End)
	}
	slices.Sort(got)
	slices.Sort(pools)
	if s.CIDR != cidr || s.GatewayIP != gw || !slices.Equal(got, pools) || s.EnableDHCP {
		t.Fatalf("subnet %s: cidr %s gateway %s pools %v dhcp %v, want %s %s %v false", id, s.CIDR, s.GatewayIP, got, s.EnableDHCP, cidr, gw, pools)
	}
}

func TestEnsureCreates(t *testing.T) {
	f := newFixture(t)
	owner := newOwner("blue")
	st := f.ensure(t, network(owner, "10.20.0.0/24", "10.20.0.1"), nil, backend.ActionCreated)

	n, err := networks.Get(testContext(t), f.b.client, st.NetworkID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if n.Name != "netop-"+owner.Namespace+"-blue" || n.Description != "netop:"+owner.Namespace+"/blue/"+string(owner.UID) || n.ProjectID != f.project {
		t.Errorf("network name %q description %q project %q", n.Name, n.Description, n.ProjectID)
	}
	if !hasTags(n.Tags, []string{"netop", "netop-uid=" + string(owner.UID)}) {
		t.Errorf("network tags %v", n.Tags)
	}
	if !slices.Equal(n.Subnets, []string{st.SubnetID}) {
		t.Errorf("network subnets %v, want [%s]", n.Subnets, st.SubnetID)
	}
	f.checkSubnet(t, st.SubnetID, "10.20.0.0/24", "10.20.0.1", "10.20.0.2-10.20.0.254")
	if s := f.subnet(t, st.SubnetID); !hasTags(s.Tags, Tags(owner)) || s.Description != n.Description {
		t.Errorf("subnet tags %v description %q", s.Tags, s.Description)
	}

	// A gateway inside the range splits the pool; IPv6 has no broadcast.
	st = f.ensure(t, network(newOwner("mid"), "10.30.0.0/24", "10.30.0.100"), nil, backend.ActionCreated)
	f.checkSubnet(t, st.SubnetID, "10.30.0.0/24", "10.30.0.100", "10.30.0.1-10.30.0.99", "10.30.0.101-10.30.0.254")
	st = f.ensure(t, network(newOwner("v6"), "fd00:1::/64", "fd00:1::1"), nil, backend.ActionCreated)
	f.checkSubnet(t, st.SubnetID, "fd00:1::/64", "fd00:1::1", "fd00:1::2-fd00:1::ffff:ffff:ffff:ffff")
	if s := f.subnet(t, st.SubnetID); s.IPVersion != 6 {
		t.Errorf("ip_version %d", s.IPVersion)
	}

	nets, subs := f.inProject(t)
	if len(nets) != 3 || len(subs) != 3 {
		t.Errorf("project has %d networks and %d subnets, want 3 and 3", len(nets), len(subs))
	}
}

func TestEnsureNoopRequests(t *testing.T) {
	f := newFixture(t)
	want := network(newOwner("noop"), "10.40.0.0/24", "10.40.0.1")
	st := f.ensure(t, want, nil, backend.ActionCreated)

	mark := f.count.mark()
	again := f.ensure(t, want, st.status(), backend.ActionNone)
	reqs := f.count.since(mark)
	if again != st {
		t.Errorf("status %+v, want %+v", again, st)
	}
	if len(reqs) != 2 {
		t.Errorf("no-op Ensure made %d requests, want 2 (network, subnets): %q", len(reqs), reqs)
	}
	for _, r := range reqs {
		if !strings.HasPrefix(r, "GET ") {
			t.Errorf("no-op Ensure changed something: %s", r)
		}
	}
}

// TestWalkthrough follows the tutorial: a gateway change keeps the subnet,
// a CIDR change replaces it, and Delete leaves nothing.
func TestWalkthrough(t *testing.T) {
	f := newFixture(t)
	owner := newOwner("tutorial")
	st := f.ensure(t, network(owner, "192.168.0.0/16", "192.168.0.1"), nil, backend.ActionCreated)
	f.checkSubnet(t, st.SubnetID, "192.168.0.0/16", "192.168.0.1", "192.168.0.2-192.168.255.254")

	st2 := f.ensure(t, network(owner, "192.168.0.0/16", "192.168.1.1"), st.status(), backend.ActionUpdated)
	if st2 != st {
		t.Fatalf("gateway change: status %+v, want the same IDs %+v", st2, st)
	}
	f.checkSubnet(t, st.SubnetID, "192.168.0.0/16", "192.168.1.1", "192.168.0.1-192.168.1.0", "192.168.1.2-192.168.255.254")
	f.ensure(t, network(owner, "192.168.0.0/16", "192.168.1.1"), st2.status(), backend.ActionNone)

	steps := []struct{ cidr, gw, pool string }{
		{"10.0.0.0/24", "10.0.0.1", "10.0.0.2-10.0.0.254"},
		{"10.1.0.0/24", "10.1.0.1", "10.1.0.2-10.1.0.254"},
		// Overlapping the old one: Neutron refuses both in one network.
		{"10.1.0.0/16", "10.1.0.1", "10.1.0.2-10.1.255.254"},
	}
	for _, step := range steps {
		prev := st2
		st2 = f.ensure(t, network(owner, step.cidr, step.gw), prev.status(), backend.ActionUpdated)
		if st2.NetworkID != prev.NetworkID || st2.SubnetID == prev.SubnetID {
			t.Fatalf("CIDR change to %s: status %+v, want network %s and a new subnet", step.cidr, st2, prev.NetworkID)
		}
		f.checkSubnet(t, st2.SubnetID, step.cidr, step.gw, step.pool)
		if _, err := subnets.Get(testContext(t), f.b.client, prev.SubnetID).Extract(); !isNotFound(err) {
			t.Fatalf("old subnet %s: err %v, want 404", prev.SubnetID, err)
		}
		if _, subs := f.inProject(t); len(subs) != 1 {
			t.Fatalf("after CIDR change to %s: %d subnets", step.cidr, len(subs))
		}
	}

	if err := f.b.Delete(testContext(t), owner, st2.status()); err != nil {
		t.Fatal(err)
	}
	if nets, subs := f.inProject(t); len(nets)+len(subs) != 0 {
		t.Fatalf("after Delete: %d networks, %d subnets", len(nets), len(subs))
	}
}

func TestRecreatesWhatWasDeletedByHand(t *testing.T) {
	f := newFixture(t)
	ctx := testContext(t)
	want := network(newOwner("hand"), "10.50.0.0/24", "10.50.0.1")
	st := f.ensure(t, want, nil, backend.ActionCreated)

	if err := networks.Delete(ctx, f.b.client, st.NetworkID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	st2 := f.ensure(t, want, st.status(), backend.ActionCreated)
	if st2.NetworkID == st.NetworkID || st2.SubnetID == st.SubnetID {
		t.Fatalf("after the network was deleted: %+v, want new IDs", st2)
	}
	f.checkSubnet(t, st2.SubnetID, "10.50.0.0/24", "10.50.0.1", "10.50.0.2-10.50.0.254")

	if err := subnets.Delete(ctx, f.b.client, st2.SubnetID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	st3 := f.ensure(t, want, st2.status(), backend.ActionUpdated)
	if st3.NetworkID != st2.NetworkID || st3.SubnetID == st2.SubnetID {
		t.Fatalf("after the subnet was deleted: %+v, want network %s and a new subnet", st3, st2.NetworkID)
	}
	f.checkSubnet(t, st3.SubnetID, "10.50.0.0/24", "10.50.0.1", "10.50.0.2-10.50.0.254")

	// A subnet added by hand to netop's network goes; the gateway and
	// pools edited by hand are put back.
	extra, err := subnets.Create(ctx, f.b.client, subnets.CreateOpts{NetworkID: st3.NetworkID, CIDR: "10.51.0.0/24", IPVersion: 4, ProjectID: f.project}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	gw := "10.50.0.200"
	if _, err := subnets.Update(ctx, f.b.client, st3.SubnetID, subnets.UpdateOpts{GatewayIP: &gw, AllocationPools: []subnets.AllocationPool{{Start: "10.50.0.10", End: "10.50.0.20"}}}).Extract(); err != nil {
		t.Fatal(err)
	}
	if obs := f.listOwned(t); len(obs) != 1 || obs[0].Families != nil {
		t.Fatalf("ListOwned with two subnets of one family = %+v, want one network without families", obs)
	}
	st4 := f.ensure(t, want, st3.status(), backend.ActionUpdated)
	if st4 != st3 {
		t.Fatalf("status %+v, want %+v", st4, st3)
	}
	f.checkSubnet(t, st3.SubnetID, "10.50.0.0/24", "10.50.0.1", "10.50.0.2-10.50.0.254")
	if _, err := subnets.Get(ctx, f.b.client, extra.ID).Extract(); !isNotFound(err) {
		t.Fatalf("extra subnet: %v, want 404", err)
	}
	f.ensure(t, want, st4.status(), backend.ActionNone)
}

// TestAdoption covers a netop that died after creating a network but before
// recording it in the Network's status.
func TestAdoption(t *testing.T) {
	f := newFixture(t)
	ctx := testContext(t)
	owner := newOwner("crash")
	want := network(owner, "10.60.0.0/24", "10.60.0.1")
	st := f.ensure(t, want, nil, backend.ActionCreated)

	mark := f.count.mark()
	again := f.ensure(t, want, nil, backend.ActionNone)
	if again != st {
		t.Fatalf("adopted %+v, want %+v", again, st)
	}
	t.Logf("adoption took %d requests", len(f.count.since(mark)))
	// A stale recorded ID is no better than none.
	stale := backend.Ref{Type: backend.TypeNeutron, NetworkID: "2b0e0d5e-0000-4000-8000-000000000000"}
	if again = f.ensure(t, want, &stale, backend.ActionNone); again != st {
		t.Fatalf("with a stale ID: %+v, want %+v", again, st)
	}

	// Died between creating and tagging: only the description says whose.
	owner2 := newOwner("untagged")
	n, err := networks.Create(ctx, f.b.client, networks.CreateOpts{Name: NetworkName(owner2), Description: Description(owner2), ProjectID: f.project}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	st2 := f.ensure(t, network(owner2, "10.61.0.0/24", "10.61.0.1"), nil, backend.ActionUpdated)
	if st2.NetworkID != n.ID {
		t.Fatalf("created %s instead of adopting %s", st2.NetworkID, n.ID)
	}

	nets, _ := f.inProject(t)
	if len(nets) != 2 {
		t.Fatalf("%d networks, want 2", len(nets))
	}
	obs := f.listOwned(t)
	if len(obs) != 2 {
		t.Fatalf("ListOwned = %+v", obs)
	}

	// Two netops raced: the first network made is kept, the other goes.
	owner3 := newOwner("raced")
	var made []string
	for range 2 {
		n, err := networks.Create(testContext(t), f.b.client, networks.CreateOpts{Name: NetworkName(owner3), Description: Description(owner3), ProjectID: f.project}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, n.ID)
		time.Sleep(1100 * time.Millisecond) // created_at has whole seconds
	}
	st3 := f.ensure(t, network(owner3, "10.62.0.0/24", "10.62.0.1"), nil, backend.ActionUpdated)
	if st3.NetworkID != made[0] {
		t.Fatalf("kept %s, want the first made, %s", st3.NetworkID, made[0])
	}
	if _, err := networks.Get(testContext(t), f.b.client, made[1]).Extract(); !isNotFound(err) {
		t.Fatalf("duplicate network %s: %v, want 404", made[1], err)
	}
}

// TestNeverTouchesOthers: a recorded ID of another Network's network, or of
// a network netop did not make, is neither used nor deleted.
func TestNeverTouchesOthers(t *testing.T) {
	f := newFixture(t)
	ctx := testContext(t)
	a := f.ensure(t, network(newOwner("a"), "10.70.0.0/24", "10.70.0.1"), nil, backend.ActionCreated)
	foreign, err := networks.Create(ctx, f.b.client, networks.CreateOpts{Name: "someone-elses", ProjectID: f.project}).Extract()
	if err != nil {
		t.Fatal(err)
	}

	ownerB := newOwner("b")
	for _, recorded := range []string{a.NetworkID, foreign.ID} {
		rec := backend.Ref{Type: backend.TypeNeutron, NetworkID: recorded}
		b := f.ensure(t, network(ownerB, "10.70.0.0/24", "10.70.0.1"), &rec, backend.ActionCreated)
		if b.NetworkID == recorded {
			t.Fatalf("Ensure took over network %s", recorded)
		}
		if err := f.b.Delete(ctx, ownerB, &rec); err != nil {
			t.Fatal(err)
		}
	}
	f.ensure(t, network(newOwner("a"), "10.70.0.0/24", "10.70.0.1"), nil, backend.ActionCreated)
	for _, id := range []string{a.NetworkID, foreign.ID} {
		if _, err := networks.Get(ctx, f.b.client, id).Extract(); err != nil {
			t.Fatalf("network %s: %v", id, err)
		}
	}
}

// A network recorded before clusters were is adopted (tagged with the
// cluster) by the cluster whose Network has its UID; another cluster's
// network with the same UID is neither adopted nor deleted.
func TestClusterOwnership(t *testing.T) {
	f := newFixture(t)
	ctx := testContext(t)
	legacy := newOwner("legacy")
	st := f.ensure(t, network(legacy, "10.71.0.0/24", "10.71.0.1"), nil, backend.ActionCreated)
	adopter := legacy
	adopter.Cluster = "cluster-a"
	if got := f.ensure(t, network(adopter, "10.71.0.0/24", "10.71.0.1"), st.status(), backend.ActionUpdated); got != st {
		t.Fatalf("adoption made %+v, want %+v", got, st)
	}
	n, err := networks.Get(ctx, f.b.client, st.NetworkID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(n.Tags, TagClusterPrefix+"cluster-a") || !hasTags(f.subnet(t, st.SubnetID).Tags, Tags(adopter)) {
		t.Errorf("adopted network tags %v", n.Tags)
	}

	other := adopter
	other.Cluster = "cluster-b"
	got := f.ensure(t, network(other, "10.71.0.0/24", "10.71.0.1"), st.status(), backend.ActionCreated)
	if got.NetworkID == st.NetworkID {
		t.Fatal("another cluster took the network over")
	}
	if err := f.b.Delete(ctx, other, st.status()); err != nil {
		t.Fatal(err)
	}
	if _, err := networks.Get(ctx, f.b.client, st.NetworkID).Extract(); err != nil {
		t.Fatalf("another cluster's Delete removed the network: %v", err)
	}
	clusters := map[string]string{}
	for _, o := range f.listOwned(t) {
		clusters[o.Status.NetworkID] = o.Cluster
	}
	// cluster-b's Delete removed its own network, only that.
	if _, ok := clusters[got.NetworkID]; clusters[st.NetworkID] != "cluster-a" || ok {
		t.Errorf("ListOwned clusters %v, want only %s of cluster-a", clusters, st.NetworkID)
	}
}

func (f *fixture) listOwned(t testing.TB) []backend.Observed {
	t.Helper()
	obs, err := f.b.ListOwned(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	return obs
}

func TestListOwnedRequestsAreConstant(t *testing.T) {
	one := newFixture(t)
	many := newFixture(t)
	wants := map[types.UID]backend.Network{}
	ensure := func(f *fixture, i int) {
		w := network(newOwner(fmt.Sprintf("n%d", i)), fmt.Sprintf("10.%d.%d.0/24", 100+i/200, i%200), fmt.Sprintf("10.%d.%d.%d", 100+i/200, i%200, 1+i%250))
		wants[w.UID] = w
		f.ensure(t, w, nil, backend.ActionCreated)
	}
	ensure(one, 0)
	for i := range 20 {
		ensure(many, i)
	}
	// Someone else's network, tagged "netop" by hand, is not netop's.
	x, err := networks.Create(testContext(t), many.b.client, networks.CreateOpts{Name: "x", ProjectID: many.project}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if err := many.b.replaceTags(testContext(t), "networks", x.ID, []string{TagOwned}); err != nil {
		t.Fatal(err)
	}

	for _, f := range []*fixture{one, many} {
		mark := f.count.mark()
		obs := f.listOwned(t)
		if n := len(f.count.since(mark)); n != 2 {
			t.Errorf("ListOwned of %d networks made %d requests, want 2", len(obs), n)
		}
		for _, o := range obs {
			w, ok := wants[o.UID]
			if !ok {
				t.Errorf("ListOwned returned %+v, which is no test's", o)
				continue
			}
			if o.Owner != w.Owner || !o.Provides(w) || o.Status.NetworkID == "" || len(o.Status.SubnetIDs) != 1 || o.Status.Type != backend.TypeNeutron {
				t.Errorf("ListOwned: %+v, want %+v", o, w)
			}
		}
		if want := map[*fixture]int{one: 1, many: 20}[f]; len(obs) != want {
			t.Errorf("ListOwned returned %d networks, want %d", len(obs), want)
		}
	}

	// Neutron pages long lists when asked to (or when its operator caps
	// them); every page is read.
	if nets, err := many.b.listNetworks(testContext(t), networks.ListOpts{Tags: TagOwned, ProjectID: many.project, Limit: 3}); err != nil || len(nets) != 21 {
		t.Errorf("paged list: %d networks, %v; want 21", len(nets), err)
	}

	// A network without its subnet is listed without families.
	obs := one.listOwned(t)
	if err := subnets.Delete(testContext(t), one.b.client, obs[0].Status.SubnetIDs[0]).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	obs = one.listOwned(t)
	if len(obs) != 1 || len(obs[0].Families) != 0 || len(obs[0].Status.SubnetIDs) != 0 {
		t.Fatalf("ListOwned without subnet = %+v", obs)
	}
}

// TestConcurrentEnsure: the backend is used by several workers at once.
func TestConcurrentEnsure(t *testing.T) {
	f := newFixture(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			w := network(newOwner(fmt.Sprintf("c%d", i)), fmt.Sprintf("10.120.%d.0/24", i), fmt.Sprintf("10.120.%d.1", i))
			if _, err := f.b.Ensure(testContext(t), w, nil); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if obs := f.listOwned(t); len(obs) != 8 {
		t.Errorf("ListOwned = %d networks, want 8", len(obs))
	}
}

func TestDeleteMissing(t *testing.T) {
	f := newFixture(t)
	ctx := testContext(t)
	owner := newOwner("gone")
	if err := f.b.Delete(ctx, owner, nil); err != nil {
		t.Fatalf("Delete of a Network that never had a network: %v", err)
	}
	st := f.ensure(t, network(owner, "10.80.0.0/24", "10.80.0.1"), nil, backend.ActionCreated)
	if err := f.b.Delete(ctx, owner, st.status()); err != nil {
		t.Fatal(err)
	}
	if err := f.b.Delete(ctx, owner, st.status()); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	// Without a recorded ID, Delete finds the network by its owner.
	f.ensure(t, network(owner, "10.80.0.0/24", "10.80.0.1"), nil, backend.ActionCreated)
	if err := f.b.Delete(ctx, owner, nil); err != nil {
		t.Fatal(err)
	}
	if nets, _ := f.inProject(t); len(nets) != 0 {
		t.Fatalf("%d networks left", len(nets))
	}
}

// TestNeutronErrorIsQuoted: the caller's status message should say what
// Neutron said.
func TestNeutronErrorIsQuoted(t *testing.T) {
	f := newFixture(t)
	ctx := testContext(t)
	owner := newOwner("busy")
	st := f.ensure(t, network(owner, "10.90.0.0/24", "10.90.0.1"), nil, backend.ActionCreated)
	noGroups := []string{}
	_, err := ports.Create(ctx, f.b.client, ports.CreateOpts{
		NetworkID:      st.NetworkID,
		ProjectID:      f.project,
		SecurityGroups: &noGroups,
		FixedIPs:       []ports.IP{{SubnetID: st.SubnetID, IPAddress: "10.90.0.5"}},
	}).Extract()
	if err != nil {
		t.Fatal(err)
	}

	err = f.b.Delete(ctx, owner, st.status())
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict || apiErr.Type != "NetworkInUse" {
		t.Fatalf("Delete of a network with a port: %v, want a 409 NetworkInUse", err)
	}
	if msg := err.Error(); !strings.Contains(msg, st.NetworkID) || !strings.Contains(msg, "NetworkInUse") || !strings.Contains(msg, "ports") {
		t.Errorf("message %q does not say what happened", msg)
	}
	t.Logf("message: %v", err)

	// The CIDR cannot change under a port either.
	_, err = f.b.Ensure(ctx, network(owner, "10.91.0.0/24", "10.91.0.1"), st.status())
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict {
		t.Fatalf("CIDR change under a port: %v, want a 409", err)
	}
	t.Logf("message: %v", err)
}

// TestOutage: with Neutron down, Ensure fails fast with a useful message;
// once it is back, Ensure converges without duplicates.
func TestOutage(t *testing.T) {
	neutrontest.Require(t)
	ctx := testContext(t)
	srv, err := neutrontest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	f := newFixtureOn(t, srv)
	owner := newOwner("outage")
	want := network(owner, "10.95.0.0/24", "10.95.0.1")
	st := f.ensure(t, want, nil, backend.ActionCreated)

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = f.b.Ensure(ctx, network(owner, "10.95.0.0/24", "10.95.0.9"), st.status())
	took := time.Since(start)
	if err == nil {
		t.Fatal("Ensure with Neutron down succeeded")
	}
	if took > 15*time.Second {
		t.Errorf("Ensure with Neutron down took %v", took)
	}
	// Refused, or reset when the request went out on a connection kept
	// alive from before the stop (seen in CI).
	unreachable := strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "connection reset by peer")
	if !unreachable || !strings.Contains(err.Error(), st.NetworkID) {
		t.Errorf("message %q does not say what failed", err)
	}
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
	_, err = f.b.ListOwned(ctx)
	if err == nil {
		t.Fatal("ListOwned with Neutron down succeeded")
	}

	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	st2 := f.ensure(t, network(owner, "10.95.0.0/24", "10.95.0.9"), st.status(), backend.ActionUpdated)
	if st2 != st {
		t.Fatalf("after the outage: %+v, want %+v", st2, st)
	}
	// Also with status lost: adopted, not duplicated.
	f.ensure(t, network(owner, "10.95.0.0/24", "10.95.0.9"), nil, backend.ActionNone)
	if nets, subs := f.inProject(t); len(nets) != 1 || len(subs) != 1 {
		t.Fatalf("after the outage: %d networks, %d subnets, want 1 and 1", len(nets), len(subs))
	}
}

// TestHungNeutron: a Neutron that accepts connections but never answers
// makes each operation time out instead of hanging.
func TestHungNeutron(t *testing.T) {
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hung.Close()
	defer close(release)

	// A hung Neutron at start neither blocks nor stops netop: New returns
	// within the request timeout, and the calls fail until Neutron answers.
	start := time.Now()
	b, err := New(testContext(t), Config{Endpoint: hung.URL, ProjectID: "p", RequestTimeout: 500 * time.Millisecond})
	if err != nil || time.Since(start) > 5*time.Second {
		t.Fatalf("New against a hung Neutron: %v after %v", err, time.Since(start))
	}
	start = time.Now()
	_, err = b.Ensure(testContext(t), network(newOwner("hung"), "10.0.0.0/24", "10.0.0.1"), nil)
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("Ensure against a hung Neutron: %v after %v", err, time.Since(start))
	}
	t.Logf("Ensure: %v", err)
}

func TestNewErrors(t *testing.T) {
	ctx := testContext(t)
	_, err := New(ctx, Config{Endpoint: "http://127.0.0.1:9696/"})
	if err == nil || !strings.Contains(err.Error(), "--neutron-project") {
		t.Errorf("no project: %v", err)
	}
	for _, ep := range []string{"127.0.0.1:9696", "ftp://x/", "http://", "http://h/?a=b"} {
		if _, err := New(ctx, Config{Endpoint: ep, ProjectID: "p"}); err == nil || !strings.Contains(err.Error(), "invalid neutron endpoint") {
			t.Errorf("endpoint %q: %v", ep, err)
		}
	}

	// Nothing listens on a port just closed.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// A Neutron that is down at start does not keep netop down: the
	// backend is made, and its calls fail until Neutron answers.
	down, err := New(ctx, Config{Endpoint: "http://" + addr, ProjectID: "p"})
	if err != nil {
		t.Fatalf("unreachable endpoint at start: %v", err)
	}
	if _, err := down.ListOwned(ctx); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("ListOwned against an unreachable endpoint: %v", err)
	}

	// Neither an endpoint nor any OpenStack configuration.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OS_") {
			t.Setenv(k, "")
		}
	}
	_, err = New(ctx, Config{})
	if !errors.Is(err, errNoCredentials) {
		t.Errorf("no configuration: %v", err)
	}
	t.Setenv("OS_CLOUD", "nowhere")
	t.Setenv("OS_CLIENT_CONFIG_FILE", filepath.Join(t.TempDir(), "clouds.yaml"))
	if _, err = New(ctx, Config{}); err == nil || !strings.Contains(err.Error(), "nowhere") {
		t.Errorf("missing clouds.yaml: %v", err)
	}
}

func TestEndpointForms(t *testing.T) {
	for _, ep := range []string{"http://h:9696", "http://h:9696/", "http://h:9696/v2.0", "http://h:9696/v2.0/"} {
		sc, err := noauthClient(ep, http.Client{})
		if err != nil {
			t.Fatal(err)
		}
		if sc.Endpoint != "http://h:9696/" || sc.ResourceBase != "http://h:9696/v2.0/" {
			t.Errorf("%s: endpoint %s, resource base %s", ep, sc.Endpoint, sc.ResourceBase)
		}
	}
}

func TestCloudConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "clouds.yaml")
	yaml := `
clouds:
  prod:
    auth:
      auth_url: https://keystone.example:5000/v3
      username: netop
      project_name: nets
      user_domain_name: Users
      project_domain_name: Projects
    region_name: RegionTwo
    interface: internal
  appcred:
    auth:
      auth_url: https://keystone.example:5000/v3
      application_credential_id: abc
      application_credential_secret: s3cret
`
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"OS_CLIENT_CONFIG_FILE": file, "OS_PASSWORD": "pw"}
	getenv := func(k string) string { return env[k] }

	c, err := loadCloud("prod", getenv)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := c.authOptions()
	if err != nil {
		t.Fatal(err)
	}
	if opts.Username != "netop" || opts.Password != "pw" || opts.DomainName != "Users" || opts.Scope == nil ||
		opts.Scope.ProjectName != "nets" || opts.Scope.DomainName != "Projects" || !opts.AllowReauth || c.RegionName != "RegionTwo" {
		t.Errorf("prod: %+v scope %+v region %q", opts, opts.Scope, c.RegionName)
	}

	c, err = loadCloud("appcred", getenv)
	if err != nil {
		t.Fatal(err)
	}
	if opts, err = c.authOptions(); err != nil || opts.ApplicationCredentialID != "abc" || opts.Scope != nil {
		t.Errorf("appcred: %+v, %v", opts, err)
	}

	env = map[string]string{
		"OS_AUTH_URL": "https://k/v3", "OS_USERNAME": "u", "OS_PASSWORD": "p",
		"OS_PROJECT_NAME": "pr", "OS_USER_DOMAIN_NAME": "Default", "OS_PROJECT_DOMAIN_ID": "default",
	}
	c, err = loadCloud("", getenv)
	if err != nil {
		t.Fatal(err)
	}
	if opts, err = c.authOptions(); err != nil || opts.DomainName != "Default" || opts.Scope.ProjectName != "pr" || opts.Scope.DomainID != "default" {
		t.Errorf("env: %+v scope %+v, %v", opts, opts.Scope, err)
	}
	delete(env, "OS_PASSWORD")
	if c, err = loadCloud("", getenv); err == nil {
		_, err = c.authOptions()
	}
	if err == nil || !strings.Contains(err.Error(), "OS_PASSWORD") {
		t.Errorf("no password: %v", err)
	}
}

func TestAllocationPools(t *testing.T) {
	for _, tc := range []struct {
		cidr, gw string
		want     string
	}{
		{"10.0.0.0/24", "10.0.0.1", "10.0.0.2-10.0.0.254"},
		{"10.0.0.0/24", "10.0.0.254", "10.0.0.1-10.0.0.253"},
		{"10.0.0.0/24", "10.0.0.7", "10.0.0.1-10.0.0.6 10.0.0.8-10.0.0.254"},
		{"10.0.0.0/8", "10.0.0.1", "10.0.0.2-10.255.255.254"},
		{"10.0.0.0/30", "10.0.0.1", "10.0.0.2-10.0.0.2"},
		{"10.0.0.0/31", "10.0.0.1", ""},
		{"10.0.0.4/32", "10.0.0.4", ""},
		{"fd00::/64", "fd00::1", "fd00::2-fd00::ffff:ffff:ffff:ffff"},
		{"fd00::/127", "fd00::1", ""},
		{"fd00::/126", "fd00::3", "fd00::1-fd00::2"},
	} {
		var got []string
		for _, p := range allocationPools(netip.MustParsePrefix(tc.cidr), netip.MustParseAddr(tc.gw)) {
			got = append(got, p.start.String()+"-"+p.end.String())
		}
		if s := strings.Join(got, " "); s != tc.want {
			t.Errorf("%s gw %s: %q, want %q", tc.cidr, tc.gw, s, tc.want)
		}
	}
}

func TestNaming(t *testing.T) {
	owner := backend.Owner{Namespace: "default", Name: "blue", UID: "0b9f3c1e-3b1a-4c56-9a0e-1f2d3c4b5a69"}
	if got := Description(owner); got != "netop:default/blue/0b9f3c1e-3b1a-4c56-9a0e-1f2d3c4b5a69" {
		t.Errorf("Description = %q", got)
	}
	if got, ok := ParseDescription(Description(owner)); !ok || got != owner {
		t.Errorf("ParseDescription = %+v, %v", got, ok)
	}
	long := backend.Owner{Namespace: strings.Repeat("n", 63), Name: strings.Repeat("m", 253), UID: owner.UID}
	d := Description(long)
	got, ok := ParseDescription(d)
	if len(d) != maxDescriptionLen || !ok || got.UID != owner.UID || got.Namespace != long.Namespace {
		t.Errorf("long Description %q (%d) parses as %+v %v", d, len(d), got, ok)
	}
	if n := NetworkName(long); len(n) != maxNameLen || !strings.HasPrefix(n, "netop-"+long.Namespace+"-m") {
		t.Errorf("long NetworkName %q", n)
	}
	for _, bad := range []string{"", "x", "netop:a/b", "netop:a/b/", "netop:a/b/has,comma"} {
		if _, ok := ParseDescription(bad); ok {
			t.Errorf("ParseDescription(%q) accepted", bad)
		}
	}
	for _, uid := range []types.UID{"", "a,b", "a b", types.UID(strings.Repeat("a", 51))} {
		if validUID(uid) {
			t.Errorf("validUID(%q)", uid)
		}
	}
}

func TestEnsureRejectsInvalid(t *testing.T) {
	b := &Backend{}
	owner := newOwner("bad")
	for _, w := range []backend.Network{
		{Owner: owner},
		network(owner, "10.0.0.1/24", "10.0.0.1"),
		network(owner, "10.0.0.0/24", "10.0.1.1"),
		network(backend.Owner{Name: "x", UID: "a,b"}, "10.0.0.0/24", "10.0.0.1"),
	} {
		if _, err := b.Ensure(testContext(t), w, nil); err == nil {
			t.Errorf("Ensure(%+v) accepted", w)
		}
	}
}

func BenchmarkEnsureNoop(b *testing.B) {
	f := newFixture(b)
	want := network(newOwner("bench"), "10.99.0.0/24", "10.99.0.1")
	st := f.ensure(b, want, nil, backend.ActionCreated)
	ctx := testContext(b)
	var failed atomic.Bool
	for b.Loop() {
		res, err := f.b.Ensure(ctx, want, st.status())
		if err != nil || res.Action != backend.ActionNone {
			failed.Store(true)
		}
	}
	b.StopTimer()
	if failed.Load() {
		b.Fatal("a no-op Ensure failed or changed something")
	}
}

// A dual-stack network is one Neutron network with a subnet per family:
// made, left alone when it matches, listed with both families, and
// converged when the second family is removed, moved or deleted by hand.
// The status records the primary family's subnet.
func TestDualStackSubnets(t *testing.T) {
	f := newFixture(t)
	ctx := testContext(t)
	want := network(newOwner("dual"), "10.51.0.0/24", "10.51.0.1")
	want.Families = append(want.Families, backend.Family{CIDR: netip.MustParsePrefix("fd00:51::/64"), Gateway: netip.MustParseAddr("fd00:51::1")})
	st := f.ensure(t, want, nil, backend.ActionCreated)
	f.checkSubnet(t, st.SubnetID, "10.51.0.0/24", "10.51.0.1", "10.51.0.2-10.51.0.254")
	v6 := func() *subnets.Subnet {
		t.Helper()
		_, subs := f.inProject(t)
		var found *subnets.Subnet
		for i := range subs {
			if subs[i].IPVersion == 6 {
				if found != nil {
					t.Fatalf("two IPv6 subnets: %+v", subs)
				}
				found = &subs[i]
			}
		}
		return found
	}
	if s := v6(); s == nil || s.CIDR != "fd00:51::/64" || s.GatewayIP != "fd00:51::1" || s.NetworkID != st.NetworkID || !hasTags(s.Tags, Tags(want.Owner)) {
		t.Fatalf("IPv6 subnet %+v, want fd00:51::/64 gateway fd00:51::1 in network %s, tagged", s, st.NetworkID)
	}
	if again := f.ensure(t, want, st.status(), backend.ActionNone); again != st {
		t.Errorf("a matching network changed its status: %+v -> %+v", st, again)
	}
	if obs := f.listOwned(t); len(obs) != 1 || !obs[0].Provides(want) {
		t.Errorf("ListOwned = %+v, want one network with both families", obs)
	}

	moved := want
	moved.Families = []backend.Family{want.Families[0], {CIDR: netip.MustParsePrefix("fd00:52::/64"), Gateway: netip.MustParseAddr("fd00:52::9")}}
	if st2 := f.ensure(t, moved, st.status(), backend.ActionUpdated); st2.NetworkID != st.NetworkID || st2.SubnetID != st.SubnetID {
		t.Errorf("moving the IPv6 family changed the primary's status: %+v -> %+v", st, st2)
	}
	if s := v6(); s == nil || s.CIDR != "fd00:52::/64" || s.GatewayIP != "fd00:52::9" {
		t.Fatalf("IPv6 subnet after the move: %+v", s)
	}

	if err := subnets.Delete(ctx, f.b.client, v6().ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if obs := f.listOwned(t); len(obs) != 1 || obs[0].Provides(moved) {
		t.Errorf("without its IPv6 subnet, ListOwned = %+v, as if it matched", obs)
	}
	f.ensure(t, moved, st.status(), backend.ActionUpdated)
	if s := v6(); s == nil || s.CIDR != "fd00:52::/64" {
		t.Fatalf("IPv6 subnet after it was deleted by hand: %+v", s)
	}

	single := want
	single.Families = want.Families[:1]
	f.ensure(t, single, st.status(), backend.ActionUpdated)
	if s := v6(); s != nil {
		t.Errorf("single-stack again, an IPv6 subnet is left: %+v", s)
	}
	if obs := f.listOwned(t); len(obs) != 1 || !obs[0].Provides(single) || !slices.Equal(obs[0].Status.SubnetIDs, []string{st.SubnetID}) {
		t.Errorf("ListOwned = %+v, want the IPv4 family alone", obs)
	}
}
