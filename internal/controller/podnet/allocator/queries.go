package allocator

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/ipam"
	"github.com/netop-dev/netop/internal/netselect"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// Usage counts the Network's pod interfaces that hold addresses, how many
// more can get theirs, and the addresses it keeps from pods, as status
// shows them.
func (al *Allocator) Usage(network *samplecrdv2.Network) (*samplecrdv2.NetworkAddresses, error) {
	al.mu.Lock()
	defer al.mu.Unlock()
	ps, _, err := al.poolsLocked(network)
	if err != nil {
		return nil, err
	}
	allocated, available := ps.usage()
	usage := &samplecrdv2.NetworkAddresses{Allocated: allocated, Available: available.String()}
	if reserved := ps.reserved(); reserved.Sign() > 0 {
		usage.Reserved = reserved.String()
	}
	return usage, nil
}

// Retire stops allocating in a Network that is being deleted, and counts
// the pods that still hold addresses in it, naming up to limit of them.
// Both under one lock: once it reports none, none are handed out.
func (al *Allocator) Retire(network *samplecrdv2.Network, limit int) (netselect.Holders, error) {
	al.mu.Lock()
	defer al.mu.Unlock()
	al.retired[network.UID] = true
	return al.heldLocked(network, netip.Prefix{}, limit)
}

// Held counts the pods that hold addresses of family (one of the
// Network's cidrs) in a Network, naming up to limit of them.
func (al *Allocator) Held(network *samplecrdv2.Network, family netip.Prefix, limit int) (netselect.Holders, error) {
	al.mu.Lock()
	defer al.mu.Unlock()
	return al.heldLocked(network, family, limit)
}

// heldLocked counts the holders of addresses of family, or of any family
// if family is the zero Prefix.
func (al *Allocator) heldLocked(network *samplecrdv2.Network, family netip.Prefix, limit int) (netselect.Holders, error) {
	ps, _, err := al.poolsLocked(network)
	if err != nil {
		// No valid spec, no pool: nothing can have been allocated.
		return netselect.Holders{}, nil //nolint:nilerr
	}
	if family.IsValid() {
		p := ps.prefix(family)
		if p == nil {
			return netselect.Holders{}, nil
		}
		ps = familyPools{p}
	}
	// The pods cache answers on any replica: a replica that does not lead
	// runs no sync, so its pools are as they were when first built.
	holders, err := al.podsOf(network, limit, func(pod *corev1.Pod) bool { return holdsIn(pod, network.UID, ps) })
	if err != nil {
		return holders, err
	}
	// On the leader, pods whose allocation is still being written are not
	// in the cache yet, but hold their addresses already.
	if allocated, _ := ps.usage(); holders.Count == 0 && allocated > 0 {
		holders.Count = 1
	}
	return holders, nil
}

// podsOf counts the pods holding addresses of network that match, naming
// up to limit of them, in order.
func (al *Allocator) podsOf(network *samplecrdv2.Network, limit int, match func(*corev1.Pod) bool) (netselect.Holders, error) {
	holders, err := al.reads.PodsOf(network.UID)
	if err != nil {
		return netselect.Holders{}, err
	}
	var pods []string
	for _, pod := range holders {
		if match(pod) {
			pods = append(pods, cache.MetaObjectToName(pod).String())
		}
	}
	slices.Sort(pods)
	return netselect.Holders{Count: int64(len(pods)), Pods: pods[:min(limit, len(pods))]}, nil
}

// HeldIn counts the pods that hold addresses of network in r, naming up
// to limit of them: admission refuses to reserve addresses pods hold.
func (al *Allocator) HeldIn(network *samplecrdv2.Network, r ipam.Range, limit int) (netselect.Holders, error) {
	al.mu.Lock()
	defer al.mu.Unlock()
	holders, err := al.podsOf(network, limit, func(pod *corev1.Pod) bool {
		return slices.ContainsFunc(podAddresses(pod, network.UID), func(p netip.Prefix) bool { return r.Contains(p.Addr()) })
	})
	// On the leader, addresses whose pods' allocations are still being
	// written are in the pools before they are in the cache.
	if ps, ok := al.pools[network.UID]; ok && err == nil && holders.Count == 0 {
		for _, p := range ps {
			if p.HeldIn(r) > 0 {
				holders.Count = 1
			}
		}
	}
	return holders, err
}

// CheckPinned says why the addresses that s pins on network cannot be
// any pod's: outside the Network's cidrs, of another prefix length, its
// network, gateway or broadcast address. Admission asks before the pod
// exists (and of workload templates); allocation checks again. A Network
// whose spec does not resolve has nothing to check against (the pod
// waits).
func (al *Allocator) CheckPinned(network *samplecrdv2.Network, s netselect.Selection) error {
	if len(s.IPs) == 0 {
		return nil
	}
	families, errs := al.specs.Resolve(network)
	if len(errs) > 0 {
		return nil
	}
	// Empty pools of the Network's cidrs answer for them alone.
	ps, err := newFamilyPools(families)
	if err != nil {
		return nil //nolint:nilerr // as an invalid spec
	}
	_, err = ps.allocate("", s.IPs)
	return err
}

// PinnedHolder says which other pod than pod holds an address or the MAC
// that s pins on network, if one does, as the pods cache shows them: any replica
// answers, leader or not; allocation checks again against what it handed
// out since.
func (al *Allocator) PinnedHolder(network *samplecrdv2.Network, s netselect.Selection, pod cache.ObjectName) error {
	if len(s.IPs) == 0 && s.MAC == nil {
		return nil
	}
	holders, err := al.reads.PodsOf(network.UID)
	if err != nil {
		return err
	}
	for _, holder := range holders {
		// A pod being deleted frees its address when it goes: its
		// successor (a pinned replica) is admitted and waits for it.
		if holder.Namespace == pod.Namespace && holder.Name == pod.Name || holder.DeletionTimestamp != nil {
			continue
		}
		for _, a := range onNetwork(holder, network.UID) {
			for _, held := range addresses(a) {
				if slices.ContainsFunc(s.IPs, func(want netip.Prefix) bool { return want.Addr() == held.Addr() }) {
					return fmt.Errorf("address %s: held by pod %s", held.Addr(), klog.KObj(holder))
				}
			}
			if s.MAC != nil && a.MAC == s.MAC.String() {
				return fmt.Errorf("mac %s: held by pod %s", s.MAC, klog.KObj(holder))
			}
		}
	}
	return nil
}

// Outsiders counts the pods that hold addresses of network although its
// namespaces may no longer join it (its selector or their labels changed
// since they got them), naming up to limit of them. They keep their
// addresses until they finish: taking an interface from a running pod is
// not the allocator's to do.
func (al *Allocator) Outsiders(network *samplecrdv2.Network, limit int) (netselect.Holders, error) {
	return al.podsOf(network, limit, func(pod *corev1.Pod) bool { return al.admits(network, pod.Namespace) != nil })
}

// holdsIn says whether pod holds an address of one of the pools of the
// Network with UID uid.
func holdsIn(pod *corev1.Pod, uid types.UID, ps familyPools) bool {
	return slices.ContainsFunc(podAddresses(pod, uid), func(p netip.Prefix) bool { return ps.of(p.Addr()) != nil })
}

// podAddresses are the addresses pod holds of the Network with UID uid.
func podAddresses(pod *corev1.Pod, uid types.UID) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range onNetwork(pod, uid) {
		out = append(out, addresses(a)...)
	}
	return out
}

// onNetwork are pod's allocations on the Network with UID uid, as its
// allocations annotation says; one that does not parse holds none.
func onNetwork(pod *corev1.Pod, uid types.UID) []netselect.Allocation {
	have, err := netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
	if err != nil {
		return nil
	}
	return slices.DeleteFunc(have, func(a netselect.Allocation) bool { return a.NetworkUID != uid })
}

// addresses are an allocation's addresses; one that does not parse is
// nobody's.
func addresses(a netselect.Allocation) []netip.Prefix {
	var out []netip.Prefix
	for _, ip := range a.IPs {
		if prefix, err := netip.ParsePrefix(ip); err == nil {
			out = append(out, prefix)
		}
	}
	return out
}
