package kubeclient

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DropManagedFields, an informer transform, trims what netop never reads from cached
// objects: managedFields are often most of an object's size.
func DropManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// TrimPod, an informer transform, keeps of a pod what the address allocation reads (identity,
// annotations, phase), its Ready condition, which says whether a node
// agent's pod works, and its controller reference, finalizers and
// deletion, which say which At it runs and whether it goes, and its
// labels and named container ports, which network policies select and
// name: a cluster's
// pods are most of its objects, and their specs and statuses most of
// their size.
func TrimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return DropManagedFields(obj)
	}
	trimmed := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
			Labels: pod.Labels, Annotations: pod.Annotations, Finalizers: pod.Finalizers, DeletionTimestamp: pod.DeletionTimestamp},
		// The node, for hot-plug: only a pod a node runs has interfaces
		// that must be taken down before its addresses are freed.
		Spec:   corev1.PodSpec{NodeName: pod.Spec.NodeName},
		Status: corev1.PodStatus{Phase: pod.Status.Phase},
	}
	// Network policies select pods by label and name their ports.
	for _, c := range pod.Spec.Containers {
		var named []corev1.ContainerPort
		for _, p := range c.Ports {
			if p.Name != "" {
				named = append(named, corev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: p.Protocol})
			}
		}
		if len(named) > 0 {
			trimmed.Spec.Containers = append(trimmed.Spec.Containers, corev1.Container{Name: c.Name, Ports: named})
		}
	}
	if ref := metav1.GetControllerOf(pod); ref != nil {
		trimmed.OwnerReferences = []metav1.OwnerReference{*ref}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			trimmed.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return trimmed, nil
}
