// Package controlplane runs a real Kubernetes control plane inside the
// calling process: etcd (embedded), kube-apiserver, kube-controller-manager
// and kube-scheduler, all on 127.0.0.1.
//
// It is what netop-standalone and the tests run on. It keeps its state,
// certificates, tokens and listening ports in a data directory and reuses
// them on the next start, so that a kubeconfig written once stays valid and
// objects survive a restart. Component logs go to files under DIR/logs, never
// to the terminal.
//
// kube-controller-manager is part of it because without it namespaces never
// finish terminating, ownerReference garbage collection never happens,
// Deployments make no Pods and no default ServiceAccount exists.
//
// etcd serves TLS only, and only to clients with a certificate of its own
// CA, which only kube-apiserver has: another user of the host cannot read
// or write objects past the API server's authorization. etcd and
// kube-apiserver accept TLS 1.3 and TLS 1.2 with ECDHE and AEAD suites.
//
// Only one control plane can run in a process at a time: both Kubernetes
// components register process-wide names.
package controlplane
