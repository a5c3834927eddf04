// Package nettest helps tests that make real kernel network objects
// (bridges, network namespaces). It has no Kubernetes dependencies, so that
// the backend's own tests stay small.
package nettest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where named network namespaces are bind-mounted, as by
// iproute2 and the linux backend.
const netnsDir = "/run/netns"

// RequireRoot skips a test that makes real kernel network objects when not
// root, except in CI (CI=true), where skipping would hide the feature.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("CI must run this test as root: it makes real Linux bridges in throwaway network namespaces")
	}
	t.Skip("not root: this test makes real Linux bridges in throwaway network namespaces; run it as root (sudo -E go test ...)")
}

// NetnsName returns a network namespace name unique to this run, for a
// test's throwaway namespace.
func NetnsName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// DeleteNetns removes the named network namespace, as `ip netns delete`
// does: the namespace itself lives on while processes or open handles
// still use it. A namespace that does not exist is not an error.
func DeleteNetns(name string) error {
	// The name becomes a path to unmount and remove: one that leaves
	// netnsDir must never get that far.
	if name == "" || name == "." || name == ".." || len(name) > 255 || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("invalid network namespace name %q", name)
	}
	path := filepath.Join(netnsDir, name)
	// EINVAL: not a mount point, a leftover of an interrupted creation;
	// removing the file is still right.
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete network namespace %q: unmount %s: %w", name, path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete network namespace %q: %w", name, err)
	}
	return nil
}

// Handle is a netlink handle in the named network namespace, closed when
// the test ends.
func Handle(t testing.TB, name string) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ns.Close() }()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// AcceptAndClose accepts connections on l and closes them until l is
// closed: an open TCP port for probes that only connect.
func AcceptAndClose(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		_ = c.Close()
	}
}

// EchoDatagrams answers every datagram on conn with itself until conn is
// closed: a UDP port that probes can tell from a dropped one.
func EchoDatagrams(conn net.PacketConn) {
	buf := make([]byte, 64)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = conn.WriteTo(buf[:n], from)
	}
}

// FloodsTo lists, sorted, the underlay addresses the VXLAN device vx in the
// named network namespace floods to: its all-zero forwarding entries.
func FloodsTo(t testing.TB, namespace, vx string) []string {
	t.Helper()
	out, err := exec.Command("bridge", "-n", namespace, "fdb", "show", "dev", vx).CombinedOutput()
	if err != nil {
		t.Fatalf("bridge -n %s fdb show dev %s: %v\n%s", namespace, vx, err, out)
	}
	var peers []string
	for line := range strings.SplitSeq(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == "00:00:00:00:00:00" && f[1] == "dst" {
			peers = append(peers, f[2])
		}
	}
	slices.Sort(peers)
	return peers
}

// AddrGenMode is the IPv6 address generation mode of the link in the named
// network namespace, as iproute2 names it ("eui64", "none", ...): what
// decides whether the kernel gives the link a link-local address, read
// without waiting for the kernel to make one.
func AddrGenMode(t testing.TB, namespace, link string) string {
	t.Helper()
	out, err := exec.Command("ip", "-n", namespace, "-d", "link", "show", "dev", link).CombinedOutput()
	if err != nil {
		t.Fatalf("ip -n %s -d link show dev %s: %v\n%s", namespace, link, err, out)
	}
	f := strings.Fields(string(out))
	if i := slices.Index(f, "addrgenmode"); i >= 0 && i+1 < len(f) {
		return f[i+1]
	}
	t.Fatalf("ip -n %s -d link show dev %s: no addrgenmode in\n%s", namespace, link, out)
	return ""
}
