// Package pods injects the Envoy sidecar into Pods that ask for it: the
// tutorial's annotation initializer.kubernetes.io/envoy: "true", or every
// pod of a namespace labelled initializer.kubernetes.io/envoy=enabled. The
// template is merged with a strategic merge patch and the answer is the
// JSON patch of the difference. A pod is never injected twice.
package pods

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/envoy"
	"github.com/netop-dev/netop/internal/webhook"
)

// Injector is the Pod webhook.
type Injector struct {
	// ConfigMaps needs to hold only the envoy-initializer ConfigMaps.
	ConfigMaps        corelisters.ConfigMapLister
	OperatorNamespace string
	Recorder          record.EventRecorder
	// NamespaceOptIn is set on the handler behind the webhook that the API
	// server calls only for pods of labelled namespaces: those pods are
	// opted in unless annotated "false". Deciding by the API server's
	// selector, not a cache of namespaces, means a pod created right after
	// its namespace was labelled is never missed.
	NamespaceOptIn bool
}

// Admit handles a Pod CREATE.
func (i *Injector) Admit(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Operation != admissionv1.Create || req.SubResource != "" {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	pod := &corev1.Pod{}
	if err := json.Unmarshal(req.Object.Raw, pod); err != nil {
		return webhook.Denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("decoding Pod: %v", err))
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(pod.Namespace, podName(pod)))

	if !i.wanted(pod) {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	if pod.Annotations[envoy.Injected] != "" {
		// Already injected (a pod of an initialized Deployment): left
		// alone, even if the template has broken since.
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	if pod.Spec.HostNetwork {
		return skip(pod, "hostNetwork pods share the node's network; no sidecar")
	}
	tmpl, cm, err := envoy.Find(i.ConfigMaps, pod.Namespace, i.OperatorNamespace)
	if err != nil {
		if cm != nil {
			i.Recorder.Eventf(cm, corev1.EventTypeWarning, "InvalidTemplate", "Pod %s/%s not injected: %v", pod.Namespace, podName(pod), err)
		}
		logger.Info("Rejected pod: broken envoy template", "err", err)
		return webhook.Denied(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid,
			fmt.Sprintf("envoy sidecar requested but the template is broken: %v", err))
	}
	if tmpl == nil {
		return skip(pod, fmt.Sprintf("no ConfigMap %s in namespace %s or %s", envoy.ConfigMapName, pod.Namespace, i.OperatorNamespace))
	}
	if tmpl.AlreadyInjected(pod.Annotations, &pod.Spec) {
		logger.V(2).Info("Already injected, left alone")
		return &admissionv1.AdmissionResponse{Allowed: true}
	}

	if clash := tmpl.Clash(&pod.Spec); clash != "" {
		// A merge by name would rewrite the pod's own volume.
		return webhook.Denied(http.StatusConflict, metav1.StatusReasonConflict, "envoy sidecar requested but "+clash)
	}
	resp, err := inject(pod, tmpl)
	if err != nil {
		return webhook.Denied(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid,
			fmt.Sprintf("injecting the envoy sidecar from %s: %v", tmpl.Source, err))
	}
	logger.V(1).Info("Injected envoy sidecar", "template", tmpl.Source, "hash", tmpl.Hash)
	return resp
}

// wanted reports whether the pod asked for the sidecar: "false" always opts
// out; otherwise the namespace's opt-in or the annotation "true".
func (i *Injector) wanted(pod *corev1.Pod) bool {
	switch pod.Annotations[envoy.OptIn] {
	case "true":
		return true
	case "false":
		return false
	}
	return i.NamespaceOptIn
}

// inject merges the template into the pod and answers with the JSON patch
// of the difference. managedFields are dropped before diffing: they are
// often most of the object and never change here.
func inject(pod *corev1.Pod, tmpl *envoy.Template) (*admissionv1.AdmissionResponse, error) {
	pod.ManagedFields = nil
	original, err := json.Marshal(pod)
	if err != nil {
		return nil, err
	}
	patch, err := tmpl.Patch(&pod.Spec)
	if err != nil {
		return nil, err
	}
	merged, err := envoy.Merge(original, corev1.Pod{}, patch)
	if err != nil {
		return nil, err
	}
	ops, err := jsonpatch.CreatePatch(original, merged)
	if err != nil {
		return nil, fmt.Errorf("diffing the merged pod: %w", err)
	}
	return webhook.Patched(ops), nil
}

// skip admits the pod unchanged but for an annotation that says why it got
// no sidecar.
func skip(pod *corev1.Pod, reason string) *admissionv1.AdmissionResponse {
	var op jsonpatch.Operation
	if len(pod.Annotations) == 0 {
		op = jsonpatch.NewOperation("add", "/metadata/annotations", map[string]string{envoy.Skipped: reason})
	} else {
		op = jsonpatch.NewOperation("add", "/metadata/annotations/"+jsonPointerEscape(envoy.Skipped), reason)
	}
	resp := webhook.Patched([]jsonpatch.Operation{op})
	resp.Warnings = []string{"envoy sidecar not injected: " + reason}
	return resp
}

func jsonPointerEscape(s string) string {
	out := make([]byte, 0, len(s)+2)
	for i := range len(s) {
		switch s[i] {
		case '~':
			out = append(out, '~', '0')
		case '/':
			out = append(out, '~', '1')
		default:
			out = append(out, s[i])
		}
	}
	return string(out)
}

func podName(pod *corev1.Pod) string {
	if pod.Name != "" {
		return pod.Name
	}
	return pod.GenerateName + "<generated>"
}
