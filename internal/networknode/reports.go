package networknode

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	netopv1alpha1 "github.com/netop-dev/netop/pkg/apis/netop/v1alpha1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	netopinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/netop/v1alpha1"
	netoplisters "github.com/netop-dev/netop/pkg/generated/listers/netop/v1alpha1"
)

// NodeReports is NodeReadiness read from the agents' NetworkNodes, and
// from their pods: a node whose agent's pod is not ready lags on every
// Network, since nothing there repairs or reports.
type NodeReports struct {
	reports netoplisters.NetworkNodeLister
	// pods and namespace find the agents' pods; pods is nil where agents
	// do not run in pods.
	pods      corelisters.PodLister
	namespace string

	// synced is done once every report of the initial list was seen.
	synced cache.DoneChecker

	mu       sync.Mutex
	onChange []func(uids []types.UID, all bool)
}

// NewNodeReports reads the reports of informer and the readiness of the
// agents' pods in namespace from pods (nil: agents run outside pods).
// Call it before the informers start.
func NewNodeReports(informer netopinformers.NetworkNodeInformer, pods coreinformers.PodInformer, namespace string) (*NodeReports, error) {
	r := &NodeReports{reports: informer.Lister(), namespace: namespace}
	reg, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { r.changed(nil, true) },
		UpdateFunc: func(oldObj, newObj any) {
			old, cur := oldObj.(*netopv1alpha1.NetworkNode), newObj.(*netopv1alpha1.NetworkNode)
			if old.Status.AgentPod != cur.Status.AgentPod || old.Status.OnDemand != cur.Status.OnDemand {
				r.changed(nil, true)
				return
			}
			r.changed(changedNetworks(&old.Status, &cur.Status), false)
		},
		DeleteFunc: func(any) { r.changed(nil, true) },
	})
	if err != nil {
		return nil, fmt.Errorf("watching NetworkNodes: %w", err)
	}
	r.synced = reg.HasSyncedChecker()
	if pods == nil {
		return r, nil
	}
	r.pods = pods.Lister()
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { r.podChanged(nil, obj) },
		UpdateFunc: func(oldObj, newObj any) {
			if podReady(oldObj.(*corev1.Pod)) != podReady(newObj.(*corev1.Pod)) {
				r.podChanged(oldObj, newObj)
			}
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			r.podChanged(nil, obj)
		},
	}); err != nil {
		return nil, fmt.Errorf("watching the agents' pods: %w", err)
	}
	return r, nil
}

// HasSyncedChecker is done once every report of the initial list was
// seen: until then, no node seems to run an agent.
func (r *NodeReports) HasSyncedChecker() cache.DoneChecker { return r.synced }

// OnChange registers f.
func (r *NodeReports) OnChange(f func(uids []types.UID, all bool)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onChange = append(r.onChange, f)
}

func (r *NodeReports) changed(uids []types.UID, all bool) {
	if !all && len(uids) == 0 {
		return
	}
	r.mu.Lock()
	fs := slices.Clone(r.onChange)
	r.mu.Unlock()
	for _, f := range fs {
		f(uids, all)
	}
}

// podChanged tells about every Network when an agent's pod changed.
func (r *NodeReports) podChanged(_, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Namespace != r.namespace {
		return
	}
	nodes, err := r.reports.List(labels.Everything())
	if err != nil {
		return
	}
	for _, nn := range nodes {
		if nn.Status.AgentPod == pod.Name {
			r.changed(nil, true)
			return
		}
	}
}

// changedNetworks lists the Networks whose entry differs between two
// reports.
func changedNetworks(old, cur *netopv1alpha1.NetworkNodeStatus) []types.UID {
	var uids []types.UID
	for uid, gen := range cur.Ready {
		if old.Ready[uid] != gen {
			uids = append(uids, uid)
		}
	}
	for uid := range old.Ready {
		if _, ok := cur.Ready[uid]; !ok {
			uids = append(uids, uid)
		}
	}
	failures := func(s *netopv1alpha1.NetworkNodeStatus) map[types.UID]netopv1alpha1.NetworkNodeFailure {
		m := make(map[types.UID]netopv1alpha1.NetworkNodeFailure, len(s.Failed))
		for _, f := range s.Failed {
			m[f.UID] = f
		}
		return m
	}
	oldFailed, curFailed := failures(old), failures(cur)
	for uid, f := range curFailed {
		if oldFailed[uid] != f {
			uids = append(uids, uid)
		}
	}
	for uid := range oldFailed {
		if _, ok := curFailed[uid]; !ok {
			uids = append(uids, uid)
		}
	}
	slices.Sort(uids)
	return slices.Compact(uids)
}

// Nodes counts the nodes that realise n (every node, but for those whose
// agents realise Networks on demand and do not report n, ready or failed)
// and those of them where it is ready at its generation, says why up to
// limit of the others lag, in the order of their names, and counts the
// nodes whose agents report at all.
func (r *NodeReports) Nodes(n *samplecrdv2.Network, limit int) (ready, total, of int32, lagging []string) {
	nodes, err := r.reports.List(labels.Everything())
	if err != nil {
		return 0, 0, 0, nil
	}
	slices.SortFunc(nodes, func(a, b *netopv1alpha1.NetworkNode) int { return strings.Compare(a.Name, b.Name) })
	for _, nn := range nodes {
		of++
		if nn.Status.OnDemand && !reports(nn, n.UID) {
			continue
		}
		total++
		why := r.lag(nn, n)
		if why == "" {
			ready++
			continue
		}
		if len(lagging) < limit {
			lagging = append(lagging, nn.Name+": "+why)
		}
	}
	return ready, total, of, lagging
}

// reports reports whether nn's agent reports the Network of uid, ready or
// failed.
func reports(nn *netopv1alpha1.NetworkNode, uid types.UID) bool {
	if _, ok := nn.Status.Ready[uid]; ok {
		return true
	}
	return slices.ContainsFunc(nn.Status.Failed, func(f netopv1alpha1.NetworkNodeFailure) bool { return f.UID == uid })
}

// lag says why n is not ready on the node of nn, or "" if it is.
func (r *NodeReports) lag(nn *netopv1alpha1.NetworkNode, n *samplecrdv2.Network) string {
	if r.pods != nil && nn.Status.AgentPod != "" {
		pod, err := r.pods.Pods(r.namespace).Get(nn.Status.AgentPod)
		if err != nil {
			return fmt.Sprintf("its agent's pod %s is gone", nn.Status.AgentPod)
		}
		if !podReady(pod) {
			return fmt.Sprintf("its agent's pod %s is not ready", pod.Name)
		}
	}
	if gen, ok := nn.Status.Ready[n.UID]; ok {
		if gen == n.Generation {
			return ""
		}
		return fmt.Sprintf("ready at generation %d, not yet at %d", gen, n.Generation)
	}
	for _, f := range nn.Status.Failed {
		if f.UID == n.UID {
			return fmt.Sprintf("%s: %s", f.Reason, f.Message)
		}
	}
	return "not built yet"
}

// podReady reports whether pod's Ready condition is True.
func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
