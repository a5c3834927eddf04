// Package v1beta1 is MultiNetworkPolicy as the Network Plumbing Working
// Group defines it (group k8s.cni.cncf.io, the spec of networking.k8s.io/v1
// NetworkPolicy): the policies Multus users write for secondary networks,
// which netop enforces on its Networks. netop serves the kind when no other
// project does (its CRD also serves v1beta2, of the same schema) and works
// with the CRD another project installed.
//
// The annotation PolicyForAnnotation names the networks a policy applies
// to; the types carry no status, as upstream's.
//
// +k8s:deepcopy-gen=package
// +groupName=k8s.cni.cncf.io
// +groupGoName=K8sCniCncfIo
package v1beta1
