package linux

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/netpolicy/resolved"
	"github.com/netop-dev/netop/internal/testing/nettest"
)

// serve listens in p's namespace on TCP and UDP port (UDP echoes), over
// IPv4 and IPv6 apart: Go decides once per process whether "tcp" means
// both, and decides no if it first probes in a namespace whose loopback
// is down.
func (p pod) serve(t *testing.T, port int) {
	t.Helper()
	ns, err := netns.GetFromName(p.netns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ns.Close() }()
	for _, v := range []string{"4", "6"} {
		var l net.Listener
		var u net.PacketConn
		if err := InNetns(ns, func() (err error) {
			if l, err = net.Listen("tcp"+v, ":"+strconv.Itoa(port)); err != nil {
				return err
			}
			u, err = net.ListenPacket("udp"+v, ":"+strconv.Itoa(port))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(); _ = u.Close() })
		go nettest.AcceptAndClose(l)
		go nettest.EchoDatagrams(u)
	}
}

// udp reports whether p gets an answer from addr:port over UDP.
func (p pod) udp(t *testing.T, addr string, port int) bool {
	t.Helper()
	ns, err := netns.GetFromName(p.netns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ns.Close() }()
	var conn net.Conn
	if err := InNetns(ns, func() (err error) {
		conn, err = net.Dial("udp", net.JoinHostPort(addr, strconv.Itoa(port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := conn.Write([]byte("x")); err != nil {
		return false
	}
	_, err = conn.Read(make([]byte, 8))
	return err == nil
}

func ep(bridge, addr string) resolved.Endpoint {
	return resolved.Endpoint{Bridge: bridge, Addr: netip.MustParseAddr(addr)}
}

// Policies on real packets: a policy isolates the pods it selects in its
// directions and allows what its rules do (peers by address set, by block
// with excepts; ports by number, range, name; TCP and UDP); replies pass;
// pods it does not select are unaffected. A change of pods only writes
// elements; a flushed table comes back; no policy leaves no table.
func TestFirewall(t *testing.T) {
	e := newTestEnv(t)
	if err := WriteSysctl(e.b.ns, "/proc/sys/net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	n := network(t, "a", "10.93.0.0/24", "10.93.0.1")
	e.ensure(t, n, backend.ActionCreated)
	br := ifname.Bridge(n.UID)
	p1, p2, p3 := e.attach(t, n, "10.93.0.2/24"), e.attach(t, n, "10.93.0.3/24"), e.attach(t, n, "10.93.0.4/24")
	for _, p := range []pod{p1, p2, p3} {
		p.serve(t, 80)
		p.serve(t, 81)
	}
	fw := e.b.Firewall()
	apply := func(p resolved.Policies) FirewallStats {
		t.Helper()
		stats, err := fw.Apply(p)
		if err != nil {
			t.Fatal(err)
		}
		return stats
	}
	type probe struct {
		from pod
		to   string
		port int
		udp  bool
		want bool
	}
	check := func(when string, probes ...probe) {
		t.Helper()
		for _, c := range probes {
			reaches := func() bool {
				if c.udp {
					return c.from.udp(t, c.to, c.port)
				}
				return c.from.connects(t, c.to, c.port)
			}
			if got := probeExpecting(c.want, reaches); got != c.want {
				proto := "tcp"
				if c.udp {
					proto = "udp"
				}
				t.Errorf("%s: %s to %s:%d/%s: %v, want %v", when, c.from.addr, c.to, c.port, proto, got, c.want)
			}
		}
	}
	const a1, a2, a3 = "10.93.0.2", "10.93.0.3", "10.93.0.4"
	check("no policy", probe{p1, a2, 80, false, true}, probe{p3, a2, 81, true, true})

	// p2 receives TCP 80 from p1 only.
	onlyP1 := resolved.Policies{{Name: "ns/db", Ingress: &resolved.PolicyDirection{Selected: []resolved.Endpoint{ep(br, a2)},
		Rules: []resolved.PolicyRule{{PodPeers: true, Pods: []resolved.Endpoint{ep(br, a1)}, Ports: []resolved.PortRange{{Protocol: unix.IPPROTO_TCP, First: 80, Last: 80}}}}}}}
	// An administrator turned br_netfilter's IPv4 hook off in the
	// namespace: the firewall turns it back on, else nothing below holds.
	if err := WriteSysctl(e.b.ns, bridgedTrafficSysctls[0], "0"); err != nil {
		t.Fatal(err)
	}
	if s := apply(onlyP1); !s.Replaced {
		t.Errorf("the first policies: %+v, want the table written", s)
	}
	check("ingress from p1 on TCP 80",
		probe{p1, a2, 80, false, true}, probe{p1, a2, 81, false, false}, probe{p1, a2, 80, true, false},
		probe{p3, a2, 80, false, false}, probe{p2, a1, 80, false, true}, probe{p3, a1, 81, false, true})

	// p3 becomes a peer: elements only.
	onlyP1[0].Ingress.Rules[0].Pods = append(onlyP1[0].Ingress.Rules[0].Pods, ep(br, a3))
	if s := apply(onlyP1); s.Replaced || s.Changed != 1 {
		t.Errorf("a pod more: %+v, want one element added", s)
	}
	check("p3 a peer too", probe{p3, a2, 80, false, true}, probe{p3, a2, 81, false, false})

	// A block with an except, every port of UDP, a range of TCP; and a
	// second policy on p2 whose union with it allows named port 81.
	both := resolved.Policies{
		{Name: "ns/block", Ingress: &resolved.PolicyDirection{Selected: []resolved.Endpoint{ep(br, a2)},
			Rules: []resolved.PolicyRule{{Blocks: []resolved.Block{{CIDR: netip.MustParsePrefix("10.93.0.0/24"), Except: []netip.Prefix{netip.MustParsePrefix("10.93.0.4/32")}}},
				Ports: []resolved.PortRange{{Protocol: unix.IPPROTO_UDP}, {Protocol: unix.IPPROTO_TCP, First: 79, Last: 80}}}}}},
		{Name: "ns/named", Ingress: &resolved.PolicyDirection{Selected: []resolved.Endpoint{ep(br, a2)},
			Rules: []resolved.PolicyRule{{AnyPeer: true, NamedPorts: true, Named: []resolved.PortEndpoint{{Endpoint: ep(br, a2), Protocol: unix.IPPROTO_TCP, Port: 81}}}}}},
	}
	if s := apply(both); !s.Replaced {
		t.Errorf("new policies: %+v, want the table written", s)
	}
	check("a block but p3, and a named port for all",
		probe{p1, a2, 80, false, true}, probe{p1, a2, 81, true, true}, probe{p3, a2, 80, false, false}, probe{p3, a2, 80, true, false},
		probe{p3, a2, 81, false, true}, probe{p1, a2, 81, false, true})

	// Egress: p1 sends only UDP to p3; its TCP to p2 is refused, p2's
	// replies to p1's allowed UDP pass.
	egress := resolved.Policies{{Name: "ns/out", Egress: &resolved.PolicyDirection{Selected: []resolved.Endpoint{ep(br, a1)},
		Rules: []resolved.PolicyRule{{PodPeers: true, Pods: []resolved.Endpoint{ep(br, a3)}, Ports: []resolved.PortRange{{Protocol: unix.IPPROTO_UDP, First: 80, Last: 81}}}}}}}
	apply(egress)
	check("egress of p1 to p3's UDP",
		probe{p1, a3, 80, true, true}, probe{p1, a3, 81, true, true}, probe{p1, a3, 80, false, false}, probe{p1, a2, 80, true, false},
		probe{p2, a1, 80, false, true})
	if p1.pings(t, a2) {
		t.Error("p1, isolated in egress, pings p2")
	}
	if !p1.pings(t, "10.93.0.1") {
		t.Error("p1, isolated in egress, does not ping its gateway")
	}

	// Tampered with: the watch or a repair puts it back.
	startFirewallWatch(t, fw)
	// Its subscription starts asynchronously: deleted until it repairs,
	// then flushed.
	c, err := fw.conn()
	if err != nil {
		t.Fatal(err)
	}
	inOrder := func() bool {
		fw.mu.Lock()
		defer fw.mu.Unlock()
		ok, err := fw.inOrder(c)
		return ok && err == nil
	}
	tamperUntilRepaired(t, fw.conn, "deleted", func(c *nftables.Conn) { c.AddTable(policyTable); c.DelTable(policyTable) }, inOrder)
	tamperUntilRepaired(t, fw.conn, "flushed", func(c *nftables.Conn) { c.FlushTable(policyTable) }, inOrder)
	check("repaired", probe{p1, a3, 80, false, false}, probe{p1, a3, 80, true, true})
	if err := c.SetDeleteElements(&nftables.Set{Table: policyTable, Name: "p0-eg4-r0-peers", KeyType: concat(nftables.TypeIFName, nftables.TypeIPAddr), Concatenation: true},
		[]nftables.SetElement{{Key: endpointKey(ep(br, a3))}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if repaired, err := fw.Repair(); err != nil || !repaired {
		t.Errorf("an element removed behind its back: repaired %v (%v)", repaired, err)
	}
	check("element repaired", probe{p1, a3, 80, true, true})

	apply(nil)
	if _, err := c.ListTableOfFamily(PolicyTable, nftables.TableFamilyINet); !errors.Is(err, unix.ENOENT) {
		t.Errorf("no policy left the table (%v)", err)
	}
	check("no policy", probe{p1, a2, 80, false, true}, probe{p3, a2, 81, true, true})
}

// IPv6: the same sets and rules by family. A pod isolated in egress still
// answers neighbour solicitations (ICMPv6 133–137 are never filtered), so
// connections to it work; ingress by peer and port as in IPv4.
func TestFirewallIPv6(t *testing.T) {
	e := newTestEnv(t)
	if err := WriteSysctl(e.b.ns, "/proc/sys/net/ipv6/conf/all/forwarding", "1"); err != nil {
		t.Fatal(err)
	}
	n := network(t, "v6", "fd00:93::/64", "fd00:93::1")
	e.ensure(t, n, backend.ActionCreated)
	br := ifname.Bridge(n.UID)
	const a1, a2, a3 = "fd00:93::2", "fd00:93::3", "fd00:93::4"
	p1, p2, p3 := e.attach(t, n, a1+"/64"), e.attach(t, n, a2+"/64"), e.attach(t, n, a3+"/64")
	for _, p := range []pod{p1, p2, p3} {
		p.serve(t, 80)
		p.serve(t, 81)
	}
	fw := e.b.Firewall()
	apply := func(p resolved.Policies) {
		t.Helper()
		if _, err := fw.Apply(p); err != nil {
			t.Fatal(err)
		}
	}
	// Before any packet between them: p2's neighbour advertisements to p1
	// cross the table with p2 isolated in egress.
	noEgress := &resolved.PolicyDirection{Selected: []resolved.Endpoint{ep(br, a2)}}
	apply(resolved.Policies{{Name: "ns/quiet", Egress: noEgress}})
	if !probeExpecting(true, func() bool { return p1.connects(t, a2, 80) }) {
		t.Error("p1 does not connect to p2, isolated in egress only")
	}
	if p2.connects(t, a1, 80) || p2.udp(t, a3, 81) {
		t.Error("p2, isolated in egress, opens a connection")
	}
	apply(resolved.Policies{{Name: "ns/db", Ingress: &resolved.PolicyDirection{Selected: []resolved.Endpoint{ep(br, a2)},
		Rules: []resolved.PolicyRule{{PodPeers: true, Pods: []resolved.Endpoint{ep(br, a1)}, Ports: []resolved.PortRange{{Protocol: unix.IPPROTO_TCP, First: 80, Last: 80}}}}}}})
	for _, c := range []struct {
		from pod
		to   string
		port int
		want bool
	}{{p1, a2, 80, true}, {p1, a2, 81, false}, {p3, a2, 80, false}, {p3, a1, 81, true}, {p2, a3, 80, true}} {
		if got := probeExpecting(c.want, func() bool { return c.from.connects(t, c.to, c.port) }); got != c.want {
			t.Errorf("p2 receiving TCP 80 from p1: %s to [%s]:%d: %v, want %v", c.from.addr, c.to, c.port, got, c.want)
		}
	}
	if p1.udp(t, a2, 80) {
		t.Error("p1 reaches p2 over UDP")
	}
}

func startFirewallWatch(t *testing.T, fw *Firewall) {
	ctx, cancel := context.WithCancel(testContext(t))
	done := make(chan error, 1)
	go func() { done <- fw.Watch(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// The policy table's rules grow with the policies, its elements with the
// pods: 100 policies over 1000 pod addresses, each selecting 10 pods and
// allowing 50 peers. Reports the time to write the table whole and to add
// one pod.
func BenchmarkFirewall(b *testing.B) {
	ns := benchNetns(b)
	addr := func(i int) resolved.Endpoint {
		return resolved.Endpoint{Bridge: "netop" + strconv.Itoa(i%10), Addr: netip.AddrFrom4([4]byte{10, 0, byte(i / 250), byte(1 + i%250)})}
	}
	policies := func(pods int) resolved.Policies {
		var p resolved.Policies
		for i := range 100 {
			d := &resolved.PolicyDirection{}
			for j := range 10 {
				d.Selected = append(d.Selected, addr((i*10+j)%pods))
			}
			r := resolved.PolicyRule{PodPeers: true, Ports: []resolved.PortRange{{Protocol: unix.IPPROTO_TCP, First: 80, Last: 80}}}
			for j := range 50 {
				r.Pods = append(r.Pods, addr((i*7+j*13)%pods))
			}
			d.Rules = []resolved.PolicyRule{r, {Blocks: []resolved.Block{{CIDR: netip.MustParsePrefix("10.0.0.0/16")}}}}
			p = append(p, resolved.Policy{Name: fmt.Sprintf("ns/p%d", i), Ingress: d})
		}
		return p
	}
	b.Run("replace", func(b *testing.B) {
		fw := &Firewall{ns: ns}
		var stats FirewallStats
		var err error
		for b.Loop() {
			fw.applied = nil
			if stats, err = fw.Apply(policies(1000)); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(stats.Rules), "rules")
		b.ReportMetric(float64(stats.Elements), "elements")
	})
	b.Run("a-pod-more", func(b *testing.B) {
		fw := &Firewall{ns: ns}
		p := policies(1000)
		if _, err := fw.Apply(p); err != nil {
			b.Fatal(err)
		}
		rule := &p[0].Ingress.Rules[0]
		base := rule.Pods
		i := 0
		for b.Loop() {
			i++
			rule.Pods = append(base[:len(base):len(base)], addr(2000+i%2))
			if _, err := fw.Apply(p); err != nil {
				b.Fatal(err)
			}
		}
	})
}
