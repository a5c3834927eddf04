package agent

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/netselect"
)

// Demand is which Networks this node needs: those on which a pod of the
// node holds an interface (its allocations, detaching ones included, until
// the pod finishes or goes), and each of them for ReleaseDelay more after
// the last such pod left, so that pods coming and going do not make and
// remove the bridge each time. It reads the pods from the shared cache,
// has the node's cache of Networks watch those it names, and says, through
// OnChange, when a Network's need changed.
type Demand struct {
	node     string
	delay    time.Duration
	networks Watcher
	// now is time.Now, but in tests.
	now func() time.Time

	mu sync.Mutex
	// pods holds, by pod UID, the Networks each local pod is on.
	pods map[types.UID][]networkRef
	// users counts, by Network UID, the local pods on it.
	users map[types.UID]int
	// idle holds, by Network UID, when its last local pod left, until its
	// delay is over and Wants said so.
	idle map[types.UID]time.Time
	// names holds the name of each Network followed: on which local pods
	// are, or were until Release.
	names    map[types.UID]cache.ObjectName
	onChange func(name cache.ObjectName, after time.Duration)
	synced   cache.DoneChecker
}

// Watcher is the node's cache of Networks (networkcache.ByName): it holds
// the Networks it is told to watch.
type Watcher interface {
	Watch(name cache.ObjectName)
	Unwatch(name cache.ObjectName)
}

// networkRef is a Network as an allocation names it.
type networkRef struct {
	uid  types.UID
	name cache.ObjectName
}

// NewDemand follows the pods of node in pods' cache, keeping a Network
// needed for delay after its last pod there left, and has networks watch
// the Networks they are on until Release. Call it before the informer
// starts.
func NewDemand(pods coreinformers.PodInformer, node string, delay time.Duration, networks Watcher) (*Demand, error) {
	d := &Demand{node: node, delay: delay, networks: networks, now: time.Now, pods: map[types.UID][]networkRef{},
		users: map[types.UID]int{}, idle: map[types.UID]time.Time{}, names: map[types.UID]cache.ObjectName{}}
	reg, err := pods.Informer().AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: func(obj any) bool {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			pod, ok := obj.(*corev1.Pod)
			return ok && pod.Spec.NodeName == node
		},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { d.set(obj.(*corev1.Pod)) },
			UpdateFunc: func(_, obj any) { d.set(obj.(*corev1.Pod)) },
			DeleteFunc: func(obj any) {
				if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = tomb.Obj
				}
				d.update(obj.(*corev1.Pod).UID, nil)
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("following the node's pods: %w", err)
	}
	d.synced = reg.HasSyncedChecker()
	return d, nil
}

// OnChange registers f, told of each Network whose need changed and when
// to look at it again: at once when it became needed, after the delay when
// its last pod left. Call it before the informer starts.
func (d *Demand) OnChange(f func(name cache.ObjectName, after time.Duration)) { d.onChange = f }

// HasSyncedChecker is done once every pod of the initial list was seen:
// until then, a Network that looks unneeded may be one whose pods are not
// seen yet.
func (d *Demand) HasSyncedChecker() cache.DoneChecker { return d.synced }

// Wants reports whether the node needs the Network of uid: a pod here is
// on it, or its last one left less than the delay ago.
func (d *Demand) Wants(uid types.UID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.wants(uid)
}

// wants is Wants; d.mu is held.
func (d *Demand) wants(uid types.UID) bool {
	if d.users[uid] > 0 {
		return true
	}
	since, ok := d.idle[uid]
	if !ok {
		return false
	}
	if d.now().Sub(since) < d.delay {
		return true
	}
	delete(d.idle, uid)
	return false
}

// Release is told that the node has nothing left of the Network of that
// name: unless a pod here is on a Network of that name again, or was until
// less than the delay ago, the cache stops watching it. In the second
// case it returns when to ask again: a look at the name scheduled for the
// end of a later delay may have been folded into an earlier one.
func (d *Demand) Release(name cache.ObjectName) (retryAfter time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var released []types.UID
	for uid, n := range d.names {
		if n != name {
			continue
		}
		if d.users[uid] > 0 {
			return 0 // its last pod's leaving tells
		}
		if d.wants(uid) {
			return d.delay - d.now().Sub(d.idle[uid])
		}
		released = append(released, uid)
	}
	for _, uid := range released {
		delete(d.names, uid)
	}
	// Under d.mu: a pod needing the name again waits, and watches it anew.
	d.networks.Unwatch(name)
	return 0
}

// set records the Networks pod is on: none once it finished, since its
// sandbox, and with it its interfaces, goes then.
func (d *Demand) set(pod *corev1.Pod) {
	var on []networkRef
	if !netselect.Finished(pod) {
		// A malformed annotation (which the policies keep anyone but
		// netop from writing) holds nothing here: the CNI plugin refuses
		// the pod.
		allocations, _ := netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
		for _, a := range allocations {
			namespace, name, err := cache.SplitMetaNamespaceKey(a.Network)
			if err != nil || namespace == "" {
				continue // the allocation controller always names both
			}
			on = append(on, networkRef{uid: a.NetworkUID, name: cache.ObjectName{Namespace: namespace, Name: name}})
		}
		slices.SortFunc(on, func(a, b networkRef) int { return cmp.Compare(a.uid, b.uid) })
		on = slices.CompactFunc(on, func(a, b networkRef) bool { return a.uid == b.uid })
	}
	d.update(pod.UID, on)
}

// update replaces the Networks the pod of uid is on, and tells of those
// whose need changed.
func (d *Demand) update(pod types.UID, on []networkRef) {
	type change struct {
		name  cache.ObjectName
		after time.Duration
	}
	var changes []change
	d.mu.Lock()
	had := d.pods[pod]
	if slices.Equal(had, on) {
		d.mu.Unlock()
		return
	}
	if len(on) == 0 {
		delete(d.pods, pod)
	} else {
		d.pods[pod] = on
	}
	for _, ref := range on {
		if slices.Contains(had, ref) {
			continue
		}
		uid := ref.uid
		d.users[uid]++
		if d.users[uid] == 1 {
			d.names[uid] = ref.name
			d.networks.Watch(ref.name)
			_, wasIdle := d.idle[uid]
			delete(d.idle, uid)
			if !wasIdle {
				changes = append(changes, change{ref.name, 0})
			}
		}
	}
	for _, ref := range had {
		if slices.Contains(on, ref) {
			continue
		}
		uid := ref.uid
		if d.users[uid]--; d.users[uid] > 0 {
			continue
		}
		delete(d.users, uid)
		d.idle[uid] = d.now()
		changes = append(changes, change{ref.name, d.delay})
	}
	f := d.onChange
	d.mu.Unlock()
	if f == nil {
		return
	}
	for _, c := range changes {
		f(c.name, c.after)
	}
}
