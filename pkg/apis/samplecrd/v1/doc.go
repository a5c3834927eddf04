// Package v1 is version v1 of the samplecrd.k8s.io API group: the Network
// custom resource of the classic Kubernetes custom-controller tutorial, grown
// a status that says what netop made of it.
//
// Its objects convert to and from the hub, package samplecrd (the union of
// every version's fields): generated where the fields match
// (zz_generated.conversion.go), by hand where v1 has one family and the hub
// two (conversion.go).
//
// +k8s:deepcopy-gen=package
// +k8s:conversion-gen=github.com/netop-dev/netop/pkg/apis/samplecrd
// +groupName=samplecrd.k8s.io
package v1
