package allocator

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/netselect"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// Adopt records what a pod carries, after a restart or once the
// controller's own write is in the cache.
func (al *Allocator) Adopt(name cache.ObjectName, uid types.UID, have []netselect.Allocation) {
	al.mu.Lock()
	defer al.mu.Unlock()
	if h, ok := al.held[name]; ok && h.uid == uid && (h.written || len(h.allocations) == len(have)) {
		return
	}
	for _, a := range have {
		key := networkName(a)
		network, err := al.reads.Network(key.Namespace, key.Name)
		if err != nil || network.UID != a.NetworkUID {
			continue
		}
		// Building the pool takes in every pod's allocations, this one's
		// among them.
		if _, _, err := al.poolsLocked(network); err != nil {
			continue
		}
	}
	al.held[name] = held{uid: uid, allocations: have}
}

// Release frees what the pod named holds (of the pod with uid, if given):
// it went, finished, or asks for nothing.
func (al *Allocator) Release(name cache.ObjectName, uid types.UID) {
	al.mu.Lock()
	networks := al.releaseLocked(name, uid)
	al.mu.Unlock()
	al.freed(networks)
}

func (al *Allocator) releaseLocked(name cache.ObjectName, uid types.UID) []cache.ObjectName {
	h, ok := al.held[name]
	if !ok || uid != "" && h.uid != uid {
		return nil
	}
	delete(al.held, name)
	for _, a := range h.allocations {
		al.freeLocked(h.uid, a)
	}
	return networksOf(h.allocations)
}

func (al *Allocator) freeLocked(uid types.UID, a netselect.Allocation) {
	owner := ownerKey(uid, a.Interface)
	al.pools[a.NetworkUID].release(owner, addresses(a))
	if al.macs[a.NetworkUID][a.MAC] == owner {
		delete(al.macs[a.NetworkUID], a.MAC)
	}
}

// freed retries the pods waiting for the networks, which freed addresses,
// and tells their usage changed.
func (al *Allocator) freed(networks []cache.ObjectName) {
	for _, n := range networks {
		al.wake(n.String())
		al.changed(n)
	}
}

// networksOf are the Networks of allocations, in their order.
func networksOf(allocations []netselect.Allocation) []cache.ObjectName {
	var out []cache.ObjectName
	for _, a := range allocations {
		out = append(out, networkName(a))
	}
	return out
}

// Change frees what the node of a pod that holds allocations took down
// (takenDown) and picks addresses for what the pod added (adds), in one
// step: an interface removed and asked for again under its name is the
// same owner of the same pinned address or MAC, which freeing after would
// take from the new one. The added allocations are the pod's once the
// controller wrote them (Settle), or free again (Free).
func (al *Allocator) Change(pod *corev1.Pod, takenDown []netselect.Allocation, adds []netselect.Selection) ([]netselect.Allocation, error) {
	var added []netselect.Allocation
	var err error
	al.mu.Lock()
	for _, a := range takenDown {
		al.freeLocked(pod.UID, a)
	}
	if len(adds) > 0 {
		added, err = al.allocateLocked(pod, adds)
	}
	al.mu.Unlock()
	al.freed(networksOf(takenDown))
	return added, err
}

// Free gives back allocations of the pod with uid that its write did not
// carry (Change's additions); a Network being deleted counted them while
// the write was under way and learns they are free again, as do the pods
// waiting for an address.
func (al *Allocator) Free(uid types.UID, allocations []netselect.Allocation) {
	al.mu.Lock()
	for _, a := range allocations {
		al.freeLocked(uid, a)
	}
	al.mu.Unlock()
	al.freed(networksOf(allocations))
}

// Settle records the allocations the controller wrote on the pod named
// (of the pod with uid), and frees what it gave up with the write (freed):
// a pod no node runs yet frees its removed allocations only once the
// write lands, as until then its node may attach them.
func (al *Allocator) Settle(name cache.ObjectName, uid types.UID, allocations, freed []netselect.Allocation) {
	al.mu.Lock()
	for _, a := range freed {
		al.freeLocked(uid, a)
	}
	al.held[name] = held{uid: uid, allocations: allocations, written: true}
	al.mu.Unlock()
	al.freed(networksOf(freed))
}

// Written: the controller wrote allocations on their pod, new or now
// detaching; their Networks are told (OnUsageChanged).
func (al *Allocator) Written(allocations []netselect.Allocation) {
	for _, n := range networksOf(allocations) {
		al.changed(n)
	}
}

// NetworkChanged retries the pods waiting for the Network: it appeared or
// its spec changed.
func (al *Allocator) NetworkChanged(n *samplecrdv2.Network) { al.wake(n.Namespace + "/" + n.Name) }

// NetworkDeleted drops the pools of a Network that is gone.
func (al *Allocator) NetworkDeleted(n *samplecrdv2.Network) {
	al.mu.Lock()
	defer al.mu.Unlock()
	delete(al.pools, n.UID)
	delete(al.macs, n.UID)
	delete(al.retired, n.UID)
	al.specs.Forget(n.UID)
}

// wake retries the pods waiting for the Network namespace/name.
func (al *Allocator) wake(key string) {
	al.mu.Lock()
	waiting := al.waiting[key]
	delete(al.waiting, key)
	al.mu.Unlock()
	for name := range waiting {
		al.retry(name)
	}
}

// NamespaceChanged: a namespace appeared or its labels changed, which may
// change the Networks its pods may join. Its pods that wait are retried,
// and the Networks its pods hold addresses of are told, to show anew
// whether they still admit them (Outsiders).
func (al *Allocator) NamespaceChanged(namespace string) {
	al.mu.Lock()
	var woken []cache.ObjectName
	for network, pods := range al.waiting {
		for pod := range pods {
			if pod.Namespace == namespace {
				woken = append(woken, pod)
				delete(pods, pod)
			}
		}
		if len(pods) == 0 {
			delete(al.waiting, network)
		}
	}
	var networks []cache.ObjectName
	for pod, h := range al.held {
		if pod.Namespace != namespace {
			continue
		}
		for _, a := range h.allocations {
			if name := networkName(a); !slices.Contains(networks, name) {
				networks = append(networks, name)
			}
		}
	}
	al.mu.Unlock()
	for _, pod := range woken {
		al.retry(pod)
	}
	for _, n := range networks {
		al.changed(n)
	}
}
