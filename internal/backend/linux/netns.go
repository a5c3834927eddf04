package linux

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where named network namespaces are bind-mounted; the same
// directory as vishvananda/netns and iproute2 use.
const netnsDir = "/run/netns"

// EnsureNetns creates the named network namespace unless it exists.
func EnsureNetns(name string) error {
	if err := validNetnsName(name); err != nil {
		return err
	}
	err := checkNetns(name)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return err
	}

	// Creating a namespace moves the calling thread into it. Doing that on
	// a goroutine of its own means a thread that cannot be moved back is
	// never handed to other goroutines (see createNetns).
	errc := make(chan error, 1)
	go func() { errc <- createNetns(name) }()
	err = <-errc
	if errors.Is(err, fs.ErrExist) {
		// Created concurrently by someone else.
		return checkNetns(name)
	}
	return err
}

func createNetns(name string) error {
	runtime.LockOSThread()
	// Unlocked only once the thread is back in its original namespace. If
	// that fails, the goroutine ends still locked and the Go runtime
	// destroys the thread rather than reuse it in the wrong namespace.

	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("create network namespace %q: get current namespace: %w", name, err)
	}
	defer func() { _ = orig.Close() }() // a namespace handle: nothing to flush

	created, createErr := netns.NewNamed(name)
	if createErr == nil {
		_ = created.Close()
	}
	if err := netns.Set(orig); err != nil {
		return fmt.Errorf("create network namespace %q: return to the original namespace: %w", name, err)
	}
	runtime.UnlockOSThread()

	if createErr != nil {
		return fmt.Errorf("create network namespace %q (needs CAP_SYS_ADMIN): %w", name, createErr)
	}
	return nil
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
