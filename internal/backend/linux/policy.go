package linux

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/netop-dev/netop/internal/netpolicy/resolved"
)

// PolicyTable is the nftables table (family inet) in the backend's
// namespace that enforces network policies on the traffic bridged inside
// each Network: between pods of one node, and between a pod and the
// overlay. br_netfilter shows bridged IP packets to the inet forward hook,
// where conntrack lets replies through (this kernel has no conntrack in
// the bridge family).
const PolicyTable = "netop-policy"

// shape is what of the policies decides the table's chains, rules and
// sets: everything but their elements. Policies of one shape differ only
// in elements, which are written without touching a rule.
func policyShape(p resolved.Policies) string {
	strip := func(d *resolved.PolicyDirection) *resolved.PolicyDirection {
		if d == nil {
			return nil
		}
		out := &resolved.PolicyDirection{Rules: slices.Clone(d.Rules)}
		for i := range out.Rules {
			out.Rules[i].Pods, out.Rules[i].Named = nil, nil
		}
		return out
	}
	shaped := make(resolved.Policies, len(p))
	for i, pol := range p {
		shaped[i] = resolved.Policy{Name: pol.Name, Ingress: strip(pol.Ingress), Egress: strip(pol.Egress)}
	}
	b, _ := json.Marshal(shaped)
	return string(b)
}

// family is what differs between IPv4 and IPv6 in the table.
type family struct {
	suffix   string
	nfproto  byte
	addrType nftables.SetDatatype
	// Offsets of the source and destination addresses in the network
	// header, and their length.
	saddr, daddr, len uint32
}

var ipFamilies = []family{
	{"4", unix.NFPROTO_IPV4, nftables.TypeIPAddr, 12, 16, 4},
	{"6", unix.NFPROTO_IPV6, nftables.TypeIP6Addr, 8, 24, 16},
}

func (f family) has(a netip.Addr) bool { return a.Is4() == (f.suffix == "4") }

// Registers of a set lookup's key: the bridge's name fills four, then the
// address, protocol and port. Register 1 is for single comparisons.
const (
	regKey   = 8 // NFT_REG32_00
	regMatch = 1
)

// direction is one side of a policy: its name in chain and set names,
// which of a Policy it is, and where its addresses are.
type direction struct {
	name string
	of   func(resolved.Policy) *resolved.PolicyDirection
	// peer picks the peer's address; pod the address of the policy's pod.
	peer, pod func(family) uint32
	// allowed is where a packet goes that the direction allows (on to
	// ingress, or accepted): after an allowing rule, and after the
	// dispatch for a packet that no policy isolates.
	allowed func(family) *expr.Verdict
}

var (
	egress = direction{name: "eg", of: func(p resolved.Policy) *resolved.PolicyDirection { return p.Egress },
		peer: func(f family) uint32 { return f.daddr }, pod: func(f family) uint32 { return f.saddr },
		allowed: func(f family) *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: "in" + f.suffix} }}
	ingress = direction{name: "in", of: func(p resolved.Policy) *resolved.PolicyDirection { return p.Ingress },
		peer: func(f family) uint32 { return f.saddr }, pod: func(f family) uint32 { return f.daddr },
		allowed: func(family) *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictAccept} }}
)

// policyPlan is the table the policies make: its sets with their
// elements, and its chains with their rules, in order.
type policyPlan struct {
	sets   []*planSet
	chains []*planChain
}

type planSet struct {
	name     string
	keyType  nftables.SetDatatype
	elements [][]byte
}

// planChain is a chain and its rules' expressions; those that look a set
// up name it, and get its ID in the programming transaction then.
type planChain struct {
	name  string
	base  bool
	rules [][]expr.Any
}

func (p *policyPlan) set(name string, keyType nftables.SetDatatype) *planSet {
	s := &planSet{name: name, keyType: keyType}
	p.sets = append(p.sets, s)
	return s
}

func (p *policyPlan) chain(name string) *planChain {
	c := &planChain{name: name}
	p.chains = append(p.chains, c)
	return c
}

func (c *planChain) add(exprs ...expr.Any) {
	c.rules = append(c.rules, exprs)
}

// plan lays the policies out as a table. Per family: "eg" sends each
// packet through the egress policies that select its source, drops it if
// none allowed it and a policy isolates the source, and goes on to "in",
// which does the same for its destination and accepts. A policy's chain
// has a rule per peer and port that goes on (egress) or accepts
// (ingress), and returns otherwise; an ipBlock with excepts is a chain of
// its own that returns for the excepted addresses first.
func planPolicies(p resolved.Policies) *policyPlan {
	plan := &policyPlan{}
	forward := plan.chain("forward")
	forward.base = true
	group := binaryutil.NativeEndian.PutUint32(BridgeGroup)
	forward.add(&expr.Meta{Key: expr.MetaKeyIIFGROUP, Register: regMatch},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: regMatch, Data: group}, &expr.Verdict{Kind: expr.VerdictReturn})
	forward.add(append(ctEstablished(regMatch), &expr.Verdict{Kind: expr.VerdictAccept})...)
	// Neighbour discovery (router and neighbour solicitations and
	// advertisements, redirects) is never a policy's: ARP is not IP and
	// passes no inet hook.
	forward.add(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regMatch},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regMatch, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: regMatch, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Range{Op: expr.CmpOpEq, Register: regMatch, FromData: []byte{133}, ToData: []byte{137}},
		&expr.Verdict{Kind: expr.VerdictAccept})
	for _, f := range ipFamilies {
		forward.add(&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: regMatch},
			&expr.Cmp{Op: expr.CmpOpEq, Register: regMatch, Data: []byte{f.nfproto}},
			&expr.Verdict{Kind: expr.VerdictGoto, Chain: "eg" + f.suffix})
	}
	for _, f := range ipFamilies {
		for _, d := range []direction{egress, ingress} {
			planDirection(p, plan, f, d)
		}
	}
	return plan
}

func planDirection(p resolved.Policies, plan *policyPlan, f family, d direction) {
	dispatch := plan.chain(d.name + f.suffix)
	isolated := plan.set(d.name+"-isolated"+f.suffix, concat(nftables.TypeIFName, f.addrType))
	seen := map[string]bool{}
	for i, pol := range p {
		pd := d.of(pol)
		if pd == nil {
			continue
		}
		prefix := fmt.Sprintf("p%d-%s%s", i, d.name, f.suffix)
		selected := plan.set(prefix+"-sel", concat(nftables.TypeIFName, f.addrType))
		for _, e := range pd.Selected {
			if f.has(e.Addr) {
				key := endpointKey(e)
				selected.elements = append(selected.elements, key)
				if !seen[string(key)] {
					seen[string(key)] = true
					isolated.elements = append(isolated.elements, key)
				}
			}
		}
		dispatch.add(append(endpointLookup(f, d.pod(f), selected.name),
			&expr.Verdict{Kind: expr.VerdictJump, Chain: prefix})...)
		chain := plan.chain(prefix)
		for j, r := range pd.Rules {
			ruleName := fmt.Sprintf("%s-r%d", prefix, j)
			ports := portMatches(plan, f, ruleName, r)
			if r.AnyPeer {
				for _, port := range ports {
					chain.add(slices.Concat(port, []expr.Any{d.allowed(f)})...)
				}
			}
			if r.PodPeers {
				set := plan.set(ruleName+"-peers", concat(nftables.TypeIFName, f.addrType))
				for _, e := range r.Pods {
					if f.has(e.Addr) {
						set.elements = append(set.elements, endpointKey(e))
					}
				}
				for _, port := range ports {
					chain.add(slices.Concat(endpointLookup(f, d.peer(f), set.name), port, []expr.Any{d.allowed(f)})...)
				}
			}
			for k, b := range r.Blocks {
				if !f.has(b.CIDR.Addr()) {
					continue
				}
				within := prefixMatch(f, d.peer(f), b.CIDR)
				target := chain
				if len(b.Except) > 0 {
					name := fmt.Sprintf("%s-b%d", ruleName, k)
					chain.add(append(within, &expr.Verdict{Kind: expr.VerdictJump, Chain: name})...)
					target = plan.chain(name)
					for _, e := range b.Except {
						target.add(append(prefixMatch(f, d.peer(f), e), &expr.Verdict{Kind: expr.VerdictReturn})...)
					}
				}
				for _, port := range ports {
					target.add(slices.Concat(within, port, []expr.Any{d.allowed(f)})...)
				}
			}
		}
	}
	dispatch.add(append(endpointLookup(f, d.pod(f), isolated.name), &expr.Verdict{Kind: expr.VerdictDrop})...)
	dispatch.add(d.allowed(f))
}

// portMatches are a rule's ports as expressions: one match per numbered
// port or range, one for all its named ports (a set of the destinations'
// resolved ports), or a single empty match for every port.
func portMatches(plan *policyPlan, f family, ruleName string, r resolved.PolicyRule) [][]expr.Any {
	if len(r.Ports) == 0 && !r.NamedPorts {
		return [][]expr.Any{nil}
	}
	var out [][]expr.Any
	for _, p := range r.Ports {
		m := []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regMatch},
			&expr.Cmp{Op: expr.CmpOpEq, Register: regMatch, Data: []byte{p.Protocol}}}
		if p.First != 0 {
			m = append(m, &expr.Payload{DestRegister: regMatch, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
			if p.Last > p.First {
				m = append(m, &expr.Range{Op: expr.CmpOpEq, Register: regMatch,
					FromData: binaryutil.BigEndian.PutUint16(p.First), ToData: binaryutil.BigEndian.PutUint16(p.Last)})
			} else {
				m = append(m, &expr.Cmp{Op: expr.CmpOpEq, Register: regMatch, Data: binaryutil.BigEndian.PutUint16(p.First)})
			}
		}
		out = append(out, m)
	}
	if r.NamedPorts {
		set := plan.set(ruleName+"-named", concat(nftables.TypeIFName, f.addrType, nftables.TypeInetProto, nftables.TypeInetService))
		for _, e := range r.Named {
			if f.has(e.Addr) {
				set.elements = append(set.elements, portEndpointKey(e))
			}
		}
		next := regKey + 4 + f.len/4
		out = append(out, append(endpointKeyLoad(f, f.daddr),
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: next},
			&expr.Payload{DestRegister: next + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: regKey, SetName: set.name}))
	}
	return out
}

// endpointLookup matches packets whose bridge and address at offset are
// in the set.
func endpointLookup(f family, offset uint32, set string) []expr.Any {
	return append(endpointKeyLoad(f, offset), &expr.Lookup{SourceRegister: regKey, SetName: set})
}

// endpointKeyLoad loads the bridge and the address at offset into the
// key registers, as endpointKey lays them out.
func endpointKeyLoad(f family, offset uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: regKey},
		&expr.Payload{DestRegister: regKey + 4, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: f.len},
	}
}

// prefixMatch matches packets whose address at offset is in prefix.
func prefixMatch(f family, offset uint32, prefix netip.Prefix) []expr.Any {
	mask := make([]byte, f.len)
	for i := 0; i < prefix.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{
		&expr.Payload{DestRegister: regMatch, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: f.len},
		&expr.Bitwise{SourceRegister: regMatch, DestRegister: regMatch, Len: f.len, Mask: mask, Xor: make([]byte, f.len)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regMatch, Data: prefix.Masked().Addr().AsSlice()},
	}
}

func concat(types ...nftables.SetDatatype) nftables.SetDatatype {
	return nftables.MustConcatSetType(types...)
}

// endpointKey is e as a key of (ifname, address).
func endpointKey(e resolved.Endpoint) []byte {
	key := make([]byte, unix.IFNAMSIZ, unix.IFNAMSIZ+16)
	copy(key, e.Bridge)
	return append(key, e.Addr.AsSlice()...)
}

// portEndpointKey is e as a key of (ifname, address, protocol, port),
// each field in registers of four bytes.
func portEndpointKey(e resolved.PortEndpoint) []byte {
	key := endpointKey(e.Endpoint)
	key = append(key, e.Protocol, 0, 0, 0)
	return append(binary.BigEndian.AppendUint16(key, e.Port), 0, 0)
}
