package linux

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where named network namespaces are bind-mounted; the same
// directory as iproute2 and vishvananda/netns use.
const netnsDir = "/run/netns"

// EnsureNetns creates the named network namespace unless it exists. It
// makes it as iproute2's `ip netns add` does (see createNetns), so that the
// two tools can each add and delete namespaces alongside the other.
func EnsureNetns(name string) error {
	if err := validNetnsName(name); err != nil {
		return err
	}
	err := checkNetns(name)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return err
	}

	createMu.Lock()
	err = createNetns(name)
	createMu.Unlock()
	if errors.Is(err, fs.ErrExist) {
		// Being created concurrently by someone else, who makes the file
		// before mounting the namespace onto it.
		for range 100 {
			if err = checkNetns(name); err == nil {
				return nil
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return err
}

// createMu serializes this process's creations: two of them upgrading
// netnsDir to a mount point at once would stack two mounts.
var createMu sync.Mutex

// createNetns makes a network namespace as iproute2's netns_add does:
//
//  1. netnsDir becomes a shared mount point: made shared where it is a
//     mount point already, else first bind-mounted onto itself. Namespaces
//     mounted below it then propagate between mount namespaces (a pod
//     mounting the host's /run/netns, a process that unshared its mounts),
//     and, the bug this prevents, a later `ip netns add` finds the mount
//     point in place and never bind-mounts netnsDir over namespaces already
//     mounted below the bare directory: those would stay mounted
//     underneath, their files busy (EBUSY) for every later delete.
//  2. An empty file netnsDir/name, created exclusively (fs.ErrExist when
//     someone else is making it).
//  3. A thread unshares its network namespace and bind-mounts its
//     /proc/thread-self/ns/net onto the file; failing that, the file goes.
//
// Deleting is the reverse: unmount with MNT_DETACH, then unlink (`ip netns
// delete`, or nettest.DeleteNetns).
func createNetns(name string) error {
	if err := shareNetnsDir(); err != nil {
		return fmt.Errorf("create network namespace %q (needs CAP_SYS_ADMIN): %w", name, err)
	}
	path := filepath.Join(netnsDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0)
	if err != nil {
		return fmt.Errorf("create network namespace %q: %w", name, err)
	}
	_ = f.Close() // read-only and empty: nothing to flush

	// Unsharing moves the calling thread into the new namespace. Doing that
	// on a goroutine of its own means a thread that cannot be moved back
	// is never handed to other goroutines (see mountNewNetns).
	errc := make(chan error, 1)
	go func() { errc <- mountNewNetns(path) }()
	if err := <-errc; err != nil {
		// As iproute2: a file that is no namespace is not left behind. The
		// unmount is for a mount whose return to the original namespace
		// failed.
		_ = unix.Unmount(path, unix.MNT_DETACH)
		_ = os.Remove(path)
		return fmt.Errorf("create network namespace %q (needs CAP_SYS_ADMIN): %w", name, err)
	}
	return nil
}

// shareNetnsDir makes netnsDir a shared mount point, creating it if
// missing: step 1 of createNetns.
func shareNetnsDir() error {
	if err := os.Mkdir(netnsDir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	madeMountPoint := false
	for {
		err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			return nil
		}
		// EINVAL: not a mount point (yet).
		if !errors.Is(err, unix.EINVAL) || madeMountPoint {
			return fmt.Errorf("make %s a shared mount: %w", netnsDir, err)
		}
		if err := unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mount %s onto itself: %w", netnsDir, err)
		}
		madeMountPoint = true
	}
}

// mountNewNetns moves the calling thread into a new network namespace,
// bind-mounts that onto path and returns the thread to its original
// namespace. It must run on a goroutine of its own.
func mountNewNetns(path string) error {
	runtime.LockOSThread()
	// Unlocked only once the thread is back in its original namespace. If
	// that fails, the goroutine ends still locked and the Go runtime
	// destroys the thread rather than reuse it in the wrong namespace.

	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("get current namespace: %w", err)
	}
	defer func() { _ = orig.Close() }() // a namespace handle: nothing to flush

	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread() // unshare failed: still in orig
		return fmt.Errorf("unshare: %w", err)
	}
	// This thread's namespace, not the process's (/proc/self is the
	// thread group leader's).
	self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
	mountErr := unix.Mount(self, path, "none", unix.MS_BIND, "")
	if err := netns.Set(orig); err != nil {
		return fmt.Errorf("return to the original namespace: %w", err)
	}
	runtime.UnlockOSThread()
	if mountErr != nil {
		return fmt.Errorf("bind-mount %s onto %s: %w", self, path, mountErr)
	}
	return nil
}

// InNetns runs f on a thread in the network namespace ns. f runs on a
// goroutine of its own, whose thread is unlocked only once it is back in
// its original namespace; if it cannot go back, the goroutine ends still
// locked and the Go runtime destroys the thread rather than let anything
// else run in the wrong namespace. With ns not open (netns.None(): the
// process's own namespace), f just runs.
func InNetns(ns netns.NsHandle, f func() error) error {
	if !ns.IsOpen() {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		host, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("this thread's network namespace: %w", err)
			return
		}
		defer func() { _ = host.Close() }()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread() // a failed setns leaves the thread where it was
			errc <- fmt.Errorf("entering network namespace: %w", err)
			return
		}
		fErr := f()
		if err := netns.Set(host); err != nil {
			errc <- errors.Join(fErr, fmt.Errorf("leaving network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- fErr
	}()
	return <-errc
}

// WriteSysctl writes a sysctl of the network namespace ns: /proc/sys/net
// is the calling thread's namespace's, chosen when the file is opened.
func WriteSysctl(ns netns.NsHandle, path, value string) error {
	var f *os.File
	err := InNetns(ns, func() (err error) {
		f, err = os.OpenFile(path, os.O_WRONLY, 0)
		return err
	})
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	return errors.Join(err, f.Close())
}

// readSysctl reads a sysctl of the network namespace ns, without its
// trailing newline.
func readSysctl(ns netns.NsHandle, path string) (string, error) {
	var f *os.File
	err := InNetns(ns, func() (err error) {
		f, err = os.Open(path)
		return err
	})
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	data, err := io.ReadAll(f)
	return strings.TrimSpace(string(data)), err
}

// checkNetns reports whether name is a usable network namespace; the error
// matches fs.ErrNotExist when it does not exist.
func checkNetns(name string) error {
	path := filepath.Join(netnsDir, name)
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("network namespace %q: %w", name, &fs.PathError{Op: "statfs", Path: path, Err: err})
	}
	if st.Type != unix.NSFS_MAGIC {
		return fmt.Errorf("network namespace %q: %s exists but is not a namespace mount (remove it, or `ip netns delete %s`)", name, path, name)
	}
	return nil
}

// validNetnsName rejects names that would escape netnsDir.
func validNetnsName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > 255 || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("invalid network namespace name %q", name)
	}
	return nil
}
