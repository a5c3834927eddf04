// Package podnetworks checks at admission the Networks a pod asks for
// (Multus's k8s.v1.cni.cncf.io/networks), and those a workload's pod
// template will have its pods ask for: a Network of another namespace that
// does not admit the pod's (internal/tenancy) or does not exist, a pinned
// address outside the Network's cidrs, its network, gateway or broadcast
// address or another pod's, a multicast or zero MAC. The pod is refused
// when it is created, with the reason, instead of being admitted and then
// failing in its sandbox on a node (Multus's way); the allocation
// controller enforces the same rules again whatever admission let in.
package podnetworks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/tenancy"
	"github.com/netop-dev/netop/internal/webhook"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v2"
)

// Pins checks the addresses and MAC a selection pins (the allocation
// controller's allocator).
type Pins interface {
	// CheckPinned says why the addresses cannot be any pod's on network.
	CheckPinned(network *samplecrdv2.Network, s netselect.Selection) error
	// PinnedHolder says which other pod than pod holds one of them, or
	// the MAC.
	PinnedHolder(network *samplecrdv2.Network, s netselect.Selection, pod cache.ObjectName) error
}

// Admission is the handler of the pod and workload webhooks.
type Admission struct {
	Networks   samplecrdlisters.NetworkLister
	Namespaces tenancy.Namespaces
	Pins       Pins
}

// annotationPath is where a pod's selection is, for messages.
const annotationPath = "metadata.annotations[" + netselect.NetworksAnnotation + "]"

// Pods refuses a pod naming Networks it may not join or addresses it
// cannot have.
func (a *Admission) Pods(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	pod := &corev1.Pod{}
	if err := json.Unmarshal(req.Object.Raw, pod); err != nil {
		return webhook.Denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("decoding Pod: %v", err))
	}
	name := cache.ObjectName{Namespace: req.Namespace, Name: pod.Name}
	what := "pod " + describeName(name, pod.GenerateName)
	annotation := pod.Annotations[netselect.NetworksAnnotation]
	if req.Operation == admissionv1.Update {
		// A running pod's edit (hot-plug) keeps the interfaces it has
		// under their names.
		have, err := netselect.ParseAllocations(pod.Annotations[netselect.AllocationsAnnotation])
		if err != nil {
			have = nil
		}
		if selections, err := netselect.Parse(annotation, req.Namespace); err == nil {
			if _, err := netselect.Diff(have, selections); err != nil {
				klog.FromContext(ctx).V(2).Info("Refused the Networks of "+what, "reason", err.Error())
				return webhook.Denied(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, fmt.Sprintf("%s: %s: %v", what, annotationPath, err))
			}
		}
	}
	return a.review(ctx, what, annotationPath, req.Namespace, annotation, &name)
}

// Workloads refuses a workload whose pod template names Networks its pods
// may not join or addresses they cannot have, when the template's
// selection is new or changed: a workload admitted before keeps being
// updated (scaled, restarted) whatever became of its Networks since.
func (a *Admission) Workloads(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	w, err := webhook.DecodeWorkload(req.Kind, req.Object.Raw)
	if err != nil {
		return webhook.Denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("decoding %s: %v", req.Kind.Kind, err))
	}
	annotation := w.Template.Annotations[netselect.NetworksAnnotation]
	if req.Operation == admissionv1.Update {
		if old, err := webhook.DecodeWorkload(req.Kind, req.OldObject.Raw); err == nil && old.Template.Annotations[netselect.NetworksAnnotation] == annotation {
			return &admissionv1.AdmissionResponse{Allowed: true}
		}
	}
	what := req.Kind.Kind + " " + describeName(cache.ObjectName{Namespace: req.Namespace, Name: w.Meta.Name}, w.Meta.GenerateName)
	path := strings.ReplaceAll(strings.TrimPrefix(w.Path, "/"), "/", ".") + "." + annotationPath
	return a.review(ctx, what, path, req.Namespace, annotation, nil)
}

// review checks the selection annotation of what (a pod, or a workload's
// pod template: pod is nil) in namespace; path names the annotation.
func (a *Admission) review(ctx context.Context, what, path, namespace, annotation string, pod *cache.ObjectName) *admissionv1.AdmissionResponse {
	refuse := func(code int32, reason metav1.StatusReason, msg string) *admissionv1.AdmissionResponse {
		klog.FromContext(ctx).V(2).Info("Refused the Networks of "+what, "reason", msg)
		return webhook.Denied(code, reason, fmt.Sprintf("%s: %s: %s", what, path, msg))
	}
	selections, err := netselect.Parse(annotation, namespace)
	if err != nil {
		return refuse(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, err.Error())
	}
	var warnings []string
	for _, s := range selections {
		network, err := a.Networks.Networks(s.Namespace).Get(s.Name)
		switch {
		case apierrors.IsNotFound(err) && s.Namespace == namespace:
			// Applied before its Network (kubectl apply -f of a directory):
			// the pod waits for it.
			warnings = append(warnings, fmt.Sprintf("%s: Network %s/%s does not exist yet: the pods wait for it", path, s.Namespace, s.Name))
			continue
		case apierrors.IsNotFound(err):
			return refuse(http.StatusForbidden, metav1.StatusReasonForbidden, tenancy.NotFound(namespace, s.Namespace+"/"+s.Name).Error())
		case err != nil:
			return webhook.Denied(http.StatusInternalServerError, metav1.StatusReasonInternalError, fmt.Sprintf("reading Network %s/%s: %v", s.Namespace, s.Name, err))
		}
		if err := a.Namespaces.Admits(ctx, network, namespace); err != nil {
			if notAdmitted := (*tenancy.NotAdmittedError)(nil); errors.As(err, &notAdmitted) {
				return refuse(http.StatusForbidden, metav1.StatusReasonForbidden, err.Error())
			}
			return webhook.Denied(http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error())
		}
		if a.Pins == nil {
			continue
		}
		if err := a.Pins.CheckPinned(network, s); err != nil {
			return refuse(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, fmt.Sprintf("Network %s/%s: %v", s.Namespace, s.Name, err))
		}
		if pod != nil {
			if err := a.Pins.PinnedHolder(network, s, *pod); err != nil {
				return refuse(http.StatusConflict, metav1.StatusReasonConflict, fmt.Sprintf("Network %s/%s: %v", s.Namespace, s.Name, err))
			}
		}
	}
	return &admissionv1.AdmissionResponse{Allowed: true, Warnings: warnings}
}

// describeName is namespace/name, or namespace/generateName… before the
// API server has named the object.
func describeName(name cache.ObjectName, generateName string) string {
	if name.Name == "" && generateName != "" {
		name.Name = generateName + "…"
	}
	return name.String()
}
