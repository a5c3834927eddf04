package linux

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// handle is a netlink handle whose AddrList of one link asks the kernel for
// that link's addresses only.
//
// netlink.Handle.AddrList dumps every address in the namespace and filters
// in Go: with N bridges each Ensure reads N addresses, and creating N
// bridges costs O(N²) (10000 bridges took minutes). The kernel filters a
// dump by ifa_index only on a socket with NETLINK_GET_STRICT_CHK (Linux
// 4.20), which netlink.Handle's AddrList does not fill in, so the filtered
// dump goes over a socket of its own.
type handle struct {
	*netlink.Handle
	// addrDump is nil where the kernel refuses strict checking; AddrList
	// then falls back to the full dump.
	addrDump *nl.SocketHandle
	// foreign counts addresses of other links that a filtered dump
	// returned, which a kernel honouring the index never does.
	foreign atomic.Int64
}

func newHandle(ns netns.NsHandle) (*handle, error) {
	// Only rtnetlink is needed; the default also opens xfrm, netfilter
	// and generic netlink sockets.
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("open address dump socket: %w", err)
	}
	if err := unix.SetsockoptInt(s.GetFd(), unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1); err != nil {
		s.Close()
		return &handle{Handle: h}, nil
	}
	// As netlink.Handle's own sockets, so that a wedged kernel reply
	// fails the call instead of hanging a worker.
	tv := nl.SocketTimeoutTv
	if err := s.SetSendTimeout(&tv); err != nil {
		s.Close()
		h.Close()
		return nil, fmt.Errorf("set address dump socket timeout: %w", err)
	}
	if err := s.SetReceiveTimeout(&tv); err != nil {
		s.Close()
		h.Close()
		return nil, fmt.Errorf("set address dump socket timeout: %w", err)
	}
	return &handle{Handle: h, addrDump: &nl.SocketHandle{Socket: s}}, nil
}

// Close closes both sockets.
func (h *handle) Close() {
	if h.addrDump != nil {
		h.addrDump.Socket.Close()
	}
	h.Handle.Close()
}

// AddrList lists the addresses of link, or of all links if link is nil, as
// netlink.Handle.AddrList does.
func (h *handle) AddrList(link netlink.Link, family int) ([]netlink.Addr, error) {
	if link == nil || link.Attrs().Index <= 0 || h.addrDump == nil {
		return h.Handle.AddrList(link, family)
	}
	index := link.Attrs().Index
	req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: h.addrDump}
	msg := nl.NewIfAddrmsg(family)
	msg.Index = uint32(index)
	req.AddData(msg)

	var (
		addrs    []netlink.Addr
		parseErr error
	)
	err := req.ExecuteIter(unix.NETLINK_ROUTE, unix.RTM_NEWADDR, func(m []byte) bool {
		a, msgIndex, err := parseAddrMsg(m)
		if err != nil {
			parseErr = err
			return false
		}
		// The kernel filtered already; this only guards against one that
		// accepted the option and ignored the index.
		if msgIndex == index {
			addrs = append(addrs, a)
		} else {
			h.foreign.Add(1)
		}
		return true
	})
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, err
	}
	if parseErr != nil {
		return nil, parseErr
	}
	return addrs, err
}

// parseAddrMsg decodes an RTM_NEWADDR message into what the backend uses:
// the address with its prefix length, the peer if there is one, the flags
// and the scope, and the index of its link.
func parseAddrMsg(m []byte) (netlink.Addr, int, error) {
	if len(m) < unix.SizeofIfAddrmsg {
		return netlink.Addr{}, 0, fmt.Errorf("short address message: %d bytes", len(m))
	}
	msg := nl.DeserializeIfAddrmsg(m)
	attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfAddrmsg:])
	if err != nil {
		return netlink.Addr{}, 0, fmt.Errorf("parse address message: %w", err)
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
	// when they differ; IPv6 usually sends IFA_ADDRESS alone. Decoded as
	// netlink.Handle.AddrList does, so that AddrDel of the result works
	// the same: a point-to-point local address is a host address and the
	// prefix length goes with the peer.
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
		return netlink.Addr{}, 0, errors.New("address message without an address")
	}
	return a, int(msg.Index), nil
}
