package node

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netop-dev/netop/internal/backend/linux"
)

// UnderlayBridge is the bridge, in the standalone's own network namespace,
// that joins the nodes of `netop-standalone --nodes N` as a switch joins
// machines.
const UnderlayBridge = "netop-underlay"

// Underlay is the network between several nodes on one machine: each node
// is a network namespace with an eth0 on UnderlayBridge, the standalone
// the first address of the prefix, and each node's pods a /24 of PodCIDR
// routed to its node.
type Underlay struct {
	Prefix netip.Prefix
	Nodes  []UnderlayNode
}

// UnderlayNode is one node on the underlay.
type UnderlayNode struct {
	// Netns is the node's network namespace.
	Netns string
	// Address is its InternalIP.
	Address netip.Addr
	// PodCIDR is its pods' network.
	PodCIDR netip.Prefix
}

// NewUnderlay makes the underlay of the nodes whose namespaces are named
// netns, each made if missing: the bridge with the prefix's first address,
// the nodes' eth0s with the next ones, default routes to the standalone,
// and routes from the standalone to each node's pods. It is made anew each
// time (Remove first). serviceIP, the kubernetes Service's address, is
// each node's own, for its forwarder to the API server.
func NewUnderlay(prefix netip.Prefix, netnss []string, serviceIP netip.Addr) (*Underlay, error) {
	if !prefix.Addr().Is4() || prefix.Bits() > 28 || len(netnss) > 250 || len(netnss) > 1<<(32-prefix.Bits())-3 {
		return nil, fmt.Errorf("underlay %s: an IPv4 prefix with room for %d nodes", prefix, len(netnss))
	}
	u := &Underlay{Prefix: prefix.Masked()}
	host := u.Prefix.Addr().Next()
	pods := netip.MustParsePrefix(PodCIDR)
	addr := host
	for i, name := range netnss {
		addr = addr.Next()
		pod := pods.Addr().As4()
		pod[2] = byte(i + 1)
		u.Nodes = append(u.Nodes, UnderlayNode{Netns: name, Address: addr, PodCIDR: netip.PrefixFrom(netip.AddrFrom4(pod), 24)})
	}
	u.Remove()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: UnderlayBridge, Flags: net.FlagUp}}
	if err := netlink.LinkAdd(br); err != nil {
		return nil, fmt.Errorf("underlay bridge %s: %w", UnderlayBridge, err)
	}
	if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(host, u.Prefix.Bits()))}); err != nil {
		return nil, fmt.Errorf("underlay bridge %s: %w", UnderlayBridge, err)
	}
	for i, n := range u.Nodes {
		if err := u.join(i, n, br, host, serviceIP); err != nil {
			u.Remove()
			return nil, fmt.Errorf("node %s on the underlay: %w", n.Netns, err)
		}
	}
	return u, nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// join plugs node i into the underlay.
func (u *Underlay) join(i int, n UnderlayNode, br *netlink.Bridge, host, serviceIP netip.Addr) error {
	if err := linux.EnsureNetns(n.Netns); err != nil {
		return err
	}
	ns, err := netns.GetFromName(n.Netns)
	if err != nil {
		return err
	}
	defer func() { _ = ns.Close() }()
	port := fmt.Sprintf("%s-%d", "netop-ul", i)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port, MasterIndex: br.Index, Flags: net.FlagUp},
		PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s: %w", port, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	for _, name := range []string{"lo", "eth0"} {
		link, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(link); err != nil {
			return err
		}
		if name == "eth0" {
			if err := h.AddrAdd(link, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(n.Address, u.Prefix.Bits()))}); err != nil {
				return err
			}
		}
	}
	if err := h.RouteAdd(&netlink.Route{Gw: host.AsSlice()}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	// The kubernetes Service's address is the node's own: its forwarder
	// listens there (hostns.go).
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := h.AddrAdd(lo, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(serviceIP, 32))}); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("service address: %w", err)
	}
	if err := linux.WriteSysctl(ns, "/proc/sys/net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	// The standalone (the API server calling webhooks, kubectl
	// port-forward) reaches the node's pods through it.
	return netlink.RouteAdd(&netlink.Route{Dst: ipNet(n.PodCIDR), Gw: n.Address.AsSlice()})
}

// Remove deletes the underlay bridge, which takes the nodes' veths and the
// routes through it along. The nodes' namespaces stay, for the caller.
func (u *Underlay) Remove() {
	if link, err := netlink.LinkByName(UnderlayBridge); err == nil {
		// Its ports first: deleting a bridge only frees them.
		links, _ := netlink.LinkList()
		for _, l := range links {
			if l.Attrs().MasterIndex == link.Attrs().Index {
				_ = netlink.LinkDel(l)
			}
		}
		_ = netlink.LinkDel(link)
	}
}
