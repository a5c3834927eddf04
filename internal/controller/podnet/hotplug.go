package podnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/controller/podnet/allocator"
	"github.com/netop-dev/netop/internal/netselect"
)

// follow has the interfaces of a pod that holds allocations, or runs,
// follow its selection (hot-plug). Added selections get addresses at
// once; the node attaches them and writes network-status. Removed ones
// are marked detaching and keep their addresses until the pod's node
// acknowledges that the interface is down (netselect.DetachedAnnotation):
// only then are they freed, so no address is ever configured in two pods.
// A pod no node runs has nothing to take down: its removed allocations
// are freed at once. One write per change, made only if the pod is still
// the version read (the node writes the acknowledgement the same way), so
// that neither writer acts on the other's stale state.
func (c *Controller) follow(ctx context.Context, pod *corev1.Pod, have []netselect.Allocation, selections []netselect.Selection) error {
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod))
	name := cache.MetaObjectToName(pod)
	c.allocator.Adopt(name, pod.UID, have)
	change, err := netselect.Diff(have, selections)
	if err != nil {
		c.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonInvalidNetworks, "%v; the pod keeps %s", err, describe(netselect.Active(have)))
		return nil
	}
	acked := netselect.ParseDetached(pod.Annotations[netselect.DetachedAnnotation])
	unbound := pod.Spec.NodeName == ""
	// Freed: what the node took down (takenDown), and what a pod no node
	// runs gives up (unboundFreed).
	var next, detaching, takenDown, unboundFreed []netselect.Allocation
	for _, a := range have {
		removed := !a.Detaching && slices.ContainsFunc(change.Removed, func(r netselect.Allocation) bool { return r.Key() == a.Key() })
		switch {
		case (a.Detaching || removed) && acked[a.Key()]:
			takenDown = append(takenDown, a)
		case (a.Detaching || removed) && unbound:
			unboundFreed = append(unboundFreed, a)
		case removed:
			a.Detaching = true
			detaching = append(detaching, a)
			next = append(next, a)
		default:
			next = append(next, a)
		}
	}
	// A name still held by an interface being detached is added once
	// that one is gone: the acknowledgement brings the pod back here.
	var adds []netselect.Selection
	for _, s := range change.Added {
		if !slices.ContainsFunc(next, func(a netselect.Allocation) bool { return a.Interface == s.Interface }) {
			adds = append(adds, s)
		}
	}
	// What the node took down is freed before anything is added
	// (allocator.Change). Down, it is configured nowhere, whether the
	// write below lands or not. What a pod no node runs yet gives up is
	// freed only once the write lands: until then its node may attach it.
	added, err := c.allocator.Change(pod, takenDown, adds)
	var wait *allocator.WaitError
	switch {
	case errors.As(err, &wait):
		// What is removed goes on; the additions wait.
		c.recorder.Event(pod, corev1.EventTypeWarning, wait.Reason, wait.Msg)
		logger.V(1).Info("Pod waits for added networks", "reason", wait.Reason, "message", wait.Msg)
	case err != nil:
		return err
	}
	if len(added) == 0 && len(detaching) == 0 && len(takenDown) == 0 && len(unboundFreed) == 0 {
		return nil
	}
	next = append(next, added...)
	if err := c.writeChange(ctx, pod, next, len(acked) > 0); err != nil {
		c.allocator.Free(pod.UID, added)
		if apierrors.IsNotFound(err) {
			c.allocator.Release(name, pod.UID)
		}
		return err
	}
	c.allocator.Settle(name, pod.UID, next, unboundFreed)
	c.allocator.Written(slices.Concat(added, detaching))
	if len(added) > 0 {
		c.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonAllocated, "Allocated %s", describe(added))
	}
	if len(detaching) > 0 {
		c.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonDetaching, "Detaching %s: its addresses are freed once the pod's node took the interface down", describe(detaching))
	}
	// A pod no node runs has nothing taken down: one of the two at most.
	freed := slices.Concat(takenDown, unboundFreed)
	if len(freed) > 0 {
		c.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonReleased, "Released %s", describe(freed))
	}
	logger.V(1).Info("Networks changed", "added", describe(added), "detaching", describe(detaching), "released", describe(freed))
	return nil
}

// writeChange writes a pod's new allocations (none removes the
// annotation) if the pod is still at the version read, and with
// clearAcks the node's acknowledgements, which the write consumes.
func (c *Controller) writeChange(ctx context.Context, pod *corev1.Pod, allocations []netselect.Allocation, clearAcks bool) error {
	annotations := map[string]string{netselect.AllocationsAnnotation: ""}
	if len(allocations) > 0 {
		own, err := json.Marshal(allocations)
		if err != nil {
			return err
		}
		annotations[netselect.AllocationsAnnotation] = string(own)
	}
	if clearAcks {
		annotations[netselect.DetachedAnnotation] = ""
	}
	patch, err := netselect.AnnotationsPatch(pod, annotations, true)
	if err != nil {
		return err
	}
	if _, err := c.kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("writing the pod's changed allocations: %w", err)
	}
	return nil
}
