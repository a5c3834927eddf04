package admission

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/netop-dev/netop/internal/kubeclient"
	"github.com/netop-dev/netop/internal/netselect"
	"github.com/netop-dev/netop/internal/netspec"
	"github.com/netop-dev/netop/internal/sidecar/envoy"
	"github.com/netop-dev/netop/internal/sidecar/pods"
	"github.com/netop-dev/netop/internal/sidecar/workloads"
	"github.com/netop-dev/netop/internal/tenancy"
	"github.com/netop-dev/netop/internal/webhook"
	"github.com/netop-dev/netop/internal/webhook/deployments"
	"github.com/netop-dev/netop/internal/webhook/networks"
	"github.com/netop-dev/netop/internal/webhook/podnetworks"
	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
	samplecrdlisters "github.com/netop-dev/netop/pkg/generated/listers/samplecrd/v2"
)

// WebhookConfigurationName names both of netop's webhook configurations.
const WebhookConfigurationName = "netop"

// NetworkCRD is the CRD whose conversion webhook netop serves.
const NetworkCRD = "networks." + samplecrd.GroupName

// Paths the webhook server serves.
const (
	PathValidateNetwork = "/validate-network"
	PathMutateNetwork   = "/mutate-network"
	PathInjectEnvoy     = "/inject-envoy"
	// PathInjectEnvoyNamespace serves the webhook for labelled namespaces,
	// whose pods are opted in by the API server's namespaceSelector.
	PathInjectEnvoyNamespace = "/inject-envoy-namespace"
	// PathInjectEnvoyWorkloads serves the webhook for the pod templates of
	// annotated workloads.
	PathInjectEnvoyWorkloads = "/inject-envoy-workloads"
	// PathConvert serves the Network CRD's conversion webhook.
	PathConvert = "/convert"
	// PathDeploymentNetwork serves the webhook that lists a Deployment's
	// own Network in its pod template.
	PathDeploymentNetwork = "/deployment-network"
	// PathValidatePodNetworks and PathValidateTemplateNetworks serve the
	// webhooks that check the Networks pods, and workloads' pod
	// templates, ask for.
	PathValidatePodNetworks      = "/validate-pod-networks"
	PathValidateTemplateNetworks = "/validate-template-networks"
)

// Webhooks is netop's table of admission webhooks: each handler with its
// path, rules, selectors and failure policy.
//
// Failure policies, chosen so that a webhook outage never deadlocks the
// cluster (istio#10983, cozystack#3125) yet never lets through what the
// user relies on:
//   - Every webhook skips kube-system and the operator's own namespace, so
//     that netop itself, and the system it needs to come back, can always
//     start.
//   - Network validation fails closed (Fail): an overlapping Network is
//     worse than a Network that waits for the webhook, and nothing in the
//     cluster needs Networks to start.
//   - Network defaulting fails open (Ignore): the controller sets the same
//     gateway and adds the same finalizer itself; only one write is saved.
//   - Pods in a namespace labelled initializer.kubernetes.io/envoy=enabled
//     fail closed (Fail): the user asked for the sidecar on every pod, and
//     half the pods starting without it (linkerd#3290) is the bug to avoid.
//     Only those namespaces' pods are sent to the webhook.
//   - Pods elsewhere may opt in with the tutorial's annotation. The API
//     server can select on labels, not annotations, so this webhook must see
//     every other pod; it fails open (Ignore) with a short timeout, so that
//     an outage delays no pod: such pods then start without the sidecar.
//     Use the namespace label where the sidecar is a must.
//   - Workloads (Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs,
//     CronJobs) annotated for the sidecar get it in their pod template at
//     admission, so that their first pods have it. Only annotated ones are
//     sent (a matchCondition). It fails open (Ignore): the workload
//     initializer injects Deployments it missed (one more rollout), and
//     pods of opted-in namespaces get it from the pod webhooks.
//   - Pods that name Networks are checked against who may join them and
//     what addresses they pin. Only those are sent (a matchCondition). It
//     fails closed (Fail): such a pod cannot start without netop anyway,
//     and what the check refuses it refuses for good. The allocation
//     controller enforces the same rules again.
//   - Workloads whose pod template names Networks get the same check when
//     the template's selection is new or changed. Only those are sent. It
//     fails open (Ignore): their pods are checked one by one.
//   - Deployments asking for a Network of their own get it listed in their
//     pod template. Only those are sent (a matchCondition). It fails open
//     (Ignore): the Deployment network controller lists it where admission
//     did not (one more rollout).
func Webhooks(d Deps, cidrs *networks.CIDRs) webhook.Set {
	excluded := metav1.LabelSelectorRequirement{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn,
		Values: []string{"kube-system", d.OperatorNamespace},
	}
	notExcluded := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{excluded}}
	networkRule := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule: admissionregistrationv1.Rule{
			// Each version as its client wrote it: no conversion per
			// request, and errors that name the client's fields.
			APIGroups: []string{samplecrd.GroupName}, APIVersions: []string{samplecrdv1.SchemeGroupVersion.Version, samplecrdv2.SchemeGroupVersion.Version},
			Resources: []string{"networks"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope),
		},
	}}
	podRule := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{""}, APIVersions: []string{"v1"},
			Resources: []string{"pods"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope),
		},
	}}
	// Networks go to their webhooks on create and on updates that change
	// the spec; metadata-only updates, above all the controller removing
	// its finalizer, must never depend on the webhooks being up, and cost
	// no call. CEL compares the spec maps key by key, deeply. has() keeps
	// the condition from failing (and the failurePolicy from applying) on a
	// spec missing from an update: the webhook, then the schema, answer.
	// The annotations that hold what v1 lacks (the second family, the
	// namespace selector) are part of the spec: a v1 client's change to
	// them changes them alone.
	annotation := func(o, key string) string {
		return fmt.Sprintf("(has(%[1]s.metadata.annotations) && %[2]q in %[1]s.metadata.annotations ? %[1]s.metadata.annotations[%[2]q] : '')", o, key)
	}
	specChanged := []admissionregistrationv1.MatchCondition{{
		Name: "spec-changed",
		Expression: "request.operation != 'UPDATE' || !has(object.spec) || !has(oldObject.spec) || object.spec != oldObject.spec || " +
			annotation("object", samplecrdv1.SpecFamiliesAnnotation) + " != " + annotation("oldObject", samplecrdv1.SpecFamiliesAnnotation) + " || " +
			annotation("object", samplecrdv1.NamespaceSelectorAnnotation) + " != " + annotation("oldObject", samplecrdv1.NamespaceSelectorAnnotation),
	}}
	workloadRules := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{"apps"}, APIVersions: []string{"v1"},
			Resources: []string{"deployments", "statefulsets", "daemonsets", "replicasets"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope),
		},
	}, {
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{"batch"}, APIVersions: []string{"v1"},
			Resources: []string{"cronjobs"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope),
		},
	}, {
		// A Job's pod template cannot change after its creation: injecting
		// into it on an update would have the update refused.
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{"batch"}, APIVersions: []string{"v1"},
			Resources: []string{"jobs"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope),
		},
	}}
	optedIn := []admissionregistrationv1.MatchCondition{{
		Name:       "opted-in",
		Expression: "has(object.metadata.annotations) && '" + envoy.OptIn + "' in object.metadata.annotations && object.metadata.annotations['" + envoy.OptIn + "'] == 'true'",
	}, {
		// ReplicaSets of Deployments (which copy the Deployment's
		// annotations) and Jobs of CronJobs come from a template admission
		// already saw; the handler leaves them alone too.
		Name:       "not-controlled",
		Expression: "!has(object.metadata.ownerReferences) || !object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller)",
	}}
	wantsNetwork := []admissionregistrationv1.MatchCondition{{
		Name: "wants-network",
		Expression: "has(object.metadata.annotations) && ('" + samplecrd.DeploymentNetworkAnnotation + "' in object.metadata.annotations || '" +
			samplecrd.DeploymentNetworkCIDRAnnotation + "' in object.metadata.annotations)",
	}}
	// A pod's Networks are checked when it is created and when an update
	// changes them (hot-plug); its other updates cost no call.
	podNetworkRule := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule:       podRule[0].Rule,
	}}
	namesNetworks := []admissionregistrationv1.MatchCondition{{
		Name: "names-networks-new-or-changed",
		Expression: annotation("object", netselect.NetworksAnnotation) + " != '' && (request.operation != 'UPDATE' || " +
			annotation("object", netselect.NetworksAnnotation) + " != " + annotation("oldObject", netselect.NetworksAnnotation) + ")",
	}}
	// The template's selection, "" if none, of the object o.
	templateSelection := func(o string) string {
		selection := func(template string) string {
			return fmt.Sprintf("(has(%[1]s) && has(%[1]s.metadata) ? %[2]s : '')", template, annotation(template, netselect.NetworksAnnotation))
		}
		return fmt.Sprintf("(request.kind.kind == 'CronJob' ? %s : %s)", selection(o+".spec.jobTemplate.spec.template"), selection(o+".spec.template"))
	}
	// Only a new or changed selection: a workload admitted before is
	// scaled and restarted without a call.
	templateNamesNetworks := []admissionregistrationv1.MatchCondition{{
		Name: "template-selection-new-or-changed",
		Expression: templateSelection("object") + " != '' && (request.operation != 'UPDATE' || " +
			templateSelection("object") + " != " + templateSelection("oldObject") + ")",
	}}
	var networkLister samplecrdlisters.NetworkLister
	if d.Networks != nil { // nil in unit tests of one webhook
		networkLister = samplecrdlisters.NewNetworkLister(d.Networks.GetIndexer())
	}
	joins := &podnetworks.Admission{Networks: networkLister,
		Namespaces: tenancy.Namespaces{Lister: d.Namespaces, Kube: d.Kube}, Pins: d.Pins}
	netAdmission := &networks.Admission{CIDRs: cidrs, Decoder: webhook.NewDecoder(kubeclient.Scheme()),
		Resolver: netspec.Resolver{AllowReserved: d.AllowReservedPrefixes}, Addresses: d.Addresses}
	templates := envoy.Finder{ConfigMaps: d.Templates, OperatorNamespace: d.OperatorNamespace, AllowPrivileged: d.AllowPrivilegedTemplates}
	injector := &pods.Injector{Templates: templates, Recorder: d.Recorder}
	namespaceInjector := *injector
	namespaceInjector.NamespaceOptIn = true
	workloadInjector := &workloads.Injector{Templates: templates, Recorder: d.Recorder}

	set := webhook.Set{Name: WebhookConfigurationName, Webhooks: []webhook.Webhook{{
		Name:    "networks.validate.samplecrd.k8s.io",
		Path:    PathValidateNetwork,
		Handler: webhook.HandlerFunc(netAdmission.Validate),
		Rules:   networkRule,
		// Only spec changes are validated (Validate checks that too, for
		// an API server without matchConditions).
		MatchConditions:   specChanged,
		FailurePolicy:     admissionregistrationv1.Fail,
		TimeoutSeconds:    5,
		NamespaceSelector: notExcluded,
	}, {
		Name:              "networks.default.samplecrd.k8s.io",
		Path:              PathMutateNetwork,
		Handler:           webhook.HandlerFunc(netAdmission.Default),
		Mutating:          true,
		Rules:             networkRule,
		MatchConditions:   specChanged,
		FailurePolicy:     admissionregistrationv1.Ignore,
		TimeoutSeconds:    5,
		NamespaceSelector: notExcluded,
	}, {
		Name:              "pods.networks.samplecrd.k8s.io",
		Path:              PathValidatePodNetworks,
		Handler:           webhook.HandlerFunc(joins.Pods),
		Rules:             podNetworkRule,
		MatchConditions:   namesNetworks,
		FailurePolicy:     admissionregistrationv1.Fail,
		TimeoutSeconds:    5,
		NamespaceSelector: notExcluded,
	}, {
		Name:              "templates.networks.samplecrd.k8s.io",
		Path:              PathValidateTemplateNetworks,
		Handler:           webhook.HandlerFunc(joins.Workloads),
		Rules:             workloadRules,
		MatchConditions:   templateNamesNetworks,
		FailurePolicy:     admissionregistrationv1.Ignore,
		TimeoutSeconds:    5,
		NamespaceSelector: notExcluded,
	}, {
		Name:          "namespace.envoy.initializer.kubernetes.io",
		Path:          PathInjectEnvoyNamespace,
		Handler:       &namespaceInjector,
		Mutating:      true,
		Rules:         podRule,
		FailurePolicy: admissionregistrationv1.Fail,
		// Another webhook adding containers after us does not need us again.
		ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		TimeoutSeconds:     5,
		NamespaceSelector: &metav1.LabelSelector{
			MatchLabels:      map[string]string{envoy.NamespaceLabel: envoy.NamespaceLabelEnabled},
			MatchExpressions: []metav1.LabelSelectorRequirement{excluded},
		},
	}, {
		Name:     "annotation.envoy.initializer.kubernetes.io",
		Path:     PathInjectEnvoy,
		Handler:  injector,
		Mutating: true,
		Rules:    podRule,
		// Only pods that ask: any other pod's create costs no call.
		MatchConditions:    optedIn[:1],
		FailurePolicy:      admissionregistrationv1.Ignore,
		ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		TimeoutSeconds:     2,
		// Not the labelled namespaces: opted in ("enabled", the webhook
		// above) or out ("disabled": no pod of theirs is injected).
		NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			excluded,
			{Key: envoy.NamespaceLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{envoy.NamespaceLabelEnabled, envoy.NamespaceLabelDisabled}},
		}},
	}, {
		Name:               "workloads.envoy.initializer.kubernetes.io",
		Path:               PathInjectEnvoyWorkloads,
		Handler:            webhook.HandlerFunc(workloadInjector.Admit),
		Mutating:           true,
		Rules:              workloadRules,
		MatchConditions:    optedIn,
		SideEffects:        admissionregistrationv1.SideEffectClassNoneOnDryRun, // Events
		FailurePolicy:      admissionregistrationv1.Ignore,
		ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		TimeoutSeconds:     5,
		NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			excluded,
			{Key: envoy.NamespaceLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{envoy.NamespaceLabelDisabled}},
		}},
	}}}
	if d.DeploymentNetworks {
		set.Webhooks = append(set.Webhooks, webhook.Webhook{
			Name:     "deployments.network.samplecrd.k8s.io",
			Path:     PathDeploymentNetwork,
			Handler:  webhook.HandlerFunc((&deployments.Attacher{Networks: networkLister}).Admit),
			Mutating: true,
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{"apps"}, APIVersions: []string{"v1"},
					Resources: []string{"deployments"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope),
				},
			}},
			MatchConditions:    wantsNetwork,
			FailurePolicy:      admissionregistrationv1.Ignore,
			ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
			TimeoutSeconds:     5,
			NamespaceSelector:  notExcluded,
		})
	}
	return set
}
