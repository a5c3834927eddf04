// Package agents is the backend of `netop controller` when node agents
// build the Networks' bridges: nothing is built centrally, and a Network's
// backend network is the bridge every agent makes under the name the linux
// backend derives from its UID. Whether the agents have built it is what
// they report (network.NodeReadiness), not what this backend says.
package agents

import (
	"context"

	"github.com/netop-dev/netop/internal/backend"
	"github.com/netop-dev/netop/internal/netdev/ifname"
)

// Backend stands for the bridges of the node agents.
type Backend struct{}

var _ backend.Backend = Backend{}

// Type is linux: the agents make Linux bridges.
func (Backend) Type() backend.Type { return backend.TypeLinux }

// Ensure names the bridge the agents make for want; they make it.
func (Backend) Ensure(_ context.Context, want backend.Network, _ *backend.Ref) (backend.Result, error) {
	if err := want.Validate(); err != nil {
		return backend.Result{}, err
	}
	return backend.Result{Status: backend.Ref{Type: backend.TypeLinux, Interface: ifname.Bridge(want.UID)}}, nil
}

// Delete does nothing: each agent removes its bridge once the Network is
// gone.
func (Backend) Delete(context.Context, backend.Owner, *backend.Ref) error {
	return nil
}

// ListOwned lists nothing: the agents sweep their own nodes.
func (Backend) ListOwned(context.Context) ([]backend.Observed, error) { return nil, nil }

// InUse: nothing on the controller's node attaches to the agents' bridges.
func (Backend) InUse(context.Context, backend.Owner) (bool, error) { return false, nil }
