package linux

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/netop-dev/netop/internal/testing/nettest"
)

// inMountNamespaceEnv marks the child process of a test that runs in a
// mount namespace of its own (see runInMountNamespace).
const inMountNamespaceEnv = "NETOP_TEST_IN_MOUNT_NAMESPACE"

// runInMountNamespace runs the calling test again in a child process that
// has a mount namespace of its own and a fresh, empty tmpfs on /run, so
// that /run/netns starts out as it does on a freshly booted host: missing,
// and never a mount point. It returns true in the child, which then runs
// the test's body; in the parent it waits for the child and reports its
// outcome. Nothing the child mounts propagates to the host: Go makes the
// child's mounts private when it unshares CLONE_NEWNS, and the child's
// namespaces go away with its mounts when it exits, even after a failure.
func runInMountNamespace(t *testing.T) bool {
	t.Helper()
	if os.Getenv(inMountNamespaceEnv) == t.Name() {
		// The host's netnsDir mounts, copied into this mount namespace, would
		// only be hidden by the tmpfs: detach them (here only) so that
		// netnsMounts sees just the test's.
		if err := unix.Unmount(netnsDir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			t.Fatalf("unmount %s in the test's mount namespace: %v", netnsDir, err)
		}
		if err := unix.Mount("netop-test", "/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
			t.Fatalf("mount a tmpfs on /run: %v", err)
		}
		return true
	}
	nettest.RequireRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI must run this test: it needs iproute2's ip")
		}
		t.Skip("iproute2's ip is not installed")
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), inMountNamespaceEnv+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	t.Logf("in a mount namespace of its own:\n%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatal("the child did not run the test")
	}
	return false
}

// netnsMounts returns the mount points under netnsDir, netnsDir itself
// included, once per mount.
func netnsMounts(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID parentID major:minor root mountpoint options ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		if p := fields[4]; p == netnsDir || strings.HasPrefix(p, netnsDir+"/") {
			mounts = append(mounts, p)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return mounts
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.CommandContext(t.Context(), "ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// TestNetnsSharedWithIproute2 reproduces "a namespace netop
// creates can be hidden by a later `ip netns add` and then cannot be
// deleted (Device or resource busy)" on a host where /run/netns is not yet
// a mount point: iproute2 then bind-mounts /run/netns onto itself, and a
// namespace mounted below the directory before that stays mounted
// underneath, keeping its file busy. netop must create namespaces as
// iproute2 does, so that each tool can add and delete alongside the other.
func TestNetnsSharedWithIproute2(t *testing.T) {
	if !runInMountNamespace(t) {
		return
	}
	ours, theirs, deletedByIP := "netop-a", "other", "netop-c"

	if err := EnsureNetns(ours); err != nil {
		t.Fatalf("EnsureNetns: %v", err)
	}
	ip(t, "netns", "add", theirs)
	if err := checkNetns(ours); err != nil {
		t.Fatalf("after `ip netns add %s`: %v", theirs, err)
	}
	if err := nettest.DeleteNetns(ours); err != nil {
		t.Fatalf("DeleteNetns after `ip netns add %s`: %v", theirs, err)
	}
	if err := checkNetns(ours); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after DeleteNetns: %v", err)
	}

	// The other way round: netop creates, iproute2 deletes.
	if err := EnsureNetns(deletedByIP); err != nil {
		t.Fatalf("EnsureNetns: %v", err)
	}
	ip(t, "netns", "delete", deletedByIP)
	if _, err := os.Stat(filepath.Join(netnsDir, deletedByIP)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after `ip netns delete %s`: %v", deletedByIP, err)
	}

	ip(t, "netns", "delete", theirs)
	// Left: /run/netns itself, mounted once, by whoever came first.
	if got := netnsMounts(t); len(got) != 1 || got[0] != netnsDir {
		t.Errorf("mounts left = %q, want only %s", got, netnsDir)
	}
}

// TestNetnsMountPropagation checks the point of the shared /run/netns:
// namespaces made and deleted in one mount namespace are seen so in the
// others (a pod mounting the host's /run/netns with Bidirectional
// propagation, say), as with iproute2.
func TestNetnsMountPropagation(t *testing.T) {
	if !runInMountNamespace(t) {
		return
	}
	// Not Go's SysProcAttr.Unshareflags: Go then makes every mount of the
	// child private, which would stop the very propagation under test.
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI must run this test: it needs util-linux's unshare")
		}
		t.Skip("unshare(1) is not installed")
	}
	inOtherMountNamespace := func(args ...string) {
		t.Helper()
		args = append([]string{"--mount", "--propagation", "unchanged", "ip"}, args...)
		if out, err := exec.CommandContext(t.Context(), unshare, args...).CombinedOutput(); err != nil {
			t.Fatalf("unshare %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}

	ours, theirs := "netop-p", "other"
	if err := EnsureNetns(ours); err != nil {
		t.Fatalf("EnsureNetns: %v", err)
	}
	inOtherMountNamespace("netns", "add", theirs)
	if err := checkNetns(theirs); err != nil {
		t.Errorf("a namespace added in another mount namespace: %v", err)
	}
	ip(t, "netns", "exec", theirs, "true")
	inOtherMountNamespace("netns", "delete", theirs)
	inOtherMountNamespace("netns", "delete", ours)
	if got := netnsMounts(t); len(got) != 1 || got[0] != netnsDir {
		t.Errorf("mounts left after deletes in another mount namespace = %q, want only %s", got, netnsDir)
	}
}
