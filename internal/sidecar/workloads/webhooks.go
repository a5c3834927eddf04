package workloads

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netop-dev/netop/internal/sidecar/envoy"
	"github.com/netop-dev/netop/internal/webhook"
)

// Path is where the webhook for the pod templates of annotated workloads
// is served.
const Path = "/inject-envoy-workloads"

// Webhook declares the Envoy sidecar's injection into the pod templates
// of workloads (Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs,
// CronJobs) annotated for it, served by i, in every namespace but those
// skip excludes and those labelled out: so that their first pods have it.
// Only annotated workloads are sent. It fails open (Ignore): the workload
// initializer injects Deployments it missed (one more rollout), and pods
// of opted-in namespaces get it from the pod webhooks.
func (i *Injector) Webhook(skip metav1.LabelSelectorRequirement) webhook.Webhook {
	return webhook.Webhook{
		Name:     "workloads.envoy.initializer.kubernetes.io",
		Path:     Path,
		Handler:  webhook.HandlerFunc(i.Admit),
		Mutating: true,
		Rules:    webhook.WorkloadRules(),
		MatchConditions: []admissionregistrationv1.MatchCondition{webhook.AnnotationIs("opted-in", envoy.OptIn, "true"), {
			// ReplicaSets of Deployments (which copy the Deployment's
			// annotations) and Jobs of CronJobs come from a template
			// admission already saw; the handler leaves them alone too.
			Name:       "not-controlled",
			Expression: "!has(object.metadata.ownerReferences) || !object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller)",
		}},
		SideEffects:        admissionregistrationv1.SideEffectClassNoneOnDryRun, // Events
		FailurePolicy:      admissionregistrationv1.Ignore,
		ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		TimeoutSeconds:     5,
		NamespaceSelector: webhook.NamespaceSelector(skip, metav1.LabelSelectorRequirement{
			Key: envoy.NamespaceLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{envoy.NamespaceLabelDisabled},
		}),
	}
}
