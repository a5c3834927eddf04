// Package workloads injects the Envoy sidecar into the pod templates of
// workloads at admission: Deployments, StatefulSets, DaemonSets,
// ReplicaSets, Jobs and CronJobs annotated initializer.kubernetes.io/envoy:
// "true". The tutorial's Initializer changed a Deployment before anyone
// saw it; admission is its modern form, so the first rollout already has
// the sidecar and none follows for it. The rules are the pods' (package
// pods): hostNetwork templates, port and name clashes and templates the
// policy refuses are skipped with the reason, never half-injected.
package workloads

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/sidecar/envoy"
	"github.com/netop-dev/netop/internal/webhook"
)

// Injector is the workload webhook's handler.
type Injector struct {
	// Templates finds a workload's template under the template policy.
	Templates envoy.Finder
	// Recorder records on the workload what was done and why: Events are
	// where `kubectl describe` users look. None for dry runs.
	Recorder record.EventRecorder
}

// workload is the part of any workload kind that injection reads and the
// path of its pod template.
type workload struct {
	object   runtime.Object
	meta     *metav1.ObjectMeta
	template *corev1.PodTemplateSpec
	// path is the JSON pointer of the pod template.
	path string
	// templateMutable is false for Jobs: the API server refuses an update
	// that changes their pod template.
	templateMutable bool
}

// decode reads the workload of req by its kind; the webhook's rules ask
// the API server for these versions only.
func decode(req *admissionv1.AdmissionRequest) (workload, error) {
	raw := req.Object.Raw
	into := func(obj any) error { return json.Unmarshal(raw, obj) }
	switch req.Kind {
	case metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}:
		o := &appsv1.Deployment{}
		return workload{o, &o.ObjectMeta, &o.Spec.Template, "/spec/template", true}, into(o)
	case metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "StatefulSet"}:
		o := &appsv1.StatefulSet{}
		return workload{o, &o.ObjectMeta, &o.Spec.Template, "/spec/template", true}, into(o)
	case metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "DaemonSet"}:
		o := &appsv1.DaemonSet{}
		return workload{o, &o.ObjectMeta, &o.Spec.Template, "/spec/template", true}, into(o)
	case metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "ReplicaSet"}:
		o := &appsv1.ReplicaSet{}
		return workload{o, &o.ObjectMeta, &o.Spec.Template, "/spec/template", true}, into(o)
	case metav1.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"}:
		o := &batchv1.Job{}
		return workload{o, &o.ObjectMeta, &o.Spec.Template, "/spec/template", false}, into(o)
	case metav1.GroupVersionKind{Group: "batch", Version: "v1", Kind: "CronJob"}:
		o := &batchv1.CronJob{}
		return workload{o, &o.ObjectMeta, &o.Spec.JobTemplate.Spec.Template, "/spec/jobTemplate/spec/template", true}, into(o)
	}
	return workload{}, fmt.Errorf("not a workload netop injects into: %s", req.Kind.String())
}

// Admit injects the template into an opted-in workload's pod template.
func (i *Injector) Admit(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	w, err := decode(req)
	if err != nil {
		return webhook.Denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("decoding %s: %v", req.Kind.Kind, err))
	}
	if w.meta.Namespace == "" {
		w.meta.Namespace = req.Namespace
	}
	logger := klog.FromContext(ctx).WithValues("kind", req.Kind.Kind, "workload", klog.KRef(w.meta.Namespace, req.Name))
	if w.meta.Annotations[envoy.OptIn] != "true" || req.Operation == admissionv1.Update && !w.templateMutable {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	if owner := metav1.GetControllerOfNoCopy(w.meta); owner != nil {
		// A ReplicaSet of a Deployment, a Job of a CronJob: made from its
		// owner's template, which admission already saw. Changing it here
		// would make it differ from that template, and the Deployment
		// controller would make ReplicaSet after ReplicaSet.
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	if w.template.Annotations[envoy.Injected] != "" {
		// Injected before; a newer template is the workload controller's
		// to roll out, deliberately.
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	spec := &w.template.Spec
	dryRun := req.DryRun != nil && *req.DryRun
	if spec.HostNetwork {
		return i.skip(w, dryRun, envoy.HostNetworkSkip)
	}
	tmpl, _, err := i.Templates.Find(w.meta.Namespace)
	if err != nil {
		if policy := (*envoy.PolicyError)(nil); errors.As(err, &policy) {
			return i.skip(w, dryRun, err.Error())
		}
		logger.Info("Rejected workload: broken envoy template", "err", err)
		return webhook.Denied(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid,
			fmt.Sprintf("envoy sidecar requested but the template is broken: %v", err))
	}
	if tmpl == nil {
		return i.skip(w, dryRun, i.Templates.NoTemplate(w.meta.Namespace))
	}
	if clash := tmpl.Clash(spec); clash != "" {
		return i.skip(w, dryRun, clash)
	}
	if clash := tmpl.PortClash(spec); clash != "" {
		return i.skip(w, dryRun, clash)
	}
	ops := tmpl.InjectOps(w.path, w.template.Annotations, spec)
	if _, ok := w.meta.Annotations[envoy.Skipped]; ok {
		ops = append(ops, envoy.RemoveAnnotationOp("", envoy.Skipped))
	}
	logger.V(1).Info("Injected envoy sidecar", "template", tmpl.Source, "hash", tmpl.Hash)
	if !dryRun && i.Recorder != nil {
		i.Recorder.Eventf(w.object, corev1.EventTypeNormal, envoy.ReasonInjected, "Injected the envoy sidecar from %s at admission", tmpl.Source)
	}
	return webhook.Patched(ops)
}

// skip admits the workload with its pod template unchanged, the reason on
// the workload itself (on the template it would roll the pods out again
// whenever the reason's wording changed), in a warning and in an Event.
func (i *Injector) skip(w workload, dryRun bool, reason string) *admissionv1.AdmissionResponse {
	if !dryRun && i.Recorder != nil {
		i.Recorder.Eventf(w.object, corev1.EventTypeWarning, envoy.ReasonSkipped, "Envoy sidecar not injected: %s", reason)
	}
	var ops []jsonpatch.Operation
	if w.meta.Annotations[envoy.Skipped] != reason {
		ops = envoy.AnnotationOps(nil, "", w.meta.Annotations, map[string]string{envoy.Skipped: reason})
	}
	resp := webhook.Patched(ops)
	resp.Warnings = []string{"envoy sidecar not injected: " + reason}
	return resp
}
