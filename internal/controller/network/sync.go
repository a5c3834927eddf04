package network

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
		return c.outcome.gone(ctx, name)
	}
	if err != nil {
		return err
	}
	// The cache's object is shared; never change it.
	n := cached.DeepCopy()

	if n.DeletionTimestamp != nil {
		return c.outcome.deleting(ctx, n)
	}
	if n, err = c.outcome.holdDeletion(ctx, n); err != nil {
		return err
	}
	if !c.outcome.wanted(n) {
		return c.unrealise(ctx, cached, n)
	}

	families, errs := c.specs.Resolve(n)
	if len(errs) > 0 {
		msg := errs.ToAggregate().Error()
		c.outcome.eventf(n, corev1.EventTypeWarning, samplecrd.ReasonInvalid, "Invalid spec: %s", msg)
		// Not retried: only a new spec can fix it, and that is a new event.
		return c.outcome.record(ctx, cached, n, metav1.ConditionFalse, samplecrd.ReasonInvalid, msg, n.Status.Backend)
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

	want := backendNetwork(c.owner(n), families, n.Spec)
	var ok bool
	if want.VNI, ok = c.outcome.setVNI(n); !ok {
		return c.outcome.record(ctx, cached, n, metav1.ConditionFalse, samplecrd.ReasonBackendError, "every VXLAN network identifier is taken", n.Status.Backend)
	}
	res, err := c.backend.Ensure(ctx, want, backendRef(n.Status.Backend))
	if errors.Is(err, backend.ErrInvalid) {
		msg := err.Error()
		c.outcome.eventf(n, corev1.EventTypeWarning, samplecrd.ReasonInvalid, "Backend %s refuses the spec: %s", c.backend.Type(), msg)
		// Not retried: no retry can fix it, only a new spec can.
		return c.outcome.record(ctx, cached, n, metav1.ConditionFalse, samplecrd.ReasonInvalid, msg, n.Status.Backend)
	}
	if err != nil {
		c.outcome.eventf(n, corev1.EventTypeWarning, samplecrd.ReasonBackendError, "Backend %s failed: %v", c.backend.Type(), err)
		if statusErr := c.outcome.record(ctx, cached, n, metav1.ConditionFalse, samplecrd.ReasonBackendError, err.Error(), n.Status.Backend); statusErr != nil {
			logger.Error(statusErr, "Could not record the backend error in status")
		}
		return fmt.Errorf("ensuring backend network: %w", err)
	}
	switch res.Action {
	case backend.ActionCreated:
		c.outcome.eventf(n, corev1.EventTypeNormal, ReasonCreated, "Created %s network %s for %s", res.Status.Type, backendName(&res.Status), families)
	case backend.ActionUpdated:
		c.outcome.eventf(n, corev1.EventTypeNormal, ReasonUpdated, "Updated %s network %s to %s", res.Status.Type, backendName(&res.Status), families)
	}
	if res.Action != backend.ActionNone {
		c.metrics.BackendChanges.WithLabelValues(string(res.Status.Type), string(res.Action)).Inc()
		logger.Info("Backend network converged", "action", res.Action, "cidrs", families.CIDRs(), "gateways", families.Gateways())
	}
	c.arbiter.Built(entry)
	c.setAddresses(ctx, n, true)
	n.Status.CIDRs, n.Status.Gateways = families.CIDRs(), families.Gateways()
	ready, reason, msg := c.outcome.readiness(n, fmt.Sprintf("%s network %s has %s", res.Status.Type, backendName(&res.Status), families))
	return c.outcome.record(ctx, cached, n, ready, reason, msg, backendStatus(&res.Status))
}

// backendNetwork is the backend network of families, the first the
// primary, shaped by spec: its MTU and egress.
func backendNetwork(owner backend.Owner, families netspec.Families, spec samplecrdv2.NetworkSpec) backend.Network {
	want := backend.Network{Owner: owner, Families: make([]backend.Family, 0, len(families)), MTU: int(spec.MTU), Egress: spec.Egress != nil}
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
			c.outcome.eventf(n, corev1.EventTypeWarning, samplecrd.ReasonBackendError, "Removing the backend network of an overlapping Network failed: %v", err)
			return fmt.Errorf("removing the backend network of an overlapping Network: %w", err)
		}
		if n.Status.Backend != nil {
			c.countDeleted()
		}
	}
	c.enqueueEntries(c.arbiter.Release(n.UID))
	msg := fmt.Sprintf("spec.cidr %s overlaps Network %s/%s (%s), which is older: this Network has no backend network until that one is deleted or moves",
		strings.Join(families.CIDRs(), " and "), winner.Namespace, winner.Name, winner.Overlapping(families.Prefixes()...))
	if ready := meta.FindStatusCondition(n.Status.Conditions, samplecrd.ConditionReady); ready == nil || ready.Reason != samplecrd.ReasonOverlap || ready.Message != msg {
		c.outcome.eventf(n, corev1.EventTypeWarning, samplecrd.ReasonOverlap, "Not built: %s", msg)
		klog.FromContext(ctx).Info("Network overlaps an older one; not built", "winner", klog.KRef(winner.Namespace, winner.Name))
	}
	n.Status.CIDRs, n.Status.Gateways = nil, nil
	return c.outcome.record(ctx, cached, n, metav1.ConditionFalse, samplecrd.ReasonOverlap, msg, nil)
}

// reasonNotNeeded records that a node does not need a Network: it has no
// backend network there, and nothing to report.
const reasonNotNeeded = "NotNeeded"

// inUseRecheck is when a backend network kept for what is attached to it
// is looked at again.
const inUseRecheck = 30 * time.Second

// unrealise makes sure n, which this node does not need (no pod here has
// an interface on it), has no backend network here. The bridge of a
// Network whose last pod left goes this way, once the demand's delay is
// over.
func (c *Controller) unrealise(ctx context.Context, cached, n *samplecrdv2.Network) error {
	inUse, err := c.backend.InUse(ctx, c.owner(n))
	if err != nil {
		return fmt.Errorf("looking for pods attached to the backend network: %w", err)
	}
	if inUse {
		// A pod was attached in the instant between its allocation and
		// this node's cache seeing it, or its sandbox outlived its pod:
		// its bridge stays, and is looked at again.
		klog.FromContext(ctx).Info("Keeping the backend network: something on this node is attached to it, though no pod here is known to use it")
		c.AddAfter(cache.MetaObjectToName(n), inUseRecheck)
		return nil
	}
	present := c.arbiter.Present(n.UID)
	if err := c.backend.Delete(ctx, c.owner(n), backendRef(n.Status.Backend)); err != nil {
		c.outcome.eventf(n, corev1.EventTypeWarning, samplecrd.ReasonBackendError, "Removing the backend network of a Network no pod here uses failed: %v", err)
		return fmt.Errorf("removing the backend network of a Network no pod here uses: %w", err)
	}
	if present {
		c.countDeleted()
		klog.FromContext(ctx).Info("Removed the backend network: no pod on this node uses the Network")
	}
	err = c.outcome.record(ctx, cached, n, metav1.ConditionFalse, reasonNotNeeded, "no pod on this node uses it", nil)
	// Nor does it contend here any more, once the node's cache may have
	// stopped following it: an overlapping Network its pods use builds.
	c.enqueueEntries(c.arbiter.Withdraw(n.UID))
	c.enqueueEntries(c.arbiter.Release(n.UID))
	// Nor is its spec asked about: that cache tells nothing of its end.
	c.specs.Forget(n.UID)
	return err
}

// setAddresses puts the address usage in n's status, and whether every
// pod holding an address may still join n; announce: with an Event when
// pods turn out not to be. It reports whether it knows the usage.
func (c *Controller) setAddresses(ctx context.Context, n *samplecrdv2.Network, announce bool) bool {
	if c.addresses == nil {
		return false
	}
	usage, err := c.addresses.Usage(n)
	if err != nil {
		klog.FromContext(ctx).V(2).Info("No address usage", "err", err)
		return false
	}
	n.Status.Addresses = usage
	c.setPodsAdmitted(ctx, n, announce)
	return true
}

// setPodsAdmitted sets the PodsAdmitted condition: False, with an Event
// when it turns so if announce, while pods hold addresses of n that their
// namespaces may no longer join; True once none do, if it was ever set.
func (c *Controller) setPodsAdmitted(ctx context.Context, n *samplecrdv2.Network, announce bool) {
	outsiders, err := c.addresses.Outsiders(n, 3)
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Could not count the pods not admitted", "err", err)
		return
	}
	was := meta.FindStatusCondition(n.Status.Conditions, samplecrd.ConditionPodsAdmitted)
	if outsiders.Count == 0 {
		if was != nil {
			meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{Type: samplecrd.ConditionPodsAdmitted, Status: metav1.ConditionTrue,
				Reason: samplecrd.ReasonAdmitted, Message: "every pod holding an address of the Network may join it", ObservedGeneration: n.Generation})
		}
		return
	}
	msg := fmt.Sprintf("%s although their namespaces may no longer join it; they keep them until they finish, and no new pod of those namespaces joins",
		outsiders)
	if announce && (was == nil || was.Status != metav1.ConditionFalse) {
		c.outcome.eventf(n, corev1.EventTypeWarning, samplecrd.ReasonPodsNotAdmitted, "%s", msg)
	}
	meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{Type: samplecrd.ConditionPodsAdmitted, Status: metav1.ConditionFalse,
		Reason: samplecrd.ReasonPodsNotAdmitted, Message: msg, ObservedGeneration: n.Generation})
}

// addressesInSync reports whether n's status shows its address usage and
// the pods it no longer admits.
func (c *Controller) addressesInSync(ctx context.Context, n *samplecrdv2.Network) bool {
	if c.addresses == nil || !meta.IsStatusConditionTrue(n.Status.Conditions, samplecrd.ConditionReady) {
		return true // only a provisioned Network shows its usage
	}
	want := n.DeepCopy()
	return !c.setAddresses(ctx, want, false) || sameStatus(want.Status, n.Status)
}

// countDeleted counts a backend network deleted.
func (c *Controller) countDeleted() {
	c.metrics.BackendChanges.WithLabelValues(string(c.backend.Type()), metrics.ChangeDeleted).Inc()
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
