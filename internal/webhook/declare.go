package webhook

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// What handlers declare their webhooks with: rules, namespace selectors
// and the CEL of their match conditions, so that each declaration stands
// beside its handler and reads alike.

// CreateOrUpdate are the operations of a rule on creates and updates.
var CreateOrUpdate = []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}

// Rule is a rule for ops on the namespaced resources of group/version.
func Rule(ops []admissionregistrationv1.OperationType, group, version string, resources ...string) admissionregistrationv1.RuleWithOperations {
	return admissionregistrationv1.RuleWithOperations{
		Operations: ops,
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{group}, APIVersions: []string{version},
			Resources: resources, Scope: ptr.To(admissionregistrationv1.NamespacedScope),
		},
	}
}

// WorkloadRules are the rules for the workloads that carry a pod template:
// created or updated, but Jobs only created, since a Job's pod template
// cannot change after its creation (a change at admission would have the
// update refused).
func WorkloadRules() []admissionregistrationv1.RuleWithOperations {
	return []admissionregistrationv1.RuleWithOperations{
		Rule(CreateOrUpdate, "apps", "v1", "deployments", "statefulsets", "daemonsets", "replicasets"),
		Rule(CreateOrUpdate, "batch", "v1", "cronjobs"),
		Rule([]admissionregistrationv1.OperationType{admissionregistrationv1.Create}, "batch", "v1", "jobs"),
	}
}

// NamespacesExcept is the requirement that a namespace is none of those
// named, for a webhook's namespace selector.
func NamespacesExcept(names ...string) metav1.LabelSelectorRequirement {
	return metav1.LabelSelectorRequirement{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: names}
}

// CELAnnotation is the CEL for the annotation key of object (the
// request's "object" or "oldObject", or a path into one): its value, or ”
// where it has none. has() keeps the expression from failing, and the
// failure policy from applying, on an object without annotations.
func CELAnnotation(object, key string) string {
	return fmt.Sprintf("(has(%[1]s.metadata.annotations) && %[2]q in %[1]s.metadata.annotations ? %[1]s.metadata.annotations[%[2]q] : '')", object, key)
}

// AnnotationIs is the match condition, named name, that the request's
// object has the annotation key set to value.
func AnnotationIs(name, key, value string) admissionregistrationv1.MatchCondition {
	return admissionregistrationv1.MatchCondition{
		Name:       name,
		Expression: fmt.Sprintf("has(object.metadata.annotations) && '%[1]s' in object.metadata.annotations && object.metadata.annotations['%[1]s'] == '%[2]s'", key, value),
	}
}

// CELTemplateAnnotation is the CEL for the annotation key of object's pod
// template (” if none): a CronJob's in its Job template, any other
// workload's in spec.template.
func CELTemplateAnnotation(object, key string) string {
	of := func(template string) string {
		return fmt.Sprintf("(has(%[1]s) && has(%[1]s.metadata) ? %[2]s : '')", template, CELAnnotation(template, key))
	}
	return fmt.Sprintf("(request.kind.kind == 'CronJob' ? %s : %s)", of(object+".spec.jobTemplate.spec.template"), of(object+".spec.template"))
}

// CELNewOrChanged is the CEL that value, a CEL expression of the object
// it is given, is set (” is unset) on a create, or set and changed by an
// update: what a webhook checks only when it changes.
func CELNewOrChanged(value func(object string) string) string {
	return value("object") + " != '' && (request.operation != 'UPDATE' || " + value("object") + " != " + value("oldObject") + ")"
}

// NamespaceSelector selects the namespaces that meet every requirement.
func NamespaceSelector(reqs ...metav1.LabelSelectorRequirement) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: reqs}
}
