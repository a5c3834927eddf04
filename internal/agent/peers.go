package agent

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/netop-dev/netop/internal/backend/linux"
	netopv1alpha1 "github.com/netop-dev/netop/pkg/apis/netop/v1alpha1"
	netopinformers "github.com/netop-dev/netop/pkg/generated/informers/externalversions/netop/v1alpha1"
)

var _ linux.Peers = (*Peers)(nil)

// Peers are the other nodes that realise each Network, at their Nodes'
// InternalIPs: those whose agents report it ready in their NetworkNodes.
// A Network's VXLAN device floods to them alone, so that a node's
// flooding entries follow the Networks it realises, not the cluster.
type Peers struct {
	self string

	mu sync.Mutex
	// addrs are the nodes' underlay addresses, by node name.
	addrs map[string]netip.Addr
	// realised holds, by node name, the Networks it reports ready.
	realised map[string]map[types.UID]int64
	// byNetwork holds, by Network UID, the nodes that realise it.
	byNetwork map[types.UID]map[string]bool
	onChange  func(uids []types.UID)
	// synced are done once every Node and report of the initial lists was
	// seen.
	synced []cache.DoneChecker
}

// NewPeers follows the Nodes and NetworkNodes in the informers' caches
// for the agent of node self. Call it before the informers start.
func NewPeers(nodes coreinformers.NodeInformer, reports netopinformers.NetworkNodeInformer, self string) (*Peers, error) {
	p := &Peers{self: self, addrs: map[string]netip.Addr{}, realised: map[string]map[types.UID]int64{},
		byNetwork: map[types.UID]map[string]bool{}}
	nodesSeen, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.setNode(obj) },
		UpdateFunc: func(_, obj any) { p.setNode(obj) },
		DeleteFunc: func(obj any) { p.removeNode(obj) },
	})
	if err != nil {
		return nil, fmt.Errorf("following the Nodes: %w", err)
	}
	reportsSeen, err := reports.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.setReport(obj) },
		UpdateFunc: func(_, obj any) { p.setReport(obj) },
		DeleteFunc: func(obj any) { p.removeReport(obj) },
	})
	if err != nil {
		return nil, fmt.Errorf("following the NetworkNodes: %w", err)
	}
	p.synced = []cache.DoneChecker{nodesSeen.HasSyncedChecker(), reportsSeen.HasSyncedChecker()}
	return p, nil
}

// Synced are done once the initial Nodes and reports were all seen: a
// Network synced before would stop flooding to the peers not seen yet.
// The informers' own sync is not enough, their handlers may lag.
func (p *Peers) Synced() []cache.DoneChecker { return p.synced }

// OnChange registers f, told of the Networks whose peers changed. Call it
// before the informers start.
func (p *Peers) OnChange(f func(uids []types.UID)) { p.onChange = f }

// Of returns the underlay addresses of the other nodes that realise the
// Network of uid and have one.
func (p *Peers) Of(uid types.UID) []netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []netip.Addr
	for node := range p.byNetwork[uid] {
		if a, ok := p.addrs[node]; ok {
			out = append(out, a)
		}
	}
	return out
}

func (p *Peers) setNode(obj any) {
	node, ok := obj.(*corev1.Node)
	if !ok || node.Name == p.self {
		return
	}
	addr, err := netip.ParseAddr(nodeInternalIP(node))
	p.address(node.Name, addr, err == nil)
}

func (p *Peers) removeNode(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if node, ok := obj.(*corev1.Node); ok && node.Name != p.self {
		p.address(node.Name, netip.Addr{}, false)
	}
}

// address records node's underlay address (none unless has), and tells of
// the Networks the node realises when it changed.
func (p *Peers) address(node string, addr netip.Addr, has bool) {
	p.mu.Lock()
	old, had := p.addrs[node]
	if has {
		p.addrs[node] = addr
	} else {
		delete(p.addrs, node)
	}
	var changed []types.UID
	if had != has || old != addr {
		changed = slices.Collect(maps.Keys(p.realised[node]))
	}
	p.mu.Unlock()
	p.tell(changed)
}

func (p *Peers) setReport(obj any) {
	nn, ok := obj.(*netopv1alpha1.NetworkNode)
	if !ok || nn.Name == p.self {
		return
	}
	p.tell(p.realise(nn.Name, nn.Status.Ready))
}

func (p *Peers) removeReport(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if nn, ok := obj.(*netopv1alpha1.NetworkNode); ok && nn.Name != p.self {
		p.tell(p.realise(nn.Name, nil))
	}
}

// realise records that node realises the Networks in ready, and returns
// those that joined or left it.
func (p *Peers) realise(node string, ready map[types.UID]int64) []types.UID {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.realised[node]
	var changed []types.UID
	for uid := range ready {
		if _, ok := old[uid]; ok {
			continue
		}
		changed = append(changed, uid)
		if p.byNetwork[uid] == nil {
			p.byNetwork[uid] = map[string]bool{}
		}
		p.byNetwork[uid][node] = true
	}
	for uid := range old {
		if _, ok := ready[uid]; ok {
			continue
		}
		changed = append(changed, uid)
		delete(p.byNetwork[uid], node)
		if len(p.byNetwork[uid]) == 0 {
			delete(p.byNetwork, uid)
		}
	}
	if len(ready) == 0 {
		delete(p.realised, node)
	} else {
		p.realised[node] = ready
	}
	return changed
}

func (p *Peers) tell(uids []types.UID) {
	if len(uids) > 0 && p.onChange != nil {
		p.onChange(uids)
	}
}
