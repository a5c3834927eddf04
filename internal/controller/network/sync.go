package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/overlap"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// sync reconciles one Network: desired state from the Network, actual
// state from the backend, and the difference applied. It returns an error
// only for what a retry can fix.
func (c *Controller) sync(ctx context.Context, name cache.ObjectName) error {
	logger := klog.FromContext(ctx).WithValues("network", klog.KRef(name.Namespace, name.Name))
	ctx = klog.NewContext(ctx, logger)

	cached, err := c.lister.Networks(name.Namespace).Get(name.Name)
	if apierrors.IsNotFound(err) {
		if c.agent() {
			return c.removeGone(ctx, name)
		}
		// Gone: the finalizer made sure its backend network went first.
		// Anything left over is the sweeper's.
		return nil
	}
	if err != nil {
		return err
	}
	// The cache's object is shared; never change it.
	n := cached.DeepCopy()

	if n.DeletionTimestamp != nil {
		if c.agent() {
			// Pods may still use it: the bridge goes once the Network is
			// gone, which the controller's finalizer holds until they are.
			return nil
		}
		return c.finalize(ctx, n)
	}
	if !c.agent() && !slices.Contains(n.Finalizers, samplecrd.Finalizer) {
		// The admission webhook adds it at creation; this covers Networks
		// made while it was not there.
		if n, err = c.patchFinalizers(ctx, n, append(slices.Clone(n.Finalizers), samplecrd.Finalizer)); err != nil {
			return err
		}
	}

	families, errs := c.resolver.ResolveFamilies(n.Spec)
	if len(errs) > 0 {
		msg := errs.ToAggregate().Error()
		c.eventf(n, corev1.EventTypeWarning, samplecrd.ReasonInvalid, "Invalid spec: %s", msg)
		// Not retried: only a new spec can fix it, and that is a new event.
		return c.updateStatus(ctx, cached, n, metav1.ConditionFalse, samplecrd.ReasonInvalid, msg, n.Status.Backend)
	}

	// The cache may be ahead of the event handler: record n first.
	entry := entryOf(n, families.Prefixes()...)
	c.enqueueEntries(c.arbiter.Contend(entry))
	verdict := c.arbiter.Acquire(entry)
	if verdict.Winner != nil {
		return c.yield(ctx, cached, n, families, *verdict.Winner)
	}
	if !verdict.Build() {
		// n wins, but an overlapping Network may still have its backend
		// network: its sync removes it and, through the arbiter, enqueues
		// n again.
		logger.V(2).Info("Waiting for overlapping Networks to remove their backend networks", "waiting", len(verdict.Waiting))
		c.enqueueEntries(verdict.Waiting)
		return nil
	}

	want := backendNetwork(c.owner(n), families)
	want.VNI = c.wantVNI(n)
	if c.nodes != nil {
		vni, ok := c.vnis.assign(n.UID)
		if !ok {
			return c.updateStatus(ctx, cached, n, metav1.ConditionFalse, samplecrd.ReasonBackendError, "every VXLAN network identifier is taken", n.Status.Backend)
		}
		n.Status.VNI = vni
	}
	res, err := c.backend.Ensure(ctx, want, backendRef(n.Status.Backend))
	if errors.Is(err, backend.ErrInvalid) {
		msg := err.Error()
		c.eventf(n, corev1.EventTypeWarning, samplecrd.ReasonInvalid, "Backend %s refuses the spec: %s", c.backend.Type(), msg)
		// Not retried: no retry can fix it, only a new spec can.
		return c.updateStatus(ctx, cached, n, metav1.ConditionFalse, samplecrd.ReasonInvalid, msg, n.Status.Backend)
	}
	if err != nil {
		c.eventf(n, corev1.EventTypeWarning, samplecrd.ReasonBackendError, "Backend %s failed: %v", c.backend.Type(), err)
		if statusErr := c.updateStatus(ctx, cached, n, metav1.ConditionFalse, samplecrd.ReasonBackendError, err.Error(), n.Status.Backend); statusErr != nil {
			logger.Error(statusErr, "Could not record the backend error in status")
		}
		return fmt.Errorf("ensuring backend network: %w", err)
	}
	switch res.Action {
	case backend.ActionCreated:
		c.eventf(n, corev1.EventTypeNormal, ReasonCreated, "Created %s network %s for %s", res.Status.Type, backendName(&res.Status), families)
	case backend.ActionUpdated:
		c.eventf(n, corev1.EventTypeNormal, ReasonUpdated, "Updated %s network %s to %s", res.Status.Type, backendName(&res.Status), families)
	}
	if res.Action != backend.ActionNone {
		c.metrics.BackendChanges.WithLabelValues(string(res.Status.Type), string(res.Action)).Inc()
		logger.Info("Backend network converged", "action", res.Action, "cidrs", families.CIDRs(), "gateways", families.Gateways())
	}
	c.arbiter.Built(entry)
	if c.agent() && c.overlay && want.VNI == 0 {
		// The bridge stands, but joins the other nodes' only once the
		// controller gave the Network its VNI, which is a new event.
		return nil
	}
	c.setAddresses(ctx, n)
	n.Status.CIDRs, n.Status.Gateways = families.CIDRs(), families.Gateways()
	ready, reason, msg := c.setNodes(n, fmt.Sprintf("%s network %s has %s", res.Status.Type, backendName(&res.Status), families))
	return c.updateStatus(ctx, cached, n, ready, reason, msg, backendStatus(&res.Status))
}

// backendNetwork is the backend network of families, the first the
// primary.
func backendNetwork(owner backend.Owner, families netspec.Families) backend.Network {
	want := backend.Network{Owner: owner, Families: make([]backend.Family, 0, len(families))}
	for _, f := range families {
		want.Families = append(want.Families, backend.Family{CIDR: f.Prefix, Gateway: f.Gateway})
	}
	return want
}

// yield makes sure n, which overlaps the older Network winner, has no
// backend network, and says so in its status. It is not retried: the
// winner going or moving enqueues n again.
func (c *Controller) yield(ctx context.Context, cached, n *samplecrdv2.Network, families netspec.Families, winner overlap.Entry) error {
	if c.arbiter.Present(n.UID) || n.Status.Backend != nil {
		if err := c.backend.Delete(ctx, c.owner(n), backendRef(n.Status.Backend)); err != nil {
			c.eventf(n, corev1.EventTypeWarning, samplecrd.ReasonBackendError, "Removing the backend network of an overlapping Network failed: %v", err)
			return fmt.Errorf("removing the backend network of an overlapping Network: %w", err)
		}
		if n.Status.Backend != nil {
			c.metrics.BackendChanges.WithLabelValues(string(c.backend.Type()), metrics.ChangeDeleted).Inc()
		}
	}
	c.enqueueEntries(c.arbiter.Release(n.UID))
	msg := fmt.Sprintf("spec.cidr %s overlaps Network %s/%s (%s), which is older: this Network has no backend network until that one is deleted or moves",
		strings.Join(families.CIDRs(), " and "), winner.Namespace, winner.Name, winner.Overlapping(families.Prefixes()...))
	if ready := meta.FindStatusCondition(n.Status.Conditions, samplecrd.ConditionReady); ready == nil || ready.Reason != samplecrd.ReasonOverlap || ready.Message != msg {
		c.eventf(n, corev1.EventTypeWarning, samplecrd.ReasonOverlap, "Not built: %s", msg)
		klog.FromContext(ctx).Info("Network overlaps an older one; not built", "winner", klog.KRef(winner.Namespace, winner.Name))
	}
	n.Status.CIDRs, n.Status.Gateways = nil, nil
	return c.updateStatus(ctx, cached, n, metav1.ConditionFalse, samplecrd.ReasonOverlap, msg, nil)
}

// finalize removes the backend network of a Network that is being deleted,
// then its finalizer, so that the Network goes only after its network did.
func (c *Controller) finalize(ctx context.Context, n *samplecrdv2.Network) error {
	if !slices.Contains(n.Finalizers, samplecrd.Finalizer) {
		return nil
	}
	if c.addresses != nil {
		holders, err := c.addresses.Retire(n, inUseNames)
		if err != nil {
			return err
		}
		if holders.Count > 0 {
			// Woken when they free their addresses (UsageChanged).
			cached := n.DeepCopy()
			c.setAddresses(ctx, n)
			return c.updateStatus(ctx, cached, n, metav1.ConditionFalse, samplecrd.ReasonInUse,
				holders.String()+"; it is deleted once they are gone", n.Status.Backend)
		}
	}
	owner := c.owner(n)
	if err := c.backend.Delete(ctx, owner, backendRef(n.Status.Backend)); err != nil {
		c.eventf(n, corev1.EventTypeWarning, samplecrd.ReasonBackendError, "Deleting the backend network failed: %v", err)
		cached := n.DeepCopy()
		if statusErr := c.updateStatus(ctx, cached, n, metav1.ConditionFalse, samplecrd.ReasonDeleting,
			"deleting the backend network failed, retrying: "+err.Error(), n.Status.Backend); statusErr != nil && !apierrors.IsNotFound(statusErr) {
			klog.FromContext(ctx).Error(statusErr, "Could not record the deletion error in status")
		}
		return fmt.Errorf("deleting backend network: %w", err)
	}
	if c.nodes == nil { // with agents, each removes its own bridge
		c.metrics.BackendChanges.WithLabelValues(string(c.backend.Type()), metrics.ChangeDeleted).Inc()
	}
	c.enqueueEntries(c.arbiter.Release(n.UID))
	c.eventf(n, corev1.EventTypeNormal, ReasonDeleted, "Deleted %s network %s", c.backend.Type(), backendName(backendRef(n.Status.Backend)))
	klog.FromContext(ctx).Info("Backend network deleted")
	_, err := c.patchFinalizers(ctx, n, slices.DeleteFunc(slices.Clone(n.Finalizers), func(f string) bool { return f == samplecrd.Finalizer }))
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// inUseNames is how many of the pods holding a Network's addresses the
// InUse condition names.
const inUseNames = 3

// setAddresses puts the address usage in n's status.
func (c *Controller) setAddresses(ctx context.Context, n *samplecrdv2.Network) {
	if c.addresses == nil {
		return
	}
	allocated, available, err := c.addresses.Usage(n)
	if err != nil {
		klog.FromContext(ctx).V(2).Info("No address usage", "err", err)
		return
	}
	n.Status.Addresses = &samplecrdv2.NetworkAddresses{Allocated: allocated, Available: available.String()}
}

// addressesInSync reports whether n's status shows its address usage.
func (c *Controller) addressesInSync(ctx context.Context, n *samplecrdv2.Network) bool {
	if c.addresses == nil || !meta.IsStatusConditionTrue(n.Status.Conditions, samplecrd.ConditionReady) {
		return true // only a provisioned Network shows its usage
	}
	want := n.DeepCopy()
	c.setAddresses(ctx, want)
	return apiequality.Semantic.DeepEqual(want.Status.Addresses, n.Status.Addresses)
}

// patchFinalizers sets metadata.finalizers with a merge patch that carries
// the resourceVersion it was computed from: a stale cache gets a conflict
// and a retry instead of overwriting another writer's finalizers.
func (c *Controller) patchFinalizers(ctx context.Context, n *samplecrdv2.Network, finalizers []string) (*samplecrdv2.Network, error) {
	if finalizers == nil {
		finalizers = []string{}
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"finalizers":      finalizers,
		"resourceVersion": n.ResourceVersion,
	}})
	if err != nil {
		return nil, err
	}
	patched, err := c.client.SamplecrdV2().Networks(n.Namespace).Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return nil, fmt.Errorf("patching finalizers: %w", err)
	}
	return patched, nil
}

// updateStatus sets the Ready condition, observedGeneration and the backend
// IDs on n and writes the status, unless it equals what cached already has:
// a Network that is already right costs no write.
func (c *Controller) updateStatus(ctx context.Context, cached, n *samplecrdv2.Network, ready metav1.ConditionStatus,
	reason, message string, backendStatus *samplecrdv2.NetworkBackendStatus) error {
	if c.agent() {
		c.reportOutcome(n, ready, reason, message)
		return nil
	}
	n.Status.ObservedGeneration = n.Generation
	n.Status.Backend = backendStatus
	meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{
		Type:               samplecrd.ConditionReady,
		Status:             ready,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: n.Generation,
	})
	if apiequality.Semantic.DeepEqual(cached.Status, n.Status) {
		return nil
	}
	// The cache may not have caught up with our last write yet (a drift
	// echo re-runs the sync at once): the same status written from the
	// same resourceVersion would only earn a conflict.
	if w, ok := c.written.Load(n.UID); ok {
		if w := w.(writtenStatus); w.fromResourceVersion == cached.ResourceVersion && sameStatus(w.status, n.Status) {
			return nil
		}
	}
	if _, err := c.client.SamplecrdV2().Networks(n.Namespace).UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating status: %w", err)
	}
	c.written.Store(n.UID, writtenStatus{fromResourceVersion: cached.ResourceVersion, status: *n.Status.DeepCopy()})
	return nil
}

// writtenStatus is the status last written for a Network and the
// resourceVersion it was written over.
type writtenStatus struct {
	fromResourceVersion string
	status              samplecrdv2.NetworkStatus
}

// sameStatus compares statuses but for the conditions' transition times,
// which a sync on a stale copy sets anew.
func sameStatus(a, b samplecrdv2.NetworkStatus) bool {
	a, b = *a.DeepCopy(), *b.DeepCopy()
	for i := range a.Conditions {
		a.Conditions[i].LastTransitionTime = metav1.Time{}
	}
	for i := range b.Conditions {
		b.Conditions[i].LastTransitionTime = metav1.Time{}
	}
	return apiequality.Semantic.DeepEqual(a, b)
}

// owner is n as its backend network records it.
func (c *Controller) owner(n *samplecrdv2.Network) backend.Owner {
	return backend.Owner{Cluster: c.cluster, Namespace: n.Namespace, Name: n.Name, UID: n.UID}
}

func backendName(s *backend.Ref) string {
	switch {
	case s == nil:
		return "(unknown)"
	case s.Interface != "":
		return s.Interface
	default:
		return s.NetworkID
	}
}
