// Package services serves the cluster's own Services on the standalone:
// the kubernetes Service, whose endpoint is the API server through the
// standalone's address on the underlay, and cluster DNS, CoreDNS in the
// standalone's process behind the kube-dns Service.
//
// Why so: the standalone's API server listens on loopback only, so pods
// reach it through a forwarder on the underlay, the address every node
// routes to; and CoreDNS in process starts with the control plane, in
// milliseconds, without an image to build or a pod to schedule, and costs
// a few megabytes (BENCHMARKS.md). kube-proxy on each node sends both
// Services' traffic there like any Service's, from endpoints this package
// writes (both Services have no selector).
package services
