package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=netnode,categories=netop
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyNetworks`,description="Networks ready on the node."
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.failedNetworks`,description="Networks that failed on the node."
// +kubebuilder:printcolumn:name="Agent",type=string,JSONPath=`.status.agentPod`,priority=1,description="The agent's pod."
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// NetworkNode is one node as the netop agent running there sees the
// Networks: which it has ready, at which generation, and which failed. It is
// named after its Node and owned by it, so it goes with the Node. The agent
// rewrites it only when that changes: a converged node costs no writes.
type NetworkNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// status is what the node's agent reports.
	// +optional
	Status NetworkNodeStatus `json:"status,omitempty"`
}

// NetworkNodeStatus is an agent's report on its node's Networks.
type NetworkNodeStatus struct {
	// agentPod is the name of the agent's pod in netop's namespace; empty
	// when the agent does not run in a pod. While that pod is not ready,
	// the node counts as lagging on every Network.
	// +optional
	AgentPod string `json:"agentPod,omitempty"`

	// onDemand: the node realises a Network only while a pod there holds
	// an interface on it (the agent's --networks-on-demand). A node that
	// does not lags on every Network it has not reported ready.
	// +optional
	OnDemand bool `json:"onDemand,omitempty"`

	// ready maps the UID of each Network that is ready on the node to
	// the metadata.generation it is ready at. Keyed by UID, not name: a
	// Network deleted and made again under its name is another one.
	// +optional
	Ready map[types.UID]int64 `json:"ready,omitempty"`

	// readyNetworks is the number of entries of ready.
	// +optional
	ReadyNetworks int32 `json:"readyNetworks,omitempty"`

	// failed lists the Networks that failed on the node, and why.
	// +optional
	// +listType=map
	// +listMapKey=uid
	Failed []NetworkNodeFailure `json:"failed,omitempty"`

	// failedNetworks is the number of entries of failed.
	// +optional
	FailedNetworks int32 `json:"failedNetworks,omitempty"`
}

// NetworkNodeFailure is a Network that failed on a node.
type NetworkNodeFailure struct {
	// network is the Network's namespace/name.
	// +required
	Network string `json:"network"`

	// uid is the Network's UID.
	// +required
	UID types.UID `json:"uid"`

	// generation is the Network's metadata.generation that failed.
	// +required
	Generation int64 `json:"generation"`

	// reason is a CamelCase word for the failure: BackendError or Invalid.
	// +required
	Reason string `json:"reason"`

	// message says what failed.
	// +required
	Message string `json:"message"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// NetworkNodeList is a list of NetworkNodes.
type NetworkNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	// items are the NetworkNodes.
	Items []NetworkNode `json:"items"`
}
