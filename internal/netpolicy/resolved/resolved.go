// Package resolved holds MultiNetworkPolicies as a node's firewall takes
// them: pods as their interfaces' addresses, selectors and named ports
// resolved. It is the contract between the resolver (package netpolicy),
// which reads Kubernetes objects, and the linux backend, which speaks no
// Kubernetes API.
package resolved

import "net/netip"

// Endpoint is an interface of a pod: its address on the Network of a
// bridge. Keys of the table's sets are (bridge name, address), so that
// Networks of overlapping cidrs stay apart.
type Endpoint struct {
	Bridge string
	Addr   netip.Addr
}

// PortEndpoint is a named port resolved: a port of a pod's containers on
// one of its interfaces.
type PortEndpoint struct {
	Endpoint
	Protocol uint8
	Port     uint16
}

// Policies are the network policies a node enforces, as the firewall
// takes them: the pods are addresses, the selectors resolved.
type Policies []Policy

// Policy is one policy: the directions it isolates the pods it selects
// in, and what it allows them.
type Policy struct {
	// Name is for people: namespace/name.
	Name    string
	Ingress *PolicyDirection
	Egress  *PolicyDirection
}

// PolicyDirection is a direction a policy isolates its pods in: their
// interfaces on the policy's Networks, and the rules (the union of which
// is allowed). No rule allows nothing.
type PolicyDirection struct {
	Selected []Endpoint
	Rules    []PolicyRule
}

// PolicyRule allows traffic from (ingress) or to (egress) one of its
// peers, to one of its ports.
type PolicyRule struct {
	// AnyPeer: the rule names no peer; PodPeers: it selects pods, whose
	// interfaces are Pods (maybe none); Blocks are its ipBlocks.
	AnyPeer  bool
	PodPeers bool
	Pods     []Endpoint
	Blocks   []Block
	// Ports are its numbered ports and ranges; NamedPorts says it names
	// ports, resolved on the destination pods into Named. Neither: every
	// port.
	Ports      []PortRange
	NamedPorts bool
	Named      []PortEndpoint
}

// PortRange is First to Last of Protocol (an IPPROTO_*); First 0 is every
// port of it.
type PortRange struct {
	Protocol    uint8
	First, Last uint16
}

// Block is CIDR but the Except blocks.
type Block struct {
	CIDR   netip.Prefix
	Except []netip.Prefix
}
