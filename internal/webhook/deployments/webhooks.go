package deployments

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netop-dev/netop/internal/webhook"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
)

// Path is where the webhook that lists a Deployment's own Network in its
// pod template is served.
const Path = "/deployment-network"

// Webhook declares the listing of a Deployment's own Network in its pod
// template, served by a, in every namespace but those skip excludes. Only
// Deployments asking for a Network are sent. It fails open (Ignore): the
// Deployment network controller lists it where admission did not (one more
// rollout).
func (a *Attacher) Webhook(skip metav1.LabelSelectorRequirement) webhook.Webhook {
	return webhook.Webhook{
		Name:     "deployments.network.samplecrd.k8s.io",
		Path:     Path,
		Handler:  webhook.HandlerFunc(a.Admit),
		Mutating: true,
		Rules:    []admissionregistrationv1.RuleWithOperations{webhook.Rule(webhook.CreateOrUpdate, "apps", "v1", "deployments")},
		MatchConditions: []admissionregistrationv1.MatchCondition{{
			Name: "wants-network",
			Expression: "has(object.metadata.annotations) && ('" + samplecrd.DeploymentNetworkAnnotation + "' in object.metadata.annotations || '" +
				samplecrd.DeploymentNetworkCIDRAnnotation + "' in object.metadata.annotations)",
		}},
		FailurePolicy:      admissionregistrationv1.Ignore,
		ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		TimeoutSeconds:     5,
		NamespaceSelector:  webhook.NamespaceSelector(skip),
	}
}
