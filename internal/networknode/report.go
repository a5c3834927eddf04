// Package networknode is both ends of a NetworkNode (netop.dev/v1alpha1),
// the report of one node's agent to the cluster-wide controller: the
// agent writes its node's Report (which Networks are built there, and
// which failed why), and the controller reads every node's in
// NodeReports to tell when a Network is ready everywhere. Keeping the
// writer and the reader together keeps the report's meaning in one place.
package networknode

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	netopv1alpha1 "github.com/netop-dev/netop/pkg/apis/netop/v1alpha1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	"github.com/netop-dev/netop/pkg/generated/clientset/versioned"
)

// Report is what the agent tells the controller about its node: the
// NetworkNode named after it. The Network controller running as the
// node's agent records its outcomes here instead of in the Networks'
// statuses; the report is written when it changed, at most once per
// delay, so that a burst of Networks costs one write and a converged node
// none.
type Report struct {
	client versioned.Interface
	kube   kubernetes.Interface
	node   string
	pod    string
	delay  time.Duration
	// onDemand is reported as the NetworkNode's status.onDemand.
	onDemand bool

	mu     sync.Mutex
	ready  map[types.UID]int64
	failed map[types.UID]netopv1alpha1.NetworkNodeFailure
	// current is the NetworkNode as last read or written.
	current *netopv1alpha1.NetworkNode
	changed chan struct{}
}

// NewReport makes the report of node, written by the agent in pod (empty
// outside a pod), coalescing changes for delay.
func NewReport(client versioned.Interface, kube kubernetes.Interface, node, pod string, delay time.Duration) *Report {
	return &Report{
		client: client, kube: kube, node: node, pod: pod, delay: delay,
		ready:   map[types.UID]int64{},
		failed:  map[types.UID]netopv1alpha1.NetworkNodeFailure{},
		changed: make(chan struct{}, 1),
	}
}

// OnDemand tells that the node realises only the Networks its pods use:
// the report says so, so that the controller does not count the node as
// lagging on the others. Call it before Load.
func (r *Report) OnDemand(on bool) { r.onDemand = on }

// Load reads the node's NetworkNode, creating it if it is missing, so
// that a restarted agent starts from what it reported and writes nothing
// when that still holds. The NetworkNode is owned by the Node, so that it
// goes, so that the garbage collector removes it with the Node.
func (r *Report) Load(ctx context.Context) error {
	nn, err := r.client.NetopV1alpha1().NetworkNodes().Get(ctx, r.node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		nn, err = r.create(ctx)
	}
	if err != nil {
		return fmt.Errorf("reading NetworkNode %s: %w", r.node, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.current = nn
	r.ready = maps.Clone(nn.Status.Ready)
	if r.ready == nil {
		r.ready = map[types.UID]int64{}
	}
	for _, f := range nn.Status.Failed {
		r.failed[f.UID] = f
	}
	if nn.Status.AgentPod != r.pod || nn.Status.OnDemand != r.onDemand {
		r.notify()
	}
	return nil
}

func (r *Report) create(ctx context.Context) (*netopv1alpha1.NetworkNode, error) {
	// The agent of a node that is not (or no longer) in the cluster has
	// nothing to report: its NetworkNode would outlive it.
	node, err := r.kube.CoreV1().Nodes().Get(ctx, r.node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading Node %s: %w", r.node, err)
	}
	nn := &netopv1alpha1.NetworkNode{ObjectMeta: metav1.ObjectMeta{Name: r.node,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}}}
	created, err := r.client.NetopV1alpha1().NetworkNodes().Create(ctx, nn, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return r.client.NetopV1alpha1().NetworkNodes().Get(ctx, r.node, metav1.GetOptions{})
	}
	return created, err
}

// Node is the name of the report's node.
func (r *Report) Node() string { return r.node }

// ReadyAt is the generation n's UID was reported ready at, or 0.
func (r *Report) ReadyAt(uid types.UID) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ready[uid]
}

// Ready records that n is ready on the node at its generation.
func (r *Report) Ready(n *samplecrdv2.Network) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, failed := r.failed[n.UID]
	if r.ready[n.UID] == n.Generation && !failed {
		return
	}
	r.ready[n.UID] = n.Generation
	delete(r.failed, n.UID)
	r.notify()
}

// Failed records that n failed on the node.
func (r *Report) Failed(n *samplecrdv2.Network, reason, message string) {
	f := netopv1alpha1.NetworkNodeFailure{Network: n.Namespace + "/" + n.Name, UID: n.UID, Generation: n.Generation, Reason: reason, Message: message}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ready := r.ready[n.UID]
	if old, ok := r.failed[n.UID]; ok && old == f && !ready {
		return
	}
	r.failed[n.UID] = f
	delete(r.ready, n.UID)
	r.notify()
}

// Forget removes a Network from the report: it is gone, or not built
// here by design (it overlaps an older one).
func (r *Report) Forget(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ready := r.ready[uid]
	_, failed := r.failed[uid]
	if !ready && !failed {
		return
	}
	delete(r.ready, uid)
	delete(r.failed, uid)
	r.notify()
}

// Retain forgets every Network for which keep is false: those deleted
// while the agent was down.
func (r *Report) Retain(keep func(types.UID) bool) {
	r.mu.Lock()
	var gone []types.UID
	for uid := range r.ready {
		if !keep(uid) {
			gone = append(gone, uid)
		}
	}
	for uid := range r.failed {
		if !keep(uid) {
			gone = append(gone, uid)
		}
	}
	r.mu.Unlock()
	for _, uid := range gone {
		r.Forget(uid)
	}
}

// notify wakes the writer; r.mu is held.
func (r *Report) notify() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// status is the report as a NetworkNode status; r.mu is held.
func (r *Report) status() netopv1alpha1.NetworkNodeStatus {
	s := netopv1alpha1.NetworkNodeStatus{AgentPod: r.pod, OnDemand: r.onDemand, ReadyNetworks: int32(len(r.ready)), FailedNetworks: int32(len(r.failed))}
	if len(r.ready) > 0 {
		s.Ready = maps.Clone(r.ready)
	}
	for _, f := range r.failed {
		s.Failed = append(s.Failed, f)
	}
	slices.SortFunc(s.Failed, func(a, b netopv1alpha1.NetworkNodeFailure) int { return strings.Compare(string(a.UID), string(b.UID)) })
	return s
}

// Run writes the report whenever it changed, until ctx is done. Load must
// have succeeded.
func (r *Report) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("networkNode", r.node)
	backoff := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Cap: 10 * time.Second, Steps: 1 << 30}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.changed:
		}
		// Coalesce: what changes meanwhile goes into the same write.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.delay):
		}
		if err := r.write(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			logger.Error(err, "Writing the node's report failed, retrying")
			r.mu.Lock()
			r.notify()
			r.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff.Step()):
			}
			continue
		}
		backoff.Steps = 1 << 30
		backoff.Duration = 100 * time.Millisecond
	}
}

// write writes the report if it differs from what the NetworkNode says.
func (r *Report) write(ctx context.Context) error {
	r.mu.Lock()
	nn := r.current.DeepCopy()
	nn.Status = r.status()
	same := apiequality.Semantic.DeepEqual(nn.Status, r.current.Status)
	r.mu.Unlock()
	if same {
		return nil
	}
	written, err := r.client.NetopV1alpha1().NetworkNodes().UpdateStatus(ctx, nn, metav1.UpdateOptions{})
	switch {
	case apierrors.IsConflict(err):
		// Someone else wrote it: start from theirs, and write ours again.
		written, err = r.client.NetopV1alpha1().NetworkNodes().Get(ctx, r.node, metav1.GetOptions{})
		if err == nil {
			err = fmt.Errorf("NetworkNode %s changed meanwhile", r.node)
		}
	case apierrors.IsNotFound(err):
		// Deleted under us (its Node went and came back, or by hand).
		written, err = r.create(ctx)
		if err == nil {
			err = fmt.Errorf("NetworkNode %s was gone, made it again", r.node)
		}
	}
	if written != nil {
		r.mu.Lock()
		r.current = written
		r.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("writing NetworkNode %s: %w", r.node, err)
	}
	klog.FromContext(ctx).V(2).Info("Reported the node's networks", "ready", nn.Status.ReadyNetworks, "failed", nn.Status.FailedNetworks)
	return nil
}
