// Package backend defines what the Network controller needs from a provider
// of real networks (a Linux bridge, a Neutron network), so that the
// controller's logic is the same whatever provides the network.
//
// A backend records on everything it creates which Network owns it (by UID),
// so that after a crash netop adopts what it made instead of making it
// twice, and so that the orphan sweeper can find what no Network claims.
package backend

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
)

// Owner identifies the Network that a backend network belongs to. UID is the
// authority; Namespace and Name are for people and logs.
type Owner struct {
	Namespace string
	Name      string
	UID       types.UID
}

// Network is the desired state of one backend network.
type Network struct {
	Owner
	// CIDR is canonical: its host bits are zero.
	CIDR netip.Prefix
	// Gateway lies inside CIDR.
	Gateway netip.Addr
}

// Validate checks what every backend relies on: an owner UID, a valid and
// canonical CIDR that is not IPv4-mapped IPv6, and a gateway inside it. The
// controller resolves specs with netspec, so an error here is a bug in the
// caller, not a user's mistake. Backends check the UID's form themselves,
// since what they can record differs.
func (n Network) Validate() error {
	if n.UID == "" {
		return errors.New("missing owner UID")
	}
	if !n.CIDR.IsValid() {
		return fmt.Errorf("invalid CIDR %s", n.CIDR)
	}
	if n.CIDR.Addr().Is4In6() {
		return fmt.Errorf("CIDR %s: IPv4-mapped IPv6 prefixes are not supported", n.CIDR)
	}
	if n.CIDR != n.CIDR.Masked() {
		return fmt.Errorf("CIDR %s has host bits set (did you mean %s?)", n.CIDR, n.CIDR.Masked())
	}
	if !n.CIDR.Contains(n.Gateway) {
		return fmt.Errorf("gateway %s is not an address in %s", n.Gateway, n.CIDR)
	}
	return nil
}

// Observed is one backend network that netop made, as the backend sees it.
type Observed struct {
	Owner
	// Status identifies it, as status.backend records it.
	Status samplecrdv1.NetworkBackendStatus
	// CIDR and Gateway are what it provides now. Both are zero when it is
	// incomplete or ambiguous (a bridge with no or several addresses, a
	// Neutron network without its subnet): it then differs from any spec.
	CIDR    netip.Prefix
	Gateway netip.Addr
}

// Action says what Ensure had to do.
type Action string

const (
	// ActionNone: the backend network already matched; nothing was changed.
	ActionNone Action = ""
	// ActionCreated: the backend network did not exist and was created.
	ActionCreated Action = "Created"
	// ActionUpdated: the backend network existed and was changed to match.
	ActionUpdated Action = "Updated"
)

// Result is the outcome of Ensure.
type Result struct {
	// Status identifies the backend network; it goes into status.backend.
	Status samplecrdv1.NetworkBackendStatus
	Action Action
}

// Backend provides real networks for Networks.
//
// All methods are safe for concurrent use and idempotent. The recorded
// argument is status.backend as last written, or nil; a backend must not
// trust it blindly (the network may have been deleted or replaced by hand)
// but uses it to find what it made.
type Backend interface {
	// Type is the value of status.backend.type for this backend.
	Type() samplecrdv1.BackendType

	// Ensure converges the backend network of want.Owner to want, creating
	// it if it is missing, and reports what it did.
	Ensure(ctx context.Context, want Network, recorded *samplecrdv1.NetworkBackendStatus) (Result, error)

	// Delete removes the backend network of owner. A network that is
	// already gone is not an error.
	Delete(ctx context.Context, owner Owner, recorded *samplecrdv1.NetworkBackendStatus) error

	// ListOwned lists every backend network that netop made, with what it
	// provides now, in one pass: the resync diffs it against the Networks
	// in memory instead of asking the backend once per Network.
	ListOwned(ctx context.Context) ([]Observed, error)
}

// DriftWatcher is implemented by backends that can see changes made behind
// netop's back, so that they are repaired at once rather than at the next
// resync.
type DriftWatcher interface {
	// WatchDrift calls changed with the owner of each backend network that
	// changed or disappeared, until ctx is done. It returns early only
	// with an error that stops the watch.
	WatchDrift(ctx context.Context, changed func(Owner)) error
}

// RecordPrefix begins every ownership record.
const RecordPrefix = "netop:"

// Record is how a backend writes owner down on what it makes, in a field of
// at most maxLen bytes (an interface alias, a Neutron description):
// "netop:<namespace>/<name>/<uid>". The name, then the namespace, is
// shortened to fit; the UID is kept whole, because ownership is decided by
// it.
func (o Owner) Record(maxLen int) string {
	ns, name, uid := o.Namespace, o.Name, string(o.UID)
	if over := len(RecordPrefix) + len(ns) + 1 + len(name) + 1 + len(uid) - maxLen; over > 0 {
		cut := min(over, len(name))
		name = name[:len(name)-cut]
		over -= cut
		ns = ns[:len(ns)-min(over, len(ns))]
	}
	return RecordPrefix + ns + "/" + name + "/" + uid
}

// ParseRecord reads what Record wrote, and returns false for anything else.
// Backends check the UID's form themselves.
func ParseRecord(s string) (Owner, bool) {
	rest, ok := strings.CutPrefix(s, RecordPrefix)
	if !ok {
		return Owner{}, false
	}
	first := strings.IndexByte(rest, '/')
	last := strings.LastIndexByte(rest, '/')
	if first < 0 || first == last || last == len(rest)-1 {
		return Owner{}, false
	}
	return Owner{Namespace: rest[:first], Name: rest[first+1 : last], UID: types.UID(rest[last+1:])}, true
}
