package netselect

import (
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// AllocationsAnnotation holds what netop allocated to the pod: written by
// the allocation controller, the one writer, read by the CNI plugin on the
// node, and the source of truth a restarted controller rebuilds from.
const AllocationsAnnotation = "networks.netop.dev/allocations"

// RefusedAnnotation says why the allocation controller refuses the pod
// the Networks it asks for (its namespace may not join one, an address it
// pins cannot be its): the CNI plugin fails the pod's sandbox with it at
// once instead of waiting. The allocation that ends the refusal removes
// it.
const RefusedAnnotation = "networks.netop.dev/refused"

// Allocation is one interface of a pod on a Network.
type Allocation struct {
	// Network is namespace/name.
	Network    string    `json:"network"`
	NetworkUID types.UID `json:"networkUID"`
	Interface  string    `json:"interface"`
	// IPs have the Network's prefix length.
	IPs []string `json:"ips"`
	MAC string   `json:"mac"`
	// Routes are the Network's spec.routes when the addresses were
	// allocated, for the interface to carry.
	Routes []Route `json:"routes,omitempty"`
	// Detaching: the pod no longer asks for the interface. The addresses
	// stay the pod's until its node acknowledges (DetachedAnnotation) that
	// the interface is not configured in the pod's sandbox: no address is
	// handed to another pod while this one may still use it.
	Detaching bool `json:"detaching,omitempty"`
}

// AnnotationsPatch is a merge patch of pod's annotations, each set to its
// value or removed where the value is "" (none of these annotations is
// ever empty). It holds only for the pod of that UID, not a new one of the
// same name, and with atVersion only at the version read.
func AnnotationsPatch(pod *corev1.Pod, annotations map[string]string, atVersion bool) ([]byte, error) {
	values := make(map[string]any, len(annotations))
	for k, v := range annotations {
		values[k] = v
		if v == "" {
			values[k] = nil
		}
	}
	meta := map[string]any{"uid": pod.UID, "annotations": values}
	if atVersion {
		meta["resourceVersion"] = pod.ResourceVersion
	}
	return json.Marshal(map[string]any{"metadata": meta})
}

// Key names the allocation in DetachedAnnotation: its interface and its
// Network's UID.
func (a Allocation) Key() string { return a.Interface + "/" + string(a.NetworkUID) }

// DetachedAnnotation is the pod's node acknowledging detaching
// allocations (a comma-separated list of their keys) that are not
// configured in the pod's sandbox: the allocation controller then frees
// their addresses and drops them, and this annotation, in one write.
const DetachedAnnotation = "networks.netop.dev/detached"

// ParseDetached reads DetachedAnnotation into a set of keys.
func ParseDetached(annotation string) map[string]bool {
	out := map[string]bool{}
	for _, k := range strings.Split(annotation, ",") {
		if k = strings.TrimSpace(k); k != "" {
			out[k] = true
		}
	}
	return out
}

// Active are the allocations a pod still asks for (not detaching).
func Active(allocations []Allocation) []Allocation {
	var out []Allocation
	for _, a := range allocations {
		if !a.Detaching {
			out = append(out, a)
		}
	}
	return out
}

// Route is a route an interface carries: to Dst (a prefix) through GW.
type Route struct {
	Dst string `json:"dst"`
	GW  string `json:"gw"`
}

// Finished reports whether the pod's containers are done and will not run
// again: its allocations no longer hold addresses, which can go to others.
func Finished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// HoldingChanged reports whether what the pod holds changed from old to
// cur: its allocations, or whether it finished.
func HoldingChanged(old, cur *corev1.Pod) bool {
	return old.Annotations[AllocationsAnnotation] != cur.Annotations[AllocationsAnnotation] || Finished(old) != Finished(cur)
}

// ParseAllocations reads the allocations annotation; empty is none.
func ParseAllocations(annotation string) ([]Allocation, error) {
	if annotation == "" {
		return nil, nil
	}
	var out []Allocation
	if err := json.Unmarshal([]byte(annotation), &out); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AllocationsAnnotation, err)
	}
	return out, nil
}

// Satisfies reports whether allocations answer selections interface for
// interface: the networks annotation has not changed since they were made.
func Satisfies(allocations []Allocation, selections []Selection) bool {
	if len(allocations) != len(selections) {
		return false
	}
	for i, s := range selections {
		if allocations[i].Interface != s.Interface || allocations[i].Network != s.Namespace+"/"+s.Name {
			return false
		}
	}
	return true
}

// Holders are the pods that hold addresses of a Network: how many, and
// some of them by namespace/name.
type Holders struct {
	Count int64
	Pods  []string
}

// String names them as the InUse condition and admission say it:
// "3 pods hold addresses of the Network (ns/a, ns/b, ...)".
func (h Holders) String() string {
	more := ""
	if int64(len(h.Pods)) < h.Count {
		more = ", ..."
	}
	return fmt.Sprintf("%d pods hold addresses of the Network (%s%s)", h.Count, strings.Join(h.Pods, ", "), more)
}
