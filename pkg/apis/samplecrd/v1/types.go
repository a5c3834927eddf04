package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netop-dev/netop/pkg/apis/samplecrd"
)

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=net,categories=netop
// +kubebuilder:metadata:annotations="api-approved.kubernetes.io=unapproved, the group of the classic custom-controller tutorial"
// +kubebuilder:printcolumn:name="CIDR",type=string,JSONPath=`.spec.cidr`,description="The address range of the network."
// +kubebuilder:printcolumn:name="Gateway",type=string,JSONPath=`.spec.gateway`,description="The gateway address."
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,description="Whether the backend network matches the spec."
// +kubebuilder:printcolumn:name="Nodes",type=string,JSONPath=`.status.nodes.summary`,description="Nodes where the network is ready, of the nodes that realise it (R/T), and of the nodes running netop's agent when fewer realise it (of N)."
// +kubebuilder:printcolumn:name="Allocated",type=integer,JSONPath=`.status.addresses.allocated`,description="Addresses held by pods."
// +kubebuilder:printcolumn:name="Available",type=string,JSONPath=`.status.addresses.available`,priority=1,description="Addresses left for pods."
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Backend",type=string,JSONPath=`.status.backend.type`,priority=1
// +kubebuilder:printcolumn:name="Interface",type=string,JSONPath=`.status.backend.interface`,priority=1
// +kubebuilder:printcolumn:name="VNI",type=integer,JSONPath=`.status.vni`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// Network is an IP network that netop creates and keeps in a backend: a Linux
// bridge carrying the gateway address, or an OpenStack Neutron network with a
// subnet.
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
// +kubebuilder:validation:XValidation:rule="!has(self.gateway) || !isCIDR(self.cidr) || !isIP(self.gateway) || cidr(self.cidr).containsIP(self.gateway)",message="must be an address inside spec.cidr",fieldPath=".gateway",reason="FieldValueInvalid"
type NetworkSpec struct {
	// cidr is the address range of the network in CIDR notation, IPv4 or
	// IPv6, for example "192.168.0.0/16". A value with host bits set, such
	// as "192.168.1.0/16", means the network that contains it
	// ("192.168.0.0/16"); status.cidr shows that canonical form. It must
	// not be a /0 nor be in or contain a loopback or multicast range; netop
	// refuses other special-purpose ranges too (link-local, 0.0.0.0/8,
	// 240.0.0.0/4, ...) unless started with --allow-reserved-prefixes, and
	// prefixes longer than /30 (IPv6: /126), which leave no room for a
	// gateway and a host.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=49
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be an IP prefix in CIDR notation, such as 192.168.0.0/16"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self).prefixLength() != 0",message="must not be a /0 prefix: it contains every address, loopback and multicast among them"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self).prefixLength() == 0 || !(cidr(self).containsCIDR('127.0.0.0/8') || cidr('127.0.0.0/8').containsCIDR(self) || cidr(self).containsIP('::1'))",message="must not be in or contain a loopback range (127.0.0.0/8, ::1/128)"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self).prefixLength() == 0 || !(cidr(self).containsCIDR('224.0.0.0/4') || cidr('224.0.0.0/4').containsCIDR(self) || cidr(self).containsCIDR('ff00::/8') || cidr('ff00::/8').containsCIDR(self))",message="must not be in or contain a multicast range (224.0.0.0/4, ff00::/8)"
	CIDR string `json:"cidr"`

	// gateway is the gateway address of the network, an address of the
	// same family inside cidr, for example "192.168.0.1". On a Linux bridge
	// it is the address the bridge carries. When omitted, the first usable
	// address of cidr is used.
	// +optional
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IP address, such as 192.168.0.1"
	Gateway string `json:"gateway,omitempty"`
}

// BackendType names the kind of backend that provides a network.
// +kubebuilder:validation:Enum=linux;neutron
type BackendType string

const (
	// BackendLinux is a Linux bridge on the node that runs netop.
	BackendLinux BackendType = "linux"
	// BackendNeutron is an OpenStack Neutron network and subnet.
	BackendNeutron BackendType = "neutron"
)

// NetworkStatus is the observed state of a Network.
type NetworkStatus struct {
	// observedGeneration is the metadata.generation that the status
	// describes. When it is lower than metadata.generation, netop has not
	// yet acted on the latest spec.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions describe the network's state. The Ready condition is True
	// when the backend network matches the spec; its reason is one of
	// Provisioned, NodesNotReady, BackendError, Invalid, Overlap, InUse or
	// Deleting.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// cidr is the canonical form of spec.cidr that the backend uses.
	// +optional
	CIDR string `json:"cidr,omitempty"`

	// gateway is the gateway address that the backend uses.
	// +optional
	Gateway string `json:"gateway,omitempty"`

	// backend identifies the backend network, so that netop finds and
	// deletes exactly that network again.
	// +optional
	Backend *NetworkBackendStatus `json:"backend,omitempty"`

	// nodes counts the nodes where the network is ready, when netop runs
	// an agent on every node (netop controller and netop agent); the
	// Ready condition names the nodes that lag, and why.
	// +optional
	Nodes *NetworkNodes `json:"nodes,omitempty"`

	// vni is the VXLAN network identifier that joins the network's
	// bridges on the cluster's nodes into one segment, when netop runs an
	// agent on every node. It stays the Network's for its life.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16777215
	VNI int32 `json:"vni,omitempty"`

	// addresses is how pods use the network's addresses. It is updated
	// at most about once a second, not on every pod.
	// +optional
	Addresses *NetworkAddresses `json:"addresses,omitempty"`
}

// NetworkAddresses counts the addresses of a Network that pods use.
type NetworkAddresses struct {
	// allocated is the number of addresses that pods hold.
	// +required
	Allocated int64 `json:"allocated"`

	// available is the number of addresses that can still be allocated,
	// in decimal: an IPv6 network has more than an integer field holds.
	// +required
	Available string `json:"available"`

	// reserved is the number of addresses the Network keeps from pods
	// (v2's spec.reserved), in decimal.
	// +optional
	Reserved string `json:"reserved,omitempty"`
}

// NetworkNodes counts the nodes where a Network is ready, of the nodes
// that realise it: every node running netop's agent, or, where agents
// build Networks on demand, those whose pods use it.
type NetworkNodes struct {
	// ready is the number of nodes whose agent has the network ready at
	// the Network's current generation.
	// +required
	Ready int32 `json:"ready"`

	// total is the number of nodes that run netop's agent.
	// +required
	Total int32 `json:"total"`

	// summary is "ready/total", as kubectl get shows it.
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

	// subnetID is the ID of the Neutron subnet (neutron backend).
	// +optional
	SubnetID string `json:"subnetID,omitempty"`
}

// Condition types and reasons of a Network: the hub's, which every
// version shares.
const (
	ConditionReady      = samplecrd.ConditionReady
	ReasonProvisioned   = samplecrd.ReasonProvisioned
	ReasonBackendError  = samplecrd.ReasonBackendError
	ReasonInvalid       = samplecrd.ReasonInvalid
	ReasonInUse         = samplecrd.ReasonInUse
	ReasonDeleting      = samplecrd.ReasonDeleting
	ReasonNodesNotReady = samplecrd.ReasonNodesNotReady
	ReasonOverlap       = samplecrd.ReasonOverlap
)

// Finalizer keeps a Network until netop has removed its backend network
// (the hub's).
const Finalizer = samplecrd.Finalizer

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// NetworkList is a list of Networks.
type NetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	// items are the Networks.
	Items []Network `json:"items"`
}

// Annotations of a Deployment that asks for a Network of its own (the
// hub's).
const (
	DeploymentNetworkAnnotation     = samplecrd.DeploymentNetworkAnnotation
	DeploymentNetworkAuto           = samplecrd.DeploymentNetworkAuto
	DeploymentNetworkCIDRAnnotation = samplecrd.DeploymentNetworkCIDRAnnotation
)
