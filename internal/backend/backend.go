// Package backend defines what the Network controller needs from a provider
// of real networks (a Linux bridge, a Neutron network), so that the
// controller's logic is the same whatever provides the network. It speaks
// no Kubernetes API: a backend gets a Network as netip families and an
// owner, and answers with a Ref, which the controller records in the
// Network's status; depguard keeps pkg/apis out of every backend.
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
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// ErrInvalid is wrapped by Ensure errors that no retry can fix: the backend
// refuses the network as specified (the kernel will not assign the gateway
// address, say). The controller reports them as an invalid spec and waits
// for the spec to change instead of retrying.
var ErrInvalid = errors.New("the backend cannot provide this network as specified")

// Owner identifies the Network that a backend network belongs to. UID is the
// authority; Namespace and Name are for people and logs.
type Owner struct {
	// Cluster identifies the cluster of the Network, so that netops of
	// several clusters can share a network namespace or a Neutron project
	// without touching each other's networks. Empty on records made before
	// clusters were recorded: those are adopted by the cluster that has a
	// Network with their UID, and never swept.
	Cluster   string
	Namespace string
	Name      string
	UID       types.UID
}

// MaxClusterLen is the longest cluster identity: it must fit in a Neutron
// tag with its prefix.
const MaxClusterLen = 46

// ValidCluster checks a cluster identity: 1 to MaxClusterLen letters,
// digits, '-', '_' or '.', which fit into every record and tag.
func ValidCluster(cluster string) error {
	if cluster == "" || len(cluster) > MaxClusterLen {
		return fmt.Errorf("cluster identity %q must have 1 to %d characters", cluster, MaxClusterLen)
	}
	for i := 0; i < len(cluster); i++ {
		switch c := cluster[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.':
		default:
			return fmt.Errorf("cluster identity %q may only have letters, digits, '-', '_' and '.'", cluster)
		}
	}
	return nil
}

// Claims reports whether a backend network recorded as rec's may be
// treated as o's: the same UID, and the same cluster or none recorded (a
// record from before clusters were recorded, which o adopts).
func (o Owner) Claims(rec Owner) bool {
	return rec.UID == o.UID && (rec.Cluster == "" || rec.Cluster == o.Cluster)
}

// Family is the addresses of one IP family of a network.
type Family struct {
	// CIDR is canonical: its host bits are zero.
	CIDR netip.Prefix
	// Gateway lies inside CIDR.
	Gateway netip.Addr
}

// Network is the desired state of one backend network.
type Network struct {
	Owner
	// Families are its addresses, the primary family first: one family,
	// or one IPv4 and one IPv6 (dual-stack).
	Families []Family
	// VNI, if not 0, joins the network's parts on several nodes into one
	// segment (the linux backend's overlay).
	VNI uint32
	// MTU, if not 0, is the largest packet the network carries; 0 lets
	// the backend derive it (the linux backend: the underlay's less the
	// overlay's overhead, or 1500).
	MTU int
	// Egress lets the network's traffic out through the node, its source
	// translated to the node's address.
	Egress bool
}

// Validate checks what every backend relies on: an owner UID, one or two
// families with valid and canonical CIDRs that are not IPv4-mapped IPv6,
// each with its gateway inside, and two families only of the two IP
// versions. The controller resolves specs with netspec, so an error here
// is a bug in the caller, not a user's mistake. Backends check the UID's
// form themselves, since what they can record differs.
func (n Network) Validate() error {
	if n.UID == "" {
		return errors.New("missing owner UID")
	}
	if len(n.Families) == 0 || len(n.Families) > 2 {
		return fmt.Errorf("%d address families: a network has one, or one IPv4 and one IPv6", len(n.Families))
	}
	for _, f := range n.Families {
		if err := f.validate(); err != nil {
			return err
		}
	}
	if len(n.Families) == 2 && n.Families[0].CIDR.Addr().Is4() == n.Families[1].CIDR.Addr().Is4() {
		return fmt.Errorf("CIDRs %s and %s are of one IP family: a dual-stack network has one IPv4 and one IPv6", n.Families[0].CIDR, n.Families[1].CIDR)
	}
	return nil
}

func (f Family) validate() error {
	if !f.CIDR.IsValid() {
		return fmt.Errorf("invalid CIDR %s", f.CIDR)
	}
	if f.CIDR.Addr().Is4In6() {
		return fmt.Errorf("CIDR %s: IPv4-mapped IPv6 prefixes are not supported", f.CIDR)
	}
	if f.CIDR != f.CIDR.Masked() {
		return fmt.Errorf("CIDR %s has host bits set (did you mean %s?)", f.CIDR, f.CIDR.Masked())
	}
	if !f.CIDR.Contains(f.Gateway) {
		return fmt.Errorf("gateway %s is not an address in %s", f.Gateway, f.CIDR)
	}
	return nil
}

// Type names a kind of backend; a Network's status.backend.type records it.
type Type string

// The backends netop has.
const (
	// TypeLinux is a Linux bridge per node (package linux).
	TypeLinux Type = "linux"
	// TypeNeutron is an OpenStack Neutron network (package neutron).
	TypeNeutron Type = "neutron"
)

// Ref identifies a backend network that a backend made, as the Network's
// status.backend records it: a bridge by its interface, a Neutron network
// by its ID and its subnets', one per family.
type Ref struct {
	Type      Type
	Interface string
	NetworkID string
	SubnetIDs []string
}

// Observed is one backend network that netop made, as the backend sees it.
type Observed struct {
	Owner
	// Status identifies it, as status.backend records it.
	Status Ref
	// Families are what it provides now, one per IP family, in no
	// particular order. They are nil when it is incomplete or ambiguous (a
	// bridge with no address, or several of one family; a Neutron network
	// without its subnet): it then differs from any spec.
	Families []Family
	// VNI is the overlay's, 0 without one.
	VNI uint32
}

// Provides reports whether o provides exactly the families of want.
func (o Observed) Provides(want Network) bool {
	if len(o.Families) != len(want.Families) {
		return false
	}
	for _, f := range want.Families {
		if !slices.Contains(o.Families, f) {
			return false
		}
	}
	return true
}

// Prefixes are the CIDRs o provides.
func (o Observed) Prefixes() []netip.Prefix {
	prefixes := make([]netip.Prefix, 0, len(o.Families))
	for _, f := range o.Families {
		prefixes = append(prefixes, f.CIDR)
	}
	return prefixes
}

// SameStatus reports whether two records of a backend network name the
// same network: the subnets in any order, since a backend lists them in
// its own.
func SameStatus(a, b *Ref) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.Type != b.Type || a.Interface != b.Interface || a.NetworkID != b.NetworkID || len(a.SubnetIDs) != len(b.SubnetIDs) {
		return false
	}
	for _, id := range a.SubnetIDs {
		if !slices.Contains(b.SubnetIDs, id) {
			return false
		}
	}
	return true
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
	Status Ref
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
	Type() Type

	// Ensure converges the backend network of want.Owner to want, creating
	// it if it is missing, and reports what it did.
	Ensure(ctx context.Context, want Network, recorded *Ref) (Result, error)

	// Delete removes the backend network of owner. A network that is
	// already gone is not an error.
	Delete(ctx context.Context, owner Owner, recorded *Ref) error

	// ListOwned lists every backend network that netop made, with what it
	// provides now, in one pass: the resync diffs it against the Networks
	// in memory instead of asking the backend once per Network.
	ListOwned(ctx context.Context) ([]Observed, error)

	// InUse reports whether something on this node is attached to the
	// backend network of owner (a pod's port on its bridge): a node that
	// no longer seems to need a Network keeps it while it is. Backends
	// whose networks nothing on the node attaches to say false.
	InUse(ctx context.Context, owner Owner) (bool, error)
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
// "netop:<cluster>:<namespace>/<name>/<uid>", or without "<cluster>:" when
// owner has no cluster. The name, then the namespace, is shortened to fit;
// the cluster and the UID are kept whole, because ownership is decided by
// them.
func (o Owner) Record(maxLen int) string {
	prefix := RecordPrefix
	if o.Cluster != "" {
		prefix += o.Cluster + ":"
	}
	ns, name, uid := o.Namespace, o.Name, string(o.UID)
	if over := len(prefix) + len(ns) + 1 + len(name) + 1 + len(uid) - maxLen; over > 0 {
		cut := min(over, len(name))
		name = name[:len(name)-cut]
		over -= cut
		ns = ns[:len(ns)-min(over, len(ns))]
	}
	return prefix + ns + "/" + name + "/" + uid
}

// ParseRecord reads what Record wrote, and returns false for anything else.
// Backends check the UID's form themselves. A namespace never contains
// ':', so a colon before the first '/' ends the cluster.
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
	var o Owner
	if colon := strings.IndexByte(rest[:first], ':'); colon >= 0 {
		o.Cluster = rest[:colon]
		if ValidCluster(o.Cluster) != nil {
			return Owner{}, false
		}
		rest, first, last = rest[colon+1:], first-colon-1, last-colon-1
	}
	o.Namespace, o.Name, o.UID = rest[:first], rest[first+1:last], types.UID(rest[last+1:])
	return o, true
}
