// Package linklocal turns off the IPv6 link-local address of the links
// netop makes: bridges, VXLAN ports, the host ends of pods' veths and the
// pod ends on Networks without IPv6. None of them needs one, and each one
// costs the node: the kernel sends duplicate address detection, router
// solicitations and multicast listener reports for it, which a bridge
// floods to every other port.
//
// It stands apart from the linux backend so that the CNI plugin uses it
// without linking the backend.
package linklocal

import (
	"errors"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// modeNone is IN6_ADDR_GEN_MODE_NONE: no link-local address.
const modeNone = 1

// Setter sets a link's IPv6 address generation mode: a *netlink.Handle,
// or anything standing in for one.
type Setter interface {
	LinkSetIP6AddrGenMode(link netlink.Link, mode int) error
}

// Off turns off link-local addressing on link. The kernel takes the mode
// only on an existing link, and it applies when the link comes up: a link
// already up keeps the address it has.
func Off(h Setter, link netlink.Link) error {
	return ignoreNoIPv6(h.LinkSetIP6AddrGenMode(link, modeNone))
}

// OffByName does what Off does in one RTM_SETLINK naming the link, on the
// socket given, where netlink's Handle would look the link up first.
func OffByName(socket *nl.SocketHandle, name string) error {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: socket}
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, nil)
	spec.AddRtAttr(unix.AF_INET6, nil).AddRtAttr(unix.IFLA_INET6_ADDR_GEN_MODE, []byte{modeNone})
	req.AddData(spec)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return ignoreNoIPv6(err)
}

// ignoreNoIPv6 drops EAFNOSUPPORT: a kernel without IPv6 (ipv6.disable=1)
// makes no link-local address anyway.
func ignoreNoIPv6(err error) error {
	if errors.Is(err, unix.EAFNOSUPPORT) {
		return nil
	}
	return err
}
