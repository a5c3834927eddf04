package server

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/cni/plugin"
	"github.com/netop-dev/netop/internal/testing/nettest"
)

// An ADD's node namespace comes as a new path each time (a file passed
// along the request): the attacher is the namespace's, whatever the path,
// and another namespace's is another.
func TestAttachersPerNamespace(t *testing.T) {
	nettest.RequireRoot(t)
	var paths []string
	for range 2 {
		name := nettest.NetnsName("netop-ca-")
		if err := linux.EnsureNetns(name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nettest.DeleteNetns(name) })
		paths = append(paths, filepath.Join("/run/netns", name))
	}
	f, err := os.Open(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	passed := fmt.Sprintf("/proc/self/fd/%d", f.Fd())

	var as attachers
	defer as.close()
	get := func(path string) any {
		t.Helper()
		a, err := as.get(&plugin.Config{NodeNetns: path})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	first := get(paths[0])
	if get(passed) != first || get(paths[0]) != first {
		t.Error("the same namespace under another path got another attacher")
	}
	if get(paths[1]) == first {
		t.Error("another namespace got the first one's attacher")
	}
	if get("") == first {
		t.Error("the process's own namespace got the first one's attacher")
	}
	if len(as.m) != 3 {
		t.Errorf("%d attachers kept, want 3", len(as.m))
	}
	if _, err := as.get(&plugin.Config{NodeNetns: filepath.Join(t.TempDir(), "none")}); err == nil {
		t.Error("a namespace that is not there: no error")
	}
}
