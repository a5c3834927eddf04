package networkcache

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// Specs resolves each version of a Network's spec once. The controllers
// ask what the same Network means on every sync, pod and query, and the
// API server never changes an object without changing its
// resourceVersion, so a version's answer is kept until the next one.
// What it returns is shared: callers read it and change none of it.
type Specs struct {
	resolver netspec.Resolver

	mu sync.Mutex
	// byUID holds the last version resolved of each Network.
	byUID map[types.UID]resolvedSpec
}

type resolvedSpec struct {
	resourceVersion string
	families        netspec.Families
	errs            field.ErrorList
}

// NewSpecs resolves specs with resolver.
func NewSpecs(resolver netspec.Resolver) *Specs {
	return &Specs{resolver: resolver, byUID: map[types.UID]resolvedSpec{}}
}

// Resolve is n's spec resolved, its errors naming v2's fields. A Network
// without a UID or a resourceVersion, which the API server did not store,
// is resolved anew on every call.
func (s *Specs) Resolve(n *samplecrdv2.Network) (netspec.Families, field.ErrorList) {
	stored := n.UID != "" && n.ResourceVersion != ""
	if stored {
		s.mu.Lock()
		r, ok := s.byUID[n.UID]
		s.mu.Unlock()
		if ok && r.resourceVersion == n.ResourceVersion {
			return r.families, r.errs
		}
	}
	var spec samplecrd.NetworkSpec
	// v2's spec is the hub's field for field: a copy that cannot fail.
	_ = samplecrdv2.Convert_v2_NetworkSpec_To_samplecrd_NetworkSpec(&n.Spec, &spec, nil)
	families, errs := s.resolver.Resolve(&spec, netspec.Fields{})
	if stored {
		s.mu.Lock()
		s.byUID[n.UID] = resolvedSpec{resourceVersion: n.ResourceVersion, families: families, errs: errs}
		s.mu.Unlock()
	}
	return families, errs
}

// Forget drops what is kept of the Network with uid, once it is gone.
func (s *Specs) Forget(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byUID, uid)
}
