package networks

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netop-dev/netop/internal/webhook"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// The paths the Network webhooks are served at.
const (
	PathValidate = "/validate-network"
	PathDefault  = "/mutate-network"
)

// Webhooks declares Network validation and defaulting, served by a, in
// every namespace but those skip excludes.
//
// Validation fails closed (Fail): an overlapping Network is worse than a
// Network that waits for the webhook, and nothing in the cluster needs
// Networks to start. Defaulting fails open (Ignore): the controller sets
// the same gateway and adds the same finalizer itself; only one write is
// saved.
func (a *Admission) Webhooks(skip metav1.LabelSelectorRequirement) []webhook.Webhook {
	// Each version as its client wrote it: no conversion per request, and
	// errors that name the client's fields.
	rule := webhook.Rule(webhook.CreateOrUpdate, samplecrd.GroupName, samplecrdv1.SchemeGroupVersion.Version, "networks")
	rule.APIVersions = append(rule.APIVersions, samplecrdv2.SchemeGroupVersion.Version)
	rules := []admissionregistrationv1.RuleWithOperations{rule}
	return []webhook.Webhook{{
		Name:    "networks.validate.samplecrd.k8s.io",
		Path:    PathValidate,
		Handler: webhook.HandlerFunc(a.Validate),
		Rules:   rules,
		// Only spec changes are validated (Validate checks that too, for
		// an API server without matchConditions).
		MatchConditions:   specChanged,
		FailurePolicy:     admissionregistrationv1.Fail,
		TimeoutSeconds:    5,
		NamespaceSelector: webhook.NamespaceSelector(skip),
	}, {
		Name:              "networks.default.samplecrd.k8s.io",
		Path:              PathDefault,
		Handler:           webhook.HandlerFunc(a.Default),
		Mutating:          true,
		Rules:             rules,
		MatchConditions:   specChanged,
		FailurePolicy:     admissionregistrationv1.Ignore,
		TimeoutSeconds:    5,
		NamespaceSelector: webhook.NamespaceSelector(skip),
	}}
}

// specChanged sends Networks to their webhooks on create and on updates
// that change the spec; metadata-only updates, above all the controller
// removing its finalizer, must never depend on the webhooks being up, and
// cost no call. CEL compares the spec maps key by key, deeply. has() keeps
// the condition from failing (and the failure policy from applying) on a
// spec missing from an update: the webhook, then the schema, answer. The
// annotations that hold what v1 lacks (the second family, the namespace
// selector) are part of the spec: a v1 client's change to them changes
// them alone.
var specChanged = []admissionregistrationv1.MatchCondition{{
	Name: "spec-changed",
	Expression: "request.operation != 'UPDATE' || !has(object.spec) || !has(oldObject.spec) || object.spec != oldObject.spec || " +
		annotationChanged(samplecrdv1.SpecFamiliesAnnotation) + " || " + annotationChanged(samplecrdv1.NamespaceSelectorAnnotation),
}}

// annotationChanged is the CEL that an update changes the annotation key.
func annotationChanged(key string) string {
	return webhook.CELAnnotation("object", key) + " != " + webhook.CELAnnotation("oldObject", key)
}
