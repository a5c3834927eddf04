// Package linux provides Networks as Linux bridges on the node that runs
// netop, so that netop works without any cloud: a Network becomes a bridge
// carrying the gateway address, which containers or VMs can be attached to.
//
// The backend keeps no state of its own. Everything it needs to find its
// bridges again after a crash is on the bridges themselves: the name is
// derived from the Network's UID and the interface alias records the owner.
// It can work in a named network namespace instead of the host's, so that
// tests and experiments cannot disturb the node's own networking.
package linux

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/capability"
)

var (
	_ backend.Backend      = (*Backend)(nil)
	_ backend.DriftWatcher = (*Backend)(nil)
)

// Config configures the Linux bridge backend.
type Config struct {
	// Netns is the name of the network namespace to work in, as in
	// /run/netns/NAME (what `ip netns` uses); it is created if missing.
	// Empty means the namespace of the netop process itself.
	Netns string
	// Overlay, if set, joins each Network's bridges across nodes with a
	// VXLAN device (Networks with a VNI only).
	Overlay *Overlay
}

// Backend provides Networks as Linux bridges. Its methods are safe for
// concurrent use, except Close.
type Backend struct {
	netnsName string
	// ns is kept open for the lifetime of the backend so that drift
	// subscriptions are opened in the same namespace as the handle, even
	// if the name is deleted or reused meanwhile.
	ns     netns.NsHandle
	handle *handle
	// nl is handle, behind an interface so that tests can see which
	// netlink calls an operation makes.
	nl        netlinkOps
	closeOnce sync.Once
	overlay   *Overlay
	// ipv6SysctlUnavailable is set once writing a link's IPv6 sysctl
	// failed for a reason that holds for every link.
	ipv6SysctlUnavailable atomic.Bool
	// isolation keeps the bridges apart from one another and from the
	// node (isolation.go).
	isolation *isolation
	// firewall enforces network policies (firewall.go).
	firewall *Firewall
}

// netlinkOps is the part of *netlink.Handle that the backend uses.
type netlinkOps interface {
	LinkByName(name string) (netlink.Link, error)
	LinkByIndex(index int) (netlink.Link, error)
	LinkList() ([]netlink.Link, error)
	AddrList(link netlink.Link, family int) ([]netlink.Addr, error)
	LinkAdd(link netlink.Link) error
	LinkDel(link netlink.Link) error
	LinkSetAlias(link netlink.Link, alias string) error
	LinkSetGroup(link netlink.Link, group int) error
	LinkSetMTU(link netlink.Link, mtu int) error
	LinkSetUp(link netlink.Link) error
	LinkSetIP6AddrGenMode(link netlink.Link, mode int) error
	AddrAdd(link netlink.Link, addr *netlink.Addr) error
	AddrDel(link netlink.Link, addr *netlink.Addr) error
	NeighList(linkIndex, family int) ([]netlink.Neigh, error)
	NeighAppend(neigh *netlink.Neigh) error
	NeighDel(neigh *netlink.Neigh) error
}

// New returns a backend working in cfg.Netns. It fails early, with advice,
// when netop lacks the privileges to manage links, rather than on the first
// Network.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	logger := klog.FromContext(ctx)

	if err := checkNetAdmin(); err != nil {
		return nil, err
	}

	var (
		ns  netns.NsHandle
		err error
	)
	if cfg.Netns == "" {
		// The namespace netop runs in, without entering it: setns needs
		// CAP_SYS_ADMIN, which an agent with NET_ADMIN alone lacks. Every
		// goroutine that enters another namespace (the standalone's
		// node forwarders) leaves it before unlocking its thread.
		ns = netns.None()
	} else {
		if err := EnsureNetns(cfg.Netns); err != nil {
			return nil, err
		}
		ns, err = netns.GetFromName(cfg.Netns)
		if err != nil {
			return nil, fmt.Errorf("open network namespace %q: %w", cfg.Netns, err)
		}
	}

	h, strict, err := newHandle(ns)
	if err != nil {
		_ = ns.Close()
		return nil, fmt.Errorf("open netlink in network namespace %q: %w", cfg.Netns, err)
	}

	if !strict {
		logger.Info("This kernel refuses NETLINK_GET_STRICT_CHK: each bridge check lists every address of the namespace, which slows down with many bridges", "netns", cfg.Netns)
	}
	logger.V(2).Info("Linux bridge backend ready", "netns", cfg.Netns)
	return &Backend{netnsName: cfg.Netns, ns: ns, handle: h, nl: h, overlay: cfg.Overlay, isolation: &isolation{ns: ns}, firewall: &Firewall{ns: ns}}, nil
}

// Close releases the netlink handle and the namespace. The backend must not
// be used afterwards.
func (b *Backend) Close() {
	b.closeOnce.Do(func() {
		if b.handle != nil {
			b.handle.Close()
		}
		if b.ns.IsOpen() {
			_ = b.ns.Close()
		}
	})
}

// Type is backend.TypeLinux.
func (b *Backend) Type() backend.Type { return backend.TypeLinux }

func checkNetAdmin() error {
	has, err := capability.Has(capability.NetAdmin)
	if err != nil {
		return err
	}
	if !has {
		return errors.New("linux backend needs CAP_NET_ADMIN: run netop as root or grant the capability (or use --backend=neutron)")
	}
	return nil
}
