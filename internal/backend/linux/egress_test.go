package linux

import (
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/testing/nettest"
)

// Egress on real packets: a pod routed to an outside network
// through its gateway reaches it only while its Network has egress, as
// the node's address (the outside has no route back to the Network);
// egress opens no way to the node's own services nor into another
// Network.
func TestEgress(t *testing.T) {
	e := newTestEnv(t)
	if err := WriteSysctl(e.b.ns, "/proc/sys/net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	// The outside: a namespace behind a veth, 192.0.2.2, the node 192.0.2.1.
	outsideName := nettest.NetnsName("netop-o-")
	if err := EnsureNetns(outsideName); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nettest.DeleteNetns(outsideName) })
	outsideNS, err := netns.GetFromName(outsideName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = outsideNS.Close() })
	uplink := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(outsideNS)}
	if err := e.hand.LinkAdd(uplink); err != nil {
		t.Fatal(err)
	}
	outside := nettest.Handle(t, outsideName)
	for h, spec := range map[*netlink.Handle][2]string{e.hand: {"uplink0", "192.0.2.1/24"}, outside: {"eth0", "192.0.2.2/24"}} {
		link, err := h.LinkByName(spec[0])
		if err != nil {
			t.Fatal(err)
		}
		addr, _ := netlink.ParseAddr(spec[1])
		if err := h.AddrAdd(link, addr); err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(link); err != nil {
			t.Fatal(err)
		}
	}
	var seen net.Addr
	var l net.Listener
	if err := InNetns(outsideNS, func() (err error) {
		l, err = net.Listen("tcp4", "192.0.2.2:80")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	accepted := make(chan net.Addr, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c.RemoteAddr()
			_ = c.Close()
		}
	}()

	n := network(t, "out", "10.96.0.0/24", "10.96.0.1")
	e.ensure(t, n, backend.ActionCreated)
	other := network(t, "other", "10.97.0.0/24", "10.97.0.1")
	e.ensure(t, other, backend.ActionCreated)
	p := e.attach(t, n, "10.96.0.2/24")
	q := e.attach(t, other, "10.97.0.2/24")
	q.serve(t, 80)
	pod := nettest.Handle(t, p.netns)
	net1, err := pod.LinkByName("net1")
	if err != nil {
		t.Fatal(err)
	}
	// As spec.routes gives it.
	if err := pod.RouteAdd(&netlink.Route{LinkIndex: net1.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4(192, 0, 2, 0), Mask: net.CIDRMask(24, 32)},
		Gw: net.IPv4(10, 96, 0, 1)}); err != nil {
		t.Fatal(err)
	}
	service := e.listen(t)

	if p.connects(t, "192.0.2.2", 80) {
		t.Error("without egress, the pod reaches the outside")
	}
	n.Egress = true
	e.ensure(t, n, backend.ActionUpdated)
	if !p.connects(t, "192.0.2.2", 80) {
		t.Fatal("with egress, the pod does not reach the outside")
	}
	// The outside's accept of that connection, perhaps an instant later.
	select {
	case seen = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("the outside accepted no connection")
	}
	if host, _, _ := net.SplitHostPort(seen.String()); host != "192.0.2.1" {
		t.Errorf("the outside saw the pod as %s, want the node's 192.0.2.1", seen)
	}
	if p.connects(t, "192.0.2.1", service) || p.connects(t, "10.96.0.1", service) {
		t.Error("with egress, the pod reaches a service of the node")
	}
	if p.connects(t, "10.97.0.2", 80) {
		t.Error("with egress, the pod reaches another Network")
	}
	n.Egress = false
	e.ensure(t, n, backend.ActionUpdated)
	if p.connects(t, "192.0.2.2", 80) {
		t.Error("egress turned off, the pod still reaches the outside")
	}
}
