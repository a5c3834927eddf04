// Package samplecrd is the hub of the samplecrd.k8s.io API group: the
// internal form of a Network that holds the union of the fields of every
// version (the seed tutorial's "Super Version"). Versions convert to and
// from it, never to one another, so that adding a version means two
// conversions, not one per other version. Nothing is stored or served in
// this form.
//
// +k8s:deepcopy-gen=package
// +kubebuilder:skip
package samplecrd
