// Package deployments lists a Deployment's own Network in its pod
// template at admission: a Deployment annotated samplecrd.k8s.io/network:
// auto or samplecrd.k8s.io/network-cidr gets the Network of its name
// (made by controller/deploynet) added to the template's
// k8s.v1.cni.cncf.io/networks, so that its first pods already join it and
// no second rollout follows (a Deployment made with generateName has no
// name yet: the controller lists its Network later). Bad annotations are
// refused naming the annotation, and so is a Deployment whose name is a
// Network that is not a Deployment's: its pods would join someone else's
// Network.
package deployments

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/webhook"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v2"

	"github.com/netop-dev/netop/internal/webhook/patch"
)

// Attacher is the Deployment webhook's handler.
type Attacher struct {
	// Networks is the Network cache, for the name check.
	Networks samplecrdlisters.NetworkLister
}

// Admit adds the Deployment's Network to its pod template.
func (a *Attacher) Admit(_ context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	d := &appsv1.Deployment{}
	if err := json.Unmarshal(req.Object.Raw, d); err != nil {
		return webhook.Denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("decoding Deployment: %v", err))
	}
	if d.Namespace == "" {
		d.Namespace = req.Namespace
	}
	_, wanted, err := netselect.DeploymentWants(d.Annotations)
	if err != nil {
		return webhook.Denied(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, "metadata.annotations: "+err.Error())
	}
	if !wanted {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	if d.Name == "" {
		// generateName: the name, and so the Network's, comes after
		// admission. The controller lists it in the template then (one
		// more rollout).
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	// The Network of an earlier Deployment of this name (deleted a moment
	// ago, its Network not yet collected, or going) is no conflict: the
	// new one follows it.
	if n, err := a.Networks.Networks(d.Namespace).Get(d.Name); err == nil && n.DeletionTimestamp == nil && !netselect.OfDeploymentNamed(n, d.Name) {
		return webhook.Denied(http.StatusConflict, metav1.StatusReasonAlreadyExists,
			fmt.Sprintf("metadata.annotations: Network %s/%s exists and is not this Deployment's: its pods would join it; name the Deployment otherwise or drop the annotation", d.Namespace, d.Name))
	} else if err != nil && !apierrors.IsNotFound(err) {
		return webhook.Denied(http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error())
	}
	annotation, added, err := netselect.TemplateNetworks(d)
	if err != nil {
		return webhook.Denied(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, "spec.template.metadata.annotations: "+err.Error())
	}
	if !added {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	return webhook.Patched(patch.AnnotationOps(nil, "/spec/template", d.Spec.Template.Annotations, map[string]string{netselect.NetworksAnnotation: annotation}))
}
