package webhook

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/netop-dev/netop/internal/envoy"
)

// Paths the server serves.
const (
	PathValidateNetwork = "/validate-network"
	PathMutateNetwork   = "/mutate-network"
	PathInjectEnvoy     = "/inject-envoy"
	// PathInjectEnvoyNamespace serves the webhook for labelled namespaces,
	// whose pods are opted in by the API server's namespaceSelector.
	PathInjectEnvoyNamespace = "/inject-envoy-namespace"
)

// ConfigurationName names both webhook configurations.
const ConfigurationName = "netop"

// Target is where the API server reaches the webhook server: a URL
// (standalone, https://127.0.0.1:PORT) or a Service (in a cluster).
type Target struct {
	URL     string
	Service *admissionregistrationv1.ServiceReference
}

func (t Target) client(path string, caBundle []byte) admissionregistrationv1.WebhookClientConfig {
	cc := admissionregistrationv1.WebhookClientConfig{CABundle: caBundle}
	if t.Service != nil {
		svc := *t.Service
		svc.Path = ptr.To(path)
		cc.Service = &svc
	} else {
		cc.URL = ptr.To(t.URL + path)
	}
	return cc
}

// Configurations returns netop's webhook configurations.
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
func Configurations(target Target, operatorNamespace string, caBundle []byte) (*admissionregistrationv1.ValidatingWebhookConfiguration, *admissionregistrationv1.MutatingWebhookConfiguration) {
	excluded := metav1.LabelSelectorRequirement{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn,
		Values: []string{"kube-system", operatorNamespace},
	}
	notExcluded := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{excluded}}
	none := admissionregistrationv1.SideEffectClassNone
	networkRule := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{"samplecrd.k8s.io"}, APIVersions: []string{"*"},
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
	versions := []string{"v1"}

	validating := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: ConfigurationName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "networks.validate.samplecrd.k8s.io",
			ClientConfig: target.client(PathValidateNetwork, caBundle),
			Rules:        networkRule,
			// Only spec changes are validated: metadata updates, above all
			// the controller removing its finalizer, must never depend on
			// the webhook being up.
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name:       "spec-changed",
				Expression: "request.operation != 'UPDATE' || object.spec != oldObject.spec",
			}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             &none,
			TimeoutSeconds:          ptr.To[int32](5),
			AdmissionReviewVersions: versions,
			NamespaceSelector:       notExcluded,
		}},
	}
	mutating := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: ConfigurationName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "networks.default.samplecrd.k8s.io",
			ClientConfig:            target.client(PathMutateNetwork, caBundle),
			Rules:                   networkRule,
			FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
			SideEffects:             &none,
			TimeoutSeconds:          ptr.To[int32](5),
			AdmissionReviewVersions: versions,
			NamespaceSelector:       notExcluded,
		}, {
			Name:          "namespace.envoy.initializer.kubernetes.io",
			ClientConfig:  target.client(PathInjectEnvoyNamespace, caBundle),
			Rules:         podRule,
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			SideEffects:   &none,
			// Another webhook adding containers after us does not need us again.
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
			TimeoutSeconds:          ptr.To[int32](5),
			AdmissionReviewVersions: versions,
			NamespaceSelector: &metav1.LabelSelector{
				MatchLabels:      map[string]string{envoy.NamespaceLabel: envoy.NamespaceLabelEnabled},
				MatchExpressions: []metav1.LabelSelectorRequirement{excluded},
			},
		}, {
			Name:                    "annotation.envoy.initializer.kubernetes.io",
			ClientConfig:            target.client(PathInjectEnvoy, caBundle),
			Rules:                   podRule,
			FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
			SideEffects:             &none,
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
			TimeoutSeconds:          ptr.To[int32](2),
			AdmissionReviewVersions: versions,
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				excluded,
				{Key: envoy.NamespaceLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{envoy.NamespaceLabelEnabled}},
			}},
		}},
	}
	return validating, mutating
}

// Register creates or updates the webhook configurations.
func Register(ctx context.Context, kube kubernetes.Interface, target Target, operatorNamespace string, caBundle []byte) error {
	validating, mutating := Configurations(target, operatorNamespace, caBundle)
	if err := createOrReplace(ctx, "ValidatingWebhookConfiguration", kube.AdmissionregistrationV1().ValidatingWebhookConfigurations(), validating); err != nil {
		return err
	}
	return createOrReplace(ctx, "MutatingWebhookConfiguration", kube.AdmissionregistrationV1().MutatingWebhookConfigurations(), mutating)
}

// objectClient is the part of a typed cluster-scoped client that
// createOrReplace uses.
type objectClient[T metav1.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
}

// createOrReplace makes obj, of the given kind, exist exactly as given:
// replacing the existing object over its resourceVersion, or creating it.
func createOrReplace[T metav1.Object](ctx context.Context, kind string, client objectClient[T], obj T) error {
	existing, err := client.Get(ctx, obj.GetName(), metav1.GetOptions{})
	switch {
	case err == nil:
		obj.SetResourceVersion(existing.GetResourceVersion())
		if _, err := client.Update(ctx, obj, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating %s: %w", kind, err)
		}
	case apierrors.IsNotFound(err):
		if _, err := client.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating %s: %w", kind, err)
		}
	default:
		return err
	}
	return nil
}
