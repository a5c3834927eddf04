// Package podnet allocates the addresses of the pods that join Networks.
// It is the one writer of allocations: when a pod asks for Networks (Multus's
// k8s.v1.cni.cncf.io/networks), it picks an address of each cidr of each
// Network (one per address family) and a MAC, and writes them on the pod in one patch, as netop's own
// allocations annotation and as Multus's network-status, for the pod's UID.
// An address is in use exactly while a pod that has not finished carries
// it (also while its interface is being detached, hotplug.go): deleted and
// finished pods free theirs with no write, and a restarted controller
// rebuilds every Network's pools from the pods
// before it allocates anything. The CNI plugin on the node reads the
// annotation and attaches the pod.
package podnet

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/controller/runner"
	"github.com/netop-dev/netop/internal/ipam"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/tenancy"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	samplecrdinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/samplecrd/v2"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v2"
)

// Name is the controller's name in logs and metrics.
const Name = "podnet"

// Reasons of the Events on pods.
const (
	// ReasonAllocated: a running pod got the addresses of a Network added
	// to its selection (a new pod's allocation writes no Event).
	ReasonAllocated       = "AddressesAllocated"
	ReasonInvalidNetworks = "InvalidNetworks"
	ReasonNetworkNotFound = "NetworkNotFound"
	ReasonNoFreeAddress   = "NoFreeAddress"
	ReasonAddressRefused  = "AddressRefused"
	// ReasonDetaching: the pod no longer asks for an interface; its node
	// takes it down, and then ReasonReleased.
	ReasonDetaching = "Detaching"
	ReasonReleased  = "AddressesReleased"
	// ReasonNotAdmitted: the pod's namespace may not join a Network it
	// names (tenancy.Admits).
	ReasonNotAdmitted = tenancy.Reason
)

// Options configure the controller.
type Options struct {
	Workers int
	// Resolver reads Networks' specs under the operator's policy.
	Resolver netspec.Resolver
}

// networkIndex indexes pods by the UIDs of the Networks they hold
// addresses of.
const networkIndex = "networkUID"

func podNetworkUIDs(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || netselect.Finished(pod) {
		return nil, nil
	}
	have, err := netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
	if err != nil {
		return nil, nil //nolint:nilerr // a pod with a broken annotation holds nothing
	}
	var uids []string
	for _, a := range have {
		if !slices.Contains(uids, string(a.NetworkUID)) {
			uids = append(uids, string(a.NetworkUID))
		}
	}
	return uids, nil
}

// Controller allocates pods' addresses.
type Controller struct {
	*runner.Controller
	kube kubernetes.Interface
	pods corelisters.PodLister
	// namespaces' labels say which Networks their pods may join (the
	// cache alone: a namespace it has not seen is waited for).
	namespaces tenancy.Namespaces
	// podIndex finds the pods holding addresses of a Network.
	podIndex cache.Indexer
	changed  func(network cache.ObjectName)
	networks samplecrdlisters.NetworkLister
	recorder record.EventRecorder
	resolver netspec.Resolver

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
	// readsSynced: the caches Usage, Retire and Outsiders read.
	readsSynced []cache.DoneChecker
}

type held struct {
	uid         types.UID
	allocations []netselect.Allocation
	// written: the allocations are what this controller last wrote, which
	// an older copy of the pod in the cache must not replace.
	written bool
}

// New makes the controller; call it before the informers start.
func New(ctx context.Context, kube kubernetes.Interface, pods coreinformers.PodInformer, networks samplecrdinformers.NetworkInformer,
	namespaces coreinformers.NamespaceInformer, recorder record.EventRecorder, m *metrics.Metrics, o Options) (*Controller, error) {
	c := &Controller{
		kube: kube, pods: pods.Lister(), networks: networks.Lister(), namespaces: tenancy.Namespaces{Lister: namespaces.Lister()}, recorder: recorder, resolver: o.Resolver,
		pools: map[types.UID]familyPools{}, macs: map[types.UID]map[string]string{}, held: map[cache.ObjectName]held{}, waiting: map[string]map[cache.ObjectName]bool{},
		retired: map[types.UID]bool{}, changed: func(cache.ObjectName) {}, podIndex: pods.Informer().GetIndexer(),
		readsSynced: []cache.DoneChecker{pods.Informer().HasSyncedChecker(), namespaces.Informer().HasSyncedChecker()},
	}
	if err := pods.Informer().AddIndexers(cache.Indexers{networkIndex: podNetworkUIDs}); err != nil {
		return nil, fmt.Errorf("indexing pods by Network: %w", err)
	}
	var err error
	if c.Controller, err = runner.New(runner.Options{Name: Name, Workers: o.Workers, Metrics: m}, c.sync); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	podsHandled, err := pods.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueuePod,
		UpdateFunc: func(oldObj, newObj any) {
			o, n := oldObj.(*corev1.Pod), newObj.(*corev1.Pod)
			// Not on binding: a pod no node runs holds nothing detaching,
			// and a sync then, before this controller's write is in the
			// cache, would write the allocations a second time.
			if o.Annotations[netselect.NetworksAnnotation] != n.Annotations[netselect.NetworksAnnotation] || netselect.HoldingChanged(o, n) ||
				o.Annotations[netselect.DetachedAnnotation] != n.Annotations[netselect.DetachedAnnotation] {
				c.enqueuePod(n)
			}
		},
		DeleteFunc: c.Enqueue,
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding Pod event handler: %w", err)
	}
	networksHandled, err := networks.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.wake,
		UpdateFunc: func(_, newObj any) { c.wake(newObj) },
		DeleteFunc: c.forget,
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding Network event handler: %w", err)
	}
	namespacesHandled, err := namespaces.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc: c.namespaceChanged,
		UpdateFunc: func(oldObj, newObj any) {
			o, n := oldObj.(*corev1.Namespace), newObj.(*corev1.Namespace)
			if !maps.Equal(o.Labels, n.Labels) {
				c.namespaceChanged(n)
			}
		},
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding Namespace event handler: %w", err)
	}
	c.WaitFor(podsHandled.HasSyncedChecker(), networksHandled.HasSyncedChecker(), namespacesHandled.HasSyncedChecker())
	return c, nil
}

// namespaceChanged: a namespace appeared or its labels changed, which may
// change the Networks its pods may join. Its pods that wait are tried
// again, and the Networks its pods hold addresses of show anew whether
// they still admit them.
func (c *Controller) namespaceChanged(obj any) {
	namespace, ok := obj.(*corev1.Namespace)
	if !ok {
		return
	}
	c.mu.Lock()
	var woken []cache.ObjectName
	for network, pods := range c.waiting {
		for pod := range pods {
			if pod.Namespace == namespace.Name {
				woken = append(woken, pod)
				delete(pods, pod)
			}
		}
		if len(pods) == 0 {
			delete(c.waiting, network)
		}
	}
	var networks []cache.ObjectName
	for pod, h := range c.held {
		if pod.Namespace != namespace.Name {
			continue
		}
		for _, a := range h.allocations {
			if name := networkName(a); !slices.Contains(networks, name) {
				networks = append(networks, name)
			}
		}
	}
	c.mu.Unlock()
	for _, pod := range woken {
		c.Add(pod)
	}
	for _, n := range networks {
		c.changed(n)
	}
}

// OnUsageChanged has f told of each Network whose addresses were allocated
// or freed (the Network controller, which shows the counts in status),
// instead of the function given before. Call it before Run: the workers
// read it unguarded.
func (c *Controller) OnUsageChanged(f func(network cache.ObjectName)) { c.changed = f }

// Synced are done once the pods and namespaces Usage, Retire and
// Outsiders read are in the caches.
func (c *Controller) Synced() []cache.DoneChecker { return c.readsSynced }

func (c *Controller) enqueuePod(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if ok && (pod.Annotations[netselect.NetworksAnnotation] != "" || pod.Annotations[netselect.AllocationsAnnotation] != "") {
		c.Enqueue(pod)
	}
}

// wake queues the pods waiting for a Network.
func (c *Controller) wake(obj any) {
	n, ok := obj.(*samplecrdv2.Network)
	if !ok {
		return
	}
	c.wakeNetwork(n.Namespace + "/" + n.Name)
}

// forget drops the pool of a Network that is gone.
func (c *Controller) forget(obj any) {
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	n, ok := obj.(*samplecrdv2.Network)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pools, n.UID)
	delete(c.macs, n.UID)
	delete(c.retired, n.UID)
}

func (c *Controller) wakeNetwork(key string) {
	c.mu.Lock()
	waiting := c.waiting[key]
	delete(c.waiting, key)
	c.mu.Unlock()
	for name := range waiting {
		c.Add(name)
	}
}

// sync gives a pod the addresses it asks for, or frees those of a pod that
// went or finished.
func (c *Controller) sync(ctx context.Context, name cache.ObjectName) error {
	pod, err := c.pods.Pods(name.Namespace).Get(name.Name)
	if apierrors.IsNotFound(err) {
		c.release(name, "")
		return nil
	}
	if err != nil {
		return err
	}
	if netselect.Finished(pod) {
		c.release(name, "")
		return nil
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod))
	selections, parseErr := netselect.Parse(pod.Annotations[netselect.NetworksAnnotation], pod.Namespace)
	have, haveErr := netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
	// A pod that holds allocations, or runs already, has its interfaces
	// follow its selection (hot-plug); written allocations stay the pod's
	// until its node says it no longer uses them.
	if haveErr == nil && (have != nil || pod.Spec.NodeName != "" && pod.Status.Phase == corev1.PodRunning) {
		if parseErr != nil {
			c.adopt(name, pod.UID, have)
			c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonInvalidNetworks, "%v; the pod keeps %s", parseErr, describe(netselect.Active(have)))
			return nil
		}
		return c.follow(ctx, pod, have, selections)
	}
	if parseErr != nil {
		c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonInvalidNetworks, "%v", parseErr)
		return nil
	}
	if len(selections) == 0 {
		c.release(name, "")
		return nil
	}

	allocations, err := c.allocate(pod, selections)
	if err != nil {
		var wait *waitError
		if errors.As(err, &wait) {
			c.recorder.Event(pod, corev1.EventTypeWarning, wait.reason, wait.msg)
			logger.V(1).Info("Pod waits for its networks", "reason", wait.reason, "message", wait.msg)
			if wait.refused {
				return c.recordRefusal(ctx, pod, wait.msg)
			}
			// Waiting for what is on its way: an older refusal no longer
			// holds.
			return c.recordRefusal(ctx, pod, "")
		}
		return err
	}
	if err := c.write(ctx, pod, allocations); err != nil {
		if apierrors.IsNotFound(err) {
			c.release(name, pod.UID)
		}
		return err
	}
	for _, a := range allocations {
		c.changed(networkName(a))
	}
	// No Event: the pod's own annotations say what it got, and an Event
	// per pod would double the writes of a pod's start. Events are for
	// what a user must see: waiting, refusals, changes to a running pod.
	logger.V(1).Info("Allocated", "allocations", describe(allocations))
	return nil
}

// waitError: the pod cannot get its addresses now; it is woken when the
// Network appears or changes, frees an address, or the pod's namespace
// changes. refused: not for want of something that is on its way (a
// Network being made, a free address), but because of what the pod asks:
// the CNI plugin fails the pod's sandbox at once, with msg.
type waitError struct {
	reason, msg string
	refused     bool
}

func (e *waitError) Error() string { return e.msg }

// allocate picks the pod's addresses, all or none, keeping those it holds
// already (a write that has not reached the cache yet, a retried write).
func (c *Controller) allocate(pod *corev1.Pod, selections []netselect.Selection) ([]netselect.Allocation, error) {
	name := cache.MetaObjectToName(pod)
	c.mu.Lock()
	defer c.mu.Unlock()
	if h, ok := c.held[name]; ok && h.uid == pod.UID && netselect.Satisfies(h.allocations, selections) {
		return h.allocations, nil
	}
	c.releaseLocked(name, "")
	out, err := c.allocateLocked(pod, selections)
	if err != nil {
		return nil, err
	}
	c.held[name] = held{uid: pod.UID, allocations: out}
	return out, nil
}

// allocateLocked picks addresses for selections, all or none.
func (c *Controller) allocateLocked(pod *corev1.Pod, selections []netselect.Selection) ([]netselect.Allocation, error) {
	name := cache.MetaObjectToName(pod)
	var out []netselect.Allocation
	undo := func() {
		for _, a := range out {
			c.freeLocked(pod.UID, a)
		}
	}
	for _, s := range selections {
		key := s.Namespace + "/" + s.Name
		network, err := c.networks.Networks(s.Namespace).Get(s.Name)
		if err != nil {
			undo()
			c.waitLocked(key, name)
			return nil, &waitError{reason: ReasonNetworkNotFound, msg: fmt.Sprintf("Network %s: %v", key, err)}
		}
		if c.retired[network.UID] || network.DeletionTimestamp != nil {
			undo()
			c.waitLocked(key, name)
			return nil, &waitError{reason: ReasonNetworkNotFound, msg: fmt.Sprintf("Network %s is being deleted", key)}
		}
		// Enforced here whatever admission let in: webhooks off or failing
		// open, a namespace relabelled since.
		if err := c.admits(network, pod.Namespace); err != nil {
			undo()
			c.waitLocked(key, name)
			return nil, &waitError{reason: ReasonNotAdmitted, msg: err.Error(), refused: true}
		}
		pools, families, err := c.poolsLocked(network)
		if err != nil {
			undo()
			c.waitLocked(key, name)
			return nil, &waitError{reason: ReasonNetworkNotFound, msg: fmt.Sprintf("Network %s: %v", key, err)}
		}
		a := netselect.Allocation{Network: key, NetworkUID: network.UID, Interface: s.Interface}
		addrs, err := pools.allocate(ownerKey(pod.UID, s.Interface), s.IPs)
		if err != nil {
			undo()
			var refused *refusedError
			switch {
			case errors.As(err, &refused):
				if refused.retry {
					c.waitLocked(key, name)
				}
				// An address another pod holds, or a cidr that may move,
				// is waited for; one that can never be the pod's is refused.
				return nil, &waitError{reason: ReasonAddressRefused, msg: fmt.Sprintf("Network %s: %v", key, err), refused: !refused.retry}
			case errors.Is(err, ipam.ErrFull):
				c.waitLocked(key, name)
				// A Network of one family says it as before; of two, which.
				msg := fmt.Sprintf("Network %s has no free address", key)
				var full *fullError
				if len(pools) > 1 && errors.As(err, &full) {
					msg += " in " + full.prefix.String()
				}
				return nil, &waitError{reason: ReasonNoFreeAddress, msg: msg}
			}
			return nil, err
		}
		for _, addr := range addrs {
			a.IPs = append(a.IPs, addr.String())
		}
		a.MAC = macFor(addrs[0].Addr(), s.MAC)
		if s.MAC != nil {
			// Another interface on the Network with the MAC would have
			// the bridge send one's frames to the other. The MACs netop
			// makes are apart: no pin has their prefix.
			owner := ownerKey(pod.UID, s.Interface)
			if holder, ok := c.macs[network.UID][a.MAC]; ok && holder != owner {
				pools.release(owner, addrs)
				undo()
				if strings.HasPrefix(holder, string(pod.UID)+"/") {
					return nil, &waitError{reason: ReasonAddressRefused, msg: fmt.Sprintf("Network %s: mac %s: pinned on two of the pod's interfaces", key, a.MAC), refused: true}
				}
				c.waitLocked(key, name)
				return nil, &waitError{reason: ReasonAddressRefused, msg: fmt.Sprintf("Network %s: mac %s: another pod's interface on it has it", key, a.MAC)}
			}
			c.macs[network.UID][a.MAC] = owner
		}
		a.Routes = routesOf(families)
		out = append(out, a)
	}
	return out, nil
}

// describe says what allocations give, for Events and logs.
func describe(allocations []netselect.Allocation) string {
	var parts []string
	for _, a := range allocations {
		parts = append(parts, fmt.Sprintf("%s %s on %s", a.Interface, strings.Join(a.IPs, ","), a.Network))
	}
	return strings.Join(parts, "; ")
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

func (c *Controller) waitLocked(network string, pod cache.ObjectName) {
	if c.waiting[network] == nil {
		c.waiting[network] = map[cache.ObjectName]bool{}
	}
	c.waiting[network][pod] = true
}

// poolsLocked are the pools of a Network, built from the allocations the
// pods carry the first time they are needed, and again if the Network's
// cidrs or gateways changed.
func (c *Controller) poolsLocked(network *samplecrdv2.Network) (familyPools, netspec.Families, error) {
	families, errs := c.resolver.ResolveFamilies(network.Spec)
	if len(errs) > 0 {
		return nil, nil, errs.ToAggregate()
	}
	if ps, ok := c.pools[network.UID]; ok && ps.match(families) {
		return ps, families, nil
	}
	ps, err := newFamilyPools(families)
	if err != nil {
		return nil, nil, err
	}
	macs := map[string]string{}
	pods, err := c.podIndex.ByIndex(networkIndex, string(network.UID))
	if err != nil {
		return nil, nil, err
	}
	for _, obj := range pods {
		pod := obj.(*corev1.Pod)
		have, err := netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
		if err != nil || have == nil {
			continue
		}
		name := cache.MetaObjectToName(pod)
		h, known := c.held[name]
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
				c.held[name] = h
			}
		}
	}
	c.pools[network.UID], c.macs[network.UID] = ps, macs
	return ps, families, nil
}

// Usage counts the Network's pod interfaces that hold addresses, how many
// more can get theirs, and the addresses it keeps from pods, as status
// shows them.
func (c *Controller) Usage(network *samplecrdv2.Network) (*samplecrdv2.NetworkAddresses, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ps, _, err := c.poolsLocked(network)
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
func (c *Controller) Retire(network *samplecrdv2.Network, limit int) (netselect.Holders, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retired[network.UID] = true
	return c.heldLocked(network, netip.Prefix{}, limit)
}

// Held counts the pods that hold addresses of family (one of the
// Network's cidrs) in a Network, naming up to limit of them.
func (c *Controller) Held(network *samplecrdv2.Network, family netip.Prefix, limit int) (netselect.Holders, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.heldLocked(network, family, limit)
}

// heldLocked counts the holders of addresses of family, or of any family
// if family is the zero Prefix.
func (c *Controller) heldLocked(network *samplecrdv2.Network, family netip.Prefix, limit int) (netselect.Holders, error) {
	ps, _, err := c.poolsLocked(network)
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
	holders, err := c.podsOf(network, limit, func(pod *corev1.Pod) bool { return holdsIn(pod, network.UID, ps) })
	if err != nil {
		return holders, err
	}
	// On the leader, pods whose allocation is still being written are not
	// in the index yet, but hold their addresses already.
	if allocated, _ := ps.usage(); holders.Count == 0 && allocated > 0 {
		holders.Count = 1
	}
	return holders, nil
}

// podsOf counts the pods indexed under network that match, naming up to
// limit of them, in order.
func (c *Controller) podsOf(network *samplecrdv2.Network, limit int, match func(*corev1.Pod) bool) (netselect.Holders, error) {
	objs, err := c.podIndex.ByIndex(networkIndex, string(network.UID))
	if err != nil {
		return netselect.Holders{}, err
	}
	var pods []string
	for _, obj := range objs {
		if pod := obj.(*corev1.Pod); match(pod) {
			pods = append(pods, cache.MetaObjectToName(pod).String())
		}
	}
	slices.Sort(pods)
	return netselect.Holders{Count: int64(len(pods)), Pods: pods[:min(limit, len(pods))]}, nil
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

// HeldIn counts the pods that hold addresses of network in r, naming up
// to limit of them: admission refuses to reserve addresses pods hold.
func (c *Controller) HeldIn(network *samplecrdv2.Network, r ipam.Range, limit int) (netselect.Holders, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	holders, err := c.podsOf(network, limit, func(pod *corev1.Pod) bool {
		return slices.ContainsFunc(podAddresses(pod, network.UID), func(p netip.Prefix) bool { return r.Contains(p.Addr()) })
	})
	// On the leader, addresses whose pods' allocations are still being
	// written are in the pools before they are in the cache.
	if ps, ok := c.pools[network.UID]; ok && err == nil && holders.Count == 0 {
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
func (c *Controller) CheckPinned(network *samplecrdv2.Network, s netselect.Selection) error {
	if len(s.IPs) == 0 {
		return nil
	}
	families, errs := c.resolver.ResolveFamilies(network.Spec)
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
func (c *Controller) PinnedHolder(network *samplecrdv2.Network, s netselect.Selection, pod cache.ObjectName) error {
	if len(s.IPs) == 0 && s.MAC == nil {
		return nil
	}
	objs, err := c.podIndex.ByIndex(networkIndex, string(network.UID))
	if err != nil {
		return err
	}
	for _, obj := range objs {
		holder := obj.(*corev1.Pod)
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
func (c *Controller) Outsiders(network *samplecrdv2.Network, limit int) (netselect.Holders, error) {
	return c.podsOf(network, limit, func(pod *corev1.Pod) bool { return c.admits(network, pod.Namespace) != nil })
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

// adopt records what a pod carries, after a restart or once our own write
// is in the cache.
func (c *Controller) adopt(name cache.ObjectName, uid types.UID, have []netselect.Allocation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h, ok := c.held[name]; ok && h.uid == uid && (h.written || len(h.allocations) == len(have)) {
		return
	}
	for _, a := range have {
		key := networkName(a)
		network, err := c.networks.Networks(key.Namespace).Get(key.Name)
		if err != nil || network.UID != a.NetworkUID {
			continue
		}
		// Building the pool takes in every pod's allocations, this one's
		// among them.
		if _, _, err := c.poolsLocked(network); err != nil {
			continue
		}
	}
	c.held[name] = held{uid: uid, allocations: have}
}

// release frees what the pod named holds (of the pod with uid, if given).
func (c *Controller) release(name cache.ObjectName, uid types.UID) {
	c.mu.Lock()
	networks := c.releaseLocked(name, uid)
	c.mu.Unlock()
	for _, n := range networks {
		c.wakeNetwork(n.String())
		c.changed(n)
	}
}

func (c *Controller) releaseLocked(name cache.ObjectName, uid types.UID) []cache.ObjectName {
	h, ok := c.held[name]
	if !ok || uid != "" && h.uid != uid {
		return nil
	}
	delete(c.held, name)
	var networks []cache.ObjectName
	for _, a := range h.allocations {
		c.freeLocked(h.uid, a)
		networks = append(networks, networkName(a))
	}
	return networks
}

func (c *Controller) freeLocked(uid types.UID, a netselect.Allocation) {
	owner := ownerKey(uid, a.Interface)
	c.pools[a.NetworkUID].release(owner, addresses(a))
	if c.macs[a.NetworkUID][a.MAC] == owner {
		delete(c.macs[a.NetworkUID], a.MAC)
	}
}

// admits: pods of namespace may join network (tenancy.Admits), as far as
// the namespace cache knows; a namespace it has not seen yet is tried
// again when it appears.
func (c *Controller) admits(network *samplecrdv2.Network, namespace string) error {
	err := c.namespaces.Admits(context.Background(), network, namespace)
	if notAdmitted := (*tenancy.NotAdmittedError)(nil); err != nil && !errors.As(err, &notAdmitted) {
		return &tenancy.NotAdmittedError{Namespace: namespace, Network: network.Namespace + "/" + network.Name, Why: err.Error()}
	}
	return err
}

// recordRefusal records on the pod why it gets no addresses, for the CNI
// plugin to fail its sandbox with, or with msg empty that it is not
// refused; unless the pod says so already.
func (c *Controller) recordRefusal(ctx context.Context, pod *corev1.Pod, msg string) error {
	have, refused := pod.Annotations[netselect.RefusedAnnotation]
	if have == msg && refused == (msg != "") {
		return nil
	}
	patch, err := netselect.AnnotationsPatch(pod, map[string]string{netselect.RefusedAnnotation: msg}, false)
	if err != nil {
		return err
	}
	if _, err := c.kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("recording whether the pod is refused its addresses: %w", err)
	}
	return nil
}

// write puts the allocations on the pod, as netop's annotation and as
// Multus's network-status, in one patch that holds only if the pod is
// still the one the cache showed.
func (c *Controller) write(ctx context.Context, pod *corev1.Pod, allocations []netselect.Allocation) error {
	own, err := json.Marshal(allocations)
	if err != nil {
		return err
	}
	status, err := netselect.StatusAnnotationValue(netselect.StatusesOf(allocations))
	if err != nil {
		return err
	}
	// The UID makes sure the patch lands on the pod the cache showed, not
	// on a new one of the same name. No resourceVersion: the scheduler and
	// the kubelet change a new pod at the same time, and each change would
	// cost a conflict and a second write; the annotations are netop's alone,
	// and once written they are the pod's for its life.
	// Refused no more, also if a refusal written an instant ago is not in
	// the cache yet: removing an absent annotation changes nothing.
	patch, err := netselect.AnnotationsPatch(pod, map[string]string{
		netselect.AllocationsAnnotation: string(own), netselect.StatusAnnotation: status, netselect.RefusedAnnotation: "",
	}, false)
	if err != nil {
		return err
	}
	if _, err := c.kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("writing the pod's allocations: %w", err)
	}
	return nil
}
