package webhook

import (
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A Set becomes one validating and one mutating configuration, each
// webhook with its own path on the target, its rules and selectors, and
// the defaults the API server would otherwise pick left to it.
func TestSetConfigurations(t *testing.T) {
	selector := &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}
	set := Set{Name: "cfg", Webhooks: []Webhook{
		{Name: "v.example.com", Path: "/v", FailurePolicy: admissionregistrationv1.Fail, TimeoutSeconds: 5, NamespaceSelector: selector},
		{Name: "m.example.com", Path: "/m", Mutating: true, ObjectSelector: selector},
	}}
	validating, mutating := set.Configurations(Target{URL: "https://127.0.0.1:9443"}, []byte("CA"))
	if validating.Name != "cfg" || mutating.Name != "cfg" || validating.Kind != "ValidatingWebhookConfiguration" || mutating.Kind != "MutatingWebhookConfiguration" {
		t.Fatalf("names and kinds: %s %s, %s %s", validating.Kind, validating.Name, mutating.Kind, mutating.Name)
	}
	if len(validating.Webhooks) != 1 || len(mutating.Webhooks) != 1 {
		t.Fatalf("%d validating and %d mutating webhooks, want 1 and 1", len(validating.Webhooks), len(mutating.Webhooks))
	}
	v, m := validating.Webhooks[0], mutating.Webhooks[0]
	if *v.ClientConfig.URL != "https://127.0.0.1:9443/v" || string(v.ClientConfig.CABundle) != "CA" || *m.ClientConfig.URL != "https://127.0.0.1:9443/m" {
		t.Errorf("client configs %+v, %+v", v.ClientConfig, m.ClientConfig)
	}
	if *v.FailurePolicy != admissionregistrationv1.Fail || *v.TimeoutSeconds != 5 || v.NamespaceSelector != selector {
		t.Errorf("validating webhook %+v", v)
	}
	if m.FailurePolicy != nil || m.TimeoutSeconds != nil || m.ObjectSelector != selector || *m.ReinvocationPolicy != admissionregistrationv1.NeverReinvocationPolicy {
		t.Errorf("mutating webhook: failurePolicy %v, timeout %v, reinvocation %v: want the API server's defaults and Never", m.FailurePolicy, m.TimeoutSeconds, *m.ReinvocationPolicy)
	}
	if *v.SideEffects != admissionregistrationv1.SideEffectClassNone || v.AdmissionReviewVersions[0] != "v1" {
		t.Errorf("side effects %v, review versions %v", *v.SideEffects, v.AdmissionReviewVersions)
	}
	svc := Target{Service: &admissionregistrationv1.ServiceReference{Namespace: "ns", Name: "svc"}}
	if _, mutating := set.Configurations(svc, nil); *mutating.Webhooks[0].ClientConfig.Service.Path != "/m" || svc.Service.Path != nil {
		t.Errorf("service target: path %v, and the Target's own service changed to %v", mutating.Webhooks[0].ClientConfig.Service.Path, svc.Service.Path)
	}
}
