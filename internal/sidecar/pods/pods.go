// Package pods injects the Envoy sidecar into Pods that ask for it: the
// tutorial's annotation initializer.kubernetes.io/envoy: "true", or every
// pod of a namespace labelled initializer.kubernetes.io/envoy=enabled. The
// answer is a JSON patch that appends the template's containers and volumes
// to the pod's, as the strategic merge the workload initializer uses would.
// A pod is never injected twice.
package pods

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/sidecar/envoy"
	"github.com/netop-dev/netop/internal/webhook"

	"github.com/netop-dev/netop/internal/webhook/patch"
)

// Injector is the Pod webhook.
type Injector struct {
	// Templates finds a pod's template under the template policy.
	Templates envoy.Finder
	Recorder  record.EventRecorder
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
	if req.Kind.Group != "" || req.Kind.Version != "v1" || req.Kind.Kind != "Pod" {
		// Pods have one version; decodePod reads that one only.
		return webhook.Denied(http.StatusBadRequest, metav1.StatusReasonBadRequest,
			fmt.Sprintf("expected a v1 Pod, got %s", req.Kind.String()))
	}
	pod, err := decodePod(req.Object.Raw) // only what is read below
	if err != nil {
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
		return skip(pod, envoy.HostNetworkSkip)
	}
	tmpl, cm, err := i.Templates.Find(pod.Namespace)
	if err != nil {
		if cm != nil {
			i.Recorder.Eventf(cm, corev1.EventTypeWarning, envoy.ReasonInvalidTemplate, "Pod %s/%s not injected: %v", pod.Namespace, podName(pod), err)
		}
		if policy := (*envoy.PolicyError)(nil); errors.As(err, &policy) {
			// Well-formed, but the template policy does not let this
			// namespace's template be used: the pod is admitted without the
			// sidecar; the annotation, the warning and the Event on the
			// ConfigMap name the refused fields.
			logger.Info("Pod not injected: the template policy refuses the namespace's template", "err", err)
			return skip(pod, err.Error())
		}
		logger.Info("Rejected pod: broken envoy template", "err", err)
		return webhook.Denied(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid,
			fmt.Sprintf("envoy sidecar requested but the template is broken: %v", err))
	}
	if tmpl == nil {
		return skip(pod, i.Templates.NoTemplate(pod.Namespace))
	}
	if tmpl.AlreadyInjected(pod.Annotations, &pod.Spec) {
		logger.V(2).Info("Already injected, left alone")
		return &admissionv1.AdmissionResponse{Allowed: true}
	}

	if clash := tmpl.Clash(&pod.Spec); clash != "" {
		// A merge by name would rewrite the pod's own volume.
		return webhook.Denied(http.StatusConflict, metav1.StatusReasonConflict, "envoy sidecar requested but "+clash)
	}
	if clash := tmpl.PortClash(&pod.Spec); clash != "" {
		// One of the two containers could never bind its port: the pod
		// runs as its owner wrote it, and says why it has no sidecar.
		logger.Info("Pod not injected: port clash", "reason", clash)
		return skip(pod, clash)
	}
	resp := inject(pod, tmpl)
	logger.V(1).Info("Injected envoy sidecar", "template", tmpl.Source, "hash", tmpl.Hash)
	return resp
}

// decodePod decodes the part of a Pod that the injector reads: names,
// annotations, hostNetwork, the names and ports of containers and the
// names of volumes.
// Everything else in the Pod it returns is zero: code that reads more of
// the pod must decode more here. Not decoding the rest (env, probes,
// managedFields) is most of the speed of admitting a big pod, which is why
// this handler does not use the scheme's decoder (webhook.Decoder): Pods
// have one version, checked from the request's kind.
func decodePod(raw []byte) (*corev1.Pod, error) {
	type named struct {
		Name string `json:"name"`
	}
	type container struct {
		Name  string                 `json:"name"`
		Ports []corev1.ContainerPort `json:"ports"`
	}
	var view struct {
		Metadata struct {
			Name         string            `json:"name"`
			GenerateName string            `json:"generateName"`
			Namespace    string            `json:"namespace"`
			Annotations  map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			HostNetwork bool        `json:"hostNetwork"`
			Containers  []container `json:"containers"`
			Volumes     []named     `json:"volumes"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(raw, &view); err != nil {
		return nil, err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:         view.Metadata.Name,
			GenerateName: view.Metadata.GenerateName,
			Namespace:    view.Metadata.Namespace,
			Annotations:  view.Metadata.Annotations,
		},
		Spec: corev1.PodSpec{HostNetwork: view.Spec.HostNetwork},
	}
	for _, c := range view.Spec.Containers {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: c.Name, Ports: c.Ports})
	}
	for _, v := range view.Spec.Volumes {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: v.Name})
	}
	return pod, nil
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

// inject answers with the JSON patch that appends the template's containers
// and volumes to the pod's and records the injection in its annotations.
// That is what the strategic merge of tmpl.Patch gives, because Clash has
// ruled out names the pod already has (TestInjectEqualsStrategicMerge holds
// the two together); where the merge fails, on a null list, the patch still
// applies. It is built directly because merging and diffing a 64 KB pod
// took about 8 ms.
func inject(pod *corev1.Pod, tmpl *envoy.Template) *admissionv1.AdmissionResponse {
	return webhook.Patched(tmpl.InjectOps("", pod.Annotations, &pod.Spec))
}

// skip admits the pod unchanged but for an annotation that says why it got
// no sidecar.
func skip(pod *corev1.Pod, reason string) *admissionv1.AdmissionResponse {
	resp := webhook.Patched(patch.AnnotationOps(nil, "", pod.Annotations, map[string]string{envoy.Skipped: reason}))
	resp.Warnings = []string{"envoy sidecar not injected: " + reason}
	return resp
}

func podName(pod *corev1.Pod) string {
	if pod.Name != "" {
		return pod.Name
	}
	return pod.GenerateName + "<generated>"
}
