package linux

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/netdev/linklocal"
)

// ErrForeign is wrapped by errors about an interface that has a bridge's
// name but belongs to someone else; netop never takes such an interface over.
var ErrForeign = errors.New("interface is not owned by this Network")

const (
	// maxAliasLen is IFALIASZ without the terminating NUL.
	maxAliasLen = 255

	// dumpRetries bounds retries of dumps interrupted by concurrent
	// changes, whose results may be inconsistent.
	dumpRetries = 5
)

// validUID accepts UIDs that give a full bridge name and a parsable alias.
func validUID(uid types.UID) bool {
	if len(uid) == 0 || len(uid) > 128 {
		return false
	}
	digits := 0
	for i := 0; i < len(uid); i++ {
		switch c := uid[i]; {
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f', 'A' <= c && c <= 'F':
			digits++
		case c == '-':
		default:
			return false
		}
	}
	return digits >= ifname.BridgeUIDDigits
}

// Alias returns the interface alias that marks a bridge as owner's:
// "netop:<namespace>/<name>/<uid>". The name, then the namespace, is
// shortened to fit the kernel's limit; the UID is kept whole because it is
// what ownership is decided by.
func Alias(owner backend.Owner) string { return owner.Record(maxAliasLen) }

// ParseAlias returns the owner recorded in an interface alias made by
// Alias, and false for any other alias.
func ParseAlias(alias string) (backend.Owner, bool) {
	owner, ok := backend.ParseRecord(alias)
	if !ok || !validUID(owner.UID) {
		return backend.Owner{}, false
	}
	return owner, true
}

// Ensure converges the bridge of want.Owner. The bridge is found by its
// derived name, so recorded is not needed.
func (b *Backend) Ensure(ctx context.Context, want backend.Network, _ *backend.Ref) (backend.Result, error) {
	if err := ctx.Err(); err != nil {
		return backend.Result{}, err
	}
	if !validUID(want.UID) {
		return backend.Result{}, fmt.Errorf("invalid UID %q", want.UID)
	}
	if err := want.Validate(); err != nil {
		return backend.Result{}, err
	}
	name := ifname.Bridge(want.UID)
	logger := klog.FromContext(ctx).WithValues("bridge", name, "netns", b.netnsName)
	res := backend.Result{Status: backend.Ref{Type: backend.TypeLinux, Interface: name}}

	mtu, err := b.mtu(want)
	if err != nil {
		return res, err
	}
	link, err := b.nl.LinkByName(name)
	if isLinkNotFound(err) {
		var created netlink.Link
		created, err = b.create(name, want.Owner, mtu)
		switch {
		case err != nil:
			return res, err
		case created != nil:
			res.Action = backend.ActionCreated
			logger.Info("Created bridge", "owner", created.Attrs().Alias)
			link = created
		default:
			link, err = b.nl.LinkByName(name)
		}
	}
	if err != nil {
		return res, fmt.Errorf("look up bridge %s: %w", name, err)
	}

	changed, err := b.converge(logger, link, want, mtu)
	if err == nil {
		var vxChanged bool
		vxChanged, err = b.ensureVXLAN(logger, link, want, mtu)
		changed = changed || vxChanged
	}
	if changed && res.Action == backend.ActionNone {
		res.Action = backend.ActionUpdated
	}
	if err != nil {
		return res, err
	}
	if res.Action == backend.ActionCreated || link.Attrs().Group != BridgeGroup {
		// A new bridge, or one of a netop from before isolation: a
		// bridge already in the group has its element, or the drift
		// watch and the resync put it back.
		if err := b.isolation.add(b.nl.LinkList, link.Attrs().Index); err != nil {
			return res, err
		}
	}
	egressChanged, err := b.isolation.setEgress(link.Attrs().Index, want.Egress)
	if err != nil {
		return res, err
	}
	if egressChanged && res.Action == backend.ActionNone {
		res.Action = backend.ActionUpdated
		logger.Info("Set the Network's egress", "egress", want.Egress)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		// Up last: the CNI plugin attaches a pod once the bridge is up,
		// and by then it is whole (addresses, VXLAN port, isolation).
		ipv6 := slices.ContainsFunc(want.Families, func(f backend.Family) bool { return f.Gateway.Is6() })
		if err := b.setUp(logger, link, ipv6); err != nil {
			return res, fmt.Errorf("set bridge %s up: %w", name, err)
		}
		if res.Action == backend.ActionNone {
			res.Action = backend.ActionUpdated
		}
		logger.V(2).Info("Set bridge up")
	}
	if res.Action == backend.ActionNone {
		logger.V(5).Info("Bridge is up to date")
	}
	return res, nil
}

// create adds the bridge, up and marked as owner's, and returns it as
// created; nil if someone else created the name first. The kernel ignores
// IFLA_IFALIAS when it creates a link, so the alias is set right after:
// if netop dies in between, the next Ensure adopts the unmarked bridge by
// its derived name.
func (b *Backend) create(name string, owner backend.Owner, mtu int) (netlink.Link, error) {
	// Made down: converge turns IPv6 address generation off before it
	// brings the bridge up. Multicast snooping off: a snooping bridge
	// joins the all-snoopers group and reports it, and over an overlay
	// every node's bridges receive every report, each routed through a
	// table with a route per device (O(N²) per node, as with link-local
	// addresses; see setUp). Pods' multicast is flooded, as a snooping
	// bridge without a querier floods it anyway.
	snooping := false
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, Group: BridgeGroup, MTU: mtu}, MulticastSnooping: &snooping}
	err := b.nl.LinkAdd(br)
	if errors.Is(err, unix.EEXIST) {
		return nil, nil // converge decides whether it is ours
	}
	if err != nil {
		return nil, fmt.Errorf("create bridge %s: %w", name, err)
	}
	if br.Index == 0 {
		// LinkAdd looks the index up itself; this is only if that failed.
		link, err := b.nl.LinkByName(name)
		if err != nil {
			return nil, fmt.Errorf("look up bridge %s after creating it: %w", name, err)
		}
		br.Index = link.Attrs().Index
	}
	alias := Alias(owner)
	if err := b.nl.LinkSetAlias(br, alias); err != nil {
		return nil, fmt.Errorf("mark new bridge %s as owned (the next attempt adopts it): %w", name, err)
	}
	br.Alias = alias
	return br, nil
}

// converge brings an existing link to want, refusing links that are not
// ours. A link that already matches costs one address dump and no change.
func (b *Backend) converge(logger klog.Logger, link netlink.Link, want backend.Network, mtu int) (changed bool, err error) {
	attrs := link.Attrs()
	name := attrs.Name

	if link.Type() != "bridge" {
		return false, fmt.Errorf("%w: %s is of type %s, not a bridge; remove or rename it", ErrForeign, name, link.Type())
	}
	wantAlias := Alias(want.Owner)
	if attrs.Alias != wantAlias {
		// An empty alias on a bridge with our derived name is one that
		// netop created and then crashed before marking; adopt it.
		if attrs.Alias != "" {
			// A record without a cluster is adopted by the cluster
			// whose Network has its UID; another cluster's is foreign.
			if owner, ok := ParseAlias(attrs.Alias); !ok || !want.Claims(owner) {
				return false, fmt.Errorf("%w: bridge %s has alias %q, not the UID %s of cluster %q", ErrForeign, name, attrs.Alias, want.UID, want.Cluster)
			}
		}
		if err := b.nl.LinkSetAlias(link, wantAlias); err != nil {
			return false, fmt.Errorf("set owner alias on bridge %s: %w", name, err)
		}
		changed = true
		logger.Info("Marked bridge as owned", "oldAlias", attrs.Alias, "alias", wantAlias)
	}

	if attrs.Group != BridgeGroup {
		// The isolation rules know netop's bridges by their group.
		if err := b.nl.LinkSetGroup(link, BridgeGroup); err != nil {
			return changed, fmt.Errorf("set the interface group of bridge %s: %w", name, err)
		}
		changed = true
		logger.V(2).Info("Set the bridge's interface group", "group", BridgeGroup)
	}

	if attrs.MTU != mtu {
		// Set, not left to the bridge's ports: a bridge whose MTU was
		// set keeps it as ports come, so a pod attached before the
		// VXLAN port gets the MTU that crosses nodes.
		if err := b.nl.LinkSetMTU(link, mtu); err != nil {
			return changed, fmt.Errorf("set the MTU of bridge %s to %d: %w", name, mtu, err)
		}
		changed = true
		logger.Info("Set the bridge's MTU", "mtu", mtu, "was", attrs.MTU)
	}

	families := want.Families
	addrs, err := b.addrList(link)
	if err != nil {
		return changed, fmt.Errorf("list addresses of bridge %s: %w", name, err)
	}
	have := make([]bool, len(families))
	// Removing before adding matters: with IPv4, deleting a primary address
	// also deletes the secondaries of its subnet, which a new gateway in
	// the same subnet would be; with IPv6, the same address with another
	// prefix length cannot be added beside the old one.
	for i := range addrs {
		a := &addrs[i]
		ip, ok := netip.AddrFromSlice(a.IP)
		ip = ip.Unmap()
		ones, _ := a.Mask.Size()
		if j := slices.IndexFunc(families, func(f backend.Family) bool { return ok && ip == f.Gateway && ones == f.CIDR.Bits() }); j >= 0 {
			have[j] = true
			continue
		}
		if kernelAddr(*a) {
			continue
		}
		err := b.nl.AddrDel(link, a)
		if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return changed, fmt.Errorf("remove address %s from bridge %s: %w", a.IPNet, name, err)
		}
		changed = true
		logger.V(2).Info("Removed address", "address", a.IPNet.String())
	}
	for j, f := range families {
		if have[j] {
			continue
		}
		if err := b.addGateway(logger, link, f); err != nil {
			return changed, err
		}
		changed = true
	}
	return changed, nil
}

// addGateway adds the gateway of family f to the bridge link.
func (b *Backend) addGateway(logger klog.Logger, link netlink.Link, f backend.Family) error {
	name := link.Attrs().Name
	gw := &netlink.Addr{IPNet: &net.IPNet{
		IP:   f.Gateway.AsSlice(),
		Mask: net.CIDRMask(f.CIDR.Bits(), f.Gateway.BitLen()),
	}}
	if f.Gateway.Is6() {
		// A bridge without ports has no carrier, so duplicate address
		// detection would leave the gateway tentative, unusable, until
		// the first port comes up. The address is netop's by design.
		gw.Flags = unix.IFA_F_NODAD
		// The bridge of a Network that was IPv4 has IPv6 off.
		b.setIPv6(logger, name, true)
	}
	err := b.nl.AddrAdd(link, gw)
	if errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.EINVAL) {
		// The kernel refuses this address on a bridge (a loopback or
		// multicast address, say): no retry can fix that.
		return fmt.Errorf("add address %s to bridge %s: %w: %w", gw.IPNet, name, err, backend.ErrInvalid)
	}
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add address %s to bridge %s: %w", gw.IPNet, name, err)
	}
	logger.V(2).Info("Added address", "address", gw.IPNet.String())
	return nil
}

// setUp brings link up without an IPv6 link-local address, and without
// IPv6 at all unless ipv6. netop's bridges and VXLAN ports need no
// link-local address (an IPv6 gateway is a global address, and pods are
// given their routes), and each one costs the namespace: the kernel sends
// duplicate address detection, router solicitations and multicast listener
// reports for it, and routes each of those packets through a table holding
// a link-local route per device, so that N Networks on a node cost O(N²)
// of soft interrupts as they come up (most of the machine's time with 1000
// Networks on 50 nodes). IPv6 itself, even without addresses, costs each
// link coming up O(N) in the kernel: a multicast route beside every other
// device's and a walk of the whole IPv6 routing table (fib6_add_rt2node,
// fib6_ifup; the last 1000 of 10000 bridges came up 5 times slower than
// the first 1000). The mode and the sysctl apply when the link comes up:
// a link already up keeps its addresses.
func (b *Backend) setUp(logger klog.Logger, link netlink.Link, ipv6 bool) error {
	if !ipv6 {
		b.setIPv6(logger, link.Attrs().Name, false)
	}
	if err := linklocal.Off(b.nl, link); err != nil {
		return fmt.Errorf("turn IPv6 address generation off: %w", err)
	}
	return b.nl.LinkSetUp(link)
}

// setIPv6 turns IPv6 on or off on the link named name, through its sysctl
// (netlink cannot). Turning it off is best effort: a read-only /proc/sys
// (an agent without privileges beyond NET_ADMIN) or a kernel without IPv6
// leaves links as they are, which only costs time; that is said once, and
// not tried again. Turning it on is always tried: an IPv6 gateway needs it,
// and adding one says clearly if it is still off.
func (b *Backend) setIPv6(logger klog.Logger, name string, on bool) {
	if !on && b.ipv6SysctlUnavailable.Load() {
		return
	}
	value := "1"
	if on {
		value = "0"
	}
	err := WriteSysctl(b.ns, filepath.Join("/proc/sys/net/ipv6/conf", name, "disable_ipv6"), value)
	switch {
	case err == nil:
		return
	case errors.Is(err, fs.ErrNotExist):
		if _, statErr := os.Stat("/proc/sys/net/ipv6"); statErr == nil {
			return // the link went meanwhile
		}
		err = errors.New("this kernel has no IPv6")
	case !errors.Is(err, unix.EROFS) && !errors.Is(err, unix.EACCES) && !errors.Is(err, unix.EPERM):
		logger.V(2).Info("Cannot set IPv6 on a link", "link", name, "on", on, "err", err)
		return
	}
	if b.ipv6SysctlUnavailable.CompareAndSwap(false, true) {
		logger.Info("Cannot turn IPv6 off on the bridges of IPv4 Networks: each bridge then costs the kernel time in proportion to the number of links when it comes up", "err", err)
	}
}

// kernelAddr reports whether an address on a bridge is the kernel's own,
// which netop neither removes nor counts: IPv6 link-local addresses, which
// the kernel gives every interface for neighbour discovery. IPv4
// link-local addresses (169.254.0.0/16) are not among them: the kernel
// never adds one, so one on a bridge is a Network's gateway or drift.
// converge and ListOwned both ask it, so that a bridge converge leaves
// alone is one ListOwned reports as matching its spec.
func kernelAddr(a netlink.Addr) bool {
	ip, ok := netip.AddrFromSlice(a.IP)
	ip = ip.Unmap()
	return ok && ip.Is6() && ip.IsLinkLocalUnicast()
}

// addrList lists the addresses of link, or of all links if link is nil.
func (b *Backend) addrList(link netlink.Link) ([]netlink.Addr, error) {
	return retryDump(func() ([]netlink.Addr, error) { return b.nl.AddrList(link, netlink.FAMILY_ALL) })
}

// retryDump runs a netlink dump again, up to dumpRetries times in all,
// while a concurrent change interrupts it and leaves it inconsistent.
func retryDump[T any](dump func() ([]T, error)) ([]T, error) {
	var err error
	for range dumpRetries {
		var items []T
		items, err = dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return items, err
		}
	}
	return nil, err
}

// Delete removes the bridge of owner: the one recorded in status and the
// one with the derived name, if they differ, and only if they are owner's.
// An interface that is not owner's is left alone and not an error, since
// owner's network is gone either way.
func (b *Backend) Delete(ctx context.Context, owner backend.Owner, recorded *backend.Ref) error {
	if !validUID(owner.UID) {
		return fmt.Errorf("invalid UID %q", owner.UID)
	}
	logger := klog.FromContext(ctx).WithValues("netns", b.netnsName)
	derived := ifname.Bridge(owner.UID)
	// The VXLAN port first: deleting a bridge only frees its ports.
	if err := b.deleteVXLAN(owner.UID); err != nil {
		return err
	}
	if recorded != nil && recorded.Interface != "" && recorded.Interface != derived {
		if err := b.deleteOwned(logger, recorded.Interface, owner, false); err != nil {
			return err
		}
	}
	return b.deleteOwned(logger, derived, owner, true)
}

// deleteOwned deletes the link name if its alias names owner, or if it is
// unmarked and derived says the name is the one netop would have created
// for owner.
func (b *Backend) deleteOwned(logger klog.Logger, name string, owner backend.Owner, derived bool) error {
	logger = logger.WithValues("bridge", name)
	if len(name) > ifname.Size || strings.ContainsAny(name, "/ \t\n\x00") {
		logger.Info("Ignoring invalid recorded interface name")
		return nil
	}
	link, err := b.nl.LinkByName(name)
	if isLinkNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up bridge %s: %w", name, err)
	}
	alias := link.Attrs().Alias
	if alias == "" {
		if !derived || link.Type() != "bridge" {
			logger.Info("Not deleting an interface that netop did not mark as its own")
			return nil
		}
	} else if o, ok := ParseAlias(alias); !ok || !owner.Claims(o) {
		logger.Info("Not deleting an interface owned by someone else", "alias", alias)
		return nil
	}
	// By index, so a link replaced since the check is not the one deleted.
	if err := b.nl.LinkDel(link); err != nil && !isLinkNotFound(err) && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete bridge %s: %w", name, err)
	}
	logger.Info("Deleted bridge")
	if link.Attrs().Group == BridgeGroup {
		// A stale element is harmless (it names an index no bridge has)
		// and the resync rewrites the set: the bridge is gone either way.
		if err := b.isolation.remove(b.nl.LinkList, link.Attrs().Index); err != nil {
			logger.Error(err, "Removing the bridge from the isolation rules failed; the resync does")
		}
	}
	return nil
}

// ListOwned lists the owners of all links that carry a netop alias, of
// every cluster: the caller keeps its own.
// InUse reports whether the bridge of owner has a port besides its VXLAN
// device: a pod's host end.
func (b *Backend) InUse(_ context.Context, owner backend.Owner) (bool, error) {
	bridge, err := b.nl.LinkByName(ifname.Bridge(owner.UID))
	if isLinkNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up bridge %s: %w", ifname.Bridge(owner.UID), err)
	}
	links, err := b.nl.LinkList()
	if err != nil {
		return false, fmt.Errorf("list links: %w", err)
	}
	return slices.ContainsFunc(links, func(l netlink.Link) bool {
		return l.Attrs().MasterIndex == bridge.Attrs().Index && l.Type() != "vxlan"
	}), nil
}

func (b *Backend) ListOwned(ctx context.Context) ([]backend.Observed, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	links, err := retryDump(b.nl.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	// One address dump for all bridges, not one per bridge.
	addrs, err := b.addrList(nil)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	vxlans := map[string]*netlink.Vxlan{}
	for _, l := range links {
		if vx, ok := l.(*netlink.Vxlan); ok && strings.HasPrefix(vx.Name, vxlanPrefix) {
			vxlans[vx.Name] = vx
		}
	}
	byLink := make(map[int][]netlink.Addr)
	for _, a := range addrs {
		if kernelAddr(a) {
			continue
		}
		byLink[a.LinkIndex] = append(byLink[a.LinkIndex], a)
	}
	if repaired, bridges, err := b.isolation.sync(b.nl.LinkList); err != nil {
		klog.FromContext(ctx).Error(err, "Checking the isolation rules failed", "netns", b.netnsName)
	} else if repaired {
		klog.FromContext(ctx).Info("Repaired the isolation rules", "netns", b.netnsName, "table", IsolationTable, "bridges", bridges)
	}
	var observed []backend.Observed
	for _, l := range links {
		o, ok := ParseAlias(l.Attrs().Alias)
		if !ok {
			continue
		}
		obs := backend.Observed{Owner: o, Status: backend.Ref{Type: backend.TypeLinux, Interface: l.Attrs().Name}}
		if vx, ok := vxlans[VXLANName(o.UID)]; ok && vx.MasterIndex == l.Attrs().Index && vx.Flags&net.FlagUp != 0 {
			obs.VNI = uint32(vx.VxlanId)
		}
		if l.Attrs().Flags&net.FlagUp != 0 {
			obs.Families = families(byLink[l.Attrs().Index])
		}
		observed = append(observed, obs)
	}
	return observed, nil
}

// families are what a bridge's addresses provide: one gateway per IP
// family. A bridge with no address, more than one of a family, or one
// that does not parse gives nil, so that it differs from every spec and
// is repaired.
func families(addrs []netlink.Addr) []backend.Family {
	var out []backend.Family
	for _, a := range addrs {
		gw, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			return nil
		}
		gw = gw.Unmap()
		ones, _ := a.Mask.Size()
		if slices.ContainsFunc(out, func(f backend.Family) bool { return f.Gateway.Is4() == gw.Is4() }) {
			return nil
		}
		out = append(out, backend.Family{CIDR: netip.PrefixFrom(gw, ones).Masked(), Gateway: gw})
	}
	return out
}

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}
