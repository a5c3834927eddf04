package network

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// Reporter is where an agent's controller records its outcomes: its
// node's report (networknode.Report).
type Reporter interface {
	// Node is the name of the agent's node.
	Node() string
	// ReadyAt is the generation the Network of uid was reported ready at,
	// or 0.
	ReadyAt(uid types.UID) int64
	// Ready records that n is ready on the node at its generation.
	Ready(n *samplecrdv2.Network)
	// Failed records that n failed on the node.
	Failed(n *samplecrdv2.Network, reason, message string)
	// Forget removes the Network of uid from the report.
	Forget(uid types.UID)
	// Retain forgets every Network for which keep is false.
	Retain(keep func(types.UID) bool)
}

// Demand says which Networks a node needs: those its pods hold
// interfaces on, until a while after the last one left. The node's cache
// holds those alone (networkcache.ByName).
type Demand interface {
	// Wants reports whether the node needs the Network of uid.
	Wants(uid types.UID) bool
	// Release tells that the node has nothing left of the Network of that
	// name: the cache may stop following it, unless it is needed; if only
	// for a while, retryAfter says when to release it again.
	Release(name cache.ObjectName) (retryAfter time.Duration)
}

// Agent is the outcome of a node's agent (`netop agent`): the controller
// builds the node's bridges and reports them in report, for the cluster's
// controller to read, and writes no Network (no status, no finalizer): a
// write per node and Network would grow with the cluster. overlay tells
// that the node joins the others by the Networks' VNIs: a Network is ready
// there only once it has one. demand, if not nil, limits the node to the
// Networks it needs: the others have no bridge there and are not reported.
func Agent(report Reporter, overlay bool, demand Demand) Outcome {
	return &agentOutcome{report: report, overlay: overlay, demand: demand}
}

// agentOutcome builds a node's bridges and reports them.
type agentOutcome struct {
	c       *Controller
	report  Reporter
	overlay bool
	demand  Demand
	// deletedUIDs holds, by name, the UIDs of Networks deleted, until
	// gone removed their backend networks.
	deletedUIDs sync.Map
}

func (o *agentOutcome) bind(c *Controller) Outcome {
	return &agentOutcome{c: c, report: o.report, overlay: o.overlay, demand: o.demand}
}

// wanted: the node needs n, or builds every Network.
func (o *agentOutcome) wanted(n *samplecrdv2.Network) bool {
	return o.demand == nil || o.demand.Wants(n.UID)
}

func (o *agentOutcome) seen(*samplecrdv2.Network) {}

// orphaned: on demand, the cache holds the Networks the node needs, and a
// backend network of any other goes unless something is attached to it
// (the in-use guard of unrealise); else its Network no longer exists.
func (o *agentOutcome) orphaned(ctx context.Context, owner backend.Owner) bool {
	if o.demand == nil {
		return !o.c.liveNetworkExists(ctx, owner)
	}
	if o.demand.Wants(owner.UID) {
		return false
	}
	inUse, err := o.c.backend.InUse(ctx, owner)
	return err == nil && !inUse
}

// deleted keeps n's UID for gone: the cache no longer has it then.
func (o *agentOutcome) deleted(n *samplecrdv2.Network) {
	o.deletedUIDs.Store(cache.MetaObjectToName(n), n.UID)
}

// converged: reported ready at n's generation, or, for a Network the node
// does not need, not reported (the first resync sweeps a bridge left).
func (o *agentOutcome) converged(n *samplecrdv2.Network) bool {
	if !o.wanted(n) {
		return o.report.ReadyAt(n.UID) == 0
	}
	return o.report.ReadyAt(n.UID) == n.Generation
}

// gone removes the bridge of a Network that was deleted: an agent holds no
// finalizer, so it learns of the deletion only once the Network is gone.
// The resync sweeps what this misses.
func (o *agentOutcome) gone(ctx context.Context, name cache.ObjectName) error {
	v, ok := o.deletedUIDs.Load(name)
	if !ok {
		o.release(name)
		return nil
	}
	uid := v.(types.UID)
	c := o.c
	owner := c.owner(&samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name, UID: uid}})
	if err := c.backend.Delete(ctx, owner, nil); err != nil {
		return fmt.Errorf("deleting the backend network of deleted Network (uid %s): %w", uid, err)
	}
	o.deletedUIDs.CompareAndDelete(name, v)
	o.report.Forget(uid)
	c.countDeleted()
	klog.FromContext(ctx).Info("Backend network of a deleted Network removed", "uid", uid)
	o.release(name)
	return nil
}

// release tells the demand, if any, that the node has nothing left of the
// Network of that name.
func (o *agentOutcome) release(name cache.ObjectName) {
	if o.demand == nil {
		return
	}
	if after := o.demand.Release(name); after > 0 {
		o.c.AddAfter(name, after)
	}
}

// deleting does nothing: pods may still use the Network, so the bridge
// goes once the Network is gone, which the controller's finalizer holds
// until they are.
func (o *agentOutcome) deleting(context.Context, *samplecrdv2.Network) error { return nil }

// holdDeletion holds nothing: the cluster's controller holds the finalizer.
func (o *agentOutcome) holdDeletion(_ context.Context, n *samplecrdv2.Network) (*samplecrdv2.Network, error) {
	return n, nil
}

// setVNI is the VNI the controller gave n, if the node is on an overlay.
func (o *agentOutcome) setVNI(n *samplecrdv2.Network) (uint32, bool) { return o.vni(n), true }

// vni is the VNI the node joins n's bridges by: the one the controller gave
// n, if the node is on an overlay.
func (o *agentOutcome) vni(n *samplecrdv2.Network) uint32 {
	if !o.overlay || n.Status.VNI < 1 {
		return 0
	}
	return uint32(n.Status.VNI)
}

func (o *agentOutcome) readiness(_ *samplecrdv2.Network, provisioned string) (metav1.ConditionStatus, string, string) {
	return provisionedReady(provisioned)
}

// record records the outcome in the node's report: ready, failed, or, for
// a Network that is not to be built (it overlaps an older one), nothing.
func (o *agentOutcome) record(_ context.Context, _, n *samplecrdv2.Network, ready metav1.ConditionStatus,
	reason, message string, _ *samplecrdv2.NetworkBackendStatus) error {
	switch {
	case ready == metav1.ConditionTrue && o.overlay && o.vni(n) == 0:
		// The bridge stands, but joins the other nodes' only once the
		// controller gave the Network its VNI, which is a new event.
	case ready == metav1.ConditionTrue:
		o.report.Ready(n)
	case reason == reasonNotNeeded:
		o.report.Forget(n.UID)
		o.release(cache.MetaObjectToName(n))
	case reason == samplecrd.ReasonOverlap:
		o.report.Forget(n.UID)
	default:
		o.report.Failed(n, reason, message)
	}
	return nil
}

// eventf records only Warnings, naming the node: a Normal Event per node
// and Network would be noise that grows with the cluster.
func (o *agentOutcome) eventf(n *samplecrdv2.Network, eventType, reason, format string, args ...any) {
	if eventType != corev1.EventTypeWarning {
		return
	}
	o.c.recorder.Eventf(n, eventType, reason, "node "+o.report.Node()+": "+format, args...)
}

// inSync: the node's bridge is built as n's spec and VNI say, and the
// report says so; or, where the node does not need n, there is no bridge
// and no report.
func (o *agentOutcome) inSync(n *samplecrdv2.Network, observed backend.Observed, built bool) bool {
	if !o.wanted(n) {
		return observed.UID == "" && o.report.ReadyAt(n.UID) == 0
	}
	return built && observed.VNI == o.vni(n) && o.report.ReadyAt(n.UID) == n.Generation
}

// readinessInSync: readiness is what the report says, which inSync
// compares.
func (o *agentOutcome) readinessInSync(*samplecrdv2.Network) bool { return true }

// retain forgets, in the report, the Networks that are gone.
func (o *agentOutcome) retain(exists func(types.UID) bool) { o.report.Retain(exists) }
