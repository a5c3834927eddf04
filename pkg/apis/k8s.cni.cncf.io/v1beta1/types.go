package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// PolicyForAnnotation names the networks a MultiNetworkPolicy applies to:
// a comma-separated list of NetworkAttachmentDefinitions, each
// "namespace/name" or "name" (in the policy's namespace). netop's
// NetworkAttachmentDefinitions are named after its Networks.
const PolicyForAnnotation = "k8s.v1.cni.cncf.io/policy-for"

// +genclient
// +genclient:noStatus
// +resourceName=multi-networkpolicies
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:storageversion
// +kubebuilder:resource:path=multi-networkpolicies,singular=multi-networkpolicy,shortName=multi-policy

// MultiNetworkPolicy is a NetworkPolicy for the networks its
// k8s.v1.cni.cncf.io/policy-for annotation names: which pods' interfaces on
// them may receive and send what.
type MultiNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the policy, as a networking.k8s.io/v1 NetworkPolicy's.
	// +optional
	Spec MultiNetworkPolicySpec `json:"spec,omitempty"`
}

// MultiPolicyType is a direction a policy isolates the pods it selects in.
// +kubebuilder:validation:Enum=Ingress;Egress
type MultiPolicyType string

// The directions.
const (
	PolicyTypeIngress MultiPolicyType = "Ingress"
	PolicyTypeEgress  MultiPolicyType = "Egress"
)

// MultiNetworkPolicySpec is the spec of a NetworkPolicy.
type MultiNetworkPolicySpec struct {
	// podSelector selects the pods of the policy's namespace that it
	// applies to; empty selects them all.
	PodSelector metav1.LabelSelector `json:"podSelector"`

	// ingress lists what the selected pods may receive, in addition to
	// what other policies allow. With Ingress in policyTypes and no rule,
	// they receive nothing but replies.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	Ingress []MultiNetworkPolicyIngressRule `json:"ingress,omitempty"`

	// egress lists what the selected pods may send, in addition to what
	// other policies allow.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	Egress []MultiNetworkPolicyEgressRule `json:"egress,omitempty"`

	// policyTypes are the directions the policy isolates the selected
	// pods in. Unset: Ingress, and Egress if there are egress rules.
	// +optional
	// +listType=atomic
	PolicyTypes []MultiPolicyType `json:"policyTypes,omitempty"`
}

// MultiNetworkPolicyIngressRule allows traffic that comes from one of the
// peers and goes to one of the ports of a selected pod.
type MultiNetworkPolicyIngressRule struct {
	// ports the traffic may go to; empty or unset: every port.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	Ports []MultiNetworkPolicyPort `json:"ports,omitempty"`

	// from are the peers the traffic may come from; empty or unset: any.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	From []MultiNetworkPolicyPeer `json:"from,omitempty"`
}

// MultiNetworkPolicyEgressRule allows traffic from a selected pod that
// goes to one of the peers, on one of the ports.
type MultiNetworkPolicyEgressRule struct {
	// ports the traffic may go to; empty or unset: every port.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	Ports []MultiNetworkPolicyPort `json:"ports,omitempty"`

	// to are the peers the traffic may go to; empty or unset: any.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	To []MultiNetworkPolicyPeer `json:"to,omitempty"`
}

// MultiNetworkPolicyPort is a port, a range of ports, or a named port of
// the destination pod's containers.
// +kubebuilder:validation:XValidation:rule="!has(self.port) || type(self.port) != int || (self.port >= 1 && self.port <= 65535)",fieldPath=".port",message="a port number must be between 1 and 65535"
// +kubebuilder:validation:XValidation:rule="!has(self.port) || type(self.port) == int || (size(self.port) >= 1 && size(self.port) <= 15)",fieldPath=".port",message="a port name must have 1 to 15 characters"
// +kubebuilder:validation:XValidation:rule="!has(self.endPort) || (has(self.port) && type(self.port) == int)",fieldPath=".endPort",message="endPort needs a port number (not a name) to start the range"
// +kubebuilder:validation:XValidation:rule="!has(self.endPort) || !has(self.port) || type(self.port) != int || self.endPort >= self.port",fieldPath=".endPort",message="endPort must not be below port"
type MultiNetworkPolicyPort struct {
	// protocol is TCP, UDP or SCTP; TCP when unset.
	// +optional
	// +kubebuilder:validation:Enum=TCP;UDP;SCTP
	Protocol *Protocol `json:"protocol,omitempty"`

	// port is a number, or the name of a container port of the
	// destination pod; unset: every port.
	// +optional
	Port *intstr.IntOrString `json:"port,omitempty"`

	// endPort, with a numbered port, makes the range port to endPort.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	EndPort *int32 `json:"endPort,omitempty"`
}

// Protocol is a transport protocol: TCP, UDP or SCTP.
type Protocol string

// The protocols a port may name.
const (
	ProtocolTCP  Protocol = "TCP"
	ProtocolUDP  Protocol = "UDP"
	ProtocolSCTP Protocol = "SCTP"
)

// MultiNetworkPolicyPeer is a set of pods, by their labels and their
// namespaces' labels, or a block of addresses.
// +kubebuilder:validation:XValidation:rule="has(self.ipBlock) ? !has(self.podSelector) && !has(self.namespaceSelector) : has(self.podSelector) || has(self.namespaceSelector)",message="a peer is an ipBlock, or a podSelector and/or a namespaceSelector"
type MultiNetworkPolicyPeer struct {
	// podSelector selects pods of the policy's namespace, or with
	// namespaceSelector of the namespaces it selects.
	// +optional
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`

	// namespaceSelector selects namespaces, all of whose pods are peers
	// (or those podSelector selects); empty selects every namespace.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// ipBlock is a block of addresses; with it, neither selector.
	// +optional
	IPBlock *IPBlock `json:"ipBlock,omitempty"`
}

// IPBlock is the addresses of cidr except those of the except blocks.
// +kubebuilder:validation:XValidation:rule="isCIDR(self.cidr)",fieldPath=".cidr",message="cidr must be a CIDR such as 10.0.0.0/24 or 2001:db8::/64"
// +kubebuilder:validation:XValidation:rule="!has(self.except) || !isCIDR(self.cidr) || self.except.all(e, isCIDR(e) && cidr(self.cidr).containsCIDR(e) && cidr(e).prefixLength() > cidr(self.cidr).prefixLength())",fieldPath=".except",message="every except block must be a CIDR strictly inside cidr"
type IPBlock struct {
	// cidr is the block, such as 10.0.0.0/24 or 2001:db8::/64.
	// +kubebuilder:validation:MaxLength=43
	CIDR string `json:"cidr"`

	// except are blocks inside cidr that are not part of it.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=43
	Except []string `json:"except,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// MultiNetworkPolicyList is a list of MultiNetworkPolicies.
type MultiNetworkPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []MultiNetworkPolicy `json:"items"`
}
