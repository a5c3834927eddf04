package linux

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/netdev/ifname"
)

// The overlay joins a Network's bridges on several nodes into one layer-2
// segment: a VXLAN device per Network (its VNI from the Network's status),
// a port of the bridge, flooding to the other nodes that realise the
// Network (an all-zero FDB entry per peer, head-end replication) and
// learning the rest, so that it needs neither multicast on the underlay nor
// a control plane for MAC addresses.

// VXLANPort is the IANA VXLAN port.
const VXLANPort = 4789

// vxlanPrefix begins the name of a Network's VXLAN device; the rest is
// derived from its UID as the bridge's name is.
const vxlanPrefix = "netvx"

// VXLANName is the name of the VXLAN device of the Network with this UID.
func VXLANName(uid types.UID) string {
	return vxlanPrefix + ifname.Bridge(uid)[len(ifname.BridgePrefix):]
}

// Overlay says where this node is on the underlay, and which other nodes
// realise each Network.
type Overlay struct {
	// Local is this node's underlay address: VXLAN packets leave from it.
	Local netip.Addr

	mu    sync.Mutex
	peers Peers
	// underlay is the index of the interface with Local, once found.
	underlay atomic.Int32
	// underlayMTU is its MTU when last read, at checkedMTU: every Network
	// derives its own from it, on every Ensure.
	underlayMTU int
	checkedMTU  time.Time
}

// Peers says which other nodes realise a Network: its VXLAN device floods
// to them, and to no other node.
type Peers interface {
	// Of returns the underlay addresses of the other nodes that realise
	// the Network of uid.
	Of(uid types.UID) []netip.Addr
}

// underlayMTUFresh is how long a read of the underlay's MTU is trusted: a
// change of it reaches Networks made or synced after that.
const underlayMTUFresh = 10 * time.Second

// Follow takes the Networks' peers from p from now on; the next Ensure of
// each Network brings its flooding entries in line.
func (o *Overlay) Follow(p Peers) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.peers = p
}

// PeersOf returns the other nodes' underlay addresses that realise the
// Network of uid, sorted, without this node's: none until Follow.
func (o *Overlay) PeersOf(uid types.UID) []netip.Addr {
	o.mu.Lock()
	p := o.peers
	o.mu.Unlock()
	if p == nil {
		return nil
	}
	peers := slices.Clone(p.Of(uid))
	slices.SortFunc(peers, func(a, b netip.Addr) int { return a.Compare(b) })
	peers = slices.Compact(peers)
	return slices.DeleteFunc(peers, func(p netip.Addr) bool { return p == o.Local || !p.IsValid() })
}

// overhead is what VXLAN encapsulation adds to a frame: outer IP, UDP,
// VXLAN and inner Ethernet headers.
func (o *Overlay) overhead() int {
	if o.Local.Is6() {
		return 70
	}
	return 50
}

// underlayMTU is the MTU of the interface that carries the local address,
// read at most every underlayMTUFresh. That interface is looked for once,
// in one address dump, and then only checked: with a bridge per Network,
// looking at every link's addresses for every VXLAN device made would
// cost a dump per link per Network.
func (b *Backend) underlayMTU() (int, error) {
	o := b.overlay
	o.mu.Lock()
	mtu, at := o.underlayMTU, o.checkedMTU
	o.mu.Unlock()
	if mtu != 0 && time.Since(at) < underlayMTUFresh {
		return mtu, nil
	}
	mtu, err := b.readUnderlayMTU()
	if err == nil {
		o.mu.Lock()
		o.underlayMTU, o.checkedMTU = mtu, time.Now()
		o.mu.Unlock()
	}
	return mtu, err
}

// readUnderlayMTU reads the MTU of the interface with the local address.
func (b *Backend) readUnderlayMTU() (int, error) {
	if index := int(b.overlay.underlay.Load()); index != 0 {
		if link, err := b.nl.LinkByIndex(index); err == nil && b.hasLocal(link) {
			return link.Attrs().MTU, nil
		}
	}
	addrs, err := b.addrList(nil)
	if err != nil {
		return 0, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == b.overlay.Local {
			link, err := b.nl.LinkByIndex(a.LinkIndex)
			if err != nil {
				return 0, fmt.Errorf("look up the underlay interface: %w", err)
			}
			b.overlay.underlay.Store(int32(a.LinkIndex))
			return link.Attrs().MTU, nil
		}
	}
	return 0, fmt.Errorf("no interface in this network namespace has the underlay address %s", b.overlay.Local)
}

// defaultMTU is a bridge's MTU on a node of its own: the kernel's.
const defaultMTU = 1500

// mtu is the MTU of want's bridge, VXLAN port and pods' interfaces: its
// own, which must fit the underlay with VXLAN's overhead on a node of an
// overlay; else the most that fits, or the kernel's default on a node of
// its own. On a node of an overlay, a Network whose VNI is still to come
// gets the overlay's MTU from the start: pods attached before its VXLAN
// port keep the MTU they got.
func (b *Backend) mtu(want backend.Network) (int, error) {
	if b.overlay == nil {
		if want.MTU != 0 {
			return want.MTU, nil
		}
		return defaultMTU, nil
	}
	underlay, err := b.underlayMTU()
	if err != nil {
		return 0, err
	}
	most := underlay - b.overlay.overhead()
	if want.MTU == 0 {
		return most, nil
	}
	if want.MTU > most {
		return 0, fmt.Errorf("%w: spec.mtu %d does not fit this node's underlay: its interface has MTU %d and VXLAN adds %d bytes, so at most %d",
			backend.ErrInvalid, want.MTU, underlay, b.overlay.overhead(), most)
	}
	return want.MTU, nil
}

// hasLocal reports whether link carries the overlay's local address.
func (b *Backend) hasLocal(link netlink.Link) bool {
	addrs, err := b.addrList(link)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(addrs, func(a netlink.Addr) bool {
		ip, ok := netip.AddrFromSlice(a.IP)
		return ok && ip.Unmap() == b.overlay.Local
	})
}

// ensureVXLAN converges the VXLAN port of bridge to want.VNI and the
// current peers; a Network without a VNI has none.
func (b *Backend) ensureVXLAN(logger klog.Logger, bridge netlink.Link, want backend.Network, mtu int) (changed bool, err error) {
	if b.overlay == nil && want.VNI == 0 {
		return false, nil // a node of its own: no lookup per Ensure
	}
	name := VXLANName(want.UID)
	link, err := b.nl.LinkByName(name)
	if err != nil && !isLinkNotFound(err) {
		return false, fmt.Errorf("look up VXLAN device %s: %w", name, err)
	}
	if b.overlay == nil || want.VNI == 0 {
		if link != nil {
			if err := b.nl.LinkDel(link); err != nil && !isLinkNotFound(err) {
				return false, fmt.Errorf("delete VXLAN device %s: %w", name, err)
			}
			return true, nil
		}
		return false, nil
	}
	if vx, ok := link.(*netlink.Vxlan); link != nil && (!ok || vx.VxlanId != int(want.VNI) || vx.MasterIndex != bridge.Attrs().Index ||
		!net.IP(b.overlay.Local.AsSlice()).Equal(vx.SrcAddr)) {
		// Another VNI, bridge or local address: made again, not edited
		// (the kernel changes neither on a VXLAN device).
		if err := b.nl.LinkDel(link); err != nil && !isLinkNotFound(err) {
			return false, fmt.Errorf("delete stale VXLAN device %s: %w", name, err)
		}
		logger.Info("Replacing VXLAN device", "vxlan", name, "vni", want.VNI)
		link, changed = nil, true
	}
	if link == nil {
		vx := &netlink.Vxlan{
			LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu, MasterIndex: bridge.Attrs().Index},
			VxlanId:   int(want.VNI),
			SrcAddr:   b.overlay.Local.AsSlice(),
			Port:      VXLANPort,
			Learning:  true,
		}
		addErr := b.nl.LinkAdd(vx)
		if addErr != nil && !errors.Is(addErr, unix.EEXIST) {
			return changed, fmt.Errorf("create VXLAN device %s (VNI %d): %w", name, want.VNI, addErr)
		}
		if link, err = b.nl.LinkByName(name); err != nil {
			if addErr != nil && isLinkNotFound(err) {
				// EEXIST for a name that does not exist: the kernel allows
				// one device per VNI, port and local address.
				return changed, fmt.Errorf("create VXLAN device %s: VNI %d is taken by another VXLAN device in this network namespace (another cluster's?): %w", name, want.VNI, addErr)
			}
			return changed, fmt.Errorf("look up VXLAN device %s after creating it: %w", name, err)
		}
		changed = true
		logger.Info("Created VXLAN device", "vxlan", name, "vni", want.VNI, "mtu", vx.MTU)
	}
	if link.Attrs().MTU != mtu {
		if err := b.nl.LinkSetMTU(link, mtu); err != nil {
			return changed, fmt.Errorf("set the MTU of VXLAN device %s to %d: %w", name, mtu, err)
		}
		changed = true
		logger.Info("Set the VXLAN device's MTU", "vxlan", name, "mtu", mtu)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		// Made down, as bridges are, to come up without IPv6 link-local.
		if err := b.setUp(logger, link, false); err != nil {
			return changed, fmt.Errorf("set VXLAN device %s up: %w", name, err)
		}
		changed = true
	}
	fdbChanged, err := b.ensureFlooding(link, b.overlay.PeersOf(want.UID))
	return changed || fdbChanged, err
}

// ensureFlooding makes the VXLAN device flood to exactly the peers.
func (b *Backend) ensureFlooding(link netlink.Link, peers []netip.Addr) (changed bool, err error) {
	neighs, err := retryDump(func() ([]netlink.Neigh, error) { return b.nl.NeighList(link.Attrs().Index, unix.AF_BRIDGE) })
	if err != nil {
		return false, fmt.Errorf("list forwarding entries of %s: %w", link.Attrs().Name, err)
	}
	zero := net.HardwareAddr{0, 0, 0, 0, 0, 0}
	have := map[netip.Addr]bool{}
	for i := range neighs {
		n := &neighs[i]
		if n.HardwareAddr.String() != zero.String() {
			continue // learned
		}
		ip, _ := netip.AddrFromSlice(n.IP)
		if slices.Contains(peers, ip.Unmap()) {
			have[ip.Unmap()] = true
			continue
		}
		if err := b.nl.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
			return changed, fmt.Errorf("remove forwarding entry to %s from %s: %w", n.IP, link.Attrs().Name, err)
		}
		changed = true
	}
	for _, p := range peers {
		if have[p] {
			continue
		}
		n := &netlink.Neigh{LinkIndex: link.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
			Flags: netlink.NTF_SELF, HardwareAddr: zero, IP: p.AsSlice()}
		if err := b.nl.NeighAppend(n); err != nil && !errors.Is(err, unix.EEXIST) {
			return changed, fmt.Errorf("add forwarding entry to %s on %s: %w", p, link.Attrs().Name, err)
		}
		changed = true
	}
	return changed, nil
}

// deleteVXLAN deletes the VXLAN device of the Network with uid, if any.
func (b *Backend) deleteVXLAN(uid types.UID) error {
	link, err := b.nl.LinkByName(VXLANName(uid))
	if isLinkNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up VXLAN device %s: %w", VXLANName(uid), err)
	}
	if _, ok := link.(*netlink.Vxlan); !ok {
		return nil // not ours: ours are VXLAN devices
	}
	if err := b.nl.LinkDel(link); err != nil && !isLinkNotFound(err) && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete VXLAN device %s: %w", VXLANName(uid), err)
	}
	return nil
}
