package linux

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// handle is a netlink handle whose AddrList and NeighList of one link ask
// the kernel for that link's entries only.
//
// netlink.Handle.AddrList and NeighList dump every entry in the namespace
// and filter in Go: with N bridges each Ensure reads N addresses, and
// creating N bridges costs O(N²) (10000 bridges took minutes); with an
// overlay, every VXLAN device's flooding entries are read for each one
// checked. The kernel filters an address dump by ifa_index, and a
// forwarding entry dump by ndm_ifindex, only on a socket with
// NETLINK_GET_STRICT_CHK (Linux 4.20), which netlink.Handle does not set,
// so filtered dumps go over a socket of their own.
type handle struct {
	*netlink.Handle
	// filtered is nil where the kernel refuses strict checking; AddrList
	// and NeighList then fall back to the full dump.
	filtered *nl.SocketHandle
	// foreign counts entries of other links that a filtered dump
	// returned, which a kernel honouring the index never does; dumps
	// counts the filtered dumps made.
	foreign, dumps atomic.Int64
}

// newHandle opens the handle in ns. strict is false where the kernel
// refused strict checking, so that AddrList of one link falls back to the
// full dump.
func newHandle(ns netns.NsHandle) (h *handle, strict bool, err error) {
	// Only rtnetlink is needed; the default also opens xfrm, netfilter
	// and generic netlink sockets.
	nh, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, false, err
	}
	// netlink.Handle's sockets have no timeout of their own; a kernel
	// that never answers should fail the call, not hang a worker.
	if err := nh.SetSocketTimeout(socketTimeout); err != nil {
		nh.Close()
		return nil, false, fmt.Errorf("set netlink socket timeout: %w", err)
	}
	h = &handle{Handle: nh}
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		nh.Close()
		return nil, false, fmt.Errorf("open filtered dump socket: %w", err)
	}
	if err := unix.SetsockoptInt(s.GetFd(), unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1); err != nil {
		s.Close()
		return h, false, nil
	}
	tv := unix.NsecToTimeval(socketTimeout.Nanoseconds())
	_ = s.SetSendTimeout(&tv)    // cannot fail: it only stores the value
	_ = s.SetReceiveTimeout(&tv) // likewise
	h.filtered = &nl.SocketHandle{Socket: s}
	return h, true, nil
}

// socketTimeout bounds every netlink request of the backend.
const socketTimeout = time.Minute

// Close closes both sockets.
func (h *handle) Close() {
	if h.filtered != nil {
		h.filtered.Socket.Close()
	}
	h.Handle.Close()
}

// Delete is Close: the promoted netlink.Handle.Delete would leave the
// address dump socket open.
func (h *handle) Delete() { h.Close() }

// AddrList lists the addresses of link, or of all links if link is nil. Of
// one link, it fills in what the backend reads: IPNet, Peer, LinkIndex,
// Scope and Flags (not Label, Broadcast or lifetimes), and a link that is
// gone is an error (ENODEV). Of all links, or without strict checking, it
// is netlink.Handle.AddrList.
func (h *handle) AddrList(link netlink.Link, family int) ([]netlink.Addr, error) {
	if link == nil || link.Attrs().Index <= 0 || h.filtered == nil {
		return h.Handle.AddrList(link, family)
	}
	msg := nl.NewIfAddrmsg(family)
	msg.Index = uint32(link.Attrs().Index)
	return filteredDump(h, unix.RTM_GETADDR, msg, unix.RTM_NEWADDR, link.Attrs().Index, func(m []byte) (netlink.Addr, int, error) {
		if len(m) < unix.SizeofIfAddrmsg {
			return netlink.Addr{}, 0, fmt.Errorf("short address message: %d bytes", len(m))
		}
		a, err := parseAddrMsg(m)
		return a, a.LinkIndex, err
	})
}

// NeighList lists the forwarding entries (family AF_BRIDGE) of the link
// with linkIndex; any other family, or without strict checking, is
// netlink.Handle.NeighList.
func (h *handle) NeighList(linkIndex, family int) ([]netlink.Neigh, error) {
	if family != unix.AF_BRIDGE || linkIndex <= 0 || h.filtered == nil {
		return h.Handle.NeighList(linkIndex, family)
	}
	// A strict forwarding entry dump takes the port's index from the
	// header and refuses any other field set there.
	msg := &netlink.Ndmsg{Family: unix.AF_BRIDGE, Index: uint32(linkIndex)}
	return filteredDump(h, unix.RTM_GETNEIGH, msg, unix.RTM_NEWNEIGH, linkIndex, func(m []byte) (netlink.Neigh, int, error) {
		n, err := netlink.NeighDeserialize(m)
		if err != nil {
			return netlink.Neigh{}, 0, fmt.Errorf("parse forwarding entry: %w", err)
		}
		return *n, n.LinkIndex, nil
	})
}

// filteredDump dumps, over h's strict socket, the entries of the link
// with index that the request header msg asks the kernel for, decoding
// each reply with parse (the entry and its link's index). The kernel
// filtered already; entries of other links are only counted, in case one
// accepted the option and ignored the index. An interrupted dump returns
// its entries with netlink.ErrDumpInterrupted, for retryDump.
func filteredDump[T any](h *handle, reqType int, msg nl.NetlinkRequestData, replyType uint16, index int, parse func(m []byte) (T, int, error)) ([]T, error) {
	h.dumps.Add(1)
	req := nl.NewNetlinkRequest(reqType, unix.NLM_F_DUMP)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: h.filtered}
	req.AddData(msg)
	var (
		items    []T
		parseErr error
	)
	err := req.ExecuteIter(unix.NETLINK_ROUTE, replyType, func(m []byte) bool {
		item, link, err := parse(m)
		if err != nil {
			parseErr = err
			return false
		}
		if link != index {
			h.foreign.Add(1)
			return true
		}
		items = append(items, item)
		return true
	})
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, err
	}
	if parseErr != nil {
		return nil, parseErr
	}
	return items, err
}

// parseAddrMsg decodes an RTM_NEWADDR message of at least
// unix.SizeofIfAddrmsg bytes into what the backend uses: the address with
// its prefix length, the peer if there is one, the flags, the scope and the
// index of its link.
func parseAddrMsg(m []byte) (netlink.Addr, error) {
	msg := nl.DeserializeIfAddrmsg(m)
	attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfAddrmsg:])
	if err != nil {
		return netlink.Addr{}, fmt.Errorf("parse address message: %w", err)
	}
	var (
		a          = netlink.Addr{LinkIndex: int(msg.Index), Scope: int(msg.Scope), Flags: int(msg.Flags)}
		local, dst net.IP
	)
	for _, attr := range attrs {
		switch attr.Attr.Type {
		case unix.IFA_ADDRESS:
			dst = net.IP(attr.Value)
		case unix.IFA_LOCAL:
			local = net.IP(attr.Value)
		case unix.IFA_FLAGS:
			if len(attr.Value) >= 4 {
				a.Flags = int(nl.NativeEndian().Uint32(attr.Value))
			}
		}
	}
	// IPv4 sends both IFA_LOCAL and IFA_ADDRESS, the latter being the peer
	// when they differ; IPv6 usually sends IFA_ADDRESS alone. IPNet and
	// Peer are as netlink.Handle.AddrList makes them, so that AddrDel of
	// the result works the same: a point-to-point local address is a host
	// address and the prefix length goes with the peer.
	prefix := func(ip net.IP) *net.IPNet {
		return &net.IPNet{IP: ip, Mask: net.CIDRMask(int(msg.Prefixlen), 8*len(ip))}
	}
	switch {
	case local != nil && dst != nil && !local.Equal(dst):
		a.IPNet = &net.IPNet{IP: local, Mask: net.CIDRMask(8*len(local), 8*len(local))}
		a.Peer = prefix(dst)
	case local != nil:
		a.IPNet = prefix(local)
	case dst != nil:
		a.IPNet = prefix(dst)
	default:
		return netlink.Addr{}, errors.New("address message without an address")
	}
	return a, nil
}
