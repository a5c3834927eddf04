package network

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// Outcome is the controller's part that depends on the role it runs in;
// the sync is the same in every role and calls it where they differ. Alone
// (Standalone, `netop run`), the controller builds every backend network
// and writes the Networks' status. Split across a cluster, `netop
// controller` (Cluster) writes the status and the finalizers from what the
// agents report, and `netop agent` (Agent) builds its node's bridges and
// reports them without writing Networks at all. The caller, which knows
// the role, picks the outcome; its methods are the package's own.
type Outcome interface {
	// bind returns the outcome working for c, with state of its own: an
	// Outcome a caller made is only a choice of role.
	bind(c *Controller) Outcome

	// seen is told of a Network seen for the first time (at start, after
	// a relist, or created).
	seen(n *samplecrdv2.Network)
	// deleted is told of a Network deleted from the API.
	deleted(n *samplecrdv2.Network)
	// converged reports whether n, not being deleted, is recorded (in its
	// status or elsewhere) as having its backend network match its
	// current spec.
	converged(n *samplecrdv2.Network) bool

	// gone handles the sync of a Network no longer in the cache.
	gone(ctx context.Context, name cache.ObjectName) error
	// deleting handles the sync of a Network being deleted.
	deleting(ctx context.Context, n *samplecrdv2.Network) error
	// holdDeletion makes n's deletion wait for the controller (the
	// finalizer), if it is the one to delete the backend network, and
	// returns n as it then is.
	holdDeletion(ctx context.Context, n *samplecrdv2.Network) (*samplecrdv2.Network, error)
	// setVNI gives n the VNI the Network is given, and returns the VNI
	// its bridges join the other nodes' by; false when none is left to
	// give. (A value, not a pointer to the backend network: through an
	// interface that would move it to the heap on every sync.)
	setVNI(n *samplecrdv2.Network) (vni uint32, ok bool)
	// readiness is the Ready condition of n, whose backend network is
	// provisioned as the message provisioned says, and puts in n's status
	// what it follows from.
	readiness(n *samplecrdv2.Network, provisioned string) (ready metav1.ConditionStatus, reason, message string)
	// record records the outcome of a sync of n, cached being n as the
	// cache has it: its Ready condition and backend network.
	record(ctx context.Context, cached, n *samplecrdv2.Network, ready metav1.ConditionStatus,
		reason, message string, backendStatus *samplecrdv2.NetworkBackendStatus) error
	// eventf records an Event on n.
	eventf(n *samplecrdv2.Network, eventType, reason, format string, args ...any)

	// inSync reports whether n, which is to have a backend network, is
	// as the outcome needs it: built says whether the backend has it as
	// n's spec says, observed being what it has.
	inSync(n *samplecrdv2.Network, observed backend.Observed, built bool) bool
	// readinessInSync reports whether n's status shows its readiness as
	// it now is.
	readinessInSync(n *samplecrdv2.Network) bool
	// retain forgets what the outcome keeps of the Networks for which
	// exists is false, once a resync swept the backend.
	retain(exists func(types.UID) bool)
	// wanted reports whether n is to have a backend network here at all:
	// an agent's node realises only the Networks its pods use.
	wanted(n *samplecrdv2.Network) bool
	// orphaned reports whether the backend network of owner, which no
	// Network in the cache claims, is to be removed.
	orphaned(ctx context.Context, owner backend.Owner) bool
}

// Standalone is the outcome of netop alone: the controller builds every
// backend network itself, and a Network's status and finalizer are its
// to write.
func Standalone() Outcome { return &statusOutcome{} }

// statusOutcome writes the Networks: their status, and the finalizer that
// holds their deletion until their backend network is gone. A Network is
// Ready once its backend network is built.
type statusOutcome struct {
	c *Controller
	// written holds, by UID, the status last written (writtenStatus).
	written sync.Map
}

func (o *statusOutcome) bind(c *Controller) Outcome { return &statusOutcome{c: c} }

func (o *statusOutcome) seen(*samplecrdv2.Network) {}

// orphaned: its Network no longer exists, as the API server says.
func (o *statusOutcome) orphaned(ctx context.Context, owner backend.Owner) bool {
	return !o.c.liveNetworkExists(ctx, owner)
}

func (o *statusOutcome) deleted(n *samplecrdv2.Network) { o.written.Delete(n.UID) }

func (o *statusOutcome) converged(n *samplecrdv2.Network) bool {
	return n.Status.Backend != nil &&
		n.Status.ObservedGeneration == n.Generation &&
		slices.Contains(n.Finalizers, samplecrd.Finalizer) &&
		meta.IsStatusConditionTrue(n.Status.Conditions, samplecrd.ConditionReady)
}

// gone has nothing to do: the finalizer made sure the backend network went
// first. Anything left over is the sweeper's.
func (o *statusOutcome) gone(context.Context, cache.ObjectName) error { return nil }

// deleting finalizes n, counting the deletion of its backend network.
func (o *statusOutcome) deleting(ctx context.Context, n *samplecrdv2.Network) error {
	return o.finalize(ctx, n, o.c.countDeleted)
}

// holdDeletion adds the finalizer: the admission webhook adds it at
// creation; this covers Networks made while it was not there.
func (o *statusOutcome) holdDeletion(ctx context.Context, n *samplecrdv2.Network) (*samplecrdv2.Network, error) {
	if slices.Contains(n.Finalizers, samplecrd.Finalizer) {
		return n, nil
	}
	return o.patchFinalizers(ctx, n, append(slices.Clone(n.Finalizers), samplecrd.Finalizer))
}

// setVNI gives none: alone, the bridges join no other node's.
func (o *statusOutcome) setVNI(*samplecrdv2.Network) (uint32, bool) { return 0, true }

func (o *statusOutcome) readiness(_ *samplecrdv2.Network, provisioned string) (metav1.ConditionStatus, string, string) {
	return provisionedReady(provisioned)
}

// provisionedReady is the Ready condition of a Network whose backend
// network is built, as the message provisioned says.
func provisionedReady(provisioned string) (metav1.ConditionStatus, string, string) {
	return metav1.ConditionTrue, samplecrd.ReasonProvisioned, provisioned
}

// record sets the Ready condition, observedGeneration and the backend IDs
// on n and writes the status, unless it equals what cached already has:
// a Network that is already right costs no write.
func (o *statusOutcome) record(ctx context.Context, cached, n *samplecrdv2.Network, ready metav1.ConditionStatus,
	reason, message string, backendStatus *samplecrdv2.NetworkBackendStatus) error {
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
	if w, ok := o.written.Load(n.UID); ok {
		if w := w.(writtenStatus); w.fromResourceVersion == cached.ResourceVersion && sameStatus(w.status, n.Status) {
			return nil
		}
	}
	if _, err := o.c.client.SamplecrdV2().Networks(n.Namespace).UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating status: %w", err)
	}
	o.written.Store(n.UID, writtenStatus{fromResourceVersion: cached.ResourceVersion, status: *n.Status.DeepCopy()})
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

func (o *statusOutcome) eventf(n *samplecrdv2.Network, eventType, reason, format string, args ...any) {
	o.c.recorder.Eventf(n, eventType, reason, format, args...)
}

// inSync: the backend has n's network, and the status records it.
func (o *statusOutcome) inSync(n *samplecrdv2.Network, observed backend.Observed, built bool) bool {
	return built && backend.SameStatus(backendRef(n.Status.Backend), &observed.Status)
}

// readinessInSync: Ready follows from the backend alone, which inSync
// compares.
func (o *statusOutcome) readinessInSync(*samplecrdv2.Network) bool { return true }

func (o *statusOutcome) retain(func(types.UID) bool) {}

// wanted: the one controller that builds builds every Network.
func (o *statusOutcome) wanted(*samplecrdv2.Network) bool { return true }

// finalize removes the backend network of a Network that is being deleted,
// then its finalizer, so that the Network goes only after its network did.
// deleted is called once the backend deleted it.
func (o *statusOutcome) finalize(ctx context.Context, n *samplecrdv2.Network, deleted func()) error {
	if !slices.Contains(n.Finalizers, samplecrd.Finalizer) {
		return nil
	}
	c := o.c
	if c.addresses != nil {
		holders, err := c.addresses.Retire(n, inUseNames)
		if err != nil {
			return err
		}
		if holders.Count > 0 {
			// Woken when they free their addresses (UsageChanged).
			cached := n.DeepCopy()
			c.setAddresses(ctx, n, false)
			return o.record(ctx, cached, n, metav1.ConditionFalse, samplecrd.ReasonInUse,
				holders.String()+"; it is deleted once they are gone", n.Status.Backend)
		}
	}
	if err := c.backend.Delete(ctx, c.owner(n), backendRef(n.Status.Backend)); err != nil {
		o.eventf(n, corev1.EventTypeWarning, samplecrd.ReasonBackendError, "Deleting the backend network failed: %v", err)
		cached := n.DeepCopy()
		if statusErr := o.record(ctx, cached, n, metav1.ConditionFalse, samplecrd.ReasonDeleting,
			"deleting the backend network failed, retrying: "+err.Error(), n.Status.Backend); statusErr != nil && !apierrors.IsNotFound(statusErr) {
			klog.FromContext(ctx).Error(statusErr, "Could not record the deletion error in status")
		}
		return fmt.Errorf("deleting backend network: %w", err)
	}
	deleted()
	c.enqueueEntries(c.arbiter.Release(n.UID))
	o.eventf(n, corev1.EventTypeNormal, ReasonDeleted, "Deleted %s network %s", c.backend.Type(), backendName(backendRef(n.Status.Backend)))
	klog.FromContext(ctx).Info("Backend network deleted")
	_, err := o.patchFinalizers(ctx, n, slices.DeleteFunc(slices.Clone(n.Finalizers), func(f string) bool { return f == samplecrd.Finalizer }))
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// inUseNames is how many of the pods holding a Network's addresses the
// InUse condition names.
const inUseNames = 3

// patchFinalizers sets metadata.finalizers with a merge patch that carries
// the resourceVersion it was computed from: a stale cache gets a conflict
// and a retry instead of overwriting another writer's finalizers.
func (o *statusOutcome) patchFinalizers(ctx context.Context, n *samplecrdv2.Network, finalizers []string) (*samplecrdv2.Network, error) {
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
	patched, err := o.c.client.SamplecrdV2().Networks(n.Namespace).Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return nil, fmt.Errorf("patching finalizers: %w", err)
	}
	return patched, nil
}
