package podprobe

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/testing/nettest"
	"github.com/netop-dev/netop/internal/testing/testenv"
)

// The probes tell a served port from one nobody serves, in each protocol,
// over a namespace's loopback: a probe that always said yes (or no) would
// make every policy case meaningless.
func TestReaches(t *testing.T) {
	nettest.RequireRoot(t)
	ns := loopbackNetns(t)
	closeServers, err := Serve(ns, []Port{{Number: 80, Protocol: TCP}, {Number: 80, Protocol: UDP}})
	if err != nil {
		t.Fatal(err)
	}
	defer closeServers()
	for _, c := range []struct {
		port Port
		want bool
	}{{Port{Number: 80, Protocol: TCP}, true}, {Port{Number: 81, Protocol: TCP}, false}, {Port{Number: 80, Protocol: UDP}, true}, {Port{Number: 81, Protocol: UDP}, false}, {Port{Number: 80, Protocol: SCTP}, true}} {
		if got := Reaches(ns, ns, "127.0.0.1", c.port); got != c.want {
			t.Errorf("%s: reaches %v, want %v", c.port, got, c.want)
		}
	}
}

// A stream opens on an echo that answers and closes when it stops.
func TestStream(t *testing.T) {
	nettest.RequireRoot(t)
	ns := loopbackNetns(t)
	closeServer, err := Serve(ns, []Port{{Number: 80, Protocol: UDP}})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	s, err := StartStream(ns, "127.0.0.1", 80, 5*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testenv.Eventually(t, 5*time.Second, func(context.Context) (bool, string) {
		_, ok := s.Opened(began)
		return ok, "no datagram answered"
	})
	closeServer()
	stopped := time.Now()
	testenv.Eventually(t, 5*time.Second, func(context.Context) (bool, string) {
		took, ok := s.Closed(stopped, 100*time.Millisecond)
		return ok && took >= 0, fmt.Sprintf("still answered (%v)", took)
	})
}

// loopbackNetns is a throwaway network namespace with its loopback up.
func loopbackNetns(t *testing.T) netns.NsHandle {
	t.Helper()
	name := nettest.NetnsName("probe-")
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = nettest.DeleteNetns(name) })
	h := nettest.Handle(t, name)
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	return ns
}

// A datagram that fits the MTU with don't-fragment arrives; one byte more
// is refused at the sender.
func TestDatagramArrives(t *testing.T) {
	nettest.RequireRoot(t)
	ns := loopbackNetns(t)
	if err := linux.InNetns(ns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetMTU(lo, 1500)
	}); err != nil {
		t.Fatal(err)
	}
	closeServer, err := Serve(ns, []Port{{Number: 80, Protocol: UDP}})
	if err != nil {
		t.Fatal(err)
	}
	defer closeServer()
	if ok, err := DatagramArrives(ns, "127.0.0.1", 80, 1472); !ok || err != nil {
		t.Errorf("1472 bytes in a 1500 MTU: answered %v (%v)", ok, err)
	}
	if ok, err := DatagramArrives(ns, "127.0.0.1", 80, 1473); ok || !errors.Is(err, unix.EMSGSIZE) {
		t.Errorf("1473 bytes in a 1500 MTU: answered %v (%v), want EMSGSIZE", ok, err)
	}
}
