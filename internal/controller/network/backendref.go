package network

import (
	"github.com/netop-dev/netop/internal/backend"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// The backends speak no Kubernetes API: what they answer (backend.Ref) is
// recorded in status.backend, and handed back to them from there.

// backendRef is the backend network that status.backend records, or nil.
func backendRef(s *samplecrdv2.NetworkBackendStatus) *backend.Ref {
	if s == nil {
		return nil
	}
	return &backend.Ref{Type: backend.Type(s.Type), Interface: s.Interface, NetworkID: s.NetworkID, SubnetIDs: s.SubnetIDs}
}

// backendStatus is how status.backend records ref.
func backendStatus(ref *backend.Ref) *samplecrdv2.NetworkBackendStatus {
	if ref == nil {
		return nil
	}
	return &samplecrdv2.NetworkBackendStatus{Type: samplecrdv2.BackendType(ref.Type), Interface: ref.Interface, NetworkID: ref.NetworkID, SubnetIDs: ref.SubnetIDs}
}
