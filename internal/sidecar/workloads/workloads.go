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
	"errors"
	"fmt"
	"net/http"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/sidecar/envoy"
	"github.com/netop-dev/netop/internal/webhook"

	"github.com/netop-dev/netop/internal/webhook/patch"
)

// Injector is the workload webhook's handler.
type Injector struct {
	// Templates finds a workload's template under the template policy.
	Templates envoy.Finder
	// Recorder records on the workload what was done and why: Events are
	// where `kubectl describe` users look. None for dry runs.
	Recorder record.EventRecorder
}

// Admit injects the template into an opted-in workload's pod template.
func (i *Injector) Admit(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	w, err := webhook.DecodeWorkload(req.Kind, req.Object.Raw)
	if err != nil {
		return webhook.Denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("decoding %s: %v", req.Kind.Kind, err))
	}
	if w.Meta.Namespace == "" {
		w.Meta.Namespace = req.Namespace
	}
	logger := klog.FromContext(ctx).WithValues("kind", req.Kind.Kind, "workload", klog.KRef(w.Meta.Namespace, req.Name))
	if w.Meta.Annotations[envoy.OptIn] != "true" || req.Operation == admissionv1.Update && !w.TemplateMutable {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	if owner := metav1.GetControllerOfNoCopy(w.Meta); owner != nil {
		// A ReplicaSet of a Deployment, a Job of a CronJob: made from its
		// owner's template, which admission already saw. Changing it here
		// would make it differ from that template, and the Deployment
		// controller would make ReplicaSet after ReplicaSet.
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	if w.Template.Annotations[envoy.Injected] != "" {
		// Injected before; a newer template is the workload controller's
		// to roll out, deliberately.
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	spec := &w.Template.Spec
	dryRun := req.DryRun != nil && *req.DryRun
	if spec.HostNetwork {
		return i.skip(w, dryRun, envoy.HostNetworkSkip)
	}
	tmpl, _, err := i.Templates.Find(w.Meta.Namespace)
	if err != nil {
		if policy := (*envoy.PolicyError)(nil); errors.As(err, &policy) {
			return i.skip(w, dryRun, err.Error())
		}
		logger.Info("Rejected workload: broken envoy template", "err", err)
		return webhook.Denied(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid,
			fmt.Sprintf("envoy sidecar requested but the template is broken: %v", err))
	}
	if tmpl == nil {
		return i.skip(w, dryRun, i.Templates.NoTemplate(w.Meta.Namespace))
	}
	if clash := tmpl.Clash(spec); clash != "" {
		return i.skip(w, dryRun, clash)
	}
	if clash := tmpl.PortClash(spec); clash != "" {
		return i.skip(w, dryRun, clash)
	}
	ops := tmpl.InjectOps(w.Path, w.Template.Annotations, spec)
	if _, ok := w.Meta.Annotations[envoy.Skipped]; ok {
		ops = append(ops, patch.RemoveAnnotationOp("", envoy.Skipped))
	}
	logger.V(1).Info("Injected envoy sidecar", "template", tmpl.Source, "hash", tmpl.Hash)
	if !dryRun && i.Recorder != nil {
		i.Recorder.Eventf(w.Object, corev1.EventTypeNormal, envoy.ReasonInjected, "Injected the envoy sidecar from %s at admission", tmpl.Source)
	}
	return webhook.Patched(ops)
}

// skip admits the workload with its pod template unchanged, the reason on
// the workload itself (on the template it would roll the pods out again
// whenever the reason's wording changed), in a warning and in an Event.
func (i *Injector) skip(w webhook.Workload, dryRun bool, reason string) *admissionv1.AdmissionResponse {
	if !dryRun && i.Recorder != nil {
		i.Recorder.Eventf(w.Object, corev1.EventTypeWarning, envoy.ReasonSkipped, "Envoy sidecar not injected: %s", reason)
	}
	var ops []jsonpatch.Operation
	if w.Meta.Annotations[envoy.Skipped] != reason {
		ops = patch.AnnotationOps(nil, "", w.Meta.Annotations, map[string]string{envoy.Skipped: reason})
	}
	resp := webhook.Patched(ops)
	resp.Warnings = []string{"envoy sidecar not injected: " + reason}
	return resp
}
