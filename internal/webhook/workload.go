package webhook

import (
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Workload is what admission reads of any workload kind that makes pods
// from a template: the object, its metadata, its pod template and the
// template's JSON pointer.
type Workload struct {
	Object   runtime.Object
	Meta     *metav1.ObjectMeta
	Template *corev1.PodTemplateSpec
	// Path is the JSON pointer of the pod template.
	Path string
	// TemplateMutable is false for Jobs: the API server refuses an update
	// that changes their pod template.
	TemplateMutable bool
}

// DecodeWorkload reads raw, a workload of kind; webhook rules ask the API
// server for these versions only.
func DecodeWorkload(kind metav1.GroupVersionKind, raw []byte) (Workload, error) {
	into := func(obj any) error { return json.Unmarshal(raw, obj) }
	switch kind {
	case metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}:
		o := &appsv1.Deployment{}
		return Workload{o, &o.ObjectMeta, &o.Spec.Template, "/spec/template", true}, into(o)
	case metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "StatefulSet"}:
		o := &appsv1.StatefulSet{}
		return Workload{o, &o.ObjectMeta, &o.Spec.Template, "/spec/template", true}, into(o)
	case metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "DaemonSet"}:
		o := &appsv1.DaemonSet{}
		return Workload{o, &o.ObjectMeta, &o.Spec.Template, "/spec/template", true}, into(o)
	case metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "ReplicaSet"}:
		o := &appsv1.ReplicaSet{}
		return Workload{o, &o.ObjectMeta, &o.Spec.Template, "/spec/template", true}, into(o)
	case metav1.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"}:
		o := &batchv1.Job{}
		return Workload{o, &o.ObjectMeta, &o.Spec.Template, "/spec/template", false}, into(o)
	case metav1.GroupVersionKind{Group: "batch", Version: "v1", Kind: "CronJob"}:
		o := &batchv1.CronJob{}
		return Workload{o, &o.ObjectMeta, &o.Spec.JobTemplate.Spec.Template, "/spec/jobTemplate/spec/template", true}, into(o)
	}
	return Workload{}, fmt.Errorf("not a workload kind netop reads: %s", kind.String())
}
