package cni

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/testing/nettest"
)

// namespace makes a throwaway named network namespace and a netlink
// handle in it.
func namespace(t *testing.T, prefix string) (path string, h *netlink.Handle, ns netns.NsHandle) {
	t.Helper()
	name := nettest.NetnsName(prefix)
	if err := linux.EnsureNetns(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nettest.DeleteNetns(name) })
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	h, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return filepath.Join("/run/netns", name), h, ns
}

// nodeWithBridge makes a throwaway node namespace with the bridge
// "br-test" up (MTU mtu, the kernel's if 0), and an attacher in it.
func nodeWithBridge(t *testing.T, mtu int) (*netlink.Handle, *Attacher) {
	t.Helper()
	_, node, a := namedNodeWithBridge(t, mtu)
	return node, a
}

// namedNodeWithBridge is nodeWithBridge, with the namespace's name.
func namedNodeWithBridge(t *testing.T, mtu int) (string, *netlink.Handle, *Attacher) {
	t.Helper()
	nodePath, node, nodeNS := namespace(t, "netop-cn-")
	if err := node.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br-test", MTU: mtu, Flags: net.FlagUp}}); err != nil {
		t.Fatal(err)
	}
	a, err := NewAttacher(nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return filepath.Base(nodePath), node, a
}

// A pod joins a Network: its net1 has the address (and so the cidr's
// route), is up, and its other end is a port of the bridge; CHECK agrees;
// DEL removes both ends, again and again; ADD again after a crash
// replaces what was left.
func TestAddCheckDel(t *testing.T) {
	nettest.RequireRoot(t)
	node, a := nodeWithBridge(t, 1400)
	podPath, pod, _ := namespace(t, "netop-cp-")
	mac, _ := net.ParseMAC("02:00:00:00:00:42")
	at := Attachment{ContainerID: "c0ffee", Netns: podPath, Interface: "net1", Bridge: "br-test",
		Addresses: []netip.Prefix{netip.MustParsePrefix("192.168.0.2/16"), netip.MustParsePrefix("fd00::2/64")}, MAC: mac}
	got, err := a.Add(t.Context(), at)
	if err != nil {
		t.Fatal(err)
	}
	if got.MAC.String() != mac.String() || got.HostVeth != ifname.HostVeth("c0ffee", "net1") {
		t.Errorf("attached %+v", got)
	}
	link, err := pod.LinkByName("net1")
	if err != nil {
		t.Fatal(err)
	}
	if link.Attrs().MTU != 1400 || link.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("net1: MTU %d, flags %v", link.Attrs().MTU, link.Attrs().Flags)
	}
	routes, err := pod.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(routes) != 1 || routes[0].Dst.String() != "192.168.0.0/16" {
		t.Errorf("routes of net1: %v, want the cidr's", routes)
	}
	host, err := node.LinkByName(got.HostVeth)
	if err != nil {
		t.Fatal(err)
	}
	bridge, _ := node.LinkByName("br-test")
	if host.Attrs().MasterIndex != bridge.Attrs().Index {
		t.Error("the host end is not a port of the bridge")
	}
	if host.Attrs().Flags&net.FlagUp == 0 || host.Attrs().MTU != 1400 {
		t.Errorf("the host end: MTU %d, flags %v; want the bridge's MTU, up", host.Attrs().MTU, host.Attrs().Flags)
	}
	if err := a.Check(at); err != nil {
		t.Errorf("CHECK after ADD: %v", err)
	}
	if _, err := a.Add(t.Context(), at); err == nil {
		t.Error("a second ADD of net1 into the same pod succeeded")
	}
	// CHECK tells what is not as attached (mended by making it again) from
	// what it cannot tell now.
	if err := a.Check(Attachment{ContainerID: at.ContainerID, Netns: at.Netns, Interface: at.Interface, Bridge: "no-such-bridge"}); err == nil || errors.Is(err, ErrNotAsAttached) {
		t.Errorf("CHECK with its bridge not there: %v, want an error that is not ErrNotAsAttached", err)
	}
	if err := pod.LinkSetDown(link); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(at); !errors.Is(err, ErrNotAsAttached) || !strings.Contains(err.Error(), "interface net1: down") {
		t.Errorf("CHECK of net1 set down: %v, want ErrNotAsAttached saying so", err)
	}
	if err := pod.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}

	if err := a.Del("c0ffee", "net1"); err != nil {
		t.Fatal(err)
	}
	if _, err := pod.LinkByName("net1"); err == nil {
		t.Error("net1 still in the pod after DEL")
	}
	if _, err := node.LinkByName(got.HostVeth); err == nil {
		t.Error("the host end still there after DEL")
	}
	if err := a.Check(at); err == nil {
		t.Error("CHECK passed after DEL")
	}
	for range 2 {
		if err := a.Del("c0ffee", "net1"); err != nil {
			t.Errorf("repeated DEL: %v", err)
		}
	}

	// A host end left by a crashed ADD (its pod end in another, dead
	// namespace) is replaced.
	_, _, otherNS := namespace(t, "netop-co-")
	if err := node.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: got.HostVeth}, PeerName: "net1", PeerNamespace: netlink.NsFd(otherNS)}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Add(t.Context(), at); err != nil {
		t.Fatalf("ADD over a leftover: %v", err)
	}
	veths, err := a.HostVeths()
	if err != nil || len(veths) != 1 {
		t.Fatalf("host ends %v (%v), want one", veths, err)
	}

	// The host end listed is deleted, not one of the same name made since
	// (the same container's interface made again).
	if err := a.Del("c0ffee", "net1"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Add(t.Context(), at); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteHostVeth(veths[0]); err != nil {
		t.Fatalf("deleting a listed host end that is gone: %v", err)
	}
	if _, err := node.LinkByName(got.HostVeth); err != nil {
		t.Errorf("the host end made after the listing was deleted: %v", err)
	}
}

// A bridge that does not exist, an address that cannot be added: an
// error, and nothing left behind.
func TestAddFailsCleanly(t *testing.T) {
	nettest.RequireRoot(t)
	_, node, nodeNS := namespace(t, "netop-cn-")
	podPath, pod, _ := namespace(t, "netop-cp-")
	a, err := NewAttacher(nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	at := Attachment{ContainerID: "c1", Netns: podPath, Interface: "net1", Bridge: "no-such-bridge"}
	short, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := a.Add(short, at); err == nil || !strings.Contains(err.Error(), "no-such-bridge") {
		t.Fatalf("ADD to a missing bridge: %v, want an error naming the bridge", err)
	}
	if err := node.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br-test", Flags: net.FlagUp}}); err != nil {
		t.Fatal(err)
	}
	at.Bridge = "br-test"
	at.Addresses = []netip.Prefix{netip.MustParsePrefix("192.168.0.2/16"), netip.MustParsePrefix("192.168.0.2/16")}
	if _, err := a.Add(t.Context(), at); err == nil {
		t.Fatal("ADD with the same address twice succeeded")
	}
	if _, err := pod.LinkByName("net1"); err == nil {
		t.Error("a failed ADD left net1 in the pod")
	}
	if veths, _ := a.HostVeths(); len(veths) != 0 {
		t.Errorf("a failed ADD left %v", veths)
	}
}

// An attachment's routes go on its interface, one per family, through
// their gateways; CHECK finds one that went missing.
func TestAddRoutes(t *testing.T) {
	nettest.RequireRoot(t)
	_, a := nodeWithBridge(t, 0)
	podPath, pod, _ := namespace(t, "netop-cp-")
	at := Attachment{ContainerID: "r0ute", Netns: podPath, Interface: "net1", Bridge: "br-test",
		Addresses: []netip.Prefix{netip.MustParsePrefix("10.0.0.2/24"), netip.MustParsePrefix("fd00::2/64")},
		Routes: []Route{{Dst: netip.MustParsePrefix("10.200.0.0/16"), GW: netip.MustParseAddr("10.0.0.1")},
			{Dst: netip.MustParsePrefix("fd00:200::/48"), GW: netip.MustParseAddr("fd00::fe")}}}
	if _, err := a.Add(t.Context(), at); err != nil {
		t.Fatal(err)
	}
	link, err := pod.LinkByName("net1")
	if err != nil {
		t.Fatal(err)
	}
	routes, err := pod.RouteList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range at.Routes {
		if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
			return r.Dst != nil && r.Dst.String() == want.Dst.String() && r.Gw.String() == want.GW.String()
		}) {
			t.Errorf("no route to %s via %s on net1: %v", want.Dst, want.GW, routes)
		}
	}
	if err := a.Check(at); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := pod.RouteDel(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: IPNet(at.Routes[0].Dst), Gw: at.Routes[0].GW.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(at); err == nil || !strings.Contains(err.Error(), "no route to 10.200.0.0/16 via 10.0.0.1") {
		t.Errorf("CHECK without the route: %v", err)
	}
}

// A pod's Network may be realised on its node only once the pod
// is there. waitBridge returns once the bridge is up, not before (a bridge
// made down, as the backend makes them, is not yet whole), told by the
// kernel's notifications; it gives up, naming the bridge, when its context
// is done; and returns at once for a bridge already up. The attacher's
// namespace outlives the handle it was made from.
func TestWaitBridge(t *testing.T) {
	nettest.RequireRoot(t)
	_, node, nodeNS := namespace(t, "netop-cn-")
	a, err := NewAttacher(nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	short, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := a.waitBridge(short, "br-late"); err == nil || !strings.Contains(err.Error(), "br-late") || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiting for a bridge that never comes: %v", err)
	}

	waited := make(chan error, 1)
	go func() { _, err := a.waitBridge(t.Context(), "br-late"); waited <- err }()
	if err := node.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br-late"}}); err != nil {
		t.Fatal(err)
	}
	link, err := node.LinkByName("br-late")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		t.Fatalf("returned for a bridge that is down: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := node.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not told that the bridge came up")
	}
	if _, err := a.waitBridge(short, "br-late"); err != nil {
		t.Errorf("a bridge already up: %v", err)
	}
}

// Bridge ports and the interfaces of Networks without IPv6 get no IPv6
// link-local address: it would only be chatter that the bridge floods to
// every port. An interface with IPv6 addresses keeps its own.
func TestAddLinkLocal(t *testing.T) {
	nettest.RequireRoot(t)
	nodeName, _, a := namedNodeWithBridge(t, 0)
	linkLocal := func(h *netlink.Handle, name string) bool {
		t.Helper()
		link, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		addrs, err := h.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IP.IsLinkLocalUnicast() })
	}
	for _, tc := range []struct {
		name      string
		addresses []string
		podLL     bool
	}{
		{"v4", []string{"10.0.0.2/24"}, false},
		{"dual", []string{"10.0.0.3/24", "fd00::3/64"}, true},
	} {
		podPath, pod, _ := namespace(t, "netop-cp-")
		at := Attachment{ContainerID: "ll-" + tc.name, Netns: podPath, Interface: "net1", Bridge: "br-test"}
		for _, p := range tc.addresses {
			at.Addresses = append(at.Addresses, netip.MustParsePrefix(p))
		}
		got, err := a.Add(t.Context(), at)
		if err != nil {
			t.Fatal(err)
		}
		// The mode, not the absence of an address: the kernel makes the
		// address later, from a work queue, once the carrier is up.
		if mode := nettest.AddrGenMode(t, nodeName, got.HostVeth); mode != "none" {
			t.Errorf("%s: the host end %s has addrgenmode %s, want none", tc.name, got.HostVeth, mode)
		}
		podMode := nettest.AddrGenMode(t, filepath.Base(podPath), "net1")
		if (podMode == "none") == tc.podLL {
			t.Errorf("%s: the pod's net1 has addrgenmode %s; want a link-local address: %v", tc.name, podMode, tc.podLL)
		}
		if tc.podLL {
			deadline := time.Now().Add(10 * time.Second)
			for !linkLocal(pod, "net1") {
				if time.Now().After(deadline) {
					t.Fatalf("%s: the pod's net1 has no IPv6 link-local address after 10s", tc.name)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		if err := a.Check(at); err != nil {
			t.Errorf("%s: CHECK: %v", tc.name, err)
		}
	}
}
