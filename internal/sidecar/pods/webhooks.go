package pods

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netop-dev/netop/internal/sidecar/envoy"
	"github.com/netop-dev/netop/internal/webhook"
)

// The paths the pod injection webhooks are served at.
const (
	// PathAnnotated serves pods opted in by the tutorial's annotation.
	PathAnnotated = "/inject-envoy"
	// PathNamespace serves pods of labelled namespaces, opted in by the
	// API server's namespaceSelector.
	PathNamespace = "/inject-envoy-namespace"
)

// Webhooks declares the Envoy sidecar's injection into pods, in every
// namespace but those skip excludes, by an injector of i's templates and
// recorder.
//
// Pods in a namespace labelled initializer.kubernetes.io/envoy=enabled
// fail closed (Fail): the user asked for the sidecar on every pod, and
// half the pods starting without it is the bug to avoid. Only those
// namespaces' pods are sent to that webhook.
//
// Pods elsewhere may opt in with the tutorial's annotation. The API server
// can select on labels, not annotations, so this webhook must see every
// other pod; it fails open (Ignore) with a short timeout, so that an
// outage delays no pod: such pods then start without the sidecar. Use the
// namespace label where the sidecar is a must.
func (i *Injector) Webhooks(skip metav1.LabelSelectorRequirement) []webhook.Webhook {
	annotated := *i
	annotated.NamespaceOptIn = false
	labelled := *i
	labelled.NamespaceOptIn = true
	created := []admissionregistrationv1.RuleWithOperations{
		webhook.Rule([]admissionregistrationv1.OperationType{admissionregistrationv1.Create}, "", "v1", "pods"),
	}
	return []webhook.Webhook{{
		Name:          "namespace.envoy.initializer.kubernetes.io",
		Path:          PathNamespace,
		Handler:       &labelled,
		Mutating:      true,
		Rules:         created,
		FailurePolicy: admissionregistrationv1.Fail,
		// Another webhook adding containers after us does not need us again.
		ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		TimeoutSeconds:     5,
		NamespaceSelector: &metav1.LabelSelector{
			MatchLabels:      map[string]string{envoy.NamespaceLabel: envoy.NamespaceLabelEnabled},
			MatchExpressions: []metav1.LabelSelectorRequirement{skip},
		},
	}, {
		Name:     "annotation.envoy.initializer.kubernetes.io",
		Path:     PathAnnotated,
		Handler:  &annotated,
		Mutating: true,
		Rules:    created,
		// Only pods that ask: any other pod's create costs no call.
		MatchConditions:    []admissionregistrationv1.MatchCondition{webhook.AnnotationIs("opted-in", envoy.OptIn, "true")},
		FailurePolicy:      admissionregistrationv1.Ignore,
		ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		TimeoutSeconds:     2,
		// Not the labelled namespaces: opted in ("enabled", the webhook
		// above) or out ("disabled": no pod of theirs is injected).
		NamespaceSelector: webhook.NamespaceSelector(skip, metav1.LabelSelectorRequirement{
			Key: envoy.NamespaceLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{envoy.NamespaceLabelEnabled, envoy.NamespaceLabelDisabled},
		}),
	}}
}
