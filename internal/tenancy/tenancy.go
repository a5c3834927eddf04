// Package tenancy decides who may join a Network: pods of its own
// namespace, and pods of the namespaces its spec.namespaceSelector selects.
// Admission (pods and workload templates), the allocation controller (the
// one writer, which enforces it again whatever admission let in) and the
// Network's status all ask here, so that they never disagree about who is
// a member or why not.
package tenancy

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"

	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// Reason is the reason of the Events and the refusals of a pod that may
// not join a Network.
const Reason = "NetworkNotAdmitted"

// NotAdmittedError says why pods of a namespace may not join a Network.
type NotAdmittedError struct {
	// Namespace is the pod's; Network is namespace/name.
	Namespace, Network string
	// Why is the reason, to be read after "may not join …: ".
	Why string
}

func (e *NotAdmittedError) Error() string {
	return fmt.Sprintf("pods of namespace %s may not join Network %s: %s", e.Namespace, e.Network, e.Why)
}

// Admits says whether pods of the namespace named namespace, which has
// labels namespaceLabels, may join n; if not, a *NotAdmittedError says why.
func Admits(n *samplecrdv2.Network, namespace string, namespaceLabels map[string]string) error {
	if namespace == n.Namespace {
		return nil
	}
	refuse := func(format string, args ...any) error {
		return &NotAdmittedError{Namespace: namespace, Network: n.Namespace + "/" + n.Name, Why: fmt.Sprintf(format, args...)}
	}
	if n.Spec.NamespaceSelector == nil {
		return refuse("the Network admits pods of its own namespace only (it has no spec.namespaceSelector)")
	}
	selector, err := metav1.LabelSelectorAsSelector(n.Spec.NamespaceSelector)
	if err != nil {
		return refuse("its spec.namespaceSelector is invalid: %v", err)
	}
	if !selector.Matches(labels.Set(namespaceLabels)) {
		return refuse("its spec.namespaceSelector (%s) does not select the namespace", metav1.FormatLabelSelector(n.Spec.NamespaceSelector))
	}
	return nil
}

// NotFound is the refusal of a pod naming a Network of another namespace
// that does not exist: nothing can say the pod may join it.
func NotFound(namespace, network string) error {
	return &NotAdmittedError{Namespace: namespace, Network: network, Why: "the Network does not exist"}
}

// Namespaces reads namespaces' labels from a cache, and from the API
// server when the cache has not seen a namespace yet (one made an instant
// ago), as the API server's own namespace admission does.
type Namespaces struct {
	Lister corelisters.NamespaceLister
	Kube   kubernetes.Interface
}

// Admits says whether pods of namespace may join n: its own namespace
// without reading it, another by its labels (Admits). A *NotAdmittedError
// says why not; another error, that the namespace could not be read.
func (ns Namespaces) Admits(ctx context.Context, n *samplecrdv2.Network, namespace string) error {
	if namespace == n.Namespace {
		return nil
	}
	labels, err := ns.Labels(ctx, namespace)
	if err != nil {
		return err
	}
	return Admits(n, namespace, labels)
}

// Labels are the labels of the namespace name.
func (ns Namespaces) Labels(ctx context.Context, name string) (map[string]string, error) {
	namespace, err := ns.Lister.Get(name)
	if apierrors.IsNotFound(err) && ns.Kube != nil {
		namespace, err = ns.Kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("reading namespace %s: %w", name, err)
	}
	return namespace.Labels, nil
}
