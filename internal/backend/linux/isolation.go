package linux

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// BridgeGroup is the interface group (IFLA_GROUP) of netop's bridges. The
// isolation rules match the group, not each bridge, so that they are the
// same rules beside one Network or ten thousand.
const BridgeGroup = 0x6e657470 // "netp"

// IsolationTable is netop's nftables table (family inet) in the backend's
// namespace: a Network's pods reach one another and their gateway, and
// nothing else of the node, nor another Network, through it.
const IsolationTable = "netop"

// The table's chains and set.
const (
	chainInput       = "input"
	chainForward     = "forward"
	chainFromNetwork = "from-network"
	// chainEgressNAT translates the source of what leaves a Network with
	// egress to the node's address.
	chainEgressNAT = "egress-nat"
	// setEgress holds the bridges of Networks with egress (spec.egress).
	setEgress = "egress"
	// egressMark is the conntrack mark bit of connections leaving a
	// Network by egress, which the NAT chain translates: a bit of netop's
	// own in the connection's mark (kube-proxy and the CNI plugins mark
	// packets, not connections, with theirs).
	egressMark = 0x10000000
	// setBridged holds (bridge, bridge) for every netop bridge: a packet
	// that enters and leaves by the same bridge is bridged (the kernel's
	// br_netfilter shows bridged packets to the forward hook as coming in
	// and going out by the bridge), not routed out of its Network.
	setBridged = "bridged"
)

// isolation programs the table in the backend's namespace: the rules,
// which never change, and one element of setBridged per bridge.
type isolation struct {
	ns netns.NsHandle
	// mu orders whole-table writes against element writes.
	mu sync.Mutex
	// bridges counts the elements this process added minus those it
	// removed since the last full sync: when it reaches 0 the table may be
	// unused, which a link list then decides.
	bridges atomic.Int64
	// egress are the bridges whose Networks have egress, by index, as
	// their Ensures said: a table programmed whole gets them too.
	egress map[int]bool
}

func (i *isolation) conn() (*nftables.Conn, error) { return nftablesConn(i.ns) }

var (
	isolationTable = &nftables.Table{Family: nftables.TableFamilyINet, Name: IsolationTable}
	bridgedSet     = &nftables.Set{Table: isolationTable, Name: setBridged,
		KeyType: nftables.MustConcatSetType(nftables.TypeIFIndex, nftables.TypeIFIndex), Concatenation: true}
	egressSet = &nftables.Set{Table: isolationTable, Name: setEgress, KeyType: nftables.TypeIFIndex}
)

// isolationRule is one rule of the table, tagged so that a check can tell
// it is there.
type isolationRule struct {
	chain string
	tag   string
	exprs []expr.Any
}

// ctEstablished matches, in register reg, a packet of a connection seen
// both ways or of one it opened: the isolation and policy tables let
// those pass before anything else.
func ctEstablished(reg uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: reg, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// isolationRules are the table's rules, in order: from a bridge, the node
// answers echo requests to that bridge's gateway, neighbour discovery and
// what belongs to connections it opened; nothing is forwarded out of a
// Network, nor into one from elsewhere, but for a Network with egress:
// out to what is not a Network (its connections marked for the NAT
// chain), and their replies back in. setID and egressID are the IDs of
// setBridged and setEgress in the transaction that adds the rules.
func isolationRules(setID, egressID uint32) []isolationRule {
	group := binaryutil.NativeEndian.PutUint32(BridgeGroup)
	fromBridge := func(key expr.MetaKey) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: key, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: group},
		}
	}
	verdict := func(kind expr.VerdictKind) *expr.Verdict { return &expr.Verdict{Kind: kind} }
	icmp := func(proto byte, icmpType byte) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{icmpType}},
		}
	}
	// The destination is an address of the bridge the packet came in by:
	// another bridge's gateway, or the node's other addresses, are not.
	toThisGateway := []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, FlagIIF: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
	return []isolationRule{
		{chainInput, "from-a-network", append(fromBridge(expr.MetaKeyIIFGROUP),
			&expr.Verdict{Kind: expr.VerdictJump, Chain: chainFromNetwork})},
		{chainFromNetwork, "established", append(ctEstablished(1), verdict(expr.VerdictAccept))},
		{chainFromNetwork, "echo", slices.Concat(toThisGateway, icmp(unix.IPPROTO_ICMP, 8), []expr.Any{verdict(expr.VerdictAccept)})},
		{chainFromNetwork, "echo6", slices.Concat(toThisGateway, icmp(unix.IPPROTO_ICMPV6, 128), []expr.Any{verdict(expr.VerdictAccept)})},
		{chainFromNetwork, "neighbour-solicitation", append(icmp(unix.IPPROTO_ICMPV6, 135), verdict(expr.VerdictAccept))},
		{chainFromNetwork, "neighbour-advertisement", append(icmp(unix.IPPROTO_ICMPV6, 136), verdict(expr.VerdictAccept))},
		{chainFromNetwork, "nothing-else", []expr.Any{verdict(expr.VerdictDrop)}},
		{chainForward, "bridged", []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIF, Register: 8},
			&expr.Meta{Key: expr.MetaKeyOIF, Register: 9},
			&expr.Lookup{SourceRegister: 8, SetName: setBridged, SetID: setID},
			verdict(expr.VerdictAccept),
		}},
		{chainForward, "egress-replies", slices.Concat([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIF, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: setEgress, SetID: egressID},
		}, ctEstablished(1), []expr.Any{verdict(expr.VerdictAccept)})},
		{chainForward, "egress", []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIF, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: setEgress, SetID: egressID},
			&expr.Meta{Key: expr.MetaKeyOIFGROUP, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: group},
			&expr.Ct{Register: 1, Key: expr.CtKeyMARK},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(^uint32(egressMark)), Xor: binaryutil.NativeEndian.PutUint32(egressMark)},
			&expr.Ct{Register: 1, Key: expr.CtKeyMARK, SourceRegister: true},
			verdict(expr.VerdictAccept),
		}},
		{chainForward, "out-of-a-network", append(fromBridge(expr.MetaKeyIIFGROUP), verdict(expr.VerdictDrop))},
		{chainForward, "into-a-network", append(fromBridge(expr.MetaKeyOIFGROUP), verdict(expr.VerdictDrop))},
		{chainEgressNAT, "masquerade", []expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeyMARK},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(egressMark), Xor: binaryutil.NativeEndian.PutUint32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
			&expr.Masq{},
		}},
	}
}

// isolationChains are the table's chains: the two base chains, at the
// filter priority, accept what the rules do not drop, since the rest of
// the node's traffic is not netop's.
func isolationChains() []*nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return []*nftables.Chain{
		{Name: chainInput, Table: isolationTable, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept},
		{Name: chainForward, Table: isolationTable, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept},
		{Name: chainFromNetwork, Table: isolationTable},
		{Name: chainEgressNAT, Table: isolationTable, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept},
	}
}

// bridgedElements are the elements of setBridged for the bridges of
// indexes.
func bridgedElements(indexes ...int) []nftables.SetElement {
	elements := make([]nftables.SetElement, 0, len(indexes))
	for _, index := range indexes {
		key := binaryutil.NativeEndian.PutUint32(uint32(index))
		elements = append(elements, nftables.SetElement{Key: append(slices.Clone(key), key...)})
	}
	return elements
}

// program replaces the table, in one transaction, by the rules and an
// element for each bridge index: nothing passes unfiltered meanwhile.
func (i *isolation) program(c *nftables.Conn, bridges []int) error {
	// Adding the table first makes deleting it succeed when it is missing.
	c.AddTable(isolationTable)
	c.DelTable(isolationTable)
	c.AddTable(isolationTable)
	chains := map[string]*nftables.Chain{}
	for _, ch := range isolationChains() {
		chains[ch.Name] = c.AddChain(ch)
	}
	// AddSet gives the copy the ID the rules' lookup names it by.
	set := *bridgedSet
	if err := c.AddSet(&set, bridgedElements(bridges...)); err != nil {
		return fmt.Errorf("isolation set: %w", err)
	}
	egress := *egressSet
	if err := c.AddSet(&egress, egressElements(i.egressOf(bridges)...)); err != nil {
		return fmt.Errorf("egress set: %w", err)
	}
	for _, r := range isolationRules(set.ID, egress.ID) {
		c.AddRule(&nftables.Rule{Table: isolationTable, Chain: chains[r.chain], Exprs: r.exprs, UserData: []byte(r.tag)})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("programming nftables table %s: %w", IsolationTable, err)
	}
	i.bridges.Store(int64(len(bridges)))
	return nil
}

// inOrder reports whether the table has every chain and rule, in order,
// and the set (not its elements: a full sync rewrites them).
func (i *isolation) inOrder(c *nftables.Conn) (bool, error) {
	if _, err := c.ListTableOfFamily(IsolationTable, nftables.TableFamilyINet); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, err
	}
	have := map[string]*nftables.Chain{}
	for _, ch := range chains {
		if ch.Table.Name == IsolationTable {
			have[ch.Name] = ch
		}
	}
	want := isolationChains()
	if len(have) != len(want) {
		return false, nil
	}
	tags := map[string][]string{}
	for _, r := range isolationRules(0, 0) {
		tags[r.chain] = append(tags[r.chain], r.tag)
	}
	for _, ch := range want {
		got, ok := have[ch.Name]
		if !ok {
			return false, nil
		}
		rules, err := c.GetRules(isolationTable, got)
		if err != nil {
			return false, err
		}
		var gotTags []string
		for _, r := range rules {
			gotTags = append(gotTags, string(r.UserData))
		}
		if !slices.Equal(gotTags, tags[ch.Name]) {
			return false, nil
		}
	}
	for _, name := range []string{setBridged, setEgress} {
		if _, err := c.GetSetByName(isolationTable, name); err != nil {
			return false, nil //nolint:nilerr // a missing set is a table to repair
		}
	}
	return true, nil
}

// egressElements are the elements of setEgress for the bridges of
// indexes.
func egressElements(indexes ...int) []nftables.SetElement {
	elements := make([]nftables.SetElement, 0, len(indexes))
	for _, index := range indexes {
		elements = append(elements, nftables.SetElement{Key: binaryutil.NativeEndian.PutUint32(uint32(index))})
	}
	return elements
}

// egressOf are those of bridges whose Networks have egress.
func (i *isolation) egressOf(bridges []int) []int {
	var out []int
	for _, index := range bridges {
		if i.egress[index] {
			out = append(out, index)
		}
	}
	return out
}

// setEgress lets the Network of the bridge of index out through the node,
// or not, and reports whether that changed; the table exists (add made
// it).
func (i *isolation) setEgress(index int, on bool) (changed bool, err error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.egress[index] == on {
		return false, nil
	}
	c, err := i.conn()
	if err != nil {
		return false, fmt.Errorf("nftables: %w", err)
	}
	if on {
		err = c.SetAddElements(egressSet, egressElements(index))
	} else {
		err = c.SetDeleteElements(egressSet, egressElements(index))
	}
	if err == nil {
		err = c.Flush()
	}
	if err != nil {
		return false, fmt.Errorf("egress of bridge %d in nftables set %s: %w", index, setEgress, err)
	}
	if i.egress == nil {
		i.egress = map[int]bool{}
	}
	if on {
		i.egress[index] = true
	} else {
		delete(i.egress, index)
	}
	return true, nil
}

// add isolates the bridge of index: its element, and the whole table if it
// is missing (the first bridge, or someone deleted it).
func (i *isolation) add(links func() ([]netlink.Link, error), index int) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	c, err := i.conn()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	if _, err := c.ListTableOfFamily(IsolationTable, nftables.TableFamilyINet); err != nil {
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("looking up nftables table %s: %w", IsolationTable, err)
		}
		bridges, err := netopBridges(links)
		if err != nil {
			return err
		}
		if !slices.Contains(bridges, index) {
			bridges = append(bridges, index)
		}
		return i.program(c, bridges)
	}
	if err := c.SetAddElements(bridgedSet, bridgedElements(index)); err != nil {
		return fmt.Errorf("isolation set: %w", err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("adding bridge %d to nftables set %s: %w", index, setBridged, err)
	}
	i.bridges.Add(1)
	return nil
}

// remove forgets the bridge of index, and removes the table once no netop
// bridge is left in the namespace.
func (i *isolation) remove(links func() ([]netlink.Link, error), index int) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	c, err := i.conn()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	if err := c.SetDeleteElements(bridgedSet, bridgedElements(index)); err != nil {
		return fmt.Errorf("isolation set: %w", err)
	}
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing bridge %d from nftables set %s: %w", index, setBridged, err)
	}
	if i.egress[index] {
		delete(i.egress, index)
		if err := c.SetDeleteElements(egressSet, egressElements(index)); err != nil {
			return fmt.Errorf("egress set: %w", err)
		}
		if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("removing bridge %d from nftables set %s: %w", index, setEgress, err)
		}
	}
	if i.bridges.Add(-1) > 0 {
		return nil
	}
	bridges, err := netopBridges(links)
	if err != nil || len(bridges) > 0 {
		return err
	}
	return i.removeTable(c)
}

func (i *isolation) removeTable(c *nftables.Conn) error {
	c.AddTable(isolationTable)
	c.DelTable(isolationTable)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("removing nftables table %s: %w", IsolationTable, err)
	}
	i.bridges.Store(0)
	return nil
}

// sync brings the table to the bridges there are: programmed whole when
// it is not in order, its set rewritten otherwise; removed when there are
// none. It reports whether it changed the rules, and how many bridges
// there are. The bridges are listed under the lock that add takes: a list
// made before it would miss a bridge made meanwhile, and the rewrite would
// drop that bridge's element (its pods' traffic to one another blocked
// until the next sync), which add made an instant before.
func (i *isolation) sync(links func() ([]netlink.Link, error)) (repaired bool, count int, err error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	bridges, err := netopBridges(links)
	if err != nil {
		return false, 0, err
	}
	repaired, err = i.syncLocked(bridges)
	return repaired, len(bridges), err
}

func (i *isolation) syncLocked(bridges []int) (repaired bool, err error) {
	c, err := i.conn()
	if err != nil {
		return false, fmt.Errorf("nftables: %w", err)
	}
	ok, err := i.inOrder(c)
	if err != nil {
		return false, fmt.Errorf("checking nftables table %s: %w", IsolationTable, err)
	}
	switch {
	case len(bridges) == 0 && !ok:
		return false, nil
	case len(bridges) == 0:
		return false, i.removeTable(c)
	case !ok:
		return true, i.program(c, bridges)
	}
	c.FlushSet(bridgedSet)
	if err := c.SetAddElements(bridgedSet, bridgedElements(bridges...)); err != nil {
		return false, fmt.Errorf("isolation set: %w", err)
	}
	c.FlushSet(egressSet)
	if err := c.SetAddElements(egressSet, egressElements(i.egressOf(bridges)...)); err != nil {
		return false, fmt.Errorf("egress set: %w", err)
	}
	if err := c.Flush(); err != nil {
		return false, fmt.Errorf("rewriting nftables set %s: %w", setBridged, err)
	}
	i.bridges.Store(int64(len(bridges)))
	return false, nil
}

// netopBridges are the indexes of the namespace's bridges in BridgeGroup.
func netopBridges(links func() ([]netlink.Link, error)) ([]int, error) {
	all, err := retryDump(links)
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	return bridgesOf(all), nil
}

// bridgesOf are the indexes of the bridges in BridgeGroup among links.
func bridgesOf(links []netlink.Link) []int {
	var out []int
	for _, l := range links {
		if l.Attrs().Group == BridgeGroup && l.Type() == "bridge" {
			out = append(out, l.Attrs().Index)
		}
	}
	return out
}

// watchIsolation repairs the table whenever a chain, rule or set of it, or
// the table, is deleted, until ctx is done.
func (b *Backend) watchIsolation(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	return watchTable(ctx, b.isolation.conn, IsolationTable, func() error {
		if repaired, bridges, err := b.isolation.sync(b.nl.LinkList); err != nil {
			logger.Error(err, "Repairing the isolation rules failed; the resync tries again", "table", IsolationTable)
		} else if repaired {
			logger.Info("Repaired the isolation rules", "table", IsolationTable, "bridges", bridges)
		}
		return nil
	})
}

// watchTable calls repair whenever a chain, rule or set of the inet
// table, or the table, is deleted, until ctx is done or repair fails.
func watchTable(ctx context.Context, conn func() (*nftables.Conn, error), table string, repair func() error) error {
	c, err := conn()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	// Every event, filtered here: google/nftables v0.3.0 tests a narrower
	// monitor's flags as (flags&1)<<type, which drops deletions.
	mon := nftables.NewMonitor()
	events, err := c.AddMonitor(mon)
	if err != nil {
		return fmt.Errorf("nftables monitor: %w", err)
	}
	defer func() { _ = mon.Close() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-events:
			if !ok {
				return errors.New("nftables monitor ended")
			}
			if e.Error != nil {
				return fmt.Errorf("nftables monitor: %w", e.Error)
			}
			if !aboutTable(e, table) {
				continue
			}
			if err := repair(); err != nil {
				return err
			}
		}
	}
}

// aboutTable reports whether e deleted some of the table (of any family:
// a repair that finds nothing amiss costs little).
func aboutTable(e *nftables.MonitorEvent, table string) bool {
	switch e.Type {
	case nftables.MonitorEventTypeDelTable, nftables.MonitorEventTypeDelChain, nftables.MonitorEventTypeDelRule, nftables.MonitorEventTypeDelSet:
	default:
		return false
	}
	var t *nftables.Table
	switch d := e.Data.(type) {
	case *nftables.Table:
		t = d
	case *nftables.Chain:
		t = d.Table
	case *nftables.Rule:
		t = d.Table
	case *nftables.Set:
		t = d.Table
	}
	return t != nil && t.Name == table
}
