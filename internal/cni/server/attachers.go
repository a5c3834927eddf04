package server

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/cni/plugin"
)

// attachers keeps an attacher per node namespace for the server's life:
// making one costs two namespace switches and two netlink sockets, which
// every ADD paid when it made its own. An attacher's netlink sockets are
// each used by one request at a time, so ADDs share it; the kernel's RTNL
// lock serializes their link changes anyway.
//
// A namespace is known by its inode, not by the path it was passed under
// (a file passed along the request, a new path each time). The attacher
// holds the namespace open, so its inode is not reused while kept; a node
// namespace lives as long as its node, which the server does not outlive
// (the agent's is the host's, the standalone's last as long as it).
type attachers struct {
	mu sync.Mutex
	m  map[namespaceID]*cni.Attacher
}

// namespaceID is a namespace's nsfs device and inode.
type namespaceID struct{ dev, ino uint64 }

// get returns the attacher of conf's node namespace.
func (as *attachers) get(conf *plugin.Config) (*cni.Attacher, error) {
	ns, err := conf.NodeNamespace()
	if err != nil {
		return nil, err
	}
	defer func() { _ = ns.Close() }()
	var st unix.Stat_t
	if err := unix.Fstat(int(ns), &st); err != nil {
		return nil, fmt.Errorf("node network namespace %q: %w", conf.NodeNetns, err)
	}
	id := namespaceID{dev: st.Dev, ino: st.Ino}
	as.mu.Lock()
	defer as.mu.Unlock()
	if a, ok := as.m[id]; ok {
		return a, nil
	}
	a, err := cni.NewAttacher(ns)
	if err != nil {
		return nil, err
	}
	if as.m == nil {
		as.m = map[namespaceID]*cni.Attacher{}
	}
	as.m[id] = a
	return a, nil
}

// close releases the attachers; no ADD may be under way.
func (as *attachers) close() {
	as.mu.Lock()
	defer as.mu.Unlock()
	for id, a := range as.m {
		a.Close()
		delete(as.m, id)
	}
}
