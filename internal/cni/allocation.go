package cni

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/netop-dev/netop/internal/backend/linux"
	"github.com/netop-dev/netop/internal/netselect"
)

// AttachmentOf is the attachment that gives the sandbox containerID, whose
// network namespace is netns, the interface of allocation a.
func AttachmentOf(containerID, netns string, a netselect.Allocation) (Attachment, error) {
	at := Attachment{ContainerID: containerID, Netns: netns, Interface: a.Interface, Bridge: linux.BridgeName(a.NetworkUID)}
	var err error
	if at.Addresses, err = Prefixes(a.IPs); err != nil {
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
		at.Routes = append(at.Routes, Route{Dst: dst, GW: gw})
	}
	return at, nil
}

// Prefixes parses addresses as allocations and records write them, with
// the Network's prefix length.
func Prefixes(ips []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, ip := range ips {
		p, err := netip.ParsePrefix(ip)
		if err != nil {
			return nil, fmt.Errorf("address %q: %w", ip, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// With is the record with the interfaces of allocations added (replacing
// any of the same name), attached under the network configuration config.
func (r Record) With(config string, allocations []netselect.Allocation) Record {
	r.Interfaces = slices.Clone(r.Interfaces)
	for _, a := range allocations {
		r.Interfaces = slices.DeleteFunc(r.Interfaces, func(i RecordedInterface) bool { return i.Interface == a.Interface })
		r.Interfaces = append(r.Interfaces, RecordedInterface{
			Config: config, Interface: a.Interface, Network: a.Network, Bridge: linux.BridgeName(a.NetworkUID),
			HostVeth: HostVethName(r.ContainerID, a.Interface), IPs: a.IPs, MAC: a.MAC,
		})
	}
	return r
}

// Without is the record without the interfaces named.
func (r Record) Without(interfaces []string) Record {
	r.Interfaces = slices.DeleteFunc(slices.Clone(r.Interfaces), func(i RecordedInterface) bool { return slices.Contains(interfaces, i.Interface) })
	return r
}

// Forget drops interfaces from the container's record, and the record
// once it has none.
func (s Store) Forget(record Record, interfaces []string) error {
	if len(interfaces) == 0 {
		return nil
	}
	record = record.Without(interfaces)
	if len(record.Interfaces) == 0 {
		if err := s.Remove(record.ContainerID); err != nil {
			return fmt.Errorf("removing the record of %s: %w", record.ContainerID, err)
		}
		return nil
	}
	if err := s.Save(record); err != nil {
		return fmt.Errorf("removing %s from the record of %s: %w", strings.Join(interfaces, ", "), record.ContainerID, err)
	}
	return nil
}
