package network

import (
	"context"
	"fmt"
	"strings"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// NodeReadiness is what the agents report, for the controller of a
// cluster whose nodes each run an agent.
type NodeReadiness interface {
	// Nodes counts the nodes that realise n (a node realises a Network
	// while its pods use it), those of them where it is ready at its
	// generation, and the nodes that run an agent; it says why up to limit
	// of the realising nodes lag.
	Nodes(n *samplecrdv2.Network, limit int) (ready, total, of int32, lagging []string)
	// OnChange registers f, called with the UIDs of the Networks whose
	// readiness on some node changed, or with all set when every
	// Network's may have (a node came or went).
	OnChange(f func(uids []types.UID, all bool))
	// HasSyncedChecker is done once the reports were read whole: a
	// Network synced before that would seem to have no agent anywhere.
	HasSyncedChecker() cache.DoneChecker
}

// Cluster is the outcome of the controller of a cluster whose nodes run
// agents (`netop controller`, on the agents' backend): each agent builds
// its node's bridges where its pods use them, so a Network is Ready once
// ready on every node that realises it (and on none: it is then ready for
// the first pod), and gets a VNI for the overlay between them.
func Cluster(nodes NodeReadiness) Outcome { return &clusterOutcome{nodes: nodes} }

// clusterOutcome writes the Networks as the standalone does, from what
// the agents report, and hands out their VNIs. The status writer's own
// code (finalize, record) calls none of the methods overridden here:
// embedding does not dispatch to them.
type clusterOutcome struct {
	*statusOutcome
	nodes NodeReadiness
	// vnis are the Networks' VNIs: this controller is their one writer.
	vnis *vniPool
}

// bind also has c's Networks synced again when the agents' reports of them
// change, and none synced before the reports are read: a new leader
// would otherwise write every Ready Network as having no agent.
func (o *clusterOutcome) bind(c *Controller) Outcome {
	bound := &clusterOutcome{statusOutcome: &statusOutcome{c: c}, nodes: o.nodes, vnis: newVNIPool()}
	bound.nodes.OnChange(bound.nodesChanged)
	c.WaitFor(o.nodes.HasSyncedChecker())
	return bound
}

// seen keeps the VNI n's status records: the pool is rebuilt from them at
// start, before any sync runs.
func (o *clusterOutcome) seen(n *samplecrdv2.Network) { o.vnis.keep(n.UID, n.Status.VNI) }

func (o *clusterOutcome) deleted(n *samplecrdv2.Network) {
	o.statusOutcome.deleted(n)
	o.vnis.release(n.UID)
}

// deleting finalizes n without counting a deletion: the agents' backend
// deleted nothing, each agent counts the bridge it removes.
func (o *clusterOutcome) deleting(ctx context.Context, n *samplecrdv2.Network) error {
	return o.finalize(ctx, n, func() {})
}

// setVNI gives n its VNI, by which the agents' bridges join one another.
// The agents' backend needs none: it builds nothing.
func (o *clusterOutcome) setVNI(n *samplecrdv2.Network) (uint32, bool) {
	vni, ok := o.vnis.assign(n.UID)
	if ok {
		n.Status.VNI = vni
	}
	return 0, ok
}

// readiness puts the nodes' readiness in n's status: n is Ready once it is
// ready on every node that realises it.
func (o *clusterOutcome) readiness(n *samplecrdv2.Network, provisioned string) (metav1.ConditionStatus, string, string) {
	nodes, ready, reason, msg := o.nodeReadiness(n, provisioned)
	n.Status.Nodes = nodes
	return ready, reason, msg
}

// laggingNames is how many lagging nodes the Ready condition names.
const laggingNames = 3

// nodeReadiness is what readiness puts in n's status: the nodes' count and
// the Ready condition.
func (o *clusterOutcome) nodeReadiness(n *samplecrdv2.Network, provisioned string) (*samplecrdv2.NetworkNodes, metav1.ConditionStatus, string, string) {
	ready, total, of, lagging := o.nodes.Nodes(n, laggingNames)
	summary := fmt.Sprintf("%d/%d", ready, total)
	if total < of {
		summary += fmt.Sprintf(" (of %d)", of)
	}
	nodes := &samplecrdv2.NetworkNodes{Ready: ready, Total: total, Summary: summary}
	switch {
	case of == 0:
		return nodes, metav1.ConditionFalse, samplecrd.ReasonNodesNotReady, "no node runs netop's agent yet"
	case ready < total:
		named := strings.Join(lagging, "; ")
		if more := int(total-ready) - len(lagging); more > 0 {
			named += fmt.Sprintf("; and %d more", more)
		}
		return nodes, metav1.ConditionFalse, samplecrd.ReasonNodesNotReady, fmt.Sprintf("ready on %d of the %d nodes that realise it; lagging: %s", ready, total, named)
	case total == 0:
		return nodes, metav1.ConditionTrue, samplecrd.ReasonProvisioned, fmt.Sprintf("%s; no node realises it yet: a node builds it when a pod there joins it", provisioned)
	}
	return nodes, metav1.ConditionTrue, samplecrd.ReasonProvisioned, fmt.Sprintf("%s, on %s nodes", provisioned, summary)
}

// inSync: the agents build, and what they report is readinessInSync's;
// only the status is this controller's.
func (o *clusterOutcome) inSync(n *samplecrdv2.Network, _ backend.Observed, _ bool) bool {
	return n.Status.Backend != nil && n.Status.ObservedGeneration == n.Generation
}

// readinessInSync reports whether a provisioned n's status shows the
// nodes' readiness as the agents report it.
func (o *clusterOutcome) readinessInSync(n *samplecrdv2.Network) bool {
	ready := meta.FindStatusCondition(n.Status.Conditions, samplecrd.ConditionReady)
	if ready == nil || (ready.Reason != samplecrd.ReasonProvisioned && ready.Reason != samplecrd.ReasonNodesNotReady) {
		return true
	}
	nodes, status, reason, _ := o.nodeReadiness(n, "")
	return apiequality.Semantic.DeepEqual(nodes, n.Status.Nodes) && ready.Status == status && ready.Reason == reason
}

// nodesChanged enqueues the Networks whose readiness on some node changed;
// a burst of reports costs one sync per Network.
func (o *clusterOutcome) nodesChanged(uids []types.UID, all bool) {
	c := o.c
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
