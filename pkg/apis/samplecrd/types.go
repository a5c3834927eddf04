package samplecrd

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Network is the hub form of a Network: one or two address families.
type Network struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Spec   NetworkSpec
	Status NetworkStatus
}

// NetworkSpec is the desired network: a cidr per address family, the
// first the primary one (the only one v1 has), and their gateways, in
// the order of the cidrs (empty: defaulted), the namespaces besides
// its own whose pods may join it (nil: none), and how it is shaped:
// addresses kept from pods, routes handed to them, its MTU (0: derived),
// and whether pods reach outside through their node.
type NetworkSpec struct {
	CIDRs             []string
	Gateways          []string
	NamespaceSelector *metav1.LabelSelector
	Reserved          []string
	Routes            []NetworkRoute
	MTU               int32
	Egress            *NetworkEgress
}

// NetworkEgress says how a Network's pods reach outside the cluster.
type NetworkEgress struct {
	Mode EgressMode
}

// EgressMode is how: NAT.
type EgressMode string

// NetworkRoute is a route handed to the pods of a Network: to
// Destination through Via (empty: the gateway).
type NetworkRoute struct {
	Destination string
	Via         string
}

// BackendType names the kind of backend that provides a network.
type BackendType string

// NetworkStatus is the observed state of a Network, per family where the
// spec is.
type NetworkStatus struct {
	ObservedGeneration int64
	Conditions         []metav1.Condition
	CIDRs              []string
	Gateways           []string
	Backend            *NetworkBackendStatus
	Nodes              *NetworkNodes
	VNI                int32
	Addresses          *NetworkAddresses
}

// NetworkAddresses counts the addresses of a Network that pods use.
type NetworkAddresses struct {
	Allocated int64
	Available string
	Reserved  string
}

// NetworkNodes counts the nodes where a Network is ready.
type NetworkNodes struct {
	Ready   int32
	Total   int32
	Summary string
}

// NetworkBackendStatus records which backend network belongs to a Network:
// a Neutron network has a subnet per family.
type NetworkBackendStatus struct {
	Type      BackendType
	Interface string
	NetworkID string
	SubnetIDs []string
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// NetworkList is a list of Networks.
type NetworkList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []Network
}
