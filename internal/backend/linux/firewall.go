package linux

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/netpolicy/resolved"
)

// Firewall enforces network policies in the backend's namespace, in
// PolicyTable. Policies of a new shape (a policy added, removed or
// edited) replace the table in one transaction; a change of pods only
// adds and removes set elements, in one transaction. Someone deleting the
// table, a chain, a rule or a set is repaired by Watch; elements changed
// behind its back by Repair.
type Firewall struct {
	ns netns.NsHandle
	mu sync.Mutex
	// desired are the last policies applied; applied what the table has
	// of them, nil when netop made no table.
	desired resolved.Policies
	applied *appliedTable
	// removed: the firewall removed the table, which no policy needs
	// (Apply without policies then costs nothing: pods change often).
	removed bool
}

// appliedTable is what the firewall wrote: the policies' shape, and each
// set's elements.
type appliedTable struct {
	shape    string
	rules    map[string]int
	elements map[string]map[string]bool
	keyTypes map[string]nftables.SetDatatype
}

// FirewallStats say what an Apply did.
type FirewallStats struct {
	// Replaced: the table was written whole.
	Replaced bool
	// Rules and Elements are the table's, Changed the elements added or
	// removed.
	Rules, Elements, Changed int
}

var policyTable = &nftables.Table{Family: nftables.TableFamilyINet, Name: PolicyTable}

// Firewall is the backend's firewall.
func (b *Backend) Firewall() *Firewall { return b.firewall }

func (fw *Firewall) conn() (*nftables.Conn, error) { return nftablesConn(fw.ns) }

// nftablesConn is a connection to nftables in ns (the process's own if
// ns is not open) that takes transactions as large as maxBatch.
func nftablesConn(ns netns.NsHandle) (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.WithSockOptions(largeBatches)}
	if ns.IsOpen() {
		opts = append(opts, nftables.WithNetNSFd(int(ns)))
	}
	return nftables.New(opts...)
}

// maxBatch bounds one transaction: the kernel takes a batch in one
// message, which the socket's send buffer must hold (the default holds a
// few thousand elements: 100 policies over 1000 pods are 7,000, and the
// isolation set has one per bridge of the node).
const maxBatch = 256 << 20

// largeBatches lets a transaction be as large as maxBatch, and its
// acknowledgements (one per message) wait in the receive buffer, as nft
// does: the buffers are limits, not allocations. The FORCE options pass
// over net.core.[rw]mem_max with CAP_NET_ADMIN, which netop has.
func largeBatches(c *netlink.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var opErr error
	if err := raw.Control(func(fd uintptr) {
		opErr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, maxBatch),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, maxBatch))
	}); err != nil {
		return err
	}
	if opErr != nil {
		return fmt.Errorf("netlink buffers: %w", opErr)
	}
	return nil
}

// Apply makes the table enforce p: its elements alone change when p has
// the shape of the policies applied last; no policy removes the table.
func (fw *Firewall) Apply(p resolved.Policies) (FirewallStats, error) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	fw.desired = p
	if len(p) == 0 && fw.removed {
		return FirewallStats{}, nil
	}
	c, err := fw.conn()
	if err != nil {
		return FirewallStats{}, fmt.Errorf("nftables: %w", err)
	}
	if len(p) == 0 {
		return FirewallStats{Replaced: fw.applied != nil}, fw.remove(c)
	}
	plan := planPolicies(p)
	shape := policyShape(p)
	if fw.applied == nil || fw.applied.shape != shape {
		return fw.program(c, plan, shape)
	}
	return fw.update(c, plan)
}

// bridgedTrafficSysctls make br_netfilter show bridged IPv4 and IPv6
// packets to the inet hooks, per network namespace: at 0, or without the
// module, pods' traffic bypasses the policy table and every policy is void,
// and a Service's replies between two pods on one bridge miss conntrack.
var bridgedTrafficSysctls = []string{"/proc/sys/net/bridge/bridge-nf-call-iptables", "/proc/sys/net/bridge/bridge-nf-call-ip6tables"}

// SeeBridgedTraffic makes sure bridged traffic in ns reaches netfilter: it
// sets what an administrator turned off, and says what is missing when it
// cannot (a node agent's /proc/sys is read-only).
func SeeBridgedTraffic(ns netns.NsHandle) error {
	for _, path := range bridgedTrafficSysctls {
		value, err := readSysctl(ns, path)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s does not exist: the kernel's br_netfilter module is not loaded, so bridged traffic never reaches netfilter (policies, Services) (modprobe br_netfilter)", path)
		}
		if err != nil {
			return err
		}
		if value == "1" {
			continue
		}
		if err := WriteSysctl(ns, path, "1"); err != nil {
			return fmt.Errorf("%s is %s, so bridged traffic never reaches netfilter (policies, Services), and setting it to 1: %w", path, value, err)
		}
	}
	return nil
}

// program replaces the table by plan's, in one transaction.
func (fw *Firewall) program(c *nftables.Conn, plan *policyPlan, shape string) (FirewallStats, error) {
	if err := SeeBridgedTraffic(fw.ns); err != nil {
		return FirewallStats{}, err
	}
	fw.removed = false
	c.AddTable(policyTable)
	c.DelTable(policyTable)
	c.AddTable(policyTable)
	applied := &appliedTable{shape: shape, rules: map[string]int{}, elements: map[string]map[string]bool{}, keyTypes: map[string]nftables.SetDatatype{}}
	stats := FirewallStats{Replaced: true}
	sets := map[string]*nftables.Set{}
	for _, s := range plan.sets {
		set := &nftables.Set{Table: policyTable, Name: s.name, KeyType: s.keyType, Concatenation: true}
		elements := make([]nftables.SetElement, len(s.elements))
		have := make(map[string]bool, len(s.elements))
		for i, e := range s.elements {
			elements[i] = nftables.SetElement{Key: e}
			have[string(e)] = true
		}
		if err := c.AddSet(set, elements); err != nil {
			return FirewallStats{}, fmt.Errorf("nftables set %s: %w", s.name, err)
		}
		sets[s.name] = set
		applied.elements[s.name] = have
		applied.keyTypes[s.name] = s.keyType
		stats.Elements += len(have)
	}
	accept := nftables.ChainPolicyAccept
	chains := map[string]*nftables.Chain{}
	for _, ch := range plan.chains {
		chain := &nftables.Chain{Name: ch.name, Table: policyTable}
		if ch.base {
			// Beside the isolation table's, at the filter priority:
			// either may drop, and both must accept.
			chain.Type, chain.Hooknum, chain.Priority, chain.Policy = nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter, &accept
		}
		chains[ch.name] = c.AddChain(chain)
	}
	for _, ch := range plan.chains {
		for _, exprs := range ch.rules {
			for _, e := range exprs {
				if l, ok := e.(*expr.Lookup); ok {
					l.SetID = sets[l.SetName].ID
				}
			}
			c.AddRule(&nftables.Rule{Table: policyTable, Chain: chains[ch.name], Exprs: exprs})
		}
		applied.rules[ch.name] = len(ch.rules)
		stats.Rules += len(ch.rules)
	}
	if err := c.Flush(); err != nil {
		fw.applied = nil
		return FirewallStats{}, fmt.Errorf("programming nftables table %s: %w", PolicyTable, err)
	}
	fw.applied = applied
	return stats, nil
}

// update writes the elements plan has and the table does not, and
// removes those it has and plan does not, in one transaction.
func (fw *Firewall) update(c *nftables.Conn, plan *policyPlan) (FirewallStats, error) {
	stats := FirewallStats{}
	next := map[string]map[string]bool{}
	for _, s := range plan.sets {
		set := &nftables.Set{Table: policyTable, Name: s.name, KeyType: s.keyType, Concatenation: true}
		have := fw.applied.elements[s.name]
		want := make(map[string]bool, len(s.elements))
		var add, del []nftables.SetElement
		for _, e := range s.elements {
			want[string(e)] = true
			if !have[string(e)] {
				add = append(add, nftables.SetElement{Key: e})
			}
		}
		for e := range have {
			if !want[e] {
				del = append(del, nftables.SetElement{Key: []byte(e)})
			}
		}
		if len(del) > 0 {
			if err := c.SetDeleteElements(set, del); err != nil {
				return FirewallStats{}, fmt.Errorf("nftables set %s: %w", s.name, err)
			}
		}
		if len(add) > 0 {
			if err := c.SetAddElements(set, add); err != nil {
				return FirewallStats{}, fmt.Errorf("nftables set %s: %w", s.name, err)
			}
		}
		next[s.name] = want
		stats.Elements += len(want)
		stats.Changed += len(add) + len(del)
	}
	for _, n := range fw.applied.rules {
		stats.Rules += n
	}
	if stats.Changed == 0 {
		return stats, nil
	}
	if err := c.Flush(); err != nil {
		// What the table has is not known: the next Apply writes it whole.
		fw.applied = nil
		return FirewallStats{}, fmt.Errorf("updating the elements of nftables table %s: %w", PolicyTable, err)
	}
	fw.applied.elements = next
	return stats, nil
}

// remove removes the table, or one a netop before this one left.
func (fw *Firewall) remove(c *nftables.Conn) error {
	c.AddTable(policyTable)
	c.DelTable(policyTable)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("removing nftables table %s: %w", PolicyTable, err)
	}
	fw.applied, fw.removed = nil, true
	return nil
}

// Repair rewrites the table when it is not what the firewall wrote: a
// chain, rule, set or element missing or added. It reports whether it did.
func (fw *Firewall) Repair() (bool, error) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	c, err := fw.conn()
	if err != nil {
		return false, fmt.Errorf("nftables: %w", err)
	}
	if fw.applied == nil {
		if len(fw.desired) == 0 {
			return false, nil
		}
	} else if ok, err := fw.inOrder(c); err != nil {
		return false, fmt.Errorf("checking nftables table %s: %w", PolicyTable, err)
	} else if ok {
		return false, SeeBridgedTraffic(fw.ns)
	}
	if len(fw.desired) == 0 {
		return true, fw.remove(c)
	}
	_, err = fw.program(c, planPolicies(fw.desired), policyShape(fw.desired))
	return true, err
}

// inOrder reports whether the table has the chains, rule counts, sets and
// elements the firewall wrote.
func (fw *Firewall) inOrder(c *nftables.Conn) (bool, error) {
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, err
	}
	seen := 0
	for _, ch := range chains {
		if ch.Table.Name != PolicyTable {
			continue
		}
		want, ok := fw.applied.rules[ch.Name]
		if !ok {
			return false, nil
		}
		rules, err := c.GetRules(policyTable, ch)
		if err != nil {
			return false, err
		}
		if len(rules) != want {
			return false, nil
		}
		seen++
	}
	if seen != len(fw.applied.rules) {
		return false, nil
	}
	for name, want := range fw.applied.elements {
		elements, err := c.GetSetElements(&nftables.Set{Table: policyTable, Name: name, KeyType: fw.applied.keyTypes[name], Concatenation: true})
		if err != nil {
			return false, nil //nolint:nilerr // a missing set is a table to repair
		}
		if len(elements) != len(want) {
			return false, nil
		}
		for _, e := range elements {
			if !want[string(e.Key)] {
				return false, nil
			}
		}
	}
	return true, nil
}

// Watch repairs the table whenever some of it is deleted, until ctx is
// done.
func (fw *Firewall) Watch(ctx context.Context) error {
	return watchTable(ctx, fw.conn, PolicyTable, func() error {
		if repaired, err := fw.Repair(); err != nil {
			klog.FromContext(ctx).Error(err, "Repairing the policy rules failed; the resync tries again", "table", PolicyTable)
		} else if repaired {
			klog.FromContext(ctx).Info("Repaired the policy rules", "table", PolicyTable)
		}
		return nil
	})
}

// NFTablesIn is a connection to nftables in the network namespace named
// name, and the function that releases the namespace once the connection
// is no longer used (each of its operations opens a socket there).
func NFTablesIn(name string) (*nftables.Conn, func(), error) {
	ns, err := netns.GetFromName(name)
	if err != nil {
		return nil, nil, fmt.Errorf("network namespace %s: %w", name, err)
	}
	conn, err := nftablesConn(ns)
	if err != nil {
		_ = ns.Close()
		return nil, nil, err
	}
	return conn, func() { _ = ns.Close() }, nil
}
