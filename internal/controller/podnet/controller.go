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
//
// The controller queues pods and writes them; what pods hold, and which
// addresses are free, its allocator keeps (package allocator), which the
// Network controller and admission query (Controller.Allocator).
package podnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

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

	"github.com/netop-dev/netop/internal/controller/podnet/allocator"
	"github.com/netop-dev/netop/internal/controller/runner"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/tenancy"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	samplecrdinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/samplecrd/v2"
)

// Name is the controller's name in logs and metrics.
const Name = "podnet"

// Reasons of the Events on pods.
const (
	// ReasonAllocated: a running pod got the addresses of a Network added
	// to its selection (a new pod's allocation writes no Event).
	ReasonAllocated       = "AddressesAllocated"
	ReasonInvalidNetworks = "InvalidNetworks"
	ReasonNetworkNotFound = allocator.ReasonNetworkNotFound
	ReasonNoFreeAddress   = allocator.ReasonNoFreeAddress
	ReasonAddressRefused  = allocator.ReasonAddressRefused
	// ReasonDetaching: the pod no longer asks for an interface; its node
	// takes it down, and then ReasonReleased.
	ReasonDetaching = "Detaching"
	ReasonReleased  = "AddressesReleased"
	// ReasonNotAdmitted: the pod's namespace may not join a Network it
	// names (tenancy.Admits).
	ReasonNotAdmitted = allocator.ReasonNotAdmitted
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
	kube     kubernetes.Interface
	pods     corelisters.PodLister
	recorder record.EventRecorder
	// allocator keeps what the pods hold and picks their addresses.
	allocator *allocator.Allocator
}

// New makes the controller; call it before the informers start.
func New(ctx context.Context, kube kubernetes.Interface, pods coreinformers.PodInformer, networks samplecrdinformers.NetworkInformer,
	namespaces coreinformers.NamespaceInformer, recorder record.EventRecorder, m *metrics.Metrics, o Options) (*Controller, error) {
	c := &Controller{kube: kube, pods: pods.Lister(), recorder: recorder}
	if err := pods.Informer().AddIndexers(cache.Indexers{networkIndex: podNetworkUIDs}); err != nil {
		return nil, fmt.Errorf("indexing pods by Network: %w", err)
	}
	var err error
	if c.Controller, err = runner.New(runner.Options{Name: Name, Workers: o.Workers, Metrics: m}, c.sync); err != nil {
		return nil, err
	}
	c.allocator = allocator.New(reads(pods, networks, namespaces), o.Resolver, c.Add)
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
		AddFunc:    c.networkChanged,
		UpdateFunc: func(_, newObj any) { c.networkChanged(newObj) },
		DeleteFunc: c.networkDeleted,
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

// reads are what the allocator reads of the informers' caches. Namespaces'
// labels come from the cache alone: a namespace it has not seen is waited
// for.
func reads(pods coreinformers.PodInformer, networks samplecrdinformers.NetworkInformer, namespaces coreinformers.NamespaceInformer) allocator.Reads {
	index, lister := pods.Informer().GetIndexer(), networks.Lister()
	return allocator.Reads{
		Network: func(namespace, name string) (*samplecrdv2.Network, error) {
			return lister.Networks(namespace).Get(name)
		},
		PodsOf: func(network types.UID) ([]*corev1.Pod, error) {
			objs, err := index.ByIndex(networkIndex, string(network))
			if err != nil {
				return nil, err
			}
			out := make([]*corev1.Pod, 0, len(objs))
			for _, obj := range objs {
				if pod, ok := obj.(*corev1.Pod); ok {
					out = append(out, pod)
				}
			}
			return out, nil
		},
		Admits: tenancy.Namespaces{Lister: namespaces.Lister()}.Admits,
		Synced: []cache.DoneChecker{pods.Informer().HasSyncedChecker(), namespaces.Informer().HasSyncedChecker()},
	}
}

// Allocator is the controller's allocator, which says how pods use
// Networks' addresses: the Network controller shows it in status, and
// admission checks pinned addresses and reserved ranges against it.
func (c *Controller) Allocator() *allocator.Allocator { return c.allocator }

// namespaceChanged: a namespace appeared or its labels changed, which may
// change the Networks its pods may join (allocator.NamespaceChanged).
func (c *Controller) namespaceChanged(obj any) {
	if namespace, ok := obj.(*corev1.Namespace); ok {
		c.allocator.NamespaceChanged(namespace.Name)
	}
}

func (c *Controller) enqueuePod(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if ok && (pod.Annotations[netselect.NetworksAnnotation] != "" || pod.Annotations[netselect.AllocationsAnnotation] != "") {
		c.Enqueue(pod)
	}
}

// networkChanged queues the pods waiting for a Network.
func (c *Controller) networkChanged(obj any) {
	if n, ok := obj.(*samplecrdv2.Network); ok {
		c.allocator.NetworkChanged(n)
	}
}

// networkDeleted drops the pool of a Network that is gone.
func (c *Controller) networkDeleted(obj any) {
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	if n, ok := obj.(*samplecrdv2.Network); ok {
		c.allocator.NetworkDeleted(n)
	}
}

// sync gives a pod the addresses it asks for, or frees those of a pod that
// went or finished.
func (c *Controller) sync(ctx context.Context, name cache.ObjectName) error {
	pod, err := c.pods.Pods(name.Namespace).Get(name.Name)
	if apierrors.IsNotFound(err) {
		c.allocator.Release(name, "")
		return nil
	}
	if err != nil {
		return err
	}
	if netselect.Finished(pod) {
		c.allocator.Release(name, "")
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
			c.allocator.Adopt(name, pod.UID, have)
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
		c.allocator.Release(name, "")
		return nil
	}

	allocations, err := c.allocator.Allocate(pod, selections)
	if err != nil {
		var wait *allocator.WaitError
		if errors.As(err, &wait) {
			c.recorder.Event(pod, corev1.EventTypeWarning, wait.Reason, wait.Msg)
			logger.V(1).Info("Pod waits for its networks", "reason", wait.Reason, "message", wait.Msg)
			if wait.Refused {
				return c.recordRefusal(ctx, pod, wait.Msg)
			}
			// Waiting for what is on its way: an older refusal no longer
			// holds.
			return c.recordRefusal(ctx, pod, "")
		}
		return err
	}
	if err := c.write(ctx, pod, allocations); err != nil {
		if apierrors.IsNotFound(err) {
			c.allocator.Release(name, pod.UID)
		}
		return err
	}
	c.allocator.Written(allocations)
	// No Event: the pod's own annotations say what it got, and an Event
	// per pod would double the writes of a pod's start. Events are for
	// what a user must see: waiting, refusals, changes to a running pod.
	logger.V(1).Info("Allocated", "allocations", describe(allocations))
	return nil
}

// describe says what allocations give, for Events and logs.
func describe(allocations []netselect.Allocation) string {
	var parts []string
	for _, a := range allocations {
		parts = append(parts, fmt.Sprintf("%s %s on %s", a.Interface, strings.Join(a.IPs, ","), a.Network))
	}
	return strings.Join(parts, "; ")
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
