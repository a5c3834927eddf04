package network

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// maxVNI is the largest VXLAN network identifier (24 bits).
const maxVNI = 1<<24 - 1

// vniPool hands out one VNI per Network, the cluster controller being the
// one writer. It is rebuilt at start from the VNIs the Networks' statuses
// record, before any sync runs.
type vniPool struct {
	mu    sync.Mutex
	byUID map[types.UID]int32
	used  map[int32]types.UID
	// next is where the search for a free VNI starts: freed VNIs are
	// reused last, so that a VNI a node may still have is not reused at
	// once.
	next int32
}

func newVNIPool() *vniPool {
	return &vniPool{byUID: map[types.UID]int32{}, used: map[int32]types.UID{}, next: 1}
}

// keep records a VNI a Network's status has, unless another Network has it.
func (p *vniPool) keep(uid types.UID, vni int32) {
	if vni < 1 || vni > maxVNI {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, taken := p.used[vni]; taken {
		return
	}
	if _, has := p.byUID[uid]; has {
		return
	}
	p.byUID[uid] = vni
	p.used[vni] = uid
}

// assign returns uid's VNI, allocating one if it has none. The second
// result is false when all are taken.
func (p *vniPool) assign(uid types.UID) (int32, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if vni, ok := p.byUID[uid]; ok {
		return vni, true
	}
	for range maxVNI {
		vni := p.next
		p.next = p.next%maxVNI + 1
		if _, taken := p.used[vni]; !taken {
			p.byUID[uid] = vni
			p.used[vni] = uid
			return vni, true
		}
	}
	return 0, false
}

// release frees uid's VNI.
func (p *vniPool) release(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if vni, ok := p.byUID[uid]; ok {
		delete(p.byUID, uid)
		delete(p.used, vni)
	}
}
