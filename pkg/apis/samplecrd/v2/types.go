package v2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:scope=Namespaced,shortName=net,categories=netop
// +kubebuilder:printcolumn:name="CIDRs",type=string,JSONPath=`.spec.cidrs`,description="The address ranges of the network, one per family."
// +kubebuilder:printcolumn:name="Gateways",type=string,JSONPath=`.spec.gateways`,description="The gateway addresses, in the order of the cidrs."
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,description="Whether the backend network matches the spec."
// +kubebuilder:printcolumn:name="Nodes",type=string,JSONPath=`.status.nodes.summary`,description="Nodes where the network is ready, of the nodes that realise it (R/T), and of the nodes running netop's agent when fewer realise it (of N)."
// +kubebuilder:printcolumn:name="Allocated",type=integer,JSONPath=`.status.addresses.allocated`,description="Addresses held by pods."
// +kubebuilder:printcolumn:name="Available",type=string,JSONPath=`.status.addresses.available`,priority=1,description="Addresses left for pods."
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Backend",type=string,JSONPath=`.status.backend.type`,priority=1
// +kubebuilder:printcolumn:name="Interface",type=string,JSONPath=`.status.backend.interface`,priority=1
// +kubebuilder:printcolumn:name="VNI",type=integer,JSONPath=`.status.vni`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// Network is an IP network of one or two address families that netop
// creates and keeps in a backend: a Linux bridge carrying a gateway
// address per family, or an OpenStack Neutron network with a subnet per
// family.
type Network struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the network the user asks for.
	// +required
	Spec NetworkSpec `json:"spec"`

	// status is what netop last made of the spec in the backend.
	// +optional
	Status NetworkStatus `json:"status,omitempty"`
}

// NetworkSpec is the desired network.
// +kubebuilder:validation:XValidation:rule="!has(self.gateways) || size(self.gateways) <= size(self.cidrs)",message="must not have more entries than spec.cidrs: one gateway per cidr",fieldPath=".gateways",reason="FieldValueInvalid"
// +kubebuilder:validation:XValidation:rule="!has(self.gateways) || [0, 1].all(i, i >= size(self.gateways) || i >= size(self.cidrs) || size(self.gateways[i]) == 0 || !isCIDR(self.cidrs[i]) || !isIP(self.gateways[i]) || cidr(self.cidrs[i]).containsIP(self.gateways[i]))",message="each must be an address inside the cidr of the same index in spec.cidrs",fieldPath=".gateways",reason="FieldValueInvalid"
type NetworkSpec struct {
	// cidrs are the address ranges of the network in CIDR notation, one or
	// two: at most one IPv4 and one IPv6 (dual-stack). The first is the
	// primary one, the one a v1 client sees as spec.cidr. Each follows
	// v1's rules for spec.cidr: a value with host bits set means the
	// network that contains it; not a /0, nor in or containing a loopback
	// or multicast range; netop refuses other special-purpose ranges
	// unless started with --allow-reserved-prefixes, and prefixes longer
	// than /30 (IPv6: /126).
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:MaxLength=49
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="must be an IP prefix in CIDR notation, such as 192.168.0.0/16"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self).prefixLength() != 0",message="must not be a /0 prefix: it contains every address, loopback and multicast among them"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self).prefixLength() == 0 || !(cidr(self).containsCIDR('127.0.0.0/8') || cidr('127.0.0.0/8').containsCIDR(self) || cidr(self).containsIP('::1'))",message="must not be in or contain a loopback range (127.0.0.0/8, ::1/128)"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self).prefixLength() == 0 || !(cidr(self).containsCIDR('224.0.0.0/4') || cidr('224.0.0.0/4').containsCIDR(self) || cidr(self).containsCIDR('ff00::/8') || cidr('ff00::/8').containsCIDR(self))",message="must not be in or contain a multicast range (224.0.0.0/4, ff00::/8)"
	// +kubebuilder:validation:XValidation:rule="size(self) < 2 || !isCIDR(self[0]) || !isCIDR(self[1]) || cidr(self[0]).ip().family() != cidr(self[1]).ip().family()",message="must be of different families: one IPv4 and one IPv6"
	CIDRs []string `json:"cidrs"`

	// gateways are the gateway addresses, in the order of cidrs, each
	// inside its cidr. A cidr without one (the list is shorter, or its
	// entry is empty) gets the first usable address of the cidr.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:MaxLength=45
	// +kubebuilder:validation:items:XValidation:rule="size(self) == 0 || isIP(self)",message="must be an IP address, such as 192.168.0.1, or empty for the default"
	Gateways []string `json:"gateways,omitempty"`

	// namespaceSelector selects the namespaces, besides the Network's
	// own, whose pods may join the Network, as a NetworkPolicy's
	// namespaceSelector selects namespaces: {} selects every namespace;
	// absent, only pods of the Network's own namespace may join. netop
	// refuses other pods at admission and never allocates them an
	// address. Pods that hold addresses keep them when the selector or a
	// namespace's labels change (status.conditions say so): narrowing it
	// admits no new pod from the namespaces it no longer selects.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// reserved are addresses of the Network that netop never gives a pod
	// and that no pod may ask for, kept for what runs outside Kubernetes
	// (appliances, VMs, routers): addresses (10.0.0.5), prefixes
	// (10.0.0.16/28) and ranges (10.0.0.2-10.0.0.20), each inside one of
	// cidrs. An entry that covers an address a pod holds is refused
	// while the pod holds it. status.addresses counts them apart.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=91
	// +kubebuilder:validation:items:XValidation:rule="isIP(self) || isCIDR(self) || self.matches('^[0-9A-Fa-f.:]+-[0-9A-Fa-f.:]+$')",message="must be an address, a prefix in CIDR notation, or a range first-last such as 10.0.0.2-10.0.0.20"
	Reserved []string `json:"reserved,omitempty"`
	// routes are handed to every pod that joins the Network: its
	// interface on the Network gets a route to each destination through
	// via, an address of the Network (default: the gateway of the
	// destination's family). A destination may not overlap the Network's
	// own cidrs, and its family must be one of theirs. Pods attached
	// before a change keep the routes they got.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Routes []NetworkRoute `json:"routes,omitempty"`
	// mtu is the largest IP packet the Network carries, in bytes: the
	// MTU of its bridge, of every pod's interface on it and, across
	// nodes, of its VXLAN port, which must fit the underlay with VXLAN's
	// overhead (50 bytes over IPv4, 70 over IPv6), else the node says so
	// in status. Empty: the underlay's MTU less that overhead where the
	// Network spans nodes, the kernel's default (1500) on a node of its
	// own. A Network with an IPv6 cidr needs at least 1280. Pods attached
	// before a change keep the MTU they got.
	// +optional
	// +kubebuilder:validation:Minimum=576
	// +kubebuilder:validation:Maximum=9216
	MTU int32 `json:"mtu,omitempty"`
	// egress, if set, lets the Network's pods reach addresses outside the
	// cluster through their node: what their routes (spec.routes) send
	// to the gateway leaves the node with the node's address as its
	// source. Never into another Network nor to the node's own services:
	// the isolation rules hold. Absent, nothing leaves the Network.
	// +optional
	Egress *NetworkEgress `json:"egress,omitempty"`
}

// NetworkEgress says how a Network's pods reach outside the cluster.
type NetworkEgress struct {
	// mode is how: NAT, through the pod's node, the source translated to
	// the node's address (masquerade).
	// +required
	Mode EgressMode `json:"mode"`
}

// EgressMode is how a Network's pods reach outside the cluster.
// +kubebuilder:validation:Enum=NAT
type EgressMode string

// EgressNAT sends pods' packets out through their node, source-NATed to
// the node's address.
const EgressNAT EgressMode = "NAT"

// NetworkRoute is a route handed to the pods of a Network.
type NetworkRoute struct {
	// destination is the prefix the route leads to, in CIDR notation.
	// +required
	// +kubebuilder:validation:MaxLength=49
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be an IP prefix in CIDR notation, such as 10.200.0.0/16"
	Destination string `json:"destination"`
	// via is the next hop, an address of the Network; empty: the
	// Network's gateway of the destination's family.
	// +optional
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IP address, such as 10.0.0.254"
	Via string `json:"via,omitempty"`
}

// BackendType names the kind of backend that provides a network.
// +kubebuilder:validation:Enum=linux;neutron
type BackendType string

const (
	// BackendLinux is a Linux bridge on each node.
	BackendLinux BackendType = "linux"
	// BackendNeutron is an OpenStack Neutron network with a subnet per
	// family.
	BackendNeutron BackendType = "neutron"
)

// NetworkStatus is the observed state of a Network.
type NetworkStatus struct {
	// observedGeneration is the metadata.generation that the status
	// describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions describe the network's state, as in v1.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// cidrs are the canonical forms of spec.cidrs that the backend uses,
	// in the same order.
	// +optional
	// +listType=atomic
	CIDRs []string `json:"cidrs,omitempty"`

	// gateways are the gateway addresses that the backend uses, in the
	// order of cidrs.
	// +optional
	// +listType=atomic
	Gateways []string `json:"gateways,omitempty"`

	// backend identifies the backend network.
	// +optional
	Backend *NetworkBackendStatus `json:"backend,omitempty"`

	// nodes counts the nodes where the network is ready, as in v1.
	// +optional
	Nodes *NetworkNodes `json:"nodes,omitempty"`

	// vni is the VXLAN network identifier, as in v1.
	// +optional
	VNI int32 `json:"vni,omitempty"`

	// addresses is how pods use the network's addresses, as in v1.
	// +optional
	Addresses *NetworkAddresses `json:"addresses,omitempty"`
}

// NetworkAddresses counts the addresses of a Network that pods use.
type NetworkAddresses struct {
	// allocated is the number of addresses that pods hold.
	// +required
	Allocated int64 `json:"allocated"`

	// available is the number of addresses that can still be allocated,
	// in decimal.
	// +required
	Available string `json:"available"`
	// reserved is the number of addresses spec.reserved keeps from pods
	// (besides the network, gateway and broadcast addresses), in decimal.
	// +optional
	Reserved string `json:"reserved,omitempty"`
}

// NetworkNodes counts the nodes where a Network is ready, of the nodes
// that realise it: every node running netop's agent, or, where agents
// build Networks on demand, those whose pods use it.
type NetworkNodes struct {
	// +required
	Ready int32 `json:"ready"`
	// +required
	Total int32 `json:"total"`
	// +required
	Summary string `json:"summary"`
}

// NetworkBackendStatus records which backend network belongs to a Network.
type NetworkBackendStatus struct {
	// type is the backend that provides the network: linux or neutron.
	// +required
	Type BackendType `json:"type"`

	// interface is the name of the Linux bridge (linux backend).
	// +optional
	Interface string `json:"interface,omitempty"`

	// networkID is the ID of the Neutron network (neutron backend).
	// +optional
	NetworkID string `json:"networkID,omitempty"`

	// subnetIDs are the IDs of the Neutron subnets, in the order of
	// cidrs (neutron backend).
	// +optional
	// +listType=atomic
	SubnetIDs []string `json:"subnetIDs,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// NetworkList is a list of Networks.
type NetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []Network `json:"items"`
}
