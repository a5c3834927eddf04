package node

import (
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/netop-dev/netop/internal/backend/linux"
)

// Underlay is the network between the nodes and the standalone on one
// machine: a bridge in the standalone's own network namespace, as a switch
// joins machines, each node a network namespace with an eth0 on it, the
// standalone the prefix's first address (Host), and each node's pods a /24
// of PodCIDR routed to its node.
//
// The bridge is named after the nodes' namespaces, so that standalones with
// different --netns have different underlays; its alias says whose it is,
// so that one a killed standalone left is known as stale.
type Underlay struct {
	Prefix netip.Prefix
	// Host is the standalone's address on the underlay: the nodes' default
	// gateway, where the standalone serves the cluster's own Services.
	Host   netip.Addr
	Nodes  []UnderlayNode
	bridge string
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

// underlayAlias starts the alias of every underlay bridge; the nodes'
// namespace prefix follows.
const underlayAlias = "netop-standalone underlay of "

// NewUnderlay makes the underlay of the nodes whose namespaces are named
// netns, each made if missing: the bridge with the prefix's first address,
// the nodes' eth0s with the next ones, default routes to the standalone,
// and routes from the standalone to each node's pods. It is made anew each
// time (Remove first). name names the underlay (the nodes' namespace
// prefix).
func NewUnderlay(name string, prefix netip.Prefix, netnss []string) (*Underlay, error) {
	if !prefix.Addr().Is4() || prefix.Bits() > 28 || len(netnss) > 250 || len(netnss) > 1<<(32-prefix.Bits())-3 {
		return nil, fmt.Errorf("underlay %s: an IPv4 prefix with room for %d nodes", prefix, len(netnss))
	}
	sum := fnv.New32a()
	_, _ = sum.Write([]byte(name))
	u := &Underlay{Prefix: prefix.Masked(), bridge: fmt.Sprintf("ul-%08x", sum.Sum32())}
	u.Host = u.Prefix.Addr().Next()
	pods := netip.MustParsePrefix(PodCIDR)
	addr := u.Host
	for i, name := range netnss {
		addr = addr.Next()
		pod := pods.Addr().As4()
		pod[2] = byte(i + 1)
		u.Nodes = append(u.Nodes, UnderlayNode{Netns: name, Address: addr, PodCIDR: netip.PrefixFrom(netip.AddrFrom4(pod), 24)})
	}
	u.Remove()
	if err := u.checkFree(); err != nil {
		return nil, err
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: u.bridge, Flags: net.FlagUp}}
	if err := netlink.LinkAdd(br); err != nil {
		return nil, fmt.Errorf("underlay bridge %s: %w", u.bridge, err)
	}
	if err := netlink.LinkSetAlias(br, underlayAlias+name); err != nil {
		u.Remove()
		return nil, fmt.Errorf("underlay bridge %s: %w", u.bridge, err)
	}
	if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(u.Host, u.Prefix.Bits()))}); err != nil {
		u.Remove()
		return nil, fmt.Errorf("underlay bridge %s: %w", u.bridge, err)
	}
	for i, n := range u.Nodes {
		if err := u.join(i, n, br); err != nil {
			u.Remove()
			return nil, fmt.Errorf("node %s on the underlay: %w", n.Netns, err)
		}
	}
	for _, n := range u.Nodes {
		if err := u.routePeers(n); err != nil {
			u.Remove()
			return nil, fmt.Errorf("node %s on the underlay: %w", n.Netns, err)
		}
	}
	return u, nil
}

// routePeers routes, in node n, each other node's pods to that node
// across the underlay, as one switch joins them: pods reach pods on other
// nodes without the host forwarding (its ip_forward is the developer's).
func (u *Underlay) routePeers(n UnderlayNode) error {
	ns, err := netns.GetFromName(n.Netns)
	if err != nil {
		return err
	}
	defer func() { _ = ns.Close() }()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	for _, peer := range u.Nodes {
		if peer.Netns == n.Netns {
			continue
		}
		if err := h.RouteReplace(&netlink.Route{Dst: ipNet(peer.PodCIDR), Gw: peer.Address.AsSlice()}); err != nil {
			return fmt.Errorf("route to %s's pods %s: %w", peer.Netns, peer.PodCIDR, err)
		}
	}
	return nil
}

// checkFree refuses an underlay whose addresses or pod routes another one
// holds, and removes underlays whose standalone was killed: their nodes'
// namespaces are gone, and with them their ports.
func (u *Underlay) checkFree() error {
	links, err := netlink.LinkList()
	if err != nil {
		return err
	}
	for _, link := range links {
		alias := link.Attrs().Alias
		if !strings.HasPrefix(alias, underlayAlias) {
			continue
		}
		if !hasPorts(link, links) {
			_ = netlink.LinkDel(link)
			continue
		}
		addrs, _ := netlink.AddrList(link, netlink.FAMILY_V4)
		for _, a := range addrs {
			if p, ok := netip.AddrFromSlice(a.IP); ok && u.Prefix.Overlaps(netip.PrefixFrom(p.Unmap(), 32)) {
				return fmt.Errorf("--underlay-cidr %s: %s of %s (%s) is in it: another netop-standalone runs; give each its own --netns and --underlay-cidr", u.Prefix, a.IPNet, link.Attrs().Name, alias)
			}
		}
	}
	return nil
}

func hasPorts(bridge netlink.Link, links []netlink.Link) bool {
	for _, l := range links {
		if l.Attrs().MasterIndex == bridge.Attrs().Index {
			return true
		}
	}
	return false
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// join plugs node i into the underlay.
func (u *Underlay) join(i int, n UnderlayNode, br *netlink.Bridge) error {
	if err := linux.EnsureNetns(n.Netns); err != nil {
		return err
	}
	ns, err := netns.GetFromName(n.Netns)
	if err != nil {
		return err
	}
	defer func() { _ = ns.Close() }()
	port := fmt.Sprintf("%s-%d", u.bridge, i)
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
	if err := h.RouteAdd(&netlink.Route{Gw: u.Host.AsSlice()}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	if err := linux.WriteSysctl(ns, "/proc/sys/net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	// The standalone (the API server calling webhooks, kubectl
	// port-forward) reaches the node's pods through it.
	if err := netlink.RouteAdd(&netlink.Route{Dst: ipNet(n.PodCIDR), Gw: n.Address.AsSlice()}); err != nil {
		return fmt.Errorf("route to the pods %s: %w (another netop-standalone's nodes?)", n.PodCIDR, err)
	}
	return nil
}

// Remove deletes the underlay bridge, which takes the nodes' veths and the
// routes through it along. The nodes' namespaces stay, for the caller.
func (u *Underlay) Remove() {
	if link, err := netlink.LinkByName(u.bridge); err == nil {
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
