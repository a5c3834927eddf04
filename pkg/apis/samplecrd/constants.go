package samplecrd

// What every version of a Network shares: the names netop writes and reads
// whatever version a client speaks. They live in the hub so that code
// working on one version never imports another for a constant; the
// versions keep their own names for them as aliases.

// Backends that provide networks.
const (
	// BackendLinux is a Linux bridge (with a VXLAN port per node across
	// a cluster).
	BackendLinux BackendType = "linux"
	// BackendNeutron is an OpenStack Neutron network with a subnet per
	// address family.
	BackendNeutron BackendType = "neutron"
)

// Condition types and reasons of a Network.
const (
	// ConditionReady is True when the backend network matches the spec.
	ConditionReady = "Ready"

	// ReasonProvisioned: the backend network exists and matches the spec.
	ReasonProvisioned = "Provisioned"
	// ReasonBackendError: the backend failed; netop retries with backoff.
	ReasonBackendError = "BackendError"
	// ReasonInvalid: the spec cannot be realised; netop waits for a change.
	ReasonInvalid = "Invalid"
	// ReasonInUse: the Network is being deleted and waits for the pods
	// that hold its addresses to go.
	ReasonInUse = "InUse"
	// ReasonDeleting: the Network is being deleted and its backend network removed.
	ReasonDeleting = "Deleting"
	// ReasonNodesNotReady: the network is not yet ready on every node
	// that runs netop's agent; the message names the nodes that lag.
	ReasonNodesNotReady = "NodesNotReady"
	// ReasonOverlap: a cidr overlaps an older Network, which is the one
	// built; this one has no backend network until that one goes or moves.
	ReasonOverlap = "Overlap"

	// ConditionPodsAdmitted is False while pods hold addresses of the
	// Network although their namespaces may no longer join it (the
	// Network's namespaceSelector or their labels changed since): they
	// keep them until they finish. Set once that happens, True again once
	// they are gone or admitted.
	ConditionPodsAdmitted = "PodsAdmitted"
	// ReasonAdmitted: every pod holding an address may join the Network.
	ReasonAdmitted = "Admitted"
	// ReasonPodsNotAdmitted: some pods holding addresses may no longer
	// join the Network; the message names them.
	ReasonPodsNotAdmitted = "PodsNotAdmitted"
)

// Finalizer keeps a Network until netop has removed its backend network.
const Finalizer = GroupName + "/network-cleanup"

// Annotations of a Deployment that asks for a Network of its own: a
// Network of the Deployment's name, owned by it, that its pods join.
const (
	// DeploymentNetworkAnnotation set to DeploymentNetworkAuto gives the
	// Deployment a Network with a cidr from netop's pool.
	DeploymentNetworkAnnotation = GroupName + "/network"
	DeploymentNetworkAuto       = "auto"
	// DeploymentNetworkCIDRAnnotation gives the Deployment a Network of
	// this cidr.
	DeploymentNetworkCIDRAnnotation = GroupName + "/network-cidr"
)
