// Package v1alpha1 is version v1alpha1 of the netop.dev API group: the
// objects netop keeps for itself rather than for its users. A NetworkNode is
// one node as netop's agent there sees the Networks, so that the controller
// can say on how many nodes each Network is ready without an API write per
// node and Network.
//
// +k8s:deepcopy-gen=package
// +groupName=netop.dev
package v1alpha1
