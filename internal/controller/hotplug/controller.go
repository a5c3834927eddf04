// Package hotplug is the node's side of hot-plug: a pod that runs on this
// node gets the interfaces of the Networks added to its selection, and
// loses those removed, live. The allocation controller (the one writer)
// decides the addresses and marks removed interfaces detaching; this
// controller finds the pod's sandbox through the container runtime's CRI
// (the network namespace no CNI call names once the pod runs), attaches
// and detaches with the CNI plugin's own code and records (package cni),
// so that the runtime's CNI DEL later removes what hot-plug added, and
// writes what is really configured: the pod's network-status, and the
// acknowledgement of each interface taken down, after which the
// allocation controller frees its addresses.
package hotplug

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

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

	"github.com/netop-dev/netop/internal/cni"
	"github.com/netop-dev/netop/internal/cni/allocated"
	"github.com/netop-dev/netop/internal/controller/runner"
	"github.com/netop-dev/netop/internal/cri"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netselect"
)

// Name is the controller's name in logs and metrics.
const Name = "hotplug"

// Reasons of the Events on pods.
const (
	ReasonAttached           = "NetworkAttached"
	ReasonDetached           = "NetworkDetached"
	ReasonAttachFailed       = "NetworkAttachFailed"
	ReasonDetachFailed       = "NetworkDetachFailed"
	ReasonRuntimeUnreachable = "RuntimeUnreachable"
)

// sweepDelay is how long a deleted pod's sweep waits for its sandbox to
// be stopped, each time it finds it still ready.
const sweepDelay = 2 * time.Second

// Runtime is the node's container runtime, as package cri asks it.
type Runtime interface {
	// PodSandbox is the ready sandbox of the pod with that UID, or
	// cri.ErrNoSandbox.
	PodSandbox(ctx context.Context, uid string) (cri.Sandbox, error)
	// SandboxReady says whether the sandbox of that ID is still ready.
	SandboxReady(ctx context.Context, id string) (bool, error)
}

// Options configure the controller.
type Options struct {
	// Node is this node's name: only its pods are this controller's.
	Node     string
	Runtime  Runtime
	Attacher *cni.Attacher
	// Store holds the CNI plugin's records on this node.
	Store cni.Store
	// Config is the network configuration an interface is recorded under
	// when the pod's sandbox has no record yet (it joined no Network when
	// it started): the one whose GC may remove it.
	Config  string
	Workers int
}

// Controller attaches and detaches the Networks of this node's running
// pods as their allocations change.
type Controller struct {
	*runner.Controller
	kube     kubernetes.Interface
	pods     corelisters.PodLister
	recorder record.EventRecorder
	opts     Options

	mu sync.Mutex
	// gone holds the UIDs of the node's deleted pods, by name, until their
	// records are swept: a pod made again under its name (a StatefulSet's)
	// is another pod, whose sandbox may be recorded already, and is not
	// swept with them.
	gone map[cache.ObjectName]map[types.UID]bool
}

// New makes the controller; call it before the informers start.
func New(ctx context.Context, kube kubernetes.Interface, pods coreinformers.PodInformer, recorder record.EventRecorder, m *metrics.Metrics, o Options) (*Controller, error) {
	c := &Controller{kube: kube, pods: pods.Lister(), recorder: recorder, opts: o, gone: map[cache.ObjectName]map[types.UID]bool{}}
	var err error
	if c.Controller, err = runner.New(runner.Options{Name: Name, Workers: o.Workers, Metrics: m}, c.sync); err != nil {
		return nil, err
	}
	here := func(obj any) bool {
		if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tombstone.Obj
		}
		pod, ok := obj.(*corev1.Pod)
		return ok && pod.Spec.NodeName == o.Node
	}
	logger := klog.FromContext(ctx)
	handled, err := pods.Informer().AddEventHandlerWithOptions(cache.FilteringResourceEventHandler{
		FilterFunc: here,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc: c.Enqueue,
			UpdateFunc: func(oldObj, newObj any) {
				o, n := oldObj.(*corev1.Pod), newObj.(*corev1.Pod)
				if o.Status.Phase != n.Status.Phase || o.Annotations[netselect.AllocationsAnnotation] != n.Annotations[netselect.AllocationsAnnotation] ||
					o.Annotations[netselect.DetachedAnnotation] != n.Annotations[netselect.DetachedAnnotation] {
					c.Enqueue(n)
				}
			},
			DeleteFunc: c.deleted,
		},
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding Pod event handler: %w", err)
	}
	c.WaitFor(handled.HasSyncedChecker())
	return c, nil
}

// sync makes the interfaces of a running pod's sandbox those its
// allocations ask for, and says so on the pod.
func (c *Controller) sync(ctx context.Context, name cache.ObjectName) error {
	pod, err := c.pods.Pods(name.Namespace).Get(name.Name)
	c.mu.Lock()
	gone := maps.Clone(c.gone[name])
	c.mu.Unlock()
	if apierrors.IsNotFound(err) {
		return c.sweep(ctx, name, gone)
	}
	if err != nil {
		return err
	}
	if len(gone) > 0 {
		// Its predecessors of the same name left records to sweep, which
		// does not hold up its own sync.
		if err := c.sweep(ctx, name, gone); err != nil {
			klog.FromContext(ctx).Error(err, "Sweeping what deleted pods of the same name recorded", "pod", name)
			c.AddAfter(name, sweepDelay)
		}
	}
	// A pod that does not run yet gets its interfaces from the CNI ADD of
	// its sandbox, which reads the allocations then.
	if pod.Spec.NodeName != c.opts.Node || pod.Status.Phase != corev1.PodRunning {
		return nil
	}
	allocations, err := netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
	if err != nil || allocations == nil {
		// A pod on no Network has nothing of netop's: its last interfaces
		// were acknowledged down before the annotation went. A broken
		// annotation (only the allocation controller writes it) has
		// nothing to attach by.
		return nil //nolint:nilerr
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod))
	sandbox, err := c.opts.Runtime.PodSandbox(ctx, string(pod.UID))
	if errors.Is(err, cri.ErrNoSandbox) {
		return nil
	}
	if err != nil {
		c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonRuntimeUnreachable, "Cannot change the pod's Networks: %v", err)
		return err
	}
	// The runtime's DEL of the sandbox (the pod deleted meanwhile) waits
	// for a change under way, and finds it in the record. The report to
	// the API server, which may be down, comes after the lock: a DEL
	// works without it.
	rec, _, lock, err := c.opts.Store.LoadLocked(sandbox.ID)
	if lock == nil {
		return err
	}
	var failed []error
	ready := false
	if err == nil {
		// A DEL that ran between the runtime's answer above and the lock
		// would leave this change a sandbox being torn down: asked again,
		// the runtime says it is not ready (it stops a sandbox before its
		// DEL), and nothing is attached, nor reported, as when it had no
		// ready sandbox above.
		if ready, err = c.sandboxReady(ctx, sandbox.ID); err == nil && ready {
			rec, failed, err = c.change(klog.NewContext(ctx, logger), pod, sandbox, allocations, rec)
		}
	}
	if unlockErr := lock.Unlock(); unlockErr != nil {
		logger.Error(unlockErr, "Unlocking the sandbox's record")
	}
	if err != nil || !ready {
		return err
	}
	return errors.Join(append(failed, c.report(ctx, pod, allocations, rec))...)
}

// change makes the interfaces of the pod's sandbox, recorded in rec, those
// its allocations ask for, holding the sandbox's lock, and returns the
// record as it then stands; failed are the attachments that failed, err
// what stopped the change.
func (c *Controller) change(ctx context.Context, pod *corev1.Pod, sandbox cri.Sandbox, allocations []netselect.Allocation, rec cni.Record) (cni.Record, []error, error) {
	logger := klog.FromContext(ctx)
	rec.ContainerID, rec.Netns, rec.Pod, rec.PodUID = sandbox.ID, sandbox.Netns, cache.MetaObjectToName(pod).String(), string(pod.UID)
	want := netselect.Active(allocations)

	// Interfaces no allocation asks for any more go first: a name may pass
	// from one Network to another.
	var gone []string
	for _, r := range rec.Interfaces {
		if slices.ContainsFunc(want, func(a netselect.Allocation) bool { return same(r, a) }) {
			continue
		}
		if err := c.opts.Attacher.Del(sandbox.ID, r.Interface); err != nil {
			c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonDetachFailed, "Detaching %s from Network %s: %v", r.Interface, r.Network, err)
			return rec, nil, errors.Join(err, c.opts.Store.Forget(rec, gone))
		}
		gone = append(gone, r.Interface)
		c.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonDetached, "Detached %s (%s) from Network %s", r.Interface, strings.Join(r.IPs, ","), r.Network)
		logger.Info("Detached", "interface", r.Interface, "network", r.Network, "containerID", sandbox.ID)
	}
	if err := c.opts.Store.Forget(rec, gone); err != nil {
		return rec, nil, err
	}
	rec = rec.Without(gone)

	var failed []error
	// What hot-plug adds is recorded under the sandbox's configuration.
	added := c.opts.Config
	if len(rec.Interfaces) > 0 {
		added = rec.Interfaces[0].Config
	}
	for _, a := range want {
		at, err := allocated.Attachment(sandbox.ID, sandbox.Netns, a)
		if err != nil {
			c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonAttachFailed, "Attaching %s to Network %s: %v", a.Interface, a.Network, err)
			continue
		}
		config := added
		if i := slices.IndexFunc(rec.Interfaces, func(r cni.RecordedInterface) bool { return same(r, a) }); i >= 0 {
			config = rec.Interfaces[i].Config
			err := c.opts.Attacher.Check(at)
			if err == nil {
				continue
			}
			if !errors.Is(err, cni.ErrNotAsAttached) {
				// Not known now (its bridge not there, a namespace or
				// netlink failing): left as it is, and looked at again.
				err = fmt.Errorf("checking %s on Network %s: %w", a.Interface, a.Network, err)
				c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonAttachFailed, "%v", err)
				failed = append(failed, err)
				continue
			}
			// Recorded, but not as attached (down, off its bridge, an
			// address gone): made again from nothing, under the
			// configuration that made it. Add would find the pod's
			// interface there and fail, and the record dropped then
			// would leave an interface no record knows, whose addresses
			// the node would acknowledge free while the pod still has
			// them.
			if err := c.opts.Attacher.Del(sandbox.ID, a.Interface); err != nil {
				err = fmt.Errorf("repairing %s on Network %s: %w", a.Interface, a.Network, err)
				c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonAttachFailed, "%v", err)
				failed = append(failed, err)
				continue
			}
		}
		// Recorded before anything is made, as the CNI plugin does: a
		// crash after this leaves a record that a DEL, and this
		// controller's next sync (which finds it not in place), undo.
		rec = rec.With(allocated.Interfaces(config, sandbox.ID, a)...)
		if err := c.opts.Store.Save(rec); err != nil {
			return rec, failed, err
		}
		attached, err := c.attach(ctx, at)
		if err != nil {
			// Add leaves nothing behind; the record is dropped with it.
			err = fmt.Errorf("attaching %s to Network %s: %w", a.Interface, a.Network, err)
			if ferr := c.opts.Store.Forget(rec, []string{a.Interface}); ferr != nil {
				err = errors.Join(err, ferr)
			}
			rec = rec.Without([]string{a.Interface})
			c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonAttachFailed, "%v", err)
			failed = append(failed, err)
			continue
		}
		c.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonAttached, "Attached %s (%s, %s) to Network %s", a.Interface, strings.Join(a.IPs, ","), attached.MAC, a.Network)
		logger.Info("Attached", "interface", a.Interface, "network", a.Network, "ips", a.IPs, "containerID", sandbox.ID, "hostVeth", attached.HostVeth)
	}
	return rec, failed, nil
}

// sandboxReady asks the runtime whether the sandbox is still ready, within
// runtimeWait: the sandbox's lock is held meanwhile, and its DEL waits.
func (c *Controller) sandboxReady(ctx context.Context, id string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, runtimeWait)
	defer cancel()
	return c.opts.Runtime.SandboxReady(ctx, id)
}

// runtimeWait bounds a question to the runtime asked under a sandbox's
// lock.
const runtimeWait = 5 * time.Second

// bridgeWait bounds how long an attachment waits for its Network's bridge
// on this node, which the agent builds once it sees the allocation; a
// failure is retried with the pod's backoff.
const bridgeWait = 30 * time.Second

// attach attaches at once its bridge is up.
func (c *Controller) attach(ctx context.Context, at cni.Attachment) (cni.Attached, error) {
	ctx, cancel := context.WithTimeout(ctx, bridgeWait)
	defer cancel()
	return c.opts.Attacher.Add(ctx, at)
}

// same: the recorded interface is the allocation's.
func same(r cni.RecordedInterface, a netselect.Allocation) bool {
	return r.Interface == a.Interface && r.Network == a.Network && slices.Equal(r.IPs, a.IPs)
}

// report writes on the pod what its sandbox has: network-status with the
// interfaces of its allocations that are configured (other entries, the
// pod network's and other plugins', kept as they are), and the
// acknowledgement of the detaching allocations that are not. Nothing is
// written when the pod says so already, and nothing if it changed since
// it was read: its next sync writes what holds then.
func (c *Controller) report(ctx context.Context, pod *corev1.Pod, allocations []netselect.Allocation, rec cni.Record) error {
	var current []netselect.Status
	if s := pod.Annotations[netselect.StatusAnnotation]; s != "" {
		_ = json.Unmarshal([]byte(s), &current) // one that does not parse is rewritten
	}
	ours := map[string]bool{}
	for _, a := range allocations {
		ours[a.Interface] = true
	}
	var statuses []netselect.Status
	for _, s := range current {
		if !ours[s.Interface] {
			statuses = append(statuses, s)
		}
	}
	var configured []netselect.Allocation
	var acks []string
	for _, a := range allocations {
		in := slices.ContainsFunc(rec.Interfaces, func(r cni.RecordedInterface) bool { return same(r, a) })
		switch {
		case in && !a.Detaching:
			configured = append(configured, a)
		case !in && a.Detaching:
			acks = append(acks, a.Key())
		}
	}
	statuses = append(statuses, netselect.StatusesOf(configured)...)
	ack := strings.Join(acks, ",")
	if reflect.DeepEqual(normal(current), normal(statuses)) && pod.Annotations[netselect.DetachedAnnotation] == ack {
		return nil
	}
	status, err := netselect.StatusAnnotationValue(statuses)
	if err != nil {
		return err
	}
	patch, err := netselect.AnnotationsPatch(pod, map[string]string{netselect.StatusAnnotation: status, netselect.DetachedAnnotation: ack}, true)
	if err != nil {
		return err
	}
	klog.FromContext(ctx).V(1).Info("Writing what the pod's sandbox has", "pod", klog.KObj(pod), "networkStatus", normal(statuses), "was", normal(current), "detached", ack)
	// Through pods/status, as the CNI plugin writes network-status with
	// the node's credentials.
	_, err = c.kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("writing the pod's network-status: %w", err)
	}
	return nil
}

// normal is statuses as JSON compares them: nil and empty alike.
func normal(statuses []netselect.Status) string {
	data, _ := json.Marshal(statuses)
	if string(data) == "null" {
		return "[]"
	}
	return string(data)
}

// deleted notes a deleted pod's UID for sweep, and has it swept.
func (c *Controller) deleted(obj any) {
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		name := cache.MetaObjectToName(pod)
		c.mu.Lock()
		if c.gone[name] == nil {
			c.gone[name] = map[types.UID]bool{}
		}
		c.gone[name][pod.UID] = true
		c.mu.Unlock()
	}
	c.Enqueue(obj)
}

// sweep detaches what the records of the deleted pods of a name (uids)
// still hold in sandboxes the runtime no longer has ready:
// the runtime's CNI DEL removes what it knows of (all of a chained
// configuration's interfaces), and this removes what hot-plug added beside
// Multus's delegates, whose DEL covers only the interfaces Multus
// attached.
func (c *Controller) sweep(ctx context.Context, name cache.ObjectName, uids map[types.UID]bool) error {
	// A record that is not one names no pod: its container's DEL removes
	// it, and what it held.
	records, _, err := c.opts.Store.List()
	if err != nil {
		return err
	}
	var errs []error
	again := false
	for _, r := range records {
		// A record made before UIDs were recorded goes by its name.
		if r.Pod != name.String() || r.PodUID != "" && !uids[types.UID(r.PodUID)] {
			continue
		}
		ready, err := c.opts.Runtime.SandboxReady(ctx, r.ContainerID)
		if err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", name, err))
			continue
		}
		if ready {
			// The kubelet stops the sandbox (and the runtime's CNI DEL
			// detaches) after the pod is gone from the API: looked at
			// again shortly.
			c.AddAfter(name, sweepDelay)
			again = true
			continue
		}
		gone, err := c.detachRecorded(r.ContainerID)
		if err != nil {
			errs = append(errs, err)
		}
		if len(gone) > 0 {
			klog.FromContext(ctx).V(1).Info("Removed what a deleted pod's sandbox still recorded", "pod", name, "containerID", r.ContainerID, "interfaces", gone)
		}
	}
	if err := errors.Join(errs...); err != nil || again {
		return err
	}
	c.mu.Lock()
	for uid := range uids {
		delete(c.gone[name], uid)
	}
	if len(c.gone[name]) == 0 {
		delete(c.gone, name)
	}
	c.mu.Unlock()
	return nil
}

// detachRecorded detaches what the container's record holds, as it
// stands under the container's lock (a DEL may have run since it was
// listed), and returns the interfaces it detached.
func (c *Controller) detachRecorded(containerID string) ([]string, error) {
	r, _, lock, err := c.opts.Store.LoadLocked(containerID)
	if lock == nil {
		return nil, err
	}
	var errs []error
	var gone []string
	if err != nil {
		errs = append(errs, err)
	}
	for _, i := range r.Interfaces {
		if err := c.opts.Attacher.Del(r.ContainerID, i.Interface); err != nil {
			errs = append(errs, err)
			continue
		}
		gone = append(gone, i.Interface)
	}
	if err := c.opts.Store.Forget(r, gone); err != nil {
		errs = append(errs, err)
	}
	if err := lock.Unlock(); err != nil {
		errs = append(errs, err)
	}
	return gone, errors.Join(errs...)
}
