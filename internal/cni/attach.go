// Package cni attaches pods to Networks on a node: for each Network a pod
// joins, a veth pair whose host end is a port of the Network's bridge (in
// the node's network namespace, where netop makes its bridges) and whose
// other end is the pod's interface (net1, …) with the pod's address. It is
// the part of netop's CNI plugin below the CNI protocol: ADD, CHECK and an
// idempotent DEL that needs nothing but the node (the host end's name is
// derived from the container and interface, so DEL works when the API
// server is down and when the pod's namespace is gone).
package cni

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/netdev/linklocal"
)

// Attachment is one pod interface on a Network's bridge.
type Attachment struct {
	ContainerID string
	// Netns is the path of the pod's network namespace (CNI_NETNS).
	Netns string
	// Interface is the pod's interface (CNI_IFNAME).
	Interface string
	// Bridge is the Network's bridge in the node's namespace.
	Bridge string
	// Addresses have the Network's prefix length, so that the pod gets
	// the connected route of the cidr.
	Addresses []netip.Prefix
	// MAC is the pod interface's address; nil lets the kernel choose.
	MAC net.HardwareAddr
	// Routes are the routes the interface carries besides its cidrs'.
	Routes []Route
}

// Route leads to Dst through GW, an address of the interface's Network.
type Route struct {
	Dst netip.Prefix
	GW  netip.Addr
}

// Attached is what an attachment made.
type Attached struct {
	HostVeth string
	MAC      net.HardwareAddr
}

// Attacher works in one node namespace.
type Attacher struct {
	node *netlink.Handle
	// route is a netlink socket in the node namespace for the requests
	// netlink.Handle cannot make (newVeth), opened by the first of them:
	// DEL, CHECK and GC never need it.
	routeOnce sync.Once
	route     *nl.SocketHandle
	routeErr  error
	// ns is a copy of the node namespace's handle, for waitBridge's
	// subscriptions; None for the attacher's own namespace.
	ns netns.NsHandle
}

// NewAttacher works in the node namespace ns (the attacher keeps a copy of
// the handle, not ns itself).
func NewAttacher(ns netns.NsHandle) (*Attacher, error) {
	own := netns.None()
	if ns.IsOpen() {
		fd, err := unix.Dup(int(ns))
		if err != nil {
			return nil, fmt.Errorf("the node's network namespace: %w", err)
		}
		own = netns.NsHandle(fd)
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		_ = own.Close()
		return nil, fmt.Errorf("netlink in the node's network namespace: %w", err)
	}
	return &Attacher{node: h, ns: own}, nil
}

// routeSocket is the attacher's own netlink socket in the node namespace.
func (a *Attacher) routeSocket() (*nl.SocketHandle, error) {
	a.routeOnce.Do(func() {
		s, err := nl.GetNetlinkSocketAt(a.ns, netns.None(), unix.NETLINK_ROUTE)
		if err != nil {
			a.routeErr = fmt.Errorf("netlink in the node's network namespace: %w", err)
			return
		}
		a.route = &nl.SocketHandle{Socket: s}
	})
	return a.route, a.routeErr
}

// Close releases the attacher.
func (a *Attacher) Close() {
	a.node.Close()
	if a.route != nil {
		a.route.Close()
	}
	if a.ns.IsOpen() {
		_ = a.ns.Close()
	}
}

// waitBridge returns the bridge named name once it is up in the node's
// namespace (the agent brings a Network's bridge up once it is whole), or
// an error when ctx is done first. A node realises a Network when a pod
// there first needs it, so the bridge may still be coming: this waits on
// the kernel's link notifications, not by polling.
func (a *Attacher) waitBridge(ctx context.Context, name string) (netlink.Link, error) {
	up := func(l netlink.Link) bool { return l.Attrs().Flags&net.FlagUp != 0 }
	if l, err := a.node.LinkByName(name); err == nil && up(l) {
		return l, nil
	}
	updates := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	subscribeErr := make(chan error, 1)
	opts := netlink.LinkSubscribeOptions{ErrorCallback: func(err error) {
		select {
		case subscribeErr <- err:
		default:
		}
	}}
	if a.ns.IsOpen() {
		opts.Namespace = &a.ns
	}
	if err := netlink.LinkSubscribeWithOptions(updates, done, opts); err != nil {
		return nil, fmt.Errorf("bridge %s of the network: watching the node's links: %w", name, err)
	}
	// It may have come up between the first look and the subscription.
	if l, err := a.node.LinkByName(name); err == nil && up(l) {
		return l, nil
	}
	for {
		select {
		case u, ok := <-updates:
			if !ok {
				return nil, fmt.Errorf("bridge %s of the network: the node's link notifications ended", name)
			}
			if u.Header.Type == unix.RTM_NEWLINK && u.Attrs().Name == name && up(u.Link) {
				return u.Link, nil
			}
		case err := <-subscribeErr:
			return nil, fmt.Errorf("bridge %s of the network: watching the node's links: %w", name, err)
		case <-ctx.Done():
			return nil, fmt.Errorf("bridge %s of the network is not up on this node (its agent builds it once it sees a pod here on the Network): %w", name, context.Cause(ctx))
		}
	}
}

// Add attaches the pod, once the Network's bridge is up on the node (up
// to ctx). An attachment left by an earlier ADD of the same container and
// interface is replaced; on failure nothing is left.
//
// Every link operation takes the kernel's RTNL lock, which all the ADDs
// on a node contend for: the common case does only what it must (newVeth's
// two, the pod end's index, its link-local mode on a Network without IPv6,
// its addresses, up, its routes; earlier attachments are looked for only
// when newVeth finds a name taken).
func (a *Attacher) Add(ctx context.Context, at Attachment) (_ Attached, err error) {
	bridge, err := a.waitBridge(ctx, at.Bridge)
	if err != nil {
		return Attached{}, err
	}
	podNS, err := netns.GetFromPath(at.Netns)
	if err != nil {
		return Attached{}, fmt.Errorf("pod network namespace %s: %w", at.Netns, err)
	}
	defer func() { _ = podNS.Close() }()
	pod, err := netlink.NewHandleAt(podNS, unix.NETLINK_ROUTE)
	if err != nil {
		return Attached{}, fmt.Errorf("netlink in the pod's network namespace: %w", err)
	}
	defer pod.Close()

	hostVeth := ifname.HostVeth(at.ContainerID, at.Interface)
	err = a.newVeth(hostVeth, bridge, at.Interface, podNS, at.MAC)
	if errors.Is(err, unix.EEXIST) {
		// The pod has the interface, or an earlier ADD left the host end.
		if _, err := pod.LinkByName(at.Interface); err == nil {
			return Attached{}, fmt.Errorf("interface %s: the pod already has one", at.Interface)
		}
		if err := a.deleteLink(hostVeth); err != nil {
			return Attached{}, err
		}
		err = a.newVeth(hostVeth, bridge, at.Interface, podNS, at.MAC)
	}
	if err != nil {
		return Attached{}, fmt.Errorf("creating veth %s for %s: %w", hostVeth, at.Interface, err)
	}
	defer func() {
		if err != nil {
			_ = a.deleteLink(hostVeth) // takes the pod's end with it
		}
	}()
	link, err := pod.LinkByName(at.Interface)
	if err != nil {
		return Attached{}, fmt.Errorf("the pod's end %s: %w", at.Interface, err)
	}
	if !slices.ContainsFunc(at.Addresses, func(p netip.Prefix) bool { return p.Addr().Is6() }) {
		// Before it is up: no IPv6 link-local address on an interface of
		// a Network without IPv6, and so none of its chatter.
		if err := linklocal.Off(pod, link); err != nil {
			return Attached{}, fmt.Errorf("turning off IPv6 link-local addressing on %s: %w", at.Interface, err)
		}
	}
	for _, addr := range at.Addresses {
		a := &netlink.Addr{IPNet: IPNet(addr)}
		if addr.Addr().Is6() {
			// Unique by allocation: duplicate address detection would
			// only keep the address unusable for its first second.
			a.Flags = unix.IFA_F_NODAD
		}
		if err := pod.AddrAdd(link, a); err != nil {
			return Attached{}, fmt.Errorf("adding %s to %s: %w", addr, at.Interface, err)
		}
	}
	if err := pod.LinkSetUp(link); err != nil {
		return Attached{}, fmt.Errorf("setting %s up: %w", at.Interface, err)
	}
	for _, r := range at.Routes {
		if err := pod.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: IPNet(r.Dst), Gw: r.GW.AsSlice()}); err != nil {
			return Attached{}, fmt.Errorf("adding the route to %s via %s on %s: %w", r.Dst, r.GW, at.Interface, err)
		}
	}
	return Attached{HostVeth: hostVeth, MAC: link.Attrs().HardwareAddr}, nil
}

// ErrNotAsAttached is what Check says when the attachment is not as Add
// makes it (a part missing, down, off its bridge, an address or route
// gone), as against not knowing (the bridge not there, a namespace or
// netlink failing): only the first is mended by making it again.
var ErrNotAsAttached = errors.New("not as attached")

// Check reports what differs from the attachment (ErrNotAsAttached), or
// why it cannot tell, or nil.
func (a *Attacher) Check(at Attachment) error {
	bridge, err := a.node.LinkByName(at.Bridge)
	if err != nil {
		return fmt.Errorf("bridge %s of the network: %w", at.Bridge, err)
	}
	notAttached := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrNotAsAttached, fmt.Sprintf(format, args...))
	}
	host, err := a.node.LinkByName(ifname.HostVeth(at.ContainerID, at.Interface))
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return notAttached("host end of %s: %v", at.Interface, err)
	}
	if err != nil {
		return fmt.Errorf("host end of %s: %w", at.Interface, err)
	}
	if host.Attrs().MasterIndex != bridge.Attrs().Index {
		return notAttached("host end %s: not a port of bridge %s", host.Attrs().Name, at.Bridge)
	}
	podNS, err := netns.GetFromPath(at.Netns)
	if err != nil {
		return fmt.Errorf("pod network namespace %s: %w", at.Netns, err)
	}
	defer func() { _ = podNS.Close() }()
	pod, err := netlink.NewHandleAt(podNS, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink in the pod's network namespace: %w", err)
	}
	defer pod.Close()
	link, err := pod.LinkByName(at.Interface)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return notAttached("interface %s: %v", at.Interface, err)
	}
	if err != nil {
		return fmt.Errorf("interface %s: %w", at.Interface, err)
	}
	if link.Attrs().OperState == netlink.OperDown || link.Attrs().Flags&net.FlagUp == 0 {
		return notAttached("interface %s: down", at.Interface)
	}
	have, err := pod.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("interface %s: listing its addresses: %w", at.Interface, err)
	}
	for _, want := range at.Addresses {
		if !slices.ContainsFunc(have, func(h netlink.Addr) bool { return h.IPNet.String() == IPNet(want).String() }) {
			return notAttached("interface %s: no address %s", at.Interface, want)
		}
	}
	if len(at.Routes) == 0 {
		return nil
	}
	routes, err := pod.RouteList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("interface %s: listing its routes: %w", at.Interface, err)
	}
	for _, want := range at.Routes {
		if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
			return r.Dst != nil && r.Dst.String() == IPNet(want.Dst).String() && r.Gw.Equal(want.GW.AsSlice())
		}) {
			return notAttached("interface %s: no route to %s via %s", at.Interface, want.Dst, want.GW)
		}
	}
	return nil
}

// Del detaches the pod's interface: the host end goes, and the pod's end
// with it. Nothing to detach is not an error.
func (a *Attacher) Del(containerID, iface string) error {
	return a.deleteLink(ifname.HostVeth(containerID, iface))
}

// newVeth makes the veth pair in one RTM_NEWLINK: the host end hostVeth
// up, a port of bridge, with its MTU; the pod end podIface in podNS, with
// the same MTU and mac (the kernel's choice if nil). netlink's LinkAdd
// would set the master in two more requests (a lookup and RTM_SETLINK).
// A second request turns off the host end's IPv6 link-local address.
func (a *Attacher) newVeth(hostVeth string, bridge netlink.Link, podIface string, podNS netns.NsHandle, mac net.HardwareAddr) error {
	route, err := a.routeSocket()
	if err != nil {
		return err
	}
	mtu := nl.Uint32Attr(uint32(bridge.Attrs().MTU))
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: route}
	host := nl.NewIfInfomsg(unix.AF_UNSPEC)
	host.Change, host.Flags = unix.IFF_UP, unix.IFF_UP
	req.AddData(host)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(hostVeth)))
	req.AddData(nl.NewRtAttr(unix.IFLA_MTU, mtu))
	req.AddData(nl.NewRtAttr(unix.IFLA_MASTER, nl.Uint32Attr(uint32(bridge.Attrs().Index))))
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("veth"))
	peer := info.AddRtAttr(nl.IFLA_INFO_DATA, nil).AddRtAttr(nl.VETH_INFO_PEER, nil)
	// Not up here: the kernel configures the pod end before it pairs the
	// ends, and a veth without its peer refuses to open (ENOTCONN).
	nl.NewIfInfomsgChild(peer, unix.AF_UNSPEC)
	peer.AddRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(podIface))
	peer.AddRtAttr(unix.IFLA_MTU, mtu)
	if mac != nil {
		peer.AddRtAttr(unix.IFLA_ADDRESS, []byte(mac))
	}
	peer.AddRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(podNS)))
	req.AddData(info)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return err
	}
	// A bridge port needs no IPv6 address. Its link-local one would be
	// chatter (duplicate address detection, router solicitations, MLD
	// reports) that the bridge floods to every other port, each pod's
	// new interface costing the node in proportion to the pods on the
	// Network. The kernel takes the mode only on an existing link; the
	// host end has no carrier until the pod end is up, so it has made no
	// address yet.
	if err := linklocal.OffByName(route, hostVeth); err != nil {
		err = fmt.Errorf("turning off IPv6 link-local addressing on %s: %w", hostVeth, err)
		return errors.Join(err, a.deleteLink(hostVeth))
	}
	return nil
}

// HostVeths lists the host ends netop made on this node.
func (a *Attacher) HostVeths() ([]netlink.Link, error) {
	links, err := a.node.LinkList()
	if err != nil {
		return nil, err
	}
	var veths []netlink.Link
	for _, l := range links {
		if l.Type() == "veth" && ifname.IsHostVeth(l.Attrs().Name) {
			veths = append(veths, l)
		}
	}
	return veths, nil
}

// DeleteHostVeth deletes a host end HostVeths listed, for GC of ends no
// record knows; one that is gone already is not an error. By its index,
// not its name: a host end's name is its container's and interface's, so
// the link of that name may be one made since the listing (hot-plug moving
// an interface to another Network), which a record knows.
func (a *Attacher) DeleteHostVeth(link netlink.Link) error {
	if err := a.node.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("deleting %s: %w", link.Attrs().Name, err)
	}
	return nil
}

func (a *Attacher) deleteLink(name string) error {
	link, err := a.node.LinkByName(name)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	if err := a.node.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// IPNet is p in the form netlink and CNI results take.
func IPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// AttacherIn works in the namespace of the Networks' bridges at path, or
// in the process's own if path is "".
func AttacherIn(path string) (*Attacher, error) {
	var ns netns.NsHandle
	var err error
	if path == "" {
		ns, err = netns.Get()
	} else {
		ns, err = netns.GetFromPath(path)
	}
	if err != nil {
		return nil, fmt.Errorf("node network namespace %q: %w", path, err)
	}
	defer func() { _ = ns.Close() }()
	return NewAttacher(ns)
}
