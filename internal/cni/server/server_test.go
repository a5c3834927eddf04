package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A socket another server answers on is not taken over; a stale one is.
func TestListenRefusesAServedSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cni.sock")
	l, err := listen(path, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := listen(path, ""); !errors.Is(err, errServed) {
		t.Errorf("a second server on a served socket: %v, want %v", err, errServed)
	}
	l.SetUnlinkOnClose(false)
	_ = l.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the stale socket file: %v", err)
	}
	again, err := listen(path, "")
	if err != nil {
		t.Fatalf("listening over a stale socket: %v", err)
	}
	_ = again.Close()
	abstract := "@netop-cni-test-" + filepath.Base(t.TempDir())
	a, err := listen(abstract, "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Close() }()
	if _, err := listen(abstract, ""); !errors.Is(err, errServed) {
		t.Errorf("a second server on a served abstract socket: %v, want %v", err, errServed)
	}
}

// A waiter is told of its pod's next change, and only of its pod's.
func TestChanges(t *testing.T) {
	c := changes{waiting: map[string][]chan struct{}{}}
	a, doneA := c.wait("ns/a")
	b, doneB := c.wait("ns/b")
	c.notify("ns/a")
	select {
	case <-a:
	default:
		t.Error("a's change not told")
	}
	select {
	case <-b:
		t.Error("b told of a's change")
	default:
	}
	doneA()
	doneB()
	if len(c.waiting) != 0 {
		t.Errorf("waiters left: %v", c.waiting)
	}
}

// An ADD lasts as long as the plugin that asked for it: its context ends
// when the caller exits, with errCallerGone, and not before; also when it
// exited before the watch began, and with nobody reaping it (a zombie:
// the runtime reaps its plugin after reading its answer).
func TestWatchEndsWithTheCaller(t *testing.T) {
	start := func() (*exec.Cmd, *os.File) {
		t.Helper()
		caller := exec.Command("sleep", "60")
		if err := caller.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = caller.Process.Kill()
			_ = caller.Wait()
		})
		fd, err := unix.PidfdOpen(caller.Process.Pid, unix.PIDFD_NONBLOCK)
		if err != nil {
			t.Fatal(err)
		}
		return caller, os.NewFile(uintptr(fd), "pidfd")
	}
	ended := func(ctx context.Context, what string) {
		t.Helper()
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not ended 10 s after its caller exited", what)
		}
		if cause := context.Cause(ctx); !errors.Is(cause, errCallerGone) {
			t.Errorf("%s: cause %v, want %v", what, cause, errCallerGone)
		}
	}

	caller, pidfd := start()
	ctx, stop := watch(t.Context(), pidfd)
	defer stop()
	if err := ctx.Err(); err != nil {
		t.Fatalf("ended while its caller runs: %v", context.Cause(ctx))
	}
	if err := caller.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	ended(ctx, "killed while watched")

	zombie, pidfd := start()
	if err := zombie.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	stat := fmt.Sprintf("/proc/%d/stat", zombie.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for state := ""; state != "Z"; {
		if time.Now().After(deadline) {
			t.Fatalf("%s: state %q, not a zombie after 10 s", stat, state)
		}
		data, err := os.ReadFile(stat)
		if err != nil {
			t.Fatal(err)
		}
		// pid (comm) state ...
		if fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:])); len(fields) > 0 {
			state = fields[0]
		}
	}
	ctx, stop = watch(t.Context(), pidfd)
	defer stop()
	ended(ctx, "exited before the watch")

	// Asked, the kernel answers at once, before the watch hears of it:
	// what decides to attach under the container's lock asks.
	caller, pidfd = start()
	ctx, stop = watch(t.Context(), pidfd)
	defer stop()
	if err := abandoned(ctx); err != nil {
		t.Fatalf("gone while its caller runs: %v", err)
	}
	if err := caller.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Reaped: the pidfd is readable from the exit on.
	_ = caller.Wait()
	if err := abandoned(ctx); !errors.Is(err, errCallerGone) {
		t.Errorf("the caller was killed and reaped: %v, want %v", err, errCallerGone)
	}
	ended(ctx, "found gone when asked")

	// A caller that cannot be watched has given up by the end of its time.
	expired, cancel := context.WithTimeout(t.Context(), 0)
	defer cancel()
	if err := abandoned(expired); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("its time over: %v, want %v", err, context.DeadlineExceeded)
	}

	// Stopped (the answer sent), it ends without blaming the caller; with
	// no pidfd (a caller it cannot see) it is left to its parent until
	// then.
	_, pidfd = start()
	for _, fd := range []*os.File{pidfd, nil} {
		ctx, stop := watch(t.Context(), fd)
		if err := ctx.Err(); err != nil {
			t.Fatalf("pidfd %v: ended at once: %v", fd, context.Cause(ctx))
		}
		stop()
		if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) {
			t.Errorf("pidfd %v: stopped, cause %v, want %v", fd, cause, context.Canceled)
		}
	}
}
