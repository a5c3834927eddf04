package network

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/metrics"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// The controller runs in one of three roles. Alone (the standalone, `netop
// run`), it builds every backend network and writes the Networks' status.
// Split across a cluster, `netop controller` writes the status and the
// finalizers from what the agents report (Options.Nodes), and `netop agent`
// builds its node's bridges and reports them (Options.Report) without
// writing Networks at all.

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

// NodeReadiness is what the agents report, for the controller of a
// cluster whose nodes each run an agent.
type NodeReadiness interface {
	// Nodes counts the nodes where n is ready at its generation, of the
	// nodes that run an agent, and says why up to limit of the others lag.
	Nodes(n *samplecrdv2.Network, limit int) (ready, total int32, lagging []string)
	// OnChange registers f, called with the UIDs of the Networks whose
	// readiness on some node changed, or with all set when every
	// Network's may have (a node came or went).
	OnChange(f func(uids []types.UID, all bool))
}

// laggingNames is how many lagging nodes the Ready condition names.
const laggingNames = 3

// agent reports whether the controller is a node's agent.
func (c *Controller) agent() bool { return c.report != nil }

// reportOutcome records an agent's outcome for n in its node's report: ready,
// failed, or, for a Network that is not to be built (it overlaps an older
// one), nothing.
func (c *Controller) reportOutcome(n *samplecrdv2.Network, ready metav1.ConditionStatus, reason, message string) {
	switch {
	case ready == metav1.ConditionTrue:
		c.report.Ready(n)
	case reason == samplecrd.ReasonOverlap:
		c.report.Forget(n.UID)
	default:
		c.report.Failed(n, reason, message)
	}
}

// removeGone removes, on an agent's node, the bridge of a Network that was
// deleted: an agent holds no finalizer, so it learns of the deletion only
// once the Network is gone. The resync sweeps what this misses.
func (c *Controller) removeGone(ctx context.Context, name cache.ObjectName) error {
	v, ok := c.gone.Load(name)
	if !ok {
		return nil
	}
	uid := v.(types.UID)
	owner := c.owner(&samplecrdv2.Network{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name, UID: uid}})
	if err := c.backend.Delete(ctx, owner, nil); err != nil {
		return fmt.Errorf("deleting the backend network of deleted Network (uid %s): %w", uid, err)
	}
	c.gone.CompareAndDelete(name, v)
	c.report.Forget(uid)
	c.metrics.BackendChanges.WithLabelValues(string(c.backend.Type()), metrics.ChangeDeleted).Inc()
	klog.FromContext(ctx).Info("Backend network of a deleted Network removed", "uid", uid)
	return nil
}

// setNodes puts the nodes' readiness in n's status and returns the Ready
// condition that follows from it, for a Network whose backend network is
// otherwise provisioned.
func (c *Controller) setNodes(n *samplecrdv2.Network, provisioned string) (metav1.ConditionStatus, string, string) {
	nodes, ready, reason, msg := c.nodeReadiness(n, provisioned)
	if nodes != nil {
		n.Status.Nodes = nodes
	}
	return ready, reason, msg
}

// nodeReadiness is what setNodes puts in n's status: the nodes' count
// (nil without agents) and the Ready condition.
func (c *Controller) nodeReadiness(n *samplecrdv2.Network, provisioned string) (*samplecrdv2.NetworkNodes, metav1.ConditionStatus, string, string) {
	if c.nodes == nil {
		return nil, metav1.ConditionTrue, samplecrd.ReasonProvisioned, provisioned
	}
	ready, total, lagging := c.nodes.Nodes(n, laggingNames)
	nodes := &samplecrdv2.NetworkNodes{Ready: ready, Total: total, Summary: fmt.Sprintf("%d/%d", ready, total)}
	switch {
	case total == 0:
		return nodes, metav1.ConditionFalse, samplecrd.ReasonNodesNotReady, "no node runs netop's agent yet"
	case ready < total:
		named := strings.Join(lagging, "; ")
		if more := int(total-ready) - len(lagging); more > 0 {
			named += fmt.Sprintf("; and %d more", more)
		}
		return nodes, metav1.ConditionFalse, samplecrd.ReasonNodesNotReady, fmt.Sprintf("ready on %d of %d nodes; lagging: %s", ready, total, named)
	}
	return nodes, metav1.ConditionTrue, samplecrd.ReasonProvisioned, fmt.Sprintf("%s, on %d/%d nodes", provisioned, ready, total)
}

// nodesInSync reports whether a provisioned n's status shows the nodes'
// readiness as the agents report it.
func (c *Controller) nodesInSync(n *samplecrdv2.Network) bool {
	ready := meta.FindStatusCondition(n.Status.Conditions, samplecrd.ConditionReady)
	if c.nodes == nil || ready == nil || (ready.Reason != samplecrd.ReasonProvisioned && ready.Reason != samplecrd.ReasonNodesNotReady) {
		return true
	}
	nodes, status, reason, _ := c.nodeReadiness(n, "")
	return apiequality.Semantic.DeepEqual(nodes, n.Status.Nodes) && ready.Status == status && ready.Reason == reason
}

// nodesChanged enqueues the Networks whose readiness on some node changed;
// a burst of reports costs one sync per Network.
func (c *Controller) nodesChanged(uids []types.UID, all bool) {
	if all {
		for _, obj := range c.indexer.List() {
			if name, err := cache.ObjectToName(obj); err == nil {
				c.AddAfter(name, usageDelay)
			}
		}
		return
	}
	for _, uid := range uids {
		if name, ok := c.nameForUID(uid); ok {
			c.AddAfter(name, usageDelay)
		}
	}
}

// eventf records an Event on the Network. An agent records only Warnings,
// naming its node: a Normal Event per node and Network would be noise
// that grows with the cluster.
func (c *Controller) eventf(n *samplecrdv2.Network, eventType, reason, format string, args ...any) {
	if c.agent() {
		if eventType != corev1.EventTypeWarning {
			return
		}
		format = "node " + c.report.Node() + ": " + format
	}
	c.recorder.Eventf(n, eventType, reason, format, args...)
}

// wantVNI is the VNI an agent's node joins n's bridges by: the one the
// controller gave n, if the node is on an overlay.
func (c *Controller) wantVNI(n *samplecrdv2.Network) uint32 {
	if !c.agent() || !c.overlay || n.Status.VNI < 1 {
		return 0
	}
	return uint32(n.Status.VNI)
}
