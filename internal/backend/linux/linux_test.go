package linux

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/testing/nettest"
)

// eventTimeout bounds waits for netlink notifications, which normally
// arrive within milliseconds.
const eventTimeout = 10 * time.Second

// testEnv is a backend in a throwaway network namespace, with a separate
// handle for making changes "by hand".
type testEnv struct {
	b     *Backend
	hand  *netlink.Handle
	netns string
}

func newTestEnv(t testing.TB) *testEnv {
	t.Helper()
	nettest.RequireRoot(t)
	name := nettest.NetnsName("netop-t-")
	if err := EnsureNetns(name); err != nil {
		t.Fatalf("EnsureNetns: %v", err)
	}
	t.Cleanup(func() {
		if err := nettest.DeleteNetns(name); err != nil {
			t.Errorf("DeleteNetns: %v", err)
		}
	})

	b, err := New(testContext(t), Config{Netns: name})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(b.Close)

	return &testEnv{b: b, hand: nettest.Handle(t, name), netns: name}
}

func testContext(t testing.TB) context.Context {
	if tt, ok := t.(*testing.T); ok {
		_, ctx := ktesting.NewTestContext(tt)
		return ctx
	}
	return klog.NewContext(context.Background(), logr.Discard()) // benchmarks: no log cost
}

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func newUID(t testing.TB) types.UID {
	h := randomHex(t, 16)
	return types.UID(h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:])
}

func network(t testing.TB, name, cidr, gw string) backend.Network {
	return backend.Network{
		Owner:    backend.Owner{Namespace: "default", Name: name, UID: newUID(t)},
		Families: []backend.Family{{CIDR: netip.MustParsePrefix(cidr).Masked(), Gateway: netip.MustParseAddr(gw)}},
	}
}

// withFamily is n with family i (0 the primary) set to f, or removed when
// f is zero; n's own families are left alone.
func withFamily(n backend.Network, i int, f backend.Family) backend.Network {
	families := slices.Clone(n.Families)
	switch {
	case !f.CIDR.IsValid():
		families = families[:i]
	case i == len(families):
		families = append(families, f)
	default:
		families[i] = f
	}
	n.Families = families
	return n
}

func (e *testEnv) ensure(t *testing.T, want backend.Network, wantAction backend.Action) {
	t.Helper()
	res, err := e.b.Ensure(testContext(t), want, nil)
	if err != nil {
		t.Fatalf("Ensure(%s, %v): %v", want.Name, want.Families, err)
	}
	if res.Action != wantAction {
		t.Errorf("Ensure(%s, %v) action = %q, want %q", want.Name, want.Families, res.Action, wantAction)
	}
	wantStatus := backend.Ref{Type: backend.TypeLinux, Interface: ifname.Bridge(want.UID)}
	if !backend.SameStatus(&res.Status, &wantStatus) {
		t.Errorf("status = %+v, want %+v", res.Status, wantStatus)
	}
}

// checkBridge verifies the bridge of want as the kernel sees it.
func (e *testEnv) checkBridge(t *testing.T, want backend.Network) {
	t.Helper()
	name := ifname.Bridge(want.UID)
	link, err := e.hand.LinkByName(name)
	if err != nil {
		t.Fatalf("bridge %s: %v", name, err)
	}
	if link.Type() != "bridge" {
		t.Errorf("%s type = %q, want bridge", name, link.Type())
	}
	if got, want := link.Attrs().Alias, Alias(want.Owner); got != want {
		t.Errorf("%s alias = %q, want %q", name, got, want)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("%s is not up", name)
	}
	var wantAddrs []string
	for _, f := range want.Families {
		wantAddrs = append(wantAddrs, netip.PrefixFrom(f.Gateway, f.CIDR.Bits()).String())
	}
	got := e.addresses(t, link)
	slices.Sort(got)
	slices.Sort(wantAddrs)
	if !slices.Equal(got, wantAddrs) {
		t.Errorf("%s addresses = %v, want %v", name, got, wantAddrs)
	}
}

// addresses lists link's addresses other than IPv6 link-local ones.
func (e *testEnv) addresses(t *testing.T, link netlink.Link) []string {
	t.Helper()
	addrs, err := e.hand.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() && a.IP.To4() == nil {
			continue
		}
		out = append(out, a.IPNet.String())
	}
	return out
}

// addLink creates link by hand and sets its alias, which the kernel
// ignores at creation.
func (e *testEnv) addLink(t testing.TB, link netlink.Link, alias string) {
	t.Helper()
	if err := e.hand.LinkAdd(link); err != nil {
		t.Fatalf("add %s: %v", link.Attrs().Name, err)
	}
	if alias == "" {
		return
	}
	if err := e.hand.LinkSetAlias(link, alias); err != nil {
		t.Fatalf("set alias of %s: %v", link.Attrs().Name, err)
	}
}

// addNonBridge creates a link that is not a bridge: a dummy, or an ifb
// where the kernel lacks the dummy driver.
func (e *testEnv) addNonBridge(t testing.TB, name, alias string) {
	t.Helper()
	err := e.hand.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}})
	if errors.Is(err, unix.EOPNOTSUPP) {
		err = e.hand.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: name}})
	}
	if err != nil {
		t.Fatalf("add %s: %v", name, err)
	}
	if alias == "" {
		return
	}
	link, err := e.hand.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.hand.LinkSetAlias(link, alias); err != nil {
		t.Fatalf("set alias of %s: %v", name, err)
	}
}

// recordingOps records the netlink calls the backend makes.
type recordingOps struct {
	netlinkOps
	mu    sync.Mutex
	calls []string
}

func (r *recordingOps) record(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, name)
}

func (r *recordingOps) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.calls
	r.calls = nil
	return c
}

func (r *recordingOps) LinkByName(n string) (netlink.Link, error) {
	r.record("LinkByName")
	return r.netlinkOps.LinkByName(n)
}

func (r *recordingOps) LinkByIndex(i int) (netlink.Link, error) {
	r.record("LinkByIndex")
	return r.netlinkOps.LinkByIndex(i)
}

func (r *recordingOps) LinkList() ([]netlink.Link, error) {
	r.record("LinkList")
	return r.netlinkOps.LinkList()
}

func (r *recordingOps) AddrList(l netlink.Link, f int) ([]netlink.Addr, error) {
	r.record("AddrList")
	return r.netlinkOps.AddrList(l, f)
}

func (r *recordingOps) LinkAdd(l netlink.Link) error {
	r.record("LinkAdd")
	return r.netlinkOps.LinkAdd(l)
}

func (r *recordingOps) LinkDel(l netlink.Link) error {
	r.record("LinkDel")
	return r.netlinkOps.LinkDel(l)
}

func (r *recordingOps) LinkSetAlias(l netlink.Link, a string) error {
	r.record("LinkSetAlias")
	return r.netlinkOps.LinkSetAlias(l, a)
}

func (r *recordingOps) LinkSetIP6AddrGenMode(l netlink.Link, mode int) error {
	r.record("LinkSetIP6AddrGenMode")
	return r.netlinkOps.LinkSetIP6AddrGenMode(l, mode)
}

func (r *recordingOps) LinkSetUp(l netlink.Link) error {
	r.record("LinkSetUp")
	return r.netlinkOps.LinkSetUp(l)
}

func (r *recordingOps) AddrAdd(l netlink.Link, a *netlink.Addr) error {
	r.record("AddrAdd")
	return r.netlinkOps.AddrAdd(l, a)
}

func (r *recordingOps) AddrDel(l netlink.Link, a *netlink.Addr) error {
	r.record("AddrDel")
	return r.netlinkOps.AddrDel(l, a)
}

func TestEnsureCreatesBridge(t *testing.T) {
	e := newTestEnv(t)
	rec := &recordingOps{netlinkOps: e.b.nl}
	e.b.nl = rec
	want := network(t, "net1", "192.168.0.0/16", "192.168.0.1")

	e.ensure(t, want, backend.ActionCreated)
	e.checkBridge(t, want)
	// The namespace's first bridge lists the links once: the isolation
	// table is made with every netop bridge there is. Up last, once whole:
	// the CNI plugin attaches pods to a bridge that is up.
	if got, wantCalls := rec.take(), []string{"LinkByName", "LinkAdd", "LinkSetAlias", "AddrList", "AddrAdd", "LinkList", "LinkSetIP6AddrGenMode", "LinkSetUp"}; !slices.Equal(got, wantCalls) {
		t.Errorf("creating Ensure made netlink calls %v, want %v", got, wantCalls)
	}
	second := network(t, "net2", "10.0.0.0/16", "10.0.0.1")
	e.ensure(t, second, backend.ActionCreated)
	if got, wantCalls := rec.take(), []string{"LinkByName", "LinkAdd", "LinkSetAlias", "AddrList", "AddrAdd", "LinkSetIP6AddrGenMode", "LinkSetUp"}; !slices.Equal(got, wantCalls) {
		t.Errorf("creating Ensure beside another bridge made netlink calls %v, want %v", got, wantCalls)
	}
	// Up, without an IPv6 link-local address (see setUp).
	link, err := e.hand.LinkByName(ifname.Bridge(want.UID))
	if err != nil {
		t.Fatal(err)
	}
	if addrs, err := e.hand.AddrList(link, netlink.FAMILY_V6); err != nil || len(addrs) != 0 {
		t.Errorf("IPv6 addresses on the bridge of an IPv4 Network: %v %v", addrs, err)
	}
	// Nor IPv6 at all: not even the multicast route every IPv6 link gets,
	// which costs each new link a walk past every other link's.
	if got := e.ipv6Disabled(t, link.Attrs().Name); got != "1" {
		t.Errorf("disable_ipv6 of the bridge of an IPv4 Network is %q, want 1", got)
	}
	routes, err := e.hand.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{LinkIndex: link.Attrs().Index, Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil || len(routes) != 0 {
		t.Errorf("IPv6 routes through the bridge of an IPv4 Network: %v %v", routes, err)
	}
	// Nor multicast snooping, whose group the bridge would report.
	if br, ok := link.(*netlink.Bridge); !ok || br.MulticastSnooping == nil || *br.MulticastSnooping {
		t.Errorf("multicast snooping on the bridge: %+v", link)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("bridge not up: %+v", link.Attrs())
	}

	e.ensure(t, want, backend.ActionNone)
	if got, wantCalls := rec.take(), []string{"LinkByName", "AddrList"}; !slices.Equal(got, wantCalls) {
		t.Errorf("no-op Ensure made netlink calls %v, want %v", got, wantCalls)
	}
}

func TestEnsureUpdatesAddress(t *testing.T) {
	e := newTestEnv(t)
	want := network(t, "net1", "192.168.0.0/16", "192.168.0.1")
	e.ensure(t, want, backend.ActionCreated)

	// The tutorial's change: cidr 192.168.1.0/16, canonically
	// 192.168.0.0/16, with gateway 192.168.1.1, a secondary address of the
	// same subnet as the old one.
	want = withFamily(want, 0, backend.Family{CIDR: netip.MustParsePrefix("192.168.1.0/16").Masked(), Gateway: netip.MustParseAddr("192.168.1.1")})
	e.ensure(t, want, backend.ActionUpdated)
	e.checkBridge(t, want)
	e.ensure(t, want, backend.ActionNone)

	// Same gateway, other prefix length.
	want = withFamily(want, 0, backend.Family{CIDR: netip.MustParsePrefix("192.168.1.0/24"), Gateway: want.Families[0].Gateway})
	e.ensure(t, want, backend.ActionUpdated)
	e.checkBridge(t, want)
	e.ensure(t, want, backend.ActionNone)

	// Drift: an extra address and the bridge set down by hand.
	link, err := e.hand.LinkByName(ifname.Bridge(want.UID))
	if err != nil {
		t.Fatal(err)
	}
	extra, _ := netlink.ParseAddr("10.9.9.9/8")
	if err := e.hand.AddrAdd(link, extra); err != nil {
		t.Fatal(err)
	}
	if err := e.hand.LinkSetDown(link); err != nil {
		t.Fatal(err)
	}
	e.ensure(t, want, backend.ActionUpdated)
	e.checkBridge(t, want)

	// Family change: the bridge, made with IPv6 off, gets it back.
	want = withFamily(want, 0, backend.Family{CIDR: netip.MustParsePrefix("fd00:1::/64"), Gateway: netip.MustParseAddr("fd00:1::1")})
	e.ensure(t, want, backend.ActionUpdated)
	e.checkBridge(t, want)
	if got := e.ipv6Disabled(t, ifname.Bridge(want.UID)); got != "0" {
		t.Errorf("disable_ipv6 of the bridge of an IPv6 Network is %q, want 0", got)
	}
}

// ipv6Disabled reads the disable_ipv6 sysctl of link name.
func (e *testEnv) ipv6Disabled(t *testing.T, name string) string {
	t.Helper()
	var value []byte
	err := InNetns(e.b.ns, func() (err error) {
		value, err = os.ReadFile(filepath.Join("/proc/sys/net/ipv6/conf", name, "disable_ipv6"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(value))
}

func TestEnsureIPv6(t *testing.T) {
	e := newTestEnv(t)
	want := network(t, "net6", "2001:db8:1::/64", "2001:db8:1::1")
	e.ensure(t, want, backend.ActionCreated)
	e.checkBridge(t, want)
	if got := e.ipv6Disabled(t, ifname.Bridge(want.UID)); got != "0" {
		t.Errorf("disable_ipv6 of the bridge of an IPv6 Network is %q, want 0", got)
	}

	// Link-local addresses belong to the kernel and stay.
	link, err := e.hand.LinkByName(ifname.Bridge(want.UID))
	if err != nil {
		t.Fatal(err)
	}
	ll, _ := netlink.ParseAddr("fe80::1234/64")
	if err := e.hand.AddrAdd(link, ll); err != nil {
		t.Fatal(err)
	}
	e.ensure(t, want, backend.ActionNone)

	// Same address, other prefix length: IPv6 cannot have both.
	want = withFamily(want, 0, backend.Family{CIDR: netip.MustParsePrefix("2001:db8::/32"), Gateway: want.Families[0].Gateway})
	e.ensure(t, want, backend.ActionUpdated)
	e.checkBridge(t, want)

	want = withFamily(want, 0, backend.Family{CIDR: netip.MustParsePrefix("2001:db8:2::/64"), Gateway: netip.MustParseAddr("2001:db8:2::fe")})
	e.ensure(t, want, backend.ActionUpdated)
	e.checkBridge(t, want)
	e.ensure(t, want, backend.ActionNone)

	addrs, err := e.hand.AddrList(link, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IP.Equal(ll.IP) }) {
		t.Errorf("link-local %s was removed; addresses: %v", ll, addrs)
	}
}

func TestEnsureRefusesForeignLinks(t *testing.T) {
	tests := []struct {
		name string
		add  func(t *testing.T, e *testEnv, name string, want, other backend.Owner)
	}{{
		name: "not a bridge",
		add: func(t *testing.T, e *testEnv, name string, _, _ backend.Owner) {
			e.addNonBridge(t, name, "")
		},
	}, {
		name: "not a bridge, with our alias",
		add: func(t *testing.T, e *testEnv, name string, want, _ backend.Owner) {
			e.addNonBridge(t, name, Alias(want))
		},
	}, {
		name: "bridge of another Network",
		add: func(t *testing.T, e *testEnv, name string, _, other backend.Owner) {
			e.addLink(t, &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}, Alias(other))
		},
	}, {
		name: "bridge with someone else's alias",
		add: func(t *testing.T, e *testEnv, name string, _, _ backend.Owner) {
			e.addLink(t, &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}, "my lab bridge")
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t)
			want := network(t, "net1", "192.168.0.0/16", "192.168.0.1")
			other := backend.Owner{Namespace: "default", Name: "other", UID: newUID(t)}
			name := ifname.Bridge(want.UID)
			tc.add(t, e, name, want.Owner, other)
			before, err := e.hand.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}

			_, err = e.b.Ensure(testContext(t), want, nil)
			if !errors.Is(err, ErrForeign) {
				t.Fatalf("Ensure error = %v, want ErrForeign", err)
			}
			t.Logf("Ensure: %v", err)

			after, err := e.hand.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			if after.Attrs().Alias != before.Attrs().Alias || after.Attrs().Flags != before.Attrs().Flags {
				t.Errorf("link changed: alias %q → %q, flags %v → %v",
					before.Attrs().Alias, after.Attrs().Alias, before.Attrs().Flags, after.Attrs().Flags)
			}
			if got := e.addresses(t, after); len(got) != 0 {
				t.Errorf("addresses added to a foreign link: %v", got)
			}

			// Delete leaves it alone too, unless it carries our alias.
			if err := e.b.Delete(testContext(t), want.Owner, nil); err != nil {
				t.Fatalf("Delete: %v", err)
			}
			_, err = e.hand.LinkByName(name)
			if gone := isLinkNotFound(err); gone != (tc.name == "not a bridge, with our alias") {
				t.Errorf("after Delete: LinkByName err = %v", err)
			}
		})
	}
}

func TestEnsureAdoptsUnmarkedBridge(t *testing.T) {
	e := newTestEnv(t)
	want := network(t, "net1", "10.1.0.0/16", "10.1.0.1")
	// What a crash between creating the bridge and marking it leaves.
	if err := e.hand.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: ifname.Bridge(want.UID)}}); err != nil {
		t.Fatal(err)
	}
	e.ensure(t, want, backend.ActionUpdated)
	e.checkBridge(t, want)
	e.ensure(t, want, backend.ActionNone)
}

// A bridge recorded before clusters were is adopted by the cluster whose
// Network has its UID; another cluster's bridge is never changed, adopted
// or deleted.
func TestClusterOwnership(t *testing.T) {
	e := newTestEnv(t)
	legacy := network(t, "legacy", "10.1.0.0/16", "10.1.0.1")
	e.ensure(t, legacy, backend.ActionCreated) // no cluster: the old record
	adopted := legacy
	adopted.Cluster = "cluster-a"
	e.ensure(t, adopted, backend.ActionUpdated)
	e.checkBridge(t, adopted)
	if link, err := e.hand.LinkByName(ifname.Bridge(legacy.UID)); err != nil || link.Attrs().Alias != "netop:cluster-a:default/legacy/"+string(legacy.UID) {
		t.Fatalf("adopted bridge alias %q (%v)", link.Attrs().Alias, err)
	}

	theirs := network(t, "theirs", "10.2.0.0/16", "10.2.0.1")
	theirs.Cluster = "cluster-b"
	e.ensure(t, theirs, backend.ActionCreated)
	ours := theirs
	ours.Cluster = "cluster-a"
	if _, err := e.b.Ensure(testContext(t), ours, nil); !errors.Is(err, ErrForeign) {
		t.Errorf("Ensure of another cluster's bridge: %v, want ErrForeign", err)
	}
	if err := e.b.Delete(testContext(t), ours.Owner, nil); err != nil {
		t.Fatal(err)
	}
	e.checkBridge(t, theirs)

	owned, err := e.b.ListOwned(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	clusters := map[types.UID]string{}
	for _, o := range owned {
		clusters[o.UID] = o.Cluster
	}
	if clusters[legacy.UID] != "cluster-a" || clusters[theirs.UID] != "cluster-b" {
		t.Errorf("ListOwned clusters %v", clusters)
	}
}

func TestEnsureRejectsInvalidInput(t *testing.T) {
	e := newTestEnv(t)
	good := network(t, "net1", "10.1.0.0/16", "10.1.0.1")
	tests := map[string]func(n *backend.Network){
		"empty UID":          func(n *backend.Network) { n.UID = "" },
		"short UID":          func(n *backend.Network) { n.UID = "abc" },
		"UID with slash":     func(n *backend.Network) { n.UID = "0123456789/abcdef" },
		"zero CIDR":          func(n *backend.Network) { n.Families[0].CIDR = netip.Prefix{} },
		"zero gateway":       func(n *backend.Network) { n.Families[0].Gateway = netip.Addr{} },
		"gateway outside":    func(n *backend.Network) { n.Families[0].Gateway = netip.MustParseAddr("10.2.0.1") },
		"gateway of v6":      func(n *backend.Network) { n.Families[0].Gateway = netip.MustParseAddr("fd00::1") },
		"mapped gateway":     func(n *backend.Network) { n.Families[0].Gateway = netip.MustParseAddr("::ffff:10.1.0.1") },
		"mapped IPv6 prefix": func(n *backend.Network) { n.Families[0].CIDR = netip.MustParsePrefix("::ffff:10.1.0.0/112") },
	}
	for name, mutate := range tests {
		n := good
		n.Families = slices.Clone(good.Families)
		mutate(&n)
		if _, err := e.b.Ensure(testContext(t), n, nil); err == nil {
			t.Errorf("%s: Ensure succeeded", name)
		}
	}
	links, err := e.hand.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, ifname.BridgePrefix) {
			t.Errorf("invalid input created %s", l.Attrs().Name)
		}
	}
}

func TestDelete(t *testing.T) {
	e := newTestEnv(t)
	ctx := testContext(t)
	want := network(t, "net1", "192.168.0.0/16", "192.168.0.1")
	res, err := e.b.Ensure(ctx, want, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.b.Delete(ctx, want.Owner, &res.Status); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := e.hand.LinkByName(res.Status.Interface); !isLinkNotFound(err) {
		t.Errorf("bridge still there after Delete (err %v)", err)
	}
	if err := e.b.Delete(ctx, want.Owner, &res.Status); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	if err := e.b.Delete(ctx, want.Owner, nil); err != nil {
		t.Errorf("Delete without status: %v", err)
	}

	// A recorded interface that is not ours, such as one written into the
	// status by hand, is never deleted.
	e.addNonBridge(t, "eth-lab", "")
	recorded := &backend.Ref{Type: backend.TypeLinux, Interface: "eth-lab"}
	if err := e.b.Delete(ctx, want.Owner, recorded); err != nil {
		t.Errorf("Delete of foreign recorded interface: %v", err)
	}
	if _, err := e.hand.LinkByName("eth-lab"); err != nil {
		t.Errorf("foreign interface deleted: %v", err)
	}
}

func TestListOwned(t *testing.T) {
	e := newTestEnv(t)
	ctx := testContext(t)
	a := network(t, "a", "10.1.0.0/16", "10.1.0.1")
	b := network(t, "b", "fd00:2::/64", "fd00:2::1")
	e.ensure(t, a, backend.ActionCreated)
	e.ensure(t, b, backend.ActionCreated)
	e.addLink(t, &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br-lab"}}, "lab bridge")
	e.addLink(t, &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br-lab2"}}, "netop:but/not-a-uid/x")
	e.addLink(t, &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br-lab3"}}, "")
	e.addNonBridge(t, "other0", "")

	got, err := e.b.ListOwned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	observed := func(n backend.Network) backend.Observed {
		return backend.Observed{Owner: n.Owner, Families: n.Families,
			Status: backend.Ref{Type: backend.TypeLinux, Interface: ifname.Bridge(n.UID)}}
	}
	key := func(o backend.Observed) string { return string(o.UID) }
	slices.SortFunc(got, func(x, y backend.Observed) int { return strings.Compare(key(x), key(y)) })
	want := []backend.Observed{observed(a), observed(b)}
	slices.SortFunc(want, func(x, y backend.Observed) int { return strings.Compare(key(x), key(y)) })
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ListOwned = %+v, want %+v", got, want)
	}

	// A bridge whose address was removed by hand is listed as incomplete,
	// so that the resync repairs it.
	link, err := e.hand.LinkByName(ifname.Bridge(a.UID))
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("10.1.0.1/16")
	if err := e.hand.AddrDel(link, addr); err != nil {
		t.Fatal(err)
	}
	got, err = e.b.ListOwned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range got {
		if o.UID == a.UID && o.Families != nil {
			t.Errorf("bridge without address listed with %+v", o.Families)
		}
	}
}

// TestListOwnedIPv4LinkLocal: a Network in 169.254.0.0/16 is netop's like
// any other, so ListOwned must report the address that Ensure keeps, or the
// resync would see the bridge as unconverged forever.
func TestListOwnedIPv4LinkLocal(t *testing.T) {
	e := newTestEnv(t)
	ctx := testContext(t)
	want := network(t, "ll", "169.254.10.0/24", "169.254.10.1")
	e.ensure(t, want, backend.ActionCreated)
	e.checkBridge(t, want)
	e.ensure(t, want, backend.ActionNone)

	got, err := e.b.ListOwned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantObs := backend.Observed{Owner: want.Owner, Families: want.Families,
		Status: backend.Ref{Type: backend.TypeLinux, Interface: ifname.Bridge(want.UID)}}
	if !reflect.DeepEqual(got, []backend.Observed{wantObs}) {
		t.Errorf("ListOwned = %+v, want [%+v]", got, wantObs)
	}
}

// watcher runs the drift watch of e.b in the background.
type watcher struct {
	owners chan backend.Owner
	errc   chan error
}

func startWatch(t *testing.T, e *testEnv) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(testContext(t))
	w := &watcher{owners: make(chan backend.Owner, 1024), errc: make(chan error, 1)}
	go func() {
		w.errc <- e.b.WatchDrift(ctx, func(o backend.Owner) {
			select {
			case w.owners <- o:
			default:
				t.Errorf("report buffer full, dropped %+v", o)
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-w.errc:
			if err != nil {
				t.Errorf("watch: %v", err)
			}
		case <-time.After(eventTimeout):
			t.Errorf("watch did not return after cancel")
		}
	})
	return w
}

// waitFor waits until the watcher reports owner, calling poke each time a
// short poll interval passes without that.
func (w *watcher) waitFor(t *testing.T, what string, owner backend.Owner, poke func()) {
	t.Helper()
	deadline := time.After(eventTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case o := <-w.owners:
			if o == owner {
				return
			}
		case <-tick.C:
			if poke != nil {
				poke()
			}
		case err := <-w.errc:
			t.Fatalf("watch ended while waiting for %s: %v", what, err)
		case <-deadline:
			t.Fatalf("no %s reported within %v", what, eventTimeout)
		}
	}
}

// indexLookups records the links the backend looks up by index, which the
// watch does only for an address notification of a link that no link
// notification has told it about.
type indexLookups struct {
	netlinkOps
	mu      sync.Mutex
	indexes []int
}

func (l *indexLookups) LinkByIndex(i int) (netlink.Link, error) {
	l.mu.Lock()
	l.indexes = append(l.indexes, i)
	l.mu.Unlock()
	return l.netlinkOps.LinkByIndex(i)
}

func (l *indexLookups) lookedUp(index int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.indexes, index)
}

// TestWatchDrift makes each kind of drift on a bridge of its own, and one
// for which the kernel sends notifications of one kind only, so that the
// owner reported shows which subscription saw it. The bridges are down and
// carry no IPv6 link-local address, whose duplicate address detection
// would send address notifications of its own.
func TestWatchDrift(t *testing.T) {
	e := newTestEnv(t)
	changed := network(t, "changed", "192.168.0.0/16", "192.168.0.1")
	readdressed := network(t, "readdressed", "10.0.0.0/8", "10.0.0.1")
	deleted := network(t, "deleted", "172.16.0.0/24", "172.16.0.1")
	bridges := map[backend.Owner]netlink.Link{}
	for _, n := range []backend.Network{changed, readdressed, deleted} {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: ifname.Bridge(n.UID)}}
		e.addLink(t, br, Alias(n.Owner))
		bridges[n.Owner] = br
	}
	gw, err := netlink.ParseAddr("10.0.0.1/8")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.hand.AddrAdd(bridges[readdressed.Owner], gw); err != nil {
		t.Fatal(err)
	}
	lookups := &indexLookups{netlinkOps: e.b.nl}
	e.b.nl = lookups
	w := startWatch(t, e)

	// A link change: the MTU of a bridge that is down sends a link
	// notification only. The subscription starts asynchronously, so the
	// MTU changes until the watch sees it.
	mtu := 1400
	w.waitFor(t, "link change", changed.Owner, func() {
		mtu = 2850 - mtu // 1450, 1400, 1450, …
		if err := e.hand.LinkSetMTU(bridges[changed.Owner], mtu); err != nil {
			t.Fatal(err)
		}
	})

	// Foreign links' notifications are ignored. Each subscription hands
	// over notifications in order, so these are handled before the
	// removal and the deletion below are reported.
	e.addNonBridge(t, "other0", "")
	dummy, err := e.hand.LinkByName("other0")
	if err != nil {
		t.Fatal(err)
	}
	extra, _ := netlink.ParseAddr("172.17.0.1/24")
	if err := e.hand.AddrAdd(dummy, extra); err != nil {
		t.Fatal(err)
	}

	// An address removal sends an address notification only, of a link
	// the watch has had no link notification of: it must look it up.
	if err := e.hand.AddrDel(bridges[readdressed.Owner], gw); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "address removal", readdressed.Owner, nil)
	if index := bridges[readdressed.Owner].Attrs().Index; !lookups.lookedUp(index) {
		t.Errorf("the watch reported the address removal without looking up link %d: the address subscription did not see it", index)
	}

	// Deleting a bridge without addresses sends a link notification only.
	if err := e.hand.LinkDel(bridges[deleted.Owner]); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "bridge deletion", deleted.Owner, nil)

	// Drain what is left: everything reported is one of ours.
	for {
		select {
		case o := <-w.owners:
			if _, ours := bridges[o]; !ours {
				t.Errorf("reported a foreign owner: %+v", o)
			}
			continue
		default:
		}
		break
	}

	// Ensure repairs what the watch reported.
	e.ensure(t, changed, backend.ActionUpdated)
	e.checkBridge(t, changed)
	e.ensure(t, readdressed, backend.ActionUpdated)
	e.checkBridge(t, readdressed)
	e.ensure(t, deleted, backend.ActionCreated)
	e.checkBridge(t, deleted)
}

func TestWatchDriftPublic(t *testing.T) {
	e := newTestEnv(t)
	want := network(t, "net1", "192.168.0.0/16", "192.168.0.1")
	e.ensure(t, want, backend.ActionCreated)
	link, err := e.hand.LinkByName(ifname.Bridge(want.UID))
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(testContext(t))
	owners := make(chan backend.Owner, 1024)
	errc := make(chan error, 1)
	go func() {
		errc <- e.b.WatchDrift(ctx, func(o backend.Owner) {
			select {
			case owners <- o:
			default:
			}
		})
	}()

	deadline := time.After(eventTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case o := <-owners:
			if o != want.Owner {
				t.Fatalf("reported %+v, want %+v", o, want.Owner)
			}
			break wait
		case <-tick.C:
			if err := e.hand.LinkSetDown(link); err != nil {
				t.Fatal(err)
			}
		case err := <-errc:
			t.Fatalf("WatchDrift returned early: %v", err)
		case <-deadline:
			t.Fatal("no drift reported")
		}
	}

	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("WatchDrift after cancel = %v, want nil", err)
		}
	case <-time.After(eventTimeout):
		t.Fatal("WatchDrift did not return after cancel")
	}
}

func TestNetnsLifecycle(t *testing.T) {
	nettest.RequireRoot(t)
	name := nettest.NetnsName("netop-t-")
	t.Cleanup(func() { _ = nettest.DeleteNetns(name) })
	for range 2 {
		if err := EnsureNetns(name); err != nil {
			t.Fatalf("EnsureNetns: %v", err)
		}
	}
	if err := checkNetns(name); err != nil {
		t.Fatal(err)
	}
	// The calling goroutine's thread must still be in the original namespace.
	self, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = self.Close() }()
	created, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = created.Close() }()
	if self.Equal(created) {
		t.Error("EnsureNetns left the thread in the new namespace")
	}
	for range 2 {
		if err := nettest.DeleteNetns(name); err != nil {
			t.Fatalf("DeleteNetns: %v", err)
		}
	}
	if err := checkNetns(name); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after DeleteNetns: %v", err)
	}
	for _, bad := range []string{"", ".", "..", "a/b", "../etc"} {
		if EnsureNetns(bad) == nil || nettest.DeleteNetns(bad) == nil {
			t.Errorf("name %q accepted", bad)
		}
	}
}

// TestAddrListOfOneLink checks that the backend's address list of one link
// equals netlink's own, and that the kernel, not a filter in Go, left out
// the addresses of every other link.
func TestAddrListOfOneLink(t *testing.T) {
	e := newTestEnv(t)
	if e.b.handle.filtered == nil {
		t.Skip("this kernel has no NETLINK_GET_STRICT_CHK; AddrList falls back to the full dump")
	}
	links := make([]netlink.Link, 20)
	for i := range links {
		links[i] = &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("addrs%d", i), Flags: net.FlagUp}}
		e.addLink(t, links[i], "")
		for _, cidr := range []string{fmt.Sprintf("10.9.%d.1/24", i), fmt.Sprintf("fd00:9:%x::1/64", i)} {
			addr, err := netlink.ParseAddr(cidr)
			if err != nil {
				t.Fatal(err)
			}
			addr.Flags = unix.IFA_F_NODAD
			if err := e.hand.AddrAdd(links[i], addr); err != nil {
				t.Fatalf("add %s: %v", cidr, err)
			}
		}
	}
	// A point-to-point address, whose local and peer addresses differ.
	peer, err := netlink.ParseAddr("10.8.0.1/32")
	if err != nil {
		t.Fatal(err)
	}
	peer.Peer = &net.IPNet{IP: net.ParseIP("10.8.0.2").To4(), Mask: net.CIDRMask(30, 32)}
	if err := e.hand.AddrAdd(links[0], peer); err != nil {
		t.Fatalf("add peer address: %v", err)
	}

	// What the backend uses of an address.
	key := func(a netlink.Addr) string {
		return fmt.Sprintf("%s peer=%v link=%d scope=%d flags=%#x", a.IPNet, a.Peer, a.LinkIndex, a.Scope, a.Flags)
	}
	// The same handle without strict checking, as on an old kernel.
	fallback := &handle{Handle: e.b.handle.Handle}
	for _, tc := range []struct {
		h    *handle
		link netlink.Link
	}{{e.b.handle, links[0]}, {e.b.handle, links[7]}, {fallback, links[0]}, {fallback, links[7]}} {
		h, link := tc.h, tc.link
		// Both dumps retry an interrupted dump, as the backend's own calls
		// do (retryDump): the kernel may add an IPv6 link-local address
		// while a dump of the whole namespace runs.
		want, err := retryDump(func() ([]netlink.Addr, error) { return e.hand.AddrList(link, netlink.FAMILY_ALL) })
		if err != nil {
			t.Fatal(err)
		}
		got, err := retryDump(func() ([]netlink.Addr, error) { return h.AddrList(link, netlink.FAMILY_ALL) })
		if err != nil {
			t.Fatalf("AddrList(%s): %v", link.Attrs().Name, err)
		}
		wantKeys, gotKeys := make([]string, len(want)), make([]string, len(got))
		for i := range want {
			wantKeys[i] = key(want[i])
		}
		for i := range got {
			gotKeys[i] = key(got[i])
		}
		slices.Sort(wantKeys)
		slices.Sort(gotKeys)
		if !slices.Equal(gotKeys, wantKeys) {
			t.Errorf("AddrList(%s):\n got %q\nwant %q", link.Attrs().Name, gotKeys, wantKeys)
		}
	}
	if n := e.b.handle.foreign.Load(); n != 0 {
		t.Errorf("the kernel returned %d addresses of other links: the dump was not filtered by index", n)
	}

	// A link that is gone is an error with strict checking (the full dump
	// finds no address instead, and the AddrAdd that follows fails).
	gone := links[19]
	if err := e.hand.LinkDel(gone); err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.handle.AddrList(gone, netlink.FAMILY_ALL); err == nil {
		t.Errorf("AddrList of a deleted link succeeded")
	}
}

// TestNeighListOfOneLink checks that the backend's forwarding entries of
// one VXLAN device equal netlink's own, and that the kernel, not a filter
// in Go, left out every other device's.
func TestNeighListOfOneLink(t *testing.T) {
	e := newTestEnv(t)
	if e.b.handle.filtered == nil {
		t.Skip("this kernel has no NETLINK_GET_STRICT_CHK; NeighList falls back to the full dump")
	}
	zero := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	vxlans := make([]netlink.Link, 5)
	for i := range vxlans {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("fdbbr%d", i), Flags: net.FlagUp}}
		e.addLink(t, br, "")
		vxlans[i] = &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("fdbvx%d", i), MasterIndex: br.Index, Flags: net.FlagUp},
			VxlanId: 100 + i, Port: VXLANPort, Learning: true}
		e.addLink(t, vxlans[i], "")
		for p := range 3 {
			n := &netlink.Neigh{LinkIndex: vxlans[i].Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
				Flags: netlink.NTF_SELF, HardwareAddr: zero, IP: net.IPv4(192, 0, 2, byte(10*i+p))}
			if err := e.hand.NeighAppend(n); err != nil {
				t.Fatalf("add forwarding entry: %v", err)
			}
		}
	}
	key := func(n netlink.Neigh) string {
		return fmt.Sprintf("%s %s link=%d flags=%#x state=%#x", n.HardwareAddr, n.IP, n.LinkIndex, n.Flags, n.State)
	}
	keys := func(ns []netlink.Neigh) []string {
		out := make([]string, len(ns))
		for i := range ns {
			out[i] = key(ns[i])
		}
		slices.Sort(out)
		return out
	}
	dumps := e.b.handle.dumps.Load()
	for _, vx := range []netlink.Link{vxlans[0], vxlans[3]} {
		index := vx.Attrs().Index
		want, err := retryDump(func() ([]netlink.Neigh, error) { return e.hand.NeighList(index, unix.AF_BRIDGE) })
		if err != nil {
			t.Fatal(err)
		}
		got, err := retryDump(func() ([]netlink.Neigh, error) { return e.b.handle.NeighList(index, unix.AF_BRIDGE) })
		if err != nil {
			t.Fatalf("NeighList(%s): %v", vx.Attrs().Name, err)
		}
		if g, w := keys(got), keys(want); !slices.Equal(g, w) {
			t.Errorf("NeighList(%s):\n got %q\nwant %q", vx.Attrs().Name, g, w)
		}
		flooding := 0
		for _, n := range got {
			if n.HardwareAddr.String() == zero.String() {
				flooding++
			}
		}
		if flooding != 3 {
			t.Errorf("NeighList(%s) has %d flooding entries, want 3: %q", vx.Attrs().Name, flooding, keys(got))
		}
	}
	if n := e.b.handle.foreign.Load(); n != 0 {
		t.Errorf("the kernel returned %d forwarding entries of other links: the dump was not filtered by index", n)
	}
	if n := e.b.handle.dumps.Load() - dumps; n < 2 {
		t.Errorf("%d filtered dumps for 2 lists: the whole table was dumped and filtered in Go", n)
	}
}

func TestAlias(t *testing.T) {
	uid := types.UID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
	o := backend.Owner{Namespace: "default", Name: "net1", UID: uid}
	if got, want := Alias(o), "netop:default/net1/"+string(uid); got != want {
		t.Errorf("Alias = %q, want %q", got, want)
	}
	if got, ok := ParseAlias(Alias(o)); !ok || got != o {
		t.Errorf("ParseAlias(Alias(%v)) = %v, %v", o, got, ok)
	}

	long := backend.Owner{Namespace: strings.Repeat("n", 63), Name: strings.Repeat("x", 253), UID: uid}
	a := Alias(long)
	if len(a) != maxAliasLen {
		t.Errorf("long alias has %d bytes, want %d", len(a), maxAliasLen)
	}
	got, ok := ParseAlias(a)
	if !ok || got.UID != uid || got.Namespace != long.Namespace || !strings.HasPrefix(long.Name, got.Name) {
		t.Errorf("ParseAlias(%q) = %+v, %v", a, got, ok)
	}
	huge := backend.Owner{Namespace: strings.Repeat("n", 300), Name: "x", UID: uid}
	if got, ok := ParseAlias(Alias(huge)); len(Alias(huge)) > maxAliasLen || !ok || got.UID != uid {
		t.Errorf("alias of huge namespace: %q", Alias(huge))
	}

	for _, bad := range []string{
		"", "netop", "netop:", "netop:a/b", "netop:a/b/", "netop:a/b/xyz",
		"netop:a/b/0123", "other:a/b/" + string(uid), "NETOP:a/b/" + string(uid),
	} {
		if o, ok := ParseAlias(bad); ok {
			t.Errorf("ParseAlias(%q) = %+v, true", bad, o)
		}
	}
}

// BenchmarkEnsureCreate creates a bridge alone in its namespace, which
// programs the isolation table too, and beside another, which adds its
// element to the table's set: the common case.
func BenchmarkEnsureCreate(b *testing.B) {
	for _, beside := range []bool{false, true} {
		b.Run(fmt.Sprintf("beside-another=%v", beside), func(b *testing.B) {
			e := newTestEnv(b)
			ctx := testContext(b)
			if beside {
				if _, err := e.b.Ensure(ctx, network(b, "other", "10.1.0.0/16", "10.1.0.1"), nil); err != nil {
					b.Fatal(err)
				}
			}
			want := network(b, "bench", "10.0.0.0/16", "10.0.0.1")
			for b.Loop() {
				if _, err := e.b.Ensure(ctx, want, nil); err != nil {
					b.Fatal(err)
				}
				// Not measured: deleting a link waits for RCU grace periods
				// and would dominate. Without it every iteration would add
				// a bridge and slow down the next one's address dump.
				b.StopTimer()
				if err := e.b.Delete(ctx, want.Owner, nil); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkEnsureNoop checks an unchanged bridge, alone and among 2000
// others with addresses: the cost must not grow with the number of bridges.
func BenchmarkEnsureNoop(b *testing.B) {
	for _, others := range []int{0, 2000} {
		b.Run(fmt.Sprintf("others=%d", others), func(b *testing.B) {
			e := newTestEnv(b)
			ctx := testContext(b)
			for i := range others {
				other := network(b, fmt.Sprintf("other%d", i), fmt.Sprintf("10.%d.%d.0/24", 100+i/256, i%256), fmt.Sprintf("10.%d.%d.1", 100+i/256, i%256))
				if _, err := e.b.Ensure(ctx, other, nil); err != nil {
					b.Fatal(err)
				}
			}
			want := network(b, "bench", "10.0.0.0/16", "10.0.0.1")
			if _, err := e.b.Ensure(ctx, want, nil); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				res, err := e.b.Ensure(ctx, want, nil)
				if err != nil || res.Action != backend.ActionNone {
					b.Fatalf("Ensure = %v, %v", res.Action, err)
				}
			}
		})
	}
}

func BenchmarkEnsureUpdate(b *testing.B) {
	e := newTestEnv(b)
	ctx := testContext(b)
	want := network(b, "bench", "10.0.0.0/16", "10.0.0.1")
	gateways := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.1.1")}
	if _, err := e.b.Ensure(ctx, want, nil); err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		i++
		want.Families[0].Gateway = gateways[i%2]
		res, err := e.b.Ensure(ctx, want, nil)
		if err != nil || res.Action != backend.ActionUpdated {
			b.Fatalf("Ensure = %v, %v", res.Action, err)
		}
	}
}

// Example of the alias, for readers of the tests.
func ExampleAlias() {
	fmt.Println(Alias(backend.Owner{Namespace: "default", Name: "net1", UID: "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"}))
	// Output: netop:default/net1/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0
}

// A dual-stack network is one bridge with a gateway of each family: made,
// left alone when it matches, listed with both families, and converged when
// a family is added, removed or changed, or removed behind netop's back.
func TestDualStackBridge(t *testing.T) {
	e := newTestEnv(t)
	ctx := testContext(t)
	want := network(t, "dual", "10.61.0.0/24", "10.61.0.1")
	want = withFamily(want, 1, backend.Family{CIDR: netip.MustParsePrefix("fd00:61::/64"), Gateway: netip.MustParseAddr("fd00:61::1")})
	e.ensure(t, want, backend.ActionCreated)
	e.checkBridge(t, want)
	e.ensure(t, want, backend.ActionNone)
	listed := func() backend.Observed {
		t.Helper()
		got, err := e.b.ListOwned(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range got {
			if o.UID == want.UID {
				return o
			}
		}
		t.Fatal("the bridge is not listed")
		return backend.Observed{}
	}
	if o := listed(); !o.Provides(want) {
		t.Errorf("listed with %+v, want both families", o.Families)
	}

	// IPv6 first, as a v2 spec may put it, is the same network.
	swapped := want
	swapped.Families = []backend.Family{want.Families[1], want.Families[0]}
	e.ensure(t, swapped, backend.ActionNone)

	single := withFamily(want, 1, backend.Family{})
	e.ensure(t, single, backend.ActionUpdated)
	e.checkBridge(t, single)
	if o := listed(); !o.Provides(single) || o.Provides(want) {
		t.Errorf("after removing IPv6, listed with %+v", o.Families)
	}

	moved := withFamily(want, 1, backend.Family{CIDR: netip.MustParsePrefix("fd00:62::/64"), Gateway: netip.MustParseAddr("fd00:62::9")})
	e.ensure(t, moved, backend.ActionUpdated)
	e.checkBridge(t, moved)

	// The IPv6 gateway removed by hand: listed as differing, then repaired.
	link, err := e.hand.LinkByName(ifname.Bridge(want.UID))
	if err != nil {
		t.Fatal(err)
	}
	gw := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("fd00:62::9"), Mask: net.CIDRMask(64, 128)}}
	if err := e.hand.AddrDel(link, gw); err != nil {
		t.Fatal(err)
	}
	if o := listed(); o.Provides(moved) {
		t.Errorf("without its IPv6 gateway, listed with %+v, as if it matched", o.Families)
	}
	e.ensure(t, moved, backend.ActionUpdated)
	e.checkBridge(t, moved)

	sameFamily := withFamily(want, 1, backend.Family{CIDR: netip.MustParsePrefix("10.62.0.0/24"), Gateway: netip.MustParseAddr("10.62.0.1")})
	if _, err := e.b.Ensure(ctx, sameFamily, nil); err == nil || !strings.Contains(err.Error(), "one IPv4 and one IPv6") {
		t.Errorf("two IPv4 families: %v, want refused", err)
	}
}

// A Network's MTU is its bridge's and, across nodes, its VXLAN port's:
// derived from the underlay less VXLAN's overhead by default, its own if
// it fits, refused with the numbers if not; 1500 or its own on a node of
// its own. A bridge whose MTU was set keeps it when a port comes.
func TestMTU(t *testing.T) {
	e := newTestEnv(t)
	// No dummy links in this kernel: a veth's end is the underlay.
	underlay := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "underlay0", MTU: 1400}, PeerName: "underlay1"}
	if err := e.hand.LinkAdd(underlay); err != nil {
		t.Fatal(err)
	}
	local, _ := netlink.ParseAddr("192.0.2.10/24")
	if err := e.hand.AddrAdd(underlay, local); err != nil {
		t.Fatal(err)
	}
	if err := e.hand.LinkSetUp(underlay); err != nil {
		t.Fatal(err)
	}
	e.b.overlay = &Overlay{Local: netip.MustParseAddr("192.0.2.10")}
	mtus := func(n backend.Network) (bridge, vxlan int) {
		t.Helper()
		br, err := e.hand.LinkByName(ifname.Bridge(n.UID))
		if err != nil {
			t.Fatal(err)
		}
		bridge = br.Attrs().MTU
		if vx, err := e.hand.LinkByName(VXLANName(n.UID)); err == nil {
			vxlan = vx.Attrs().MTU
		}
		return bridge, vxlan
	}
	// Before its VNI comes, already the overlay's: pods attached then
	// keep theirs.
	spans := network(t, "spans", "10.94.0.0/24", "10.94.0.1")
	e.ensure(t, spans, backend.ActionCreated)
	if br, _ := mtus(spans); br != 1350 {
		t.Errorf("default on a node of an overlay, no VNI yet: bridge %d, want 1350 (1400 less 50)", br)
	}
	spans.VNI = 42
	e.ensure(t, spans, backend.ActionUpdated)
	if br, vx := mtus(spans); br != 1350 || vx != 1350 {
		t.Errorf("default across nodes: bridge %d, VXLAN %d; want 1350 (1400 less 50)", br, vx)
	}
	spans.MTU = 1300
	e.ensure(t, spans, backend.ActionUpdated)
	if br, vx := mtus(spans); br != 1300 || vx != 1300 {
		t.Errorf("spec.mtu 1300: bridge %d, VXLAN %d", br, vx)
	}
	spans.MTU = 1400
	_, err := e.b.Ensure(testContext(t), spans, nil)
	if !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "spec.mtu 1400 does not fit this node's underlay: its interface has MTU 1400 and VXLAN adds 50 bytes, so at most 1350") {
		t.Errorf("spec.mtu too large for the underlay: %v", err)
	}

	e.b.overlay = nil
	alone := network(t, "alone", "10.95.0.0/24", "10.95.0.1")
	e.ensure(t, alone, backend.ActionCreated)
	if br, _ := mtus(alone); br != 1500 {
		t.Errorf("a node of its own, default: bridge %d, want 1500", br)
	}
	alone.MTU = 9000
	e.ensure(t, alone, backend.ActionUpdated)
	port := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "port0", MTU: 1500}, PeerName: "port1"}
	if err := e.hand.LinkAdd(port); err != nil {
		t.Fatal(err)
	}
	br, _ := e.hand.LinkByName(ifname.Bridge(alone.UID))
	if err := e.hand.LinkSetMaster(port, br); err != nil {
		t.Fatal(err)
	}
	if br, _ := mtus(alone); br != 9000 {
		t.Errorf("spec.mtu 9000 with a port of 1500: bridge %d", br)
	}
}

// A node keeps a Network's bridge while something is attached to
// it. InUse is false for a bridge that is missing or has no port but its
// VXLAN device, and true once a pod's host end is a port.
func TestInUse(t *testing.T) {
	e := newTestEnv(t)
	ctx := t.Context()
	want := network(t, "used", "10.93.0.0/24", "10.93.0.1")
	if inUse, err := e.b.InUse(ctx, want.Owner); err != nil || inUse {
		t.Errorf("no bridge: in use %v, %v", inUse, err)
	}
	e.ensure(t, want, backend.ActionCreated)
	bridge, err := e.hand.LinkByName(ifname.Bridge(want.UID))
	if err != nil {
		t.Fatal(err)
	}
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: VXLANName(want.UID), MasterIndex: bridge.Attrs().Index}, VxlanId: 93, Port: VXLANPort}
	if err := e.hand.LinkAdd(vx); err != nil {
		t.Fatal(err)
	}
	if inUse, err := e.b.InUse(ctx, want.Owner); err != nil || inUse {
		t.Errorf("a bridge with its VXLAN port alone: in use %v, %v", inUse, err)
	}
	e.attach(t, want, "10.93.0.2/24")
	if inUse, err := e.b.InUse(ctx, want.Owner); err != nil || !inUse {
		t.Errorf("a bridge with a pod's port: in use %v, %v", inUse, err)
	}
}
