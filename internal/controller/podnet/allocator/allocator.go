// Package allocator keeps the addresses and MACs that pods' interfaces
// hold on Networks, picks new ones, and answers who holds them. An address
// is in use exactly while a pod that has not finished carries it: a
// Network's pools are built from the pods' allocations the first time they
// are needed, so that a restarted controller hands out nothing a pod
// holds.
//
// The allocator runs no informer and no queue: what it reads of the
// cluster it is given as functions (Reads), and the pods that wait for a
// Network it hands back to a function (the pod allocation controller's
// queue, package podnet). The Network controller and admission query it.
package allocator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/ipam"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/networkcache"
	"github.com/netop-dev/netop/internal/tenancy"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// Reasons a pod waits or is refused (WaitError), as the Events on pods
// give them.
const (
	ReasonNetworkNotFound = "NetworkNotFound"
	ReasonNoFreeAddress   = "NoFreeAddress"
	ReasonAddressRefused  = "AddressRefused"
	// ReasonNotAdmitted: the pod's namespace may not join a Network it
	// names (tenancy.Admits).
	ReasonNotAdmitted = tenancy.Reason
)

// Reads are what the allocator reads of the cluster: the caches of the
// controller that drives it, or plain values in tests.
type Reads struct {
	// Network is the Network namespace/name, or an error if there is
	// none.
	Network func(namespace, name string) (*samplecrdv2.Network, error)
	// PodsOf are the pods whose allocations annotation names the Network
	// with UID network, except finished ones, in any order.
	PodsOf func(network types.UID) ([]*corev1.Pod, error)
	// Admits says whether pods of namespace may join network
	// (tenancy.Namespaces.Admits): a *tenancy.NotAdmittedError if not,
	// another error if the namespace could not be read.
	Admits func(ctx context.Context, network *samplecrdv2.Network, namespace string) error
	// Synced are done once what PodsOf and Admits read is whole.
	Synced []cache.DoneChecker
}

// Allocator keeps what pods hold of Networks' addresses and MACs.
type Allocator struct {
	reads Reads
	// specs say what each version of a Network's spec means.
	specs *networkcache.Specs
	// retry is handed the pods that waited for a Network once it may let
	// them in.
	retry func(pod cache.ObjectName)
	// changed is told of each Network whose usage changed (OnUsageChanged).
	changed func(network cache.ObjectName)

	mu sync.Mutex
	// pools by Network UID, built on first use from the pods.
	pools map[types.UID]familyPools
	// macs: the owner (ownerKey) of each pinned MAC a Network's
	// interfaces have, by Network UID, built with its pools: no two
	// interfaces on a Network, whose bridge forwards by MAC, share one.
	macs map[types.UID]map[string]string
	// held: what each pod holds, by pod.
	held map[cache.ObjectName]held
	// waiting: pods that wait for a Network to appear or to free an
	// address, by Network namespace/name.
	waiting map[string]map[cache.ObjectName]bool
	// retired Networks are being deleted: nothing more is allocated in
	// them.
	retired map[types.UID]bool
}

type held struct {
	uid         types.UID
	allocations []netselect.Allocation
	// written: the allocations are what the controller last wrote, which
	// an older copy of the pod in the cache must not replace.
	written bool
}

// New makes an allocator that reads r, resolves Networks' specs with
// resolver, and hands retry the pods that waited for a Network once it
// may let them in.
func New(r Reads, resolver netspec.Resolver, retry func(pod cache.ObjectName)) *Allocator {
	return &Allocator{
		reads: r, specs: networkcache.NewSpecs(resolver), retry: retry, changed: func(cache.ObjectName) {},
		pools: map[types.UID]familyPools{}, macs: map[types.UID]map[string]string{}, held: map[cache.ObjectName]held{},
		waiting: map[string]map[cache.ObjectName]bool{}, retired: map[types.UID]bool{},
	}
}

// OnUsageChanged has f told of each Network whose addresses were allocated
// or freed, or whose holders' namespaces changed (the Network controller,
// which shows the counts in status), instead of the function given before.
// Call it before the controller runs: it is read unguarded.
func (al *Allocator) OnUsageChanged(f func(network cache.ObjectName)) { al.changed = f }

// Synced are done once the pods and namespaces Usage, Retire and
// Outsiders read are whole.
func (al *Allocator) Synced() []cache.DoneChecker { return al.reads.Synced }

// WaitError: the pod cannot get its addresses now; it is retried when the
// Network appears or changes, frees an address, or the pod's namespace
// changes. Refused: not for want of something that is on its way (a
// Network being made, a free address), but because of what the pod asks:
// the CNI plugin fails the pod's sandbox at once, with Msg.
type WaitError struct {
	Reason, Msg string
	Refused     bool
}

func (e *WaitError) Error() string { return e.Msg }

// Allocate picks the pod's addresses, all or none, keeping those it holds
// already (a write that has not reached the cache yet, a retried write).
func (al *Allocator) Allocate(pod *corev1.Pod, selections []netselect.Selection) ([]netselect.Allocation, error) {
	name := cache.MetaObjectToName(pod)
	al.mu.Lock()
	defer al.mu.Unlock()
	if h, ok := al.held[name]; ok && h.uid == pod.UID && netselect.Satisfies(h.allocations, selections) {
		return h.allocations, nil
	}
	al.releaseLocked(name, "")
	out, err := al.allocateLocked(pod, selections)
	if err != nil {
		return nil, err
	}
	al.held[name] = held{uid: pod.UID, allocations: out}
	return out, nil
}

// allocateLocked picks addresses for selections, all or none.
func (al *Allocator) allocateLocked(pod *corev1.Pod, selections []netselect.Selection) ([]netselect.Allocation, error) {
	name := cache.MetaObjectToName(pod)
	var out []netselect.Allocation
	undo := func() {
		for _, a := range out {
			al.freeLocked(pod.UID, a)
		}
	}
	for _, s := range selections {
		key := s.Namespace + "/" + s.Name
		network, err := al.reads.Network(s.Namespace, s.Name)
		if err != nil {
			undo()
			al.waitLocked(key, name)
			return nil, &WaitError{Reason: ReasonNetworkNotFound, Msg: fmt.Sprintf("Network %s: %v", key, err)}
		}
		if al.retired[network.UID] || network.DeletionTimestamp != nil {
			undo()
			al.waitLocked(key, name)
			return nil, &WaitError{Reason: ReasonNetworkNotFound, Msg: fmt.Sprintf("Network %s is being deleted", key)}
		}
		// Enforced here whatever admission let in: webhooks off or failing
		// open, a namespace relabelled since.
		if err := al.admits(network, pod.Namespace); err != nil {
			undo()
			al.waitLocked(key, name)
			return nil, &WaitError{Reason: ReasonNotAdmitted, Msg: err.Error(), Refused: true}
		}
		pools, families, err := al.poolsLocked(network)
		if err != nil {
			undo()
			al.waitLocked(key, name)
			return nil, &WaitError{Reason: ReasonNetworkNotFound, Msg: fmt.Sprintf("Network %s: %v", key, err)}
		}
		a, err := al.allocateOne(pod, network, s, pools, families)
		if err != nil {
			undo()
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// allocateOne picks the addresses and MAC of one selection on network, of
// pools, for allocateLocked, which undoes the others if it fails.
func (al *Allocator) allocateOne(pod *corev1.Pod, network *samplecrdv2.Network, s netselect.Selection, pools familyPools,
	families netspec.Families) (netselect.Allocation, error) {
	name := cache.MetaObjectToName(pod)
	key := s.Namespace + "/" + s.Name
	a := netselect.Allocation{Network: key, NetworkUID: network.UID, Interface: s.Interface}
	owner := ownerKey(pod.UID, s.Interface)
	addrs, err := pools.allocate(owner, s.IPs)
	if err != nil {
		var refused *refusedError
		switch {
		case errors.As(err, &refused):
			if refused.retry {
				al.waitLocked(key, name)
			}
			// An address another pod holds, or a cidr that may move,
			// is waited for; one that can never be the pod's is refused.
			return a, &WaitError{Reason: ReasonAddressRefused, Msg: fmt.Sprintf("Network %s: %v", key, err), Refused: !refused.retry}
		case errors.Is(err, ipam.ErrFull):
			al.waitLocked(key, name)
			// A Network of one family says it as before; of two, which.
			msg := fmt.Sprintf("Network %s has no free address", key)
			var full *fullError
			if len(pools) > 1 && errors.As(err, &full) {
				msg += " in " + full.prefix.String()
			}
			return a, &WaitError{Reason: ReasonNoFreeAddress, Msg: msg}
		}
		return a, err
	}
	for _, addr := range addrs {
		a.IPs = append(a.IPs, addr.String())
	}
	a.MAC = macFor(addrs[0].Addr(), s.MAC)
	if s.MAC != nil {
		// Another interface on the Network with the MAC would have
		// the bridge send one's frames to the other. The MACs netop
		// makes are apart: no pin has their prefix.
		if holder, ok := al.macs[network.UID][a.MAC]; ok && holder != owner {
			pools.release(owner, addrs)
			if strings.HasPrefix(holder, string(pod.UID)+"/") {
				return a, &WaitError{Reason: ReasonAddressRefused, Msg: fmt.Sprintf("Network %s: mac %s: pinned on two of the pod's interfaces", key, a.MAC), Refused: true}
			}
			al.waitLocked(key, name)
			return a, &WaitError{Reason: ReasonAddressRefused, Msg: fmt.Sprintf("Network %s: mac %s: another pod's interface on it has it", key, a.MAC)}
		}
		al.macs[network.UID][a.MAC] = owner
	}
	a.Routes = routesOf(families)
	return a, nil
}

// routesOf are the routes a Network of families hands its pods, as an
// allocation records them.
func routesOf(families netspec.Families) []netselect.Route {
	var out []netselect.Route
	for _, f := range families {
		for _, r := range f.Routes {
			out = append(out, netselect.Route{Dst: r.Destination.String(), GW: r.Via.String()})
		}
	}
	return out
}

// networkName is the Network of an allocation.
func networkName(a netselect.Allocation) cache.ObjectName {
	name, _ := cache.ParseObjectName(a.Network)
	return name
}

func ownerKey(uid types.UID, iface string) string { return string(uid) + "/" + iface }

// macFor is the interface's MAC: the one asked for, else one derived from
// its address (netselect.DerivedMACPrefix and the last four bytes), so
// that it is known before the interface exists.
func macFor(addr netip.Addr, asked net.HardwareAddr) string {
	if asked != nil {
		return asked.String()
	}
	b := addr.As16()
	return net.HardwareAddr(binary.BigEndian.AppendUint32(slices.Clone(netselect.DerivedMACPrefix), binary.BigEndian.Uint32(b[12:]))).String()
}

func (al *Allocator) waitLocked(network string, pod cache.ObjectName) {
	if al.waiting[network] == nil {
		al.waiting[network] = map[cache.ObjectName]bool{}
	}
	al.waiting[network][pod] = true
}

// poolsLocked are the pools of a Network, built from the allocations the
// pods carry the first time they are needed, and again if the Network's
// cidrs or gateways changed.
func (al *Allocator) poolsLocked(network *samplecrdv2.Network) (familyPools, netspec.Families, error) {
	families, errs := al.specs.Resolve(network)
	if len(errs) > 0 {
		return nil, nil, errs.ToAggregate()
	}
	if ps, ok := al.pools[network.UID]; ok && ps.match(families) {
		return ps, families, nil
	}
	ps, err := newFamilyPools(families)
	if err != nil {
		return nil, nil, err
	}
	macs := map[string]string{}
	pods, err := al.reads.PodsOf(network.UID)
	if err != nil {
		return nil, nil, err
	}
	for _, pod := range pods {
		have, err := netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
		if err != nil || have == nil {
			continue
		}
		name := cache.MetaObjectToName(pod)
		h, known := al.held[name]
		if known && h.uid != pod.UID {
			continue // a newer pod of that name holds its own
		}
		for _, a := range have {
			if a.NetworkUID != network.UID {
				continue
			}
			for _, prefix := range addresses(a) {
				ps.take(ownerKey(pod.UID, a.Interface), prefix.Addr())
			}
			if mac, err := net.ParseMAC(a.MAC); err == nil && !netselect.IsDerivedMAC(mac) {
				macs[a.MAC] = ownerKey(pod.UID, a.Interface)
			}
			// Recorded at once, so that the pod's deletion frees it even
			// if the pod is never synced before.
			if !known {
				h.uid = pod.UID
				h.allocations = append(h.allocations, a)
				al.held[name] = h
			}
		}
	}
	al.pools[network.UID], al.macs[network.UID] = ps, macs
	return ps, families, nil
}

// admits: pods of namespace may join network (tenancy.Admits), as far as
// Reads.Admits knows; a namespace it has not seen yet is tried again when
// it appears (NamespaceChanged).
func (al *Allocator) admits(network *samplecrdv2.Network, namespace string) error {
	err := al.reads.Admits(context.Background(), network, namespace)
	if notAdmitted := (*tenancy.NotAdmittedError)(nil); err != nil && !errors.As(err, &notAdmitted) {
		return &tenancy.NotAdmittedError{Namespace: namespace, Network: network.Namespace + "/" + network.Name, Why: err.Error()}
	}
	return err
}
