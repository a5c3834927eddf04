// Package allocated turns the allocations netop recorded on a pod into
// what a node attaches for them and records. It stands apart from package
// cni so that the CNI plugin, which the runtime executes once per pod, does
// not link the pod API: only the node side (the CNI server, hot-plug)
// reads allocations.
package allocated

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/netdev/ifname"
	"github.com/netop-dev/netop/internal/netselect"
)

// Attachment is the attachment that gives the sandbox containerID, whose
// network namespace is netns, the interface of allocation a.
func Attachment(containerID, netns string, a netselect.Allocation) (cni.Attachment, error) {
	at := cni.Attachment{ContainerID: containerID, Netns: netns, Interface: a.Interface, Bridge: ifname.Bridge(a.NetworkUID)}
	var err error
	if at.Addresses, err = cni.Prefixes(a.IPs); err != nil {
		return at, fmt.Errorf("allocation on Network %s: %w", a.Network, err)
	}
	if a.MAC != "" {
		mac, err := net.ParseMAC(a.MAC)
		if err != nil {
			return at, fmt.Errorf("allocation on Network %s: mac %q: %w", a.Network, a.MAC, err)
		}
		at.MAC = mac
	}
	for _, r := range a.Routes {
		dst, errDst := netip.ParsePrefix(r.Dst)
		gw, errGW := netip.ParseAddr(r.GW)
		if errDst != nil || errGW != nil {
			return at, fmt.Errorf("allocation on Network %s: route %+v: %w", a.Network, r, errors.Join(errDst, errGW))
		}
		at.Routes = append(at.Routes, cni.Route{Dst: dst, GW: gw})
	}
	return at, nil
}

// Interfaces are the record's entries for allocations attached to the
// sandbox containerID under the network configuration config.
func Interfaces(config, containerID string, allocations ...netselect.Allocation) []cni.RecordedInterface {
	out := make([]cni.RecordedInterface, 0, len(allocations))
	for _, a := range allocations {
		out = append(out, cni.RecordedInterface{
			Config: config, Interface: a.Interface, Network: a.Network, Bridge: ifname.Bridge(a.NetworkUID),
			HostVeth: ifname.HostVeth(containerID, a.Interface), IPs: a.IPs, MAC: a.MAC,
		})
	}
	return out
}
