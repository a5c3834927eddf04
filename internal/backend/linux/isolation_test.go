package linux

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/testing/nettest"
)

// pod is a network namespace standing for a pod, its interface on a
// bridge of the backend.
type pod struct{ netns, addr string }

// attach makes a pod on the bridge of n with address addr (CIDR form) and
// its default route via the gateway, as the CNI plugin does.
func (e *testEnv) attach(t *testing.T, n backend.Network, addr string) pod {
	t.Helper()
	p := pod{netns: nettest.NetnsName("netop-p-"), addr: addr}
	if err := EnsureNetns(p.netns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nettest.DeleteNetns(p.netns) })
	podNs, err := netns.GetFromName(p.netns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = podNs.Close() }()
	bridge, err := e.hand.LinkByName(ifname.Bridge(n.UID))
	if err != nil {
		t.Fatal(err)
	}
	host := "vh" + randomHex(t, 4)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host, MasterIndex: bridge.Attrs().Index}, PeerName: "net1", PeerNamespace: netlink.NsFd(podNs)}
	if err := e.hand.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	if err := e.hand.LinkSetUp(veth); err != nil {
		t.Fatal(err)
	}
	h := nettest.Handle(t, p.netns)
	link, err := h.LinkByName("net1")
	if err != nil {
		t.Fatal(err)
	}
	a, err := netlink.ParseAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	if a.IP.To4() == nil {
		// Usable at once, as the CNI plugin's are.
		a.Flags |= unix.IFA_F_NODAD
	}
	if err := h.AddrAdd(link, a); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	gw := n.Families[0].Gateway.AsSlice()
	if err := h.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: net.IP(gw)}); err != nil {
		t.Fatal(err)
	}
	return p
}

// pings reports whether p gets an echo reply from addr.
func (p pod) pings(t *testing.T, addr string) bool {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", p.netns, "busybox", "ping", "-c", "1", "-W", "1", addr).CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("ping: %v\n%s", err, out)
	}
	return err == nil
}

// connects reports whether p opens a TCP connection to addr:port.
func (p pod) connects(t *testing.T, addr string, port int) bool {
	t.Helper()
	ns, err := netns.GetFromName(p.netns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ns.Close() }()
	var conn net.Conn
	err = InNetns(ns, func() (err error) {
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(addr, strconv.Itoa(port)), time.Second)
		return err
	})
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// probeExpecting asks probe as its expected outcome wants: a probe that
// should succeed is retried until it does or 5 s pass (on a loaded machine
// a first packet can wait on neighbour discovery longer than one probe's
// deadline); a probe that should fail is asked once.
func probeExpecting(want bool, probe func() bool) bool {
	if !want {
		return probe()
	}
	ok := false
	_ = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		ok = probe()
		return ok, nil
	})
	return ok
}

// listen opens a TCP listener on every address of the backend's namespace,
// as a service of the node would (the kubelet's 10250).
func (e *testEnv) listen(t *testing.T) int {
	t.Helper()
	var l net.Listener
	if err := InNetns(e.b.ns, func() (err error) {
		l, err = net.Listen("tcp", ":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

func (e *testEnv) isolationInOrder(t *testing.T) (tablePresent, inOrder bool) {
	t.Helper()
	c, err := e.b.isolation.conn()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListTableOfFamily(IsolationTable, nftables.TableFamilyINet); errors.Is(err, unix.ENOENT) {
		return false, false
	}
	ok, err := e.b.isolation.inOrder(c)
	if err != nil {
		t.Fatal(err)
	}
	return true, ok
}

// A node never forwards between two Networks, nor from a Network
// to the node's other addresses; a Network's gateway answers echo requests
// and nothing else; pods of one Network still reach one another. With the
// node forwarding (as a node with pods does) and br_netfilter showing
// bridged packets to the forward hook (this kernel's default), with real
// packets. Flushing the table is repaired by the drift watch; the table
// goes with the last bridge.
func TestIsolation(t *testing.T) {
	e := newTestEnv(t)
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox (ping, nc) is not installed")
	}
	if err := WriteSysctl(e.b.ns, "/proc/sys/net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	a := network(t, "a", "10.91.0.0/24", "10.91.0.1")
	b := network(t, "b", "10.92.0.0/24", "10.92.0.1")
	e.ensure(t, a, backend.ActionCreated)
	e.ensure(t, b, backend.ActionCreated)
	a1, a2 := e.attach(t, a, "10.91.0.2/24"), e.attach(t, a, "10.91.0.3/24")
	b1 := e.attach(t, b, "10.92.0.2/24")
	port := e.listen(t)

	check := func(when string) {
		t.Helper()
		for _, c := range []struct {
			what  string
			probe func() bool
			want  bool
		}{
			{"a pod pings another pod of its Network", func() bool { return a1.pings(t, "10.91.0.3") }, true},
			{"a pod pings its gateway", func() bool { return a2.pings(t, "10.91.0.1") }, true},
			{"a pod of b pings its gateway", func() bool { return b1.pings(t, "10.92.0.1") }, true},
			{"a pod of b pings a pod of a through its gateway", func() bool { return b1.pings(t, "10.91.0.2") }, false},
			{"a pod of a pings a pod of b through its gateway", func() bool { return a1.pings(t, "10.92.0.2") }, false},
			{"a pod of b pings a's gateway", func() bool { return b1.pings(t, "10.91.0.1") }, false},
			{"a pod connects to a node service on its gateway", func() bool { return a1.connects(t, "10.91.0.1", port) }, false},
			{"a pod connects to a node service on another gateway", func() bool { return a1.connects(t, "10.92.0.1", port) }, false},
		} {
			if got := probeExpecting(c.want, c.probe); got != c.want {
				t.Errorf("%s: %s: %v, want %v", when, c.what, got, c.want)
			}
		}
	}
	check("isolated")

	// Someone deletes the table, then flushes it: the drift watch puts the
	// rules back. Its subscription starts asynchronously: the table is
	// deleted until the watch repairs it, and flushed once it did.
	startWatch(t, e)
	inOrder := func() bool {
		_, ok := e.isolationInOrder(t)
		return ok
	}
	tamperUntilRepaired(t, e.b.isolation.conn, "deleted", func(c *nftables.Conn) { c.AddTable(isolationTable); c.DelTable(isolationTable) }, inOrder)
	tamperUntilRepaired(t, e.b.isolation.conn, "flushed", func(c *nftables.Conn) { c.FlushTable(isolationTable) }, inOrder)
	check("after the table was flushed and repaired")

	if err := e.b.Delete(testContext(t), a.Owner, nil); err != nil {
		t.Fatal(err)
	}
	if present, _ := e.isolationInOrder(t); !present {
		t.Error("the table went with the first of two bridges")
	}
	if err := e.b.Delete(testContext(t), b.Owner, nil); err != nil {
		t.Fatal(err)
	}
	if present, _ := e.isolationInOrder(t); present {
		t.Error("the table stayed after the last bridge went")
	}
}

// tamperUntilRepaired does f to a table until inOrder reports it repaired
// within a second, failing after eventTimeout: a watch subscribes
// asynchronously, and a table tampered with before it did stays so.
func tamperUntilRepaired(t *testing.T, conn func() (*nftables.Conn, error), what string, f func(c *nftables.Conn), inOrder func() bool) {
	t.Helper()
	deadline := time.Now().Add(eventTimeout)
	for {
		c, err := conn()
		if err != nil {
			t.Fatal(err)
		}
		f(c)
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		for poll := time.Now().Add(time.Second); time.Now().Before(poll); time.Sleep(10 * time.Millisecond) {
			if inOrder() {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the table was not repaired after it was %s", what)
		}
	}
}

// benchNetns is a throwaway network namespace for a benchmark.
func benchNetns(b *testing.B) netns.NsHandle {
	nettest.RequireRoot(b)
	name := nettest.NetnsName("netop-b-")
	if err := EnsureNetns(name); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = nettest.DeleteNetns(name) })
	ns, err := netns.GetFromName(name)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ns.Close() })
	return ns
}

// The isolation rules are the same few beside 10 Networks and 1000: only
// the set grows. Reports the time to program the whole table.
func BenchmarkIsolationProgram(b *testing.B) {
	ns := benchNetns(b)
	i := &isolation{ns: ns}
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("networks=%d", n), func(b *testing.B) {
			bridges := make([]int, n)
			for j := range bridges {
				bridges[j] = 1000 + j
			}
			for b.Loop() {
				c, err := i.conn()
				if err != nil {
					b.Fatal(err)
				}
				if err := i.program(c, bridges); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(isolationRules(0, 0))), "rules")
			b.ReportMetric(float64(n), "set-elements")
		})
	}
}

// A bridge made while the backend is being listed (a resync, the
// operator's first sweep) keeps its isolation element: the listing's
// rewrite of the set never drops a bridge that appeared after its own
// list of links was made. (It did: the pods of a Network created at the
// standalone's start could then reach their gateway but not one another,
// until the next resync.)
func TestIsolationKeepsBridgesMadeDuringAListing(t *testing.T) {
	e := newTestEnv(t)
	ctx := testContext(t)
	done := make(chan struct{})
	listed := make(chan error, 1)
	go func() {
		defer close(listed)
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := e.b.ListOwned(ctx); err != nil {
				listed <- err
				return
			}
		}
	}()
	for i := range 150 {
		e.ensure(t, network(t, fmt.Sprintf("n%d", i), fmt.Sprintf("10.93.%d.0/24", i), fmt.Sprintf("10.93.%d.1", i)), backend.ActionCreated)
	}
	close(done)
	if err := <-listed; err != nil {
		t.Fatal(err)
	}
	c, err := e.b.isolation.conn()
	if err != nil {
		t.Fatal(err)
	}
	set, err := c.GetSetByName(isolationTable, setBridged)
	if err != nil {
		t.Fatal(err)
	}
	elements, err := c.GetSetElements(set)
	if err != nil {
		t.Fatal(err)
	}
	have := map[uint32]bool{}
	for _, el := range elements {
		have[binaryutil.NativeEndian.Uint32(el.Key[:4])] = true
	}
	bridges, err := netopBridges(e.b.nl.LinkList)
	if err != nil {
		t.Fatal(err)
	}
	var missing []int
	for _, index := range bridges {
		if !have[uint32(index)] {
			missing = append(missing, index)
		}
	}
	if len(bridges) != 150 || len(missing) > 0 {
		t.Errorf("%d bridges; the isolation set misses %d of them: %v", len(bridges), len(missing), missing)
	}
}
