// Package v1 is version v1 of the samplecrd.k8s.io API group: the Network
// custom resource of the classic Kubernetes custom-controller tutorial, grown
// a status that says what netop made of it.
//
// +k8s:deepcopy-gen=package
// +groupName=samplecrd.k8s.io
package v1
