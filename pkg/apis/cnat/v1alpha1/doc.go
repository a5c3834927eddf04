// Package v1alpha1 is version v1alpha1 of the cnat.programming-kubernetes.info
// API group: the At resource of the code-generator example ("cloud native
// at"), a command run once, in a pod, at a scheduled time.
//
// +k8s:deepcopy-gen=package
// +groupName=cnat.programming-kubernetes.info
package v1alpha1
