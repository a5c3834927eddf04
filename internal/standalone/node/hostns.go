package node

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/vishvananda/netns"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend/linux"
)

// A node has a network namespace of its own (Config.Netns) and is a
// machine of its own as far as networking goes: containerd, the kubelet and
// kube-proxy run there, so host-network pods (netop's agent) see that
// namespace as their host. What the standalone serves on its loopback, the
// API server and the image registry, is forwarded into the node's loopback
// on the same ports, for the kubelet, kube-proxy and containerd.

// inNetns returns args run in the network namespace named netns, by
// nsenter, which changes nothing else: the process keeps the host's mount
// namespace, file system and cgroups. Without a namespace, args.
func inNetns(netns string, args []string) []string {
	if netns == "" {
		return args
	}
	return append([]string{"nsenter", "--net=" + filepath.Join("/run/netns", netns), "--"}, args...)
}

// listenIn listens on addr in the named network namespace. The socket
// stays in that namespace whatever thread later uses it.
func listenIn(name, addr string) (net.Listener, error) {
	target, err := netns.GetFromName(name)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", name, err)
	}
	defer func() { _ = target.Close() }()
	var l net.Listener
	err = linux.InNetns(target, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on %s in network namespace %s: %w", addr, name, err)
	}
	return l, nil
}

// Forwarder copies the connections of its listeners to their targets.
type Forwarder struct {
	listeners []net.Listener
	wg        sync.WaitGroup
}

// Forward accepts on l, in whatever namespace it was made, and connects
// each connection to target from the standalone's own namespace.
func (f *Forwarder) Forward(ctx context.Context, l net.Listener, target string) {
	f.listeners = append(f.listeners, l)
	f.wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return // closed
			}
			go func() {
				defer func() { _ = conn.Close() }()
				var d net.Dialer
				up, err := d.DialContext(ctx, "tcp", target)
				if err != nil {
					klog.FromContext(ctx).V(2).Info("Forwarding a node's connection failed", "to", target, "err", err)
					return
				}
				defer func() { _ = up.Close() }()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, conn); closeWrite(up); done <- struct{}{} }()
				go func() { _, _ = io.Copy(conn, up); closeWrite(conn); done <- struct{}{} }()
				<-done
				<-done
			}()
		}
	})
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// Stop closes the listeners; open connections end with their peers.
func (f *Forwarder) Stop() {
	for _, l := range f.listeners {
		_ = l.Close()
	}
	f.wg.Wait()
}

// startForwarding forwards into the node's namespace the standalone's
// loopback services.
func (n *Node) startForwarding(ctx context.Context) error {
	n.forwarder = &Forwarder{}
	for _, addr := range []string{n.cfg.APIServer, n.cfg.Registry.addr} {
		l, err := listenIn(n.cfg.Netns, addr)
		if err != nil {
			return err
		}
		n.forwarder.Forward(ctx, l, addr)
	}
	return nil
}

// netnsReady checks that the node's namespace exists.
func netnsReady(name string) error {
	if _, err := os.Stat(filepath.Join("/run/netns", name)); err != nil {
		return fmt.Errorf("the node's network namespace %s: %w", name, err)
	}
	return nil
}
