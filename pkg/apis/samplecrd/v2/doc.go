// Package v2 is version v2 of the samplecrd.k8s.io API group: a Network of
// one or two address families (dual-stack), with a cidr and a gateway per
// family. Its objects convert to and from the hub, package samplecrd, by
// generated functions (zz_generated.conversion.go): its fields are the
// hub's.
//
// It is the storage version and the version netop reads and writes; v1 is
// served beside it, converted by netop's conversion webhook (docs/api.md).
//
// +k8s:deepcopy-gen=package
// +k8s:conversion-gen=github.com/netop-dev/netop/pkg/apis/samplecrd
// +groupName=samplecrd.k8s.io
package v2
