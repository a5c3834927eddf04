// Package server is the node side of netop's CNI plugin: it serves the
// plugin's ADD on a unix socket, in the process that builds the node's
// bridges (the agent, or the standalone's operator), as Kube-OVN's and
// Cilium's daemons serve their plugins.
//
// The plugin the runtime executes stays small and starts fast; the work it
// did itself (a Kubernetes client, a GET and a watch of its pod per ADD)
// becomes a lookup in the informer cache the node side keeps anyway,
// waiting on the cache's events when the pod's addresses are not written
// yet. The netlink work and the records are the same as the plugin's were,
// in the same files, so that the plugin's DEL, CHECK and GC, which run
// without the node side, find them.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/cni/cniapi"
	"github.com/netop-dev/netop/internal/metrics"
)

// Options are the server's settings.
type Options struct {
	// Socket is the unix socket the node's plugins call, as their
	// configurations name it: a path or an abstract "@name".
	Socket string
	// Netns names the network namespace of the node's bridges, where an
	// abstract socket is made; "" is the process's own. (The plugin
	// passes the namespace to attach in along its request.)
	Netns string
	// Metrics, if set, times the ADDs' phases.
	Metrics *metrics.Metrics
	// Namespace, if set, is the only namespace whose pods the informer
	// holds (the operator's --namespace): no pod of another joins a
	// Network this netop manages.
	Namespace string
}

// Server attaches pods for the plugin.
type Server struct {
	opts     Options
	kube     kubernetes.Interface
	pods     corelisters.PodLister
	informer cache.SharedIndexInformer
	changes  changes
	// after is the writes made after answering, which Run waits for.
	after sync.WaitGroup
}

// ioTimeout bounds reading a request and writing an answer: both are a
// few hundred bytes on a local socket.
const ioTimeout = 10 * time.Second

// statusTimeout bounds a network-status write, made after the answer.
const statusTimeout = 30 * time.Second

// New is a server answering from the pod informer, which covers the
// node's pods; kube writes their network-status.
func New(kube kubernetes.Interface, pods coreinformers.PodInformer, opts Options) (*Server, error) {
	if opts.Socket == "" {
		return nil, errors.New("no socket")
	}
	s := &Server{opts: opts, kube: kube, pods: pods.Lister(), informer: pods.Informer(), changes: changes{waiting: map[string][]chan struct{}{}}}
	changed := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			s.changes.notify(key)
		}
	}
	if _, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: changed, UpdateFunc: func(_, obj any) { changed(obj) }, DeleteFunc: changed,
	}); err != nil {
		return nil, fmt.Errorf("watching pods: %w", err)
	}
	return s, nil
}

// HasSyncedChecker: the server answers once the node's pods are listed.
func (s *Server) HasSyncedChecker() cache.DoneChecker { return s.informer.HasSyncedChecker() }

// Run serves the socket until ctx is done, then waits for the commands
// under way, which ctx cancels, and removes the socket.
func (s *Server) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("socket", s.opts.Socket)
	l, err := listen(s.opts.Socket, s.opts.Netns)
	if err != nil {
		return fmt.Errorf("CNI socket %s: %w", s.opts.Socket, err)
	}
	logger.Info("Serving the CNI plugin")
	stop := context.AfterFunc(ctx, func() { _ = l.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer s.after.Wait()
	defer wg.Wait()
	for {
		conn, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("CNI socket %s: %w", s.opts.Socket, err)
		}
		wg.Go(func() { s.serve(ctx, conn) })
	}
}

// errServed: another server listens on the socket.
var errServed = errors.New("another process serves it (another netop on this node?)")

// listen makes the socket. An abstract one ("@name") belongs to a network
// namespace: it is made in the bridges', which is the runtime's and its
// plugins'. A path is made root's only, unless another process serves it.
func listen(path, netnsName string) (*net.UnixListener, error) {
	addr := &net.UnixAddr{Name: path, Net: "unix"}
	if strings.HasPrefix(path, "@") {
		ns := netns.None()
		if netnsName != "" {
			var err error
			if ns, err = netns.GetFromName(netnsName); err != nil {
				return nil, fmt.Errorf("network namespace %q: %w", netnsName, err)
			}
			defer func() { _ = ns.Close() }()
		}
		var l *net.UnixListener
		err := linux.InNetns(ns, func() (err error) {
			l, err = net.ListenUnix("unix", addr)
			return err
		})
		if errors.Is(err, unix.EADDRINUSE) {
			return nil, errServed
		}
		if err != nil {
			return nil, err
		}
		return l, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	// A socket file outlives a crash; one that answers is another
	// server's, which taking it over would silently cut off.
	if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
		_ = conn.Close()
		return nil, errServed
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	l, err := net.ListenUnix("unix", addr)
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		_ = l.Close()
		return nil, err
	}
	return l, nil
}

// serve answers one connection's request.
func (s *Server) serve(ctx context.Context, conn *net.UnixConn) {
	defer func() { _ = conn.Close() }()
	logger := klog.FromContext(ctx)
	// gone: the plugin exited before its answer, which nobody reads.
	gone := false
	resp := func() cniapi.Response {
		// Whoever may ask decides which pods get which addresses, as the
		// runtime does: root on the node only, whatever the socket's
		// file mode says.
		pid, err := rootCaller(conn)
		if err != nil {
			return failure(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(ioTimeout))
		req, files, err := cniapi.ReadRequest(conn)
		defer func() {
			for _, f := range files {
				_ = f.Close()
			}
		}()
		if err != nil {
			return failure(fmt.Errorf("reading the request: %w", err))
		}
		if err := cniapi.Servable(req, files); err != nil {
			logger.Error(err, "Refused a CNI request", "command", req.Command)
			return failure(err)
		}
		passed := map[string]string{}
		for i, name := range req.Files {
			// Opened through this process's descriptor, the file is
			// the plugin's, wherever its path leads here.
			passed[name] = fmt.Sprintf("/proc/self/fd/%d", files[i].Fd())
		}
		// The runtime kills a plugin that outlives its own timeout, and
		// sends DEL: an ADD going on after that would attach a pod nobody
		// waits for, and one finishing after the DEL would leave its
		// interfaces behind. The ADD ends with its caller.
		callerCtx, stop := whileAlive(ctx, conn, pid)
		defer stop()
		resp := s.handleAdd(ctx, callerCtx, req, passed)
		gone = errors.Is(context.Cause(callerCtx), errCallerGone)
		if resp.Error != nil {
			if gone {
				logger.Info("The plugin exited before its answer (killed by the runtime at its timeout?); the ADD is undone", append(cniapi.Invocation("ADD", req.Args), "error", resp.Error.Error())...)
			} else {
				logger.Error(resp.Error, "CNI ADD failed", cniapi.Invocation("ADD", req.Args)...)
			}
		}
		return resp
	}()
	if gone {
		return
	}
	_ = conn.SetWriteDeadline(time.Now().Add(ioTimeout))
	if err := json.NewEncoder(conn).Encode(resp); err != nil {
		logger.Error(err, "Answering the CNI plugin")
	}
}

// rootCaller checks that the peer runs as root, and returns its process
// ID (0 if it is in a PID namespace this process does not see).
func rootCaller(conn *net.UnixConn) (pid int, err error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, fmt.Errorf("the caller's credentials: %w", credErr)
	}
	if cred.Uid != 0 {
		return 0, fmt.Errorf("uid %d: only root on the node may attach pods", cred.Uid)
	}
	return int(cred.Pid), nil
}

// errCallerGone ends an ADD whose plugin exited before the answer.
var errCallerGone = errors.New("the plugin that asked for this ADD exited")

// whileAlive returns a context that ends with ctx or when the process at
// the other end of conn (pid, as its credentials say) exits, with cause
// errCallerGone, and a function that stops watching it and ends the
// context.
func whileAlive(ctx context.Context, conn *net.UnixConn, pid int) (context.Context, func()) {
	pidfd, err := callerPidfd(ctx, conn, pid)
	if err != nil {
		ctx, cancel := context.WithCancelCause(ctx)
		cancel(err)
		return ctx, func() {}
	}
	return watch(ctx, pidfd)
}

// watch returns a context that ends with ctx or when the process of pidfd
// (non-blocking) exits, with cause errCallerGone, and a function that
// stops watching and ends the context. With no pidfd (nil), the context is
// left to ctx.
func watch(ctx context.Context, pidfd *os.File) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	if pidfd == nil {
		return ctx, func() { cancel(nil) }
	}
	raw, err := pidfd.SyscallConn()
	if err != nil {
		_ = pidfd.Close()
		return ctx, func() { cancel(nil) }
	}
	go func() {
		// Non-blocking, the pidfd waits in the runtime's poller, not in a
		// thread of its own. It is polled on every call, not only after
		// the poller reports: an exit before the file was in the poller
		// is reported once, and may be consumed before the wait begins.
		exited := raw.Read(func(fd uintptr) bool { return readable(int(fd)) })
		if exited == nil { // not ended by Close
			cancel(errCallerGone)
		}
	}()
	ctx = context.WithValue(ctx, callerExitedKey{}, func() bool {
		exited := false
		if raw.Control(func(fd uintptr) { exited = readable(int(fd)) }) == nil && exited {
			cancel(errCallerGone)
		}
		return exited
	})
	return ctx, func() {
		_ = pidfd.Close()
		cancel(nil)
	}
}

// callerExitedKey is the context value of watch: a function that asks the
// kernel whether the caller has exited, without waiting for the watch to
// hear of it.
type callerExitedKey struct{}

// abandoned says why the ADD of ctx is no longer wanted, if it is not:
// errCallerGone if the caller watched in ctx has exited, as the kernel says
// now, or the end of its time (the configuration's timeout, which the
// plugin keeps too). What decides to attach asks it: the runtime sends DEL
// once it killed the plugin, and a DEL that ran before the ADD took the
// container's lock has to be matched by the ADD not attaching; a caller
// that cannot be watched has given up by the end of its time.
func abandoned(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != nil {
		return cause
	}
	return callerExited(ctx)
}

// callerExited is errCallerGone if the caller watched in ctx has exited,
// as the kernel says now.
func callerExited(ctx context.Context) error {
	if cause := context.Cause(ctx); errors.Is(cause, errCallerGone) {
		return cause
	}
	if exited, ok := ctx.Value(callerExitedKey{}).(func() bool); ok && exited() {
		return errCallerGone
	}
	return nil
}

// readable: fd is readable now (a pidfd: its process has exited).
func readable(fd int) bool {
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0
	}
}

// callerPidfd opens a non-blocking pidfd of the process at the other end
// of conn. The kernel names the peer itself (SO_PEERPIDFD, Linux 6.5),
// whatever PID namespace it runs in: containerd runs the plugins in the
// host's, a cluster's agent has its own. Before 6.5 the pid the peer's
// credentials gave is opened instead, which a peer this process does not
// see does not have (0). nil when the caller cannot be watched: its ADD
// then ends at the configuration's timeout; errCallerGone when it has
// exited already.
func callerPidfd(ctx context.Context, conn *net.UnixConn, pid int) (*os.File, error) {
	logger := klog.FromContext(ctx)
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, nil //nolint:nilerr // not watched, as documented
	}
	fd, sockErr := -1, error(nil)
	if err := raw.Control(func(s uintptr) {
		fd, sockErr = unix.GetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return nil, nil //nolint:nilerr // not watched, as documented
	}
	switch {
	case sockErr == nil:
		if err := unix.SetNonblock(fd, true); err != nil {
			_ = unix.Close(fd)
			return nil, nil //nolint:nilerr // not watched, as documented
		}
	case errors.Is(sockErr, unix.ESRCH):
		return nil, errCallerGone
	case pid <= 0:
		logger.V(4).Info("Not watching the plugin: in a PID namespace this one does not see, on a kernel without SO_PEERPIDFD", "error", sockErr.Error())
		return nil, nil
	default:
		if fd, err = unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK); errors.Is(err, unix.ESRCH) {
			return nil, errCallerGone
		}
		if err != nil {
			logger.V(4).Info("Not watching the plugin", "pid", pid, "error", err.Error())
			return nil, nil
		}
	}
	return os.NewFile(uintptr(fd), "pidfd"), nil
}

// handleAdd runs a servable ADD, for as long as callerCtx lasts, and
// makes its answer; ctx is the server's. passed are the paths, here, of
// the files the plugin opened, by their names in the request: they stand
// for the paths the plugin has.
func (s *Server) handleAdd(ctx, callerCtx context.Context, req cniapi.Request, passed map[string]string) cniapi.Response {
	conf, err := cniapi.LoadConfig(req.Args.StdinData)
	if err != nil {
		return failure(err)
	}
	conf.DataDir, conf.NodeNetns = passed[cniapi.FileDataDir], passed[cniapi.FileNodeNetns]
	result, err := s.add(ctx, callerCtx, conf, req.Args, passed[cniapi.FilePodNetns])
	if err != nil {
		return failure(err)
	}
	versioned, err := result.GetAsVersion(conf.CNIVersion)
	if err != nil {
		return failure(fmt.Errorf("the result in CNI version %s: %w", conf.CNIVersion, err))
	}
	data, err := json.Marshal(versioned)
	if err != nil {
		return failure(err)
	}
	return cniapi.Response{Result: data}
}

// failure is the answer for err: a CNI error as it is, any other as the
// spec's generic one.
func failure(err error) cniapi.Response {
	var cniErr *types.Error
	if !errors.As(err, &cniErr) {
		cniErr = &types.Error{Code: types.ErrInternal, Msg: err.Error()}
	}
	return cniapi.Response{Error: cniErr}
}

// changes tells the ADDs waiting for a pod that the cache's copy of it
// changed.
type changes struct {
	mu      sync.Mutex
	waiting map[string][]chan struct{}
}

// wait returns a channel closed at the pod's next change, and a function
// to call once no longer waiting.
func (c *changes) wait(key string) (changed <-chan struct{}, done func()) {
	ch := make(chan struct{})
	c.mu.Lock()
	c.waiting[key] = append(c.waiting[key], ch)
	c.mu.Unlock()
	return ch, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, w := range c.waiting[key] {
			if w == ch {
				c.waiting[key] = append(c.waiting[key][:i], c.waiting[key][i+1:]...)
				break
			}
		}
		if len(c.waiting[key]) == 0 {
			delete(c.waiting, key)
		}
	}
}

func (c *changes) notify(key string) {
	c.mu.Lock()
	chs := c.waiting[key]
	delete(c.waiting, key)
	c.mu.Unlock()
	for _, ch := range chs {
		close(ch)
	}
}
