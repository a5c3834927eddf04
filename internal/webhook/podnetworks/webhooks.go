package podnetworks

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/webhook"
)

// The paths the webhooks that check the Networks pods, and workloads' pod
// templates, ask for are served at.
const (
	PathPods      = "/validate-pod-networks"
	PathTemplates = "/validate-template-networks"
)

// Webhooks declares the checks of the Networks pods and workloads' pod
// templates ask for, served by a, in every namespace but
// those skip excludes.
//
// Pods that name Networks are checked against who may join them and what
// addresses they pin, when they are created and when an update changes
// their Networks (hot-plug); their other updates cost no call. It fails
// closed (Fail): such a pod cannot start without netop anyway, and what
// the check refuses it refuses for good. The allocation controller
// enforces the same rules again.
//
// Workloads whose pod template names Networks get the same check when the
// template's selection is new or changed: a workload admitted before is
// scaled and restarted without a call. It fails open (Ignore): their pods
// are checked one by one.
func (a *Admission) Webhooks(skip metav1.LabelSelectorRequirement) []webhook.Webhook {
	podNetworks := func(o string) string { return webhook.CELAnnotation(o, netselect.NetworksAnnotation) }
	templateNetworks := func(o string) string { return webhook.CELTemplateAnnotation(o, netselect.NetworksAnnotation) }
	return []webhook.Webhook{{
		Name:    "pods.networks.samplecrd.k8s.io",
		Path:    PathPods,
		Handler: webhook.HandlerFunc(a.Pods),
		Rules:   []admissionregistrationv1.RuleWithOperations{webhook.Rule(webhook.CreateOrUpdate, "", "v1", "pods")},
		MatchConditions: []admissionregistrationv1.MatchCondition{{
			Name: "names-networks-new-or-changed", Expression: webhook.CELNewOrChanged(podNetworks),
		}},
		FailurePolicy:     admissionregistrationv1.Fail,
		TimeoutSeconds:    5,
		NamespaceSelector: webhook.NamespaceSelector(skip),
	}, {
		Name:    "templates.networks.samplecrd.k8s.io",
		Path:    PathTemplates,
		Handler: webhook.HandlerFunc(a.Workloads),
		Rules:   webhook.WorkloadRules(),
		MatchConditions: []admissionregistrationv1.MatchCondition{{
			Name: "template-selection-new-or-changed", Expression: webhook.CELNewOrChanged(templateNetworks),
		}},
		FailurePolicy:     admissionregistrationv1.Ignore,
		TimeoutSeconds:    5,
		NamespaceSelector: webhook.NamespaceSelector(skip),
	}}
}
