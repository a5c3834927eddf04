package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/netop-dev/netop/internal/ssa"
)

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

// Webhook is one admission webhook: the handler, the path it is served
// at, and how the API server is to call it. Every webhook is side-effect
// free and speaks admission/v1.
type Webhook struct {
	// Name is the webhook's name in its configuration.
	Name    string
	Path    string
	Handler Handler
	// Mutating webhooks go into the MutatingWebhookConfiguration, the
	// others into the ValidatingWebhookConfiguration.
	Mutating          bool
	Rules             []admissionregistrationv1.RuleWithOperations
	MatchConditions   []admissionregistrationv1.MatchCondition
	NamespaceSelector *metav1.LabelSelector
	ObjectSelector    *metav1.LabelSelector
	// FailurePolicy and TimeoutSeconds: empty and zero leave the API
	// server's defaults (Fail, 10 s).
	FailurePolicy  admissionregistrationv1.FailurePolicyType
	TimeoutSeconds int32
	// ReinvocationPolicy applies to mutating webhooks; empty means Never.
	ReinvocationPolicy admissionregistrationv1.ReinvocationPolicyType
	// SideEffects: empty means None. NoneOnDryRun for a handler that
	// records Events, which it must not do for a dry run.
	SideEffects admissionregistrationv1.SideEffectClass
}

// Set is the webhooks of one operator: they are registered in one
// ValidatingWebhookConfiguration and one MutatingWebhookConfiguration,
// both named Name.
type Set struct {
	Name     string
	Webhooks []Webhook
}

// Configurations returns the webhook configurations of s, for the API
// server to call target with caBundle as the trusted CA.
func (s Set) Configurations(target Target, caBundle []byte) (*admissionregistrationv1.ValidatingWebhookConfiguration, *admissionregistrationv1.MutatingWebhookConfiguration) {
	validating := &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: s.Name},
	}
	mutating := &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: s.Name},
	}
	versions := []string{"v1"}
	for _, w := range s.Webhooks {
		sideEffects := w.SideEffects
		if sideEffects == "" {
			sideEffects = admissionregistrationv1.SideEffectClassNone
		}
		if !w.Mutating {
			validating.Webhooks = append(validating.Webhooks, admissionregistrationv1.ValidatingWebhook{
				Name:                    w.Name,
				ClientConfig:            target.client(w.Path, caBundle),
				Rules:                   w.Rules,
				MatchConditions:         w.MatchConditions,
				FailurePolicy:           optional(w.FailurePolicy),
				SideEffects:             &sideEffects,
				TimeoutSeconds:          optional(w.TimeoutSeconds),
				AdmissionReviewVersions: versions,
				NamespaceSelector:       w.NamespaceSelector,
				ObjectSelector:          w.ObjectSelector,
			})
			continue
		}
		reinvocation := w.ReinvocationPolicy
		if reinvocation == "" {
			reinvocation = admissionregistrationv1.NeverReinvocationPolicy
		}
		mutating.Webhooks = append(mutating.Webhooks, admissionregistrationv1.MutatingWebhook{
			Name:                    w.Name,
			ClientConfig:            target.client(w.Path, caBundle),
			Rules:                   w.Rules,
			MatchConditions:         w.MatchConditions,
			FailurePolicy:           optional(w.FailurePolicy),
			SideEffects:             &sideEffects,
			TimeoutSeconds:          optional(w.TimeoutSeconds),
			AdmissionReviewVersions: versions,
			NamespaceSelector:       w.NamespaceSelector,
			ObjectSelector:          w.ObjectSelector,
			ReinvocationPolicy:      &reinvocation,
		})
	}
	return validating, mutating
}

// Register applies the webhook configurations of s.
func Register(ctx context.Context, kube kubernetes.Interface, s Set, target Target, caBundle []byte) error {
	validating, mutating := s.Configurations(target, caBundle)
	if _, err := ssa.Apply(ctx, kube.AdmissionregistrationV1().ValidatingWebhookConfigurations(), s.Name, validating); err != nil {
		return fmt.Errorf("ValidatingWebhookConfiguration: %w", err)
	}
	if _, err := ssa.Apply(ctx, kube.AdmissionregistrationV1().MutatingWebhookConfigurations(), s.Name, mutating); err != nil {
		return fmt.Errorf("MutatingWebhookConfiguration: %w", err)
	}
	return nil
}

// Unregister deletes the webhook configurations of the Set named name,
// each only if Register made it: written under ssa.FieldManager. One that
// someone else made under that name is left alone and named in foreign;
// missing ones are no error. Each delete is guarded by the UID and
// resourceVersion that were checked, so a configuration replaced in
// between is never deleted unchecked (that error is a conflict: try
// again).
func Unregister(ctx context.Context, kube kubernetes.Interface, name string) (removed, foreign []string, err error) {
	for _, c := range []struct {
		kind   string
		client getDeleter[metav1.Object]
	}{
		{"ValidatingWebhookConfiguration", objectClient[*admissionregistrationv1.ValidatingWebhookConfiguration]{kube.AdmissionregistrationV1().ValidatingWebhookConfigurations()}},
		{"MutatingWebhookConfiguration", objectClient[*admissionregistrationv1.MutatingWebhookConfiguration]{kube.AdmissionregistrationV1().MutatingWebhookConfigurations()}},
	} {
		kind, client := c.kind, c.client
		obj, err := client.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return removed, foreign, fmt.Errorf("%s %s: %w", kind, name, err)
		}
		if !slices.ContainsFunc(obj.GetManagedFields(), func(f metav1.ManagedFieldsEntry) bool { return f.Manager == ssa.FieldManager }) {
			foreign = append(foreign, kind+" "+name)
			continue
		}
		uid, rv := obj.GetUID(), obj.GetResourceVersion()
		err = client.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		if err != nil && !apierrors.IsNotFound(err) {
			return removed, foreign, fmt.Errorf("deleting %s %s: %w", kind, name, err)
		}
		removed = append(removed, kind+" "+name)
	}
	return removed, foreign, nil
}

// getDeleter is what Unregister needs of a typed client.
type getDeleter[T any] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// objectClient adapts a typed client to getDeleter[metav1.Object].
type objectClient[T metav1.Object] struct{ c getDeleter[T] }

func (o objectClient[T]) Get(ctx context.Context, name string, opts metav1.GetOptions) (metav1.Object, error) {
	return o.c.Get(ctx, name, opts)
}

func (o objectClient[T]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return o.c.Delete(ctx, name, opts)
}

// optional points at v, or is nil for the zero value: the API server's
// default then applies.
func optional[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// ConversionFieldManager is the field manager of the conversion webhooks
// netop sets on its CRDs.
const ConversionFieldManager = "netop-conversion"

// RegisterConversion makes the API server convert the objects of the CRD
// named crd with the webhook at path of target: strategy Webhook,
// ConversionReviews of apiextensions.k8s.io/v1. It is a merge patch, not
// an apply: the client configuration is replaced whole (a URL where the
// manifest names a Service, in the standalone), and netop's applies of the
// CRD itself, which leave spec.conversion out, never remove it.
func RegisterConversion(ctx context.Context, client apiextensionsclient.Interface, crd string, target Target, path string, caBundle []byte) error {
	cc := target.client(path, caBundle)
	clientConfig := map[string]any{"caBundle": cc.CABundle, "url": cc.URL, "service": nil}
	if cc.Service != nil {
		clientConfig["url"] = nil
		clientConfig["service"] = apiextensionsv1.ServiceReference{Namespace: cc.Service.Namespace, Name: cc.Service.Name, Path: cc.Service.Path, Port: cc.Service.Port}
	}
	patch := map[string]any{"spec": map[string]any{"conversion": map[string]any{
		"strategy": apiextensionsv1.WebhookConverter,
		"webhook":  map[string]any{"clientConfig": clientConfig, "conversionReviewVersions": []string{"v1"}},
	}}}
	body, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if _, err := client.ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, crd, types.MergePatchType, body,
		metav1.PatchOptions{FieldManager: ConversionFieldManager}); err != nil {
		return fmt.Errorf("registering the conversion webhook of CRD %s: %w", crd, err)
	}
	return nil
}
